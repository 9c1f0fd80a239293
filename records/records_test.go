package records

import (
	"context"
	"errors"
	"sync"
	"testing"
)

func files(recipeText, lock string) *Files {
	return &Files{Recipe: []byte(recipeText), Lock: []byte(lock), Extra: map[string][]byte{}}
}

const recipeV1 = "name = \"tools\"\nseed = \"debian/bookworm\"\n[apt]\npackages = [\"jq\"]\n"

func TestRecordsCompareAndSwap(t *testing.T) {
	rs := Open(t.TempDir())
	ctx := context.Background()
	v, err := rs.Add(ctx, Version{Name: "tools", By: "op"}, files(recipeV1, "lock1\n"), nil)
	if err != nil || v.N != 1 {
		t.Fatalf("add: %+v %v", v, err)
	}
	if _, err := rs.Add(ctx, Version{Name: "tools", By: "op"}, files(recipeV1, "lock1\n"), nil); !errors.Is(err, ErrConflict) {
		t.Errorf("second add of a new record: %v, want ErrConflict", err)
	}
	// Ten racing versions on base 1: exactly one wins.
	var wg sync.WaitGroup
	var mu sync.Mutex
	wins := 0
	for i := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := rs.Add(ctx, Version{Name: "tools", Base: 1, By: "op"}, files(recipeV1+"# "+string(rune('a'+i))+"\n", "lock\n"), nil)
			if err == nil {
				mu.Lock()
				wins++
				mu.Unlock()
			} else if !errors.Is(err, ErrConflict) {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if wins != 1 {
		t.Errorf("%d racing adds on one base won, want 1", wins)
	}
	log, err := rs.Log("tools")
	if err != nil || len(log) != 2 {
		t.Errorf("log: %d versions, %v", len(log), err)
	}
}
