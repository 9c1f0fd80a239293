package atomicfile_test

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"toolshed.dev/shed/internal/atomicfile"
)

// entries lists the names in dir.
func entries(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

func TestWriteFile(t *testing.T) {
	old := syscall.Umask(0o077) // the mode is perm, whatever the umask
	defer syscall.Umask(old)
	dir := t.TempDir()
	f := filepath.Join(dir, "config.toml")
	for _, c := range []struct {
		data string
		perm os.FileMode
	}{{"one\n", 0o644}, {"two, longer\n", 0o600}, {"", 0o640}} {
		if err := atomicfile.WriteFile(f, []byte(c.data), c.perm); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		st, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		if string(b) != c.data || st.Mode().Perm() != c.perm {
			t.Errorf("got %q mode %04o, want %q mode %04o", b, st.Mode().Perm(), c.data, c.perm)
		}
	}
	if got := entries(t, dir); len(got) != 1 {
		t.Errorf("the directory holds %q, want the file alone", got)
	}
}

// TestWriteFileConcurrent: writers racing on one path all succeed, and the file is one write, whole.
func TestWriteFileConcurrent(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "workshop.lock")
	const n = 32
	writes := make([][]byte, n)
	for i := range writes {
		// Large and different in every byte, so that a mix of two writes would show.
		writes[i] = bytes.Repeat([]byte{byte('A' + i)}, 256<<10+i)
	}
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = atomicfile.WriteFile(f, writes[i], 0o644)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("writer %d: %v", i, err)
		}
	}
	b, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	whole := false
	for _, w := range writes {
		whole = whole || bytes.Equal(b, w)
	}
	if !whole {
		t.Errorf("the file (%d bytes) is none of the writes", len(b))
	}
	if got := entries(t, dir); len(got) != 1 {
		t.Errorf("the directory holds %q, want the file alone", got)
	}
}

func TestWriteFileFails(t *testing.T) {
	dir := t.TempDir()
	// A missing directory.
	missing := filepath.Join(dir, "gone", "version.json")
	if err := atomicfile.WriteFile(missing, []byte("x"), 0o644); err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("into a missing directory: %v, want an error naming %s", err, missing)
	}
	// The rename fails after the temporary file was written (the path is a directory, which a file
	// cannot replace): the temporary file is removed, the directory kept.
	target := filepath.Join(dir, "current")
	if err := os.Mkdir(target, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := atomicfile.WriteFile(target, []byte("2\n"), 0o644); err == nil || !strings.Contains(err.Error(), target) {
		t.Errorf("over a directory: %v, want an error naming %s", err, target)
	}
	if got := entries(t, dir); fmt.Sprint(got) != "[current]" {
		t.Errorf("after the failures the directory holds %q, want [current]", got)
	}
	// A directory we may not write (root may write anything: this case runs as other users).
	if os.Geteuid() != 0 {
		ro := filepath.Join(dir, "ro")
		if err := os.Mkdir(ro, 0o500); err != nil {
			t.Fatal(err)
		}
		if err := atomicfile.WriteFile(filepath.Join(ro, "f"), []byte("x"), 0o644); err == nil {
			t.Error("a write into a read-only directory succeeded")
		}
		if got := entries(t, ro); len(got) != 0 {
			t.Errorf("the read-only directory holds %q", got)
		}
	}
	if err := atomicfile.SyncDir(filepath.Join(dir, "gone")); err == nil {
		t.Error("SyncDir of a missing directory succeeded")
	}
}

func TestMkdirAll(t *testing.T) {
	dir := t.TempDir()
	d := filepath.Join(dir, "a", "b", "c")
	if err := atomicfile.MkdirAll(d, 0o700); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(d); err != nil || !st.IsDir() {
		t.Fatalf("%s: %v", d, err)
	}
	if err := atomicfile.MkdirAll(d, 0o700); err != nil {
		t.Errorf("again: %v", err)
	}
	f := filepath.Join(dir, "file")
	if err := os.WriteFile(f, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := atomicfile.MkdirAll(filepath.Join(f, "x"), 0o700); err == nil {
		t.Error("a directory under a file was made")
	}
}

// TestWriteFileError: the error names the file asked for and the step, not the temporary file.
func TestWriteFileError(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "current")
	if err := os.Mkdir(target, 0o700); err != nil {
		t.Fatal(err)
	}
	err := atomicfile.WriteFile(target, []byte("2\n"), 0o644)
	var pe *os.PathError
	if !errors.As(err, &pe) || pe.Path != target || pe.Op != "write" || !strings.HasPrefix(pe.Err.Error(), "rename: ") || strings.Contains(err.Error(), ".tmp-") {
		t.Errorf("got %v, want write %s: rename: …", err, target)
	}
	if err := atomicfile.WriteFile(filepath.Join(dir, "gone", "f"), nil, 0o644); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("into a missing directory: %v, want ErrNotExist", err)
	}
}

// TestReplace: Replace leaves the new content whole at the mode asked, and no temporary file.
func TestReplace(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "bench.json")
	for _, content := range []string{"first", "second, longer"} {
		if err := atomicfile.Replace(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(p)
		if err != nil || string(b) != content {
			t.Fatalf("after Replace(%q): %q, %v", content, b, err)
		}
	}
	if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode: %v %v", fi.Mode(), err)
	}
	if es, _ := os.ReadDir(dir); len(es) != 1 {
		t.Fatalf("left %d entries, want the file alone", len(es))
	}
}
