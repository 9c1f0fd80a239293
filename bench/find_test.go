package bench

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// keptBench writes the state of a kept Bench (a record, no runner) under benches.
func keptBench(t testing.TB, benches, id, name string, started time.Time) {
	t.Helper()
	dir := filepath.Join(benches, id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(&Record{ID: id, Name: name, Keep: true, Started: started})
	if err := os.WriteFile(filepath.Join(dir, "bench.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestFindByID: an id names its Bench, even when another Bench, started before it, took that id as
// its name (ids are random: only a guess makes one); names and ids that are no Bench's are not
// found; a name is found as before.
func TestFindByID(t *testing.T) {
	benches := t.TempDir()
	now := time.Now()
	keptBench(t, benches, "00000000000000aa", "0123456789abcdef", now.Add(-time.Hour))
	keptBench(t, benches, "0123456789abcdef", "second", now)
	if rec, err := FindIn(benches, "0123456789abcdef"); err != nil || rec.Name != "second" {
		t.Errorf("by id: %+v %v, want the Bench whose id it is", rec, err)
	}
	if rec, err := FindIn(benches, "second"); err != nil || rec.ID != "0123456789abcdef" {
		t.Errorf("by name: %+v %v", rec, err)
	}
	for _, missing := range []string{"fedcba9876543210", "../00000000000000aa", "nothing"} {
		if rec, err := FindIn(benches, missing); err == nil {
			t.Errorf("%q found %+v", missing, rec)
		}
	}
}

// BenchmarkFind: finding one Bench among 100, by id (what every E2B command does, several times)
// and by name.
func BenchmarkFind(b *testing.B) {
	benches := b.TempDir()
	for i := range 100 {
		keptBench(b, benches, fmt.Sprintf("%016x", i+1), fmt.Sprintf("bench-%d", i), time.Now())
	}
	for _, by := range []struct{ what, key string }{{"id", fmt.Sprintf("%016x", 50)}, {"name", "bench-49"}} {
		b.Run(by.what, func(b *testing.B) {
			for b.Loop() {
				if _, err := FindIn(benches, by.key); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
