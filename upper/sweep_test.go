package upper

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestSweepParts: the part of a Create or Branch that a crash cut short (a subvolume under a dot name
// no call will name again) is removed once it is older than the age given; a newer one, possibly
// under way, stays, and so do the uppers.
func TestSweepParts(t *testing.T) {
	needRoot(t)
	f, _ := open(t, Options{Size: 1 << 30})
	if err := f.Create("benches/kept"); err != nil {
		t.Fatal(err)
	}
	old, fresh := filepath.Join(f.dir, "benches", ".old"+partSuffix), filepath.Join(f.dir, "benches", ".fresh"+partSuffix)
	for _, p := range []string{old, fresh} {
		if err := subvolCreate(p); err != nil {
			t.Fatal(err)
		}
	}
	hour := time.Now().Add(-time.Hour)
	if err := os.Chtimes(old, hour, hour); err != nil {
		t.Fatal(err)
	}
	n, err := f.SweepParts("benches", time.Minute)
	if err != nil || n != 1 {
		t.Fatalf("SweepParts: %d, %v; want 1", n, err)
	}
	if _, err := os.Lstat(old); !os.IsNotExist(err) {
		t.Errorf("the old part is still there: %v", err)
	}
	for _, p := range []string{fresh, f.Dir("benches/kept")} {
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
}
