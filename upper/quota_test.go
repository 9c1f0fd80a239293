package upper

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// writeUntil writes n bytes (not zeros) to p, synced, and returns the first error.
func writeUntil(t testing.TB, p string, n int64) error {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(p)
	if err != nil {
		return err
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(i*7 + i>>8)
	}
	for w := int64(0); w < n; w += int64(len(buf)) {
		buf[0], buf[1] = byte(w>>20), byte(w>>28)
		if _, err := f.Write(buf); err != nil {
			return err
		}
	}
	return f.Sync()
}

// usage is group's usage after a commit.
func usage(t testing.TB, f *FS, group uint32) int64 {
	t.Helper()
	if err := f.Flush(); err != nil {
		t.Fatal(err)
	}
	n, err := f.GroupUsage(group)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestQuota: an upper charged to a group whose limit is 64 MiB gets EDQUOT past it, and not past
// 64 MiB by more than the kernel's slack; usage follows writes, branches and removes.
func TestQuota(t *testing.T) {
	needRoot(t)
	f, _ := open(t, Options{})
	if !f.Quotas() {
		t.Fatal("the uppers' btrfs has no quotas")
	}
	// Simple quotas, not full ones (whose backref walks cost every snapshot and commit).
	if b, err := os.ReadFile(filepath.Join(f.qgroups, "mode")); err != nil || string(b) != "squota\n" {
		t.Fatalf("quota mode: %q, %v; want squota", b, err)
	}
	const group, limit = 4242, 64 << 20
	if err := f.SetGroupLimit(group, limit); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"benches/a", "benches/free"} {
		if err := f.Create(n); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Charge("benches/a", group); err != nil {
		t.Fatal(err)
	}
	if err := f.Charge("benches/a", group); err != nil {
		t.Fatalf("a second Charge: %v", err)
	}
	if n := usage(t, f, group); n > 1<<20 {
		t.Fatalf("usage of an empty upper: %d", n)
	}
	a := filepath.Join(f.Dir("benches/a"), "upper")
	if err := writeUntil(t, filepath.Join(a, "small"), 16<<20); err != nil {
		t.Fatal(err)
	}
	if n := usage(t, f, group); n < 16<<20 || n > 18<<20 {
		t.Fatalf("usage after 16 MiB written: %d", n)
	}
	err := writeUntil(t, filepath.Join(a, "big"), 128<<20)
	if !errors.Is(err, unix.EDQUOT) {
		t.Fatalf("128 MiB more past a limit of 64 MiB: %v, want EDQUOT", err)
	}
	if n := usage(t, f, group); n > limit+(4<<20) {
		t.Fatalf("usage %d past the limit %d", n, limit)
	}
	// An upper of no group writes on.
	if err := writeUntil(t, filepath.Join(f.Dir("benches/free"), "upper/big"), 128<<20); err != nil {
		t.Fatal(err)
	}
	// What is over the bound can be removed.
	if err := os.Remove(filepath.Join(a, "big")); err != nil {
		t.Fatal(err)
	}
	if n := usage(t, f, group); n < 16<<20 || n > 18<<20 {
		t.Fatalf("usage after the big file's removal: %d", n)
	}
	// A read-only snapshot adds nothing; a branch's writes count once charged; what the source then
	// writes over stays the snapshot's, and counts.
	if err := f.Branch("benches/a", []string{"snapshots/s", "benches/b"}, false); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"snapshots/s", "benches/b"} {
		if err := f.Charge(n, group); err != nil {
			t.Fatal(err)
		}
	}
	if n := usage(t, f, group); n < 16<<20 || n > 18<<20 {
		t.Fatalf("usage after a snapshot and a branch of 16 MiB: %d", n)
	}
	if err := writeUntil(t, filepath.Join(f.Dir("benches/b"), "upper/more"), 32<<20); err != nil {
		t.Fatal(err)
	}
	if n := usage(t, f, group); n < 48<<20 || n > 50<<20 {
		t.Fatalf("usage after 32 MiB written in the branch: %d", n)
	}
	if err := writeUntil(t, filepath.Join(f.Dir("benches/b"), "upper/over"), 32<<20); !errors.Is(err, unix.EDQUOT) {
		t.Fatalf("a branch writing past the group's limit: %v, want EDQUOT", err)
	}
	if err := os.Remove(filepath.Join(f.Dir("benches/b"), "upper/over")); err != nil {
		t.Fatal(err)
	}
	// The source removed, what the snapshot still holds of it stays the group's.
	if err := f.Remove("benches/a"); err != nil {
		t.Fatal(err)
	}
	f.reclaims.Wait()
	time.Sleep(500 * time.Millisecond) // the cleaner drops the subvolume after the commit
	if n := usage(t, f, group); n < 48<<20 || n > 50<<20 {
		t.Fatalf("usage after the source's removal, its snapshot kept: %d", n)
	}
	// Removes give the bytes back, once btrfs's cleaner has dropped the subvolumes.
	for _, n := range []string{"benches/b", "snapshots/s"} {
		if err := f.Remove(n); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		f.reclaims.Wait()
		n := usage(t, f, group)
		if n < 1<<20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("usage after all the group's uppers are removed: %d", n)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := f.SetGroupLimit(group, 0); err != nil {
		t.Fatal(err)
	}
}

// TestQuotaCopies: copies have no quotas, and say so.
func TestQuotaCopies(t *testing.T) {
	f, _ := open(t, Options{copyOnly: true})
	if f.Quotas() {
		t.Fatal("copies claim quotas")
	}
	if err := f.Create("benches/a"); err != nil {
		t.Fatal(err)
	}
	if err := f.Charge("benches/a", 1); !errors.Is(err, ErrNoQuotas) {
		t.Fatalf("Charge on copies: %v", err)
	}
	if err := f.SetGroupLimit(1, 1<<20); !errors.Is(err, ErrNoQuotas) {
		t.Fatalf("SetGroupLimit on copies: %v", err)
	}
	if _, err := f.GroupUsage(1); !errors.Is(err, ErrNoQuotas) {
		t.Fatalf("GroupUsage on copies: %v", err)
	}
}
