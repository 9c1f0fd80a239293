package bench

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// TestReserveName: of many launches with one name at once, exactly one gets it; a Bench still
// starting (no record yet) holds its name; the names' lock file is not debris.
func TestReserveName(t *testing.T) {
	benches := filepath.Join(t.TempDir(), "benches")
	var wg sync.WaitGroup
	var mu sync.Mutex
	var got []*os.File
	taken := 0
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lk, err := reserve(benches, filepath.Join(benches, fmt.Sprintf("id%02d", i)), "same")
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				got = append(got, lk)
			case errors.Is(err, ErrNameTaken):
				taken++
			default:
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if len(got) != 1 || taken != 15 {
		t.Fatalf("16 launches named alike: %d got the name, %d were refused", len(got), taken)
	}
	if rec, err := FindIn(benches, "same"); err != nil || !rec.Running {
		t.Errorf("a starting Bench: %+v %v, want found by its name", rec, err)
	}
	got[0].Close()
	if _, err := FindIn(benches, "same"); err == nil {
		t.Error("a Bench whose runner is gone still holds its name")
	}
}
