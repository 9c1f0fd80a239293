package app

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"toolshed.dev/shed/derivation"
	"toolshed.dev/shed/recipe"
	"toolshed.dev/shed/store"
)

// realizedWorkshop makes a store and a Workshop realized in it, of a seed and an apt layer of 3 .debs,
// its paths made with stand-in contents (no network, no build); it returns the Service and the recipe.
func realizedWorkshop(tb testing.TB) (*Service, string) {
	if os.Geteuid() != 0 {
		tb.Skip("needs root: store paths keep owners")
	}
	ctx := context.Background()
	root := tb.TempDir()
	st, err := store.Init(filepath.Join(root, "store"))
	if err != nil {
		tb.Fatal(err)
	}
	defer st.Close()
	file := filepath.Join(root, "workshop.toml")
	if err := os.WriteFile(file, []byte("name = \"hit\"\nseed = \"debian/bookworm\"\n[apt]\npackages = [\"jq\"]\n"), 0o600); err != nil {
		tb.Fatal(err)
	}
	r, err := recipe.Load(file, recipe.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	fp, err := recipe.Fingerprint(r)
	if err != nil {
		tb.Fatal(err)
	}
	lock := &recipe.Lock{Version: recipe.LockVersion, Inputs: fp, Accounts: recipe.LockAccounts(r),
		Seed: recipe.LockedSeed{Spec: "debian/bookworm", Mirror: recipe.DefaultMirror, Epoch: 1700000000}}
	for i, n := range []string{"jq", "libjq1", "libonig5"} {
		lock.Apt = append(lock.Apt, recipe.LockedDeb{Name: n, Version: "1", Arch: "amd64", URL: "http://deb.example/" + n + ".deb",
			SHA256: strings.Repeat(string(rune('a'+i)), 64), Size: 1000, Declared: n == "jq"})
	}
	if err := recipe.WriteLock(recipe.LockFile(file), lock); err != nil {
		tb.Fatal(err)
	}
	plan, err := recipe.Compile(r, lock, st.StoreDir())
	if err != nil {
		tb.Fatal(err)
	}
	for _, d := range plan.Derivations {
		if _, err := derivation.Write(ctx, st, d); err != nil {
			tb.Fatal(err)
		}
		_, _, err := st.Realize(ctx, d.Output, store.AddOptions{}, func(ctx context.Context, out string) error {
			if err := os.MkdirAll(out, 0o755); err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(out, "data"), []byte(d.Name), 0o644)
		})
		if err != nil {
			tb.Fatal(err)
		}
	}
	return &Service{Root: st.Root()}, file
}

// TestRealizeCacheHitOneOpen: a realize of a Workshop in the store (its root too) opens the
// database once, from its recipe to its root.
func TestRealizeCacheHitOneOpen(t *testing.T) {
	s, file := realizedWorkshop(t)
	c := &Call{Caller: &Caller{Role: Operator}}
	for i := range 2 { // the first roots the Workshop: a write
		w, err := s.realize(t.Context(), c, file, true, nil)
		if err != nil {
			t.Fatal(err)
		}
		n := w.st.DBOpens()
		w.st.Close()
		if len(w.res.Built)+len(w.res.Fetched) != 0 {
			t.Fatalf("built %v, fetched %v: not a cache hit", w.res.Built, w.res.Fetched)
		}
		if i == 1 && n != 1 {
			t.Errorf("a cache-hit realize opened the database %d times, want 1", n)
		}
	}
}

// BenchmarkRealizeCacheHit is a cache-hit realize of a Workshop of a seed and an apt layer of 3
// .debs (what `shed realize` and every launch start with), by one long-lived Service as the
// supervisor's.
func BenchmarkRealizeCacheHit(b *testing.B) {
	s, file := realizedWorkshop(b)
	ctx := context.Background()
	c := &Call{Caller: &Caller{Role: Operator}}
	var before, after syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &before)
	for b.Loop() {
		res, err := s.Realize(ctx, c, &RealizeRequest{Workshop: file, Offline: true})
		if err != nil {
			b.Fatal(err)
		}
		if len(res.Built)+len(res.Fetched) != 0 {
			b.Fatalf("built %v, fetched %v: not a cache hit", res.Built, res.Fetched)
		}
	}
	// CPU time too: on a loaded machine the wall time is mostly other processes'.
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &after)
	cpu := time.Duration(after.Utime.Nano() + after.Stime.Nano() - before.Utime.Nano() - before.Stime.Nano())
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
}
