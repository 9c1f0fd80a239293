package store

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// A file that changes while it is hashed fails the scan with an error that
// names it, whether the walker hashes it (small) or a shared worker does
// (big), and the shared pool goes on serving other scans.
func TestScanTreeFileChangedWhileHashed(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	write := func(name string, size int) {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, make([]byte, size), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a/small", 10)
	write("a/big", inlineMax+1)
	write("b/other", 5)
	want, err := ScanTree(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	pool := newHashPool(ctx, runtime.GOMAXPROCS(0))
	defer pool.close()
	fh := fileHashers.Get().(*fileHasher)
	defer fileHashers.Put(fh)
	for _, c := range []struct {
		name, file string
		shared     bool
	}{
		{"ScanTree, small", "a/small", false},
		{"ScanTree, big", "a/big", false},
		{"shared pool, small (walker)", "a/small", true},
		{"shared pool, big (worker)", "a/big", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			target := filepath.Join(dir, c.file)
			testHookHashFile = func(p string) {
				if p == target {
					f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
					if err != nil {
						t.Error(err)
						return
					}
					f.Write([]byte("grown"))
					f.Close()
				}
			}
			defer func() { testHookHashFile = nil }()
			var err error
			if c.shared {
				_, err = scanTree(ctx, dir, nil, pool, fh)
			} else {
				_, err = ScanTree(ctx, dir)
			}
			if !errors.Is(err, errTreeChanged) || !strings.Contains(err.Error(), c.file) {
				t.Errorf("got %v, want errTreeChanged naming %s", err, c.file)
			}
			testHookHashFile = nil
			if err := os.Truncate(target, map[string]int64{"a/small": 10, "a/big": inlineMax + 1}[c.file]); err != nil {
				t.Fatal(err)
			}
			got, err := scanTree(ctx, dir, nil, pool, fh)
			if err != nil || got.Hash() != want.Hash() {
				t.Errorf("scan after the failure: %v, hash %v, want %v", err, got, want.Hash())
			}
		})
	}
}

// Verify of many paths, small files hashed by the walkers and big ones by
// the shared workers, names each changed file, and only those.
func TestVerifyManyPathsNamesEachChangedFile(t *testing.T) {
	ctx := context.Background()
	s, err := Init(filepath.Join(t.TempDir(), "root"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	writeVerifyStore(t, s, verifyShape{paths: 40, sizes: []int{100, inlineMax + 100}}, nil)
	infos, _, err := s.All()
	if err != nil {
		t.Fatal(err)
	}
	paths := SortedPaths(infos)
	flip := func(p Path, file string) {
		name := filepath.Join(s.Location(p), file)
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(name)
		if err != nil {
			t.Fatal(err)
		}
		b[len(b)/2] ^= 1
		if err := os.WriteFile(name, b, 0o755); err != nil {
			t.Fatal(err)
		}
		// Only the content changes: a write a second after the path was made would change its
		// mtime too, a second problem this test does not ask about.
		if err := os.Chtimes(name, fi.ModTime(), fi.ModTime()); err != nil {
			t.Fatal(err)
		}
	}
	flip(paths[7], "bin/f0")
	flip(paths[23], "bin/f1")
	res, err := s.Verify(ctx, VerifyOptions{CheckContents: true})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range res.Problems {
		if !p.Damaged {
			t.Errorf("problem not marked damaged: %s", p)
		}
		got = append(got, p.String())
	}
	want := []string{
		paths[7].String() + ": bin/f0: content differs",
		paths[23].String() + ": bin/f1: content differs",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got problems\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if res.Checked != 40 || res.Bytes != 40*(100+inlineMax+100) {
		t.Errorf("checked %d paths, %d bytes", res.Checked, res.Bytes)
	}

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.Verify(cancelled, VerifyOptions{CheckContents: true}); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: got %v, want context.Canceled", err)
	}
}
