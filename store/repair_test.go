package store_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"toolshed.dev/shed/store"
)

// Repair puts back exactly the registered bytes, over damaged or missing ones, and refuses others.
func TestRepair(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	dep := realizeFile(t, s, "dep", "d")
	p, err := store.MakePath("output", "tree", s.StoreDir(), "tree")
	if err != nil {
		t.Fatal(err)
	}
	good := func(ctx context.Context, out string) error {
		writeTree(t, out, map[string]string{"bin/tool": "#!/bin/sh\necho ok\n", "share/doc": "doc"})
		return nil
	}
	if _, _, err := s.Realize(ctx, p, store.AddOptions{References: []store.Path{dep}}, good); err != nil {
		t.Fatal(err)
	}
	top := realizeFile(t, s, "top", "t", p)
	before, _ := s.Info(p)

	tool := filepath.Join(s.Location(p), "bin", "tool")
	os.Chmod(tool, 0o755)
	if err := os.WriteFile(tool, []byte("#!/bin/sh\nexfiltrate\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	// Bytes that are not the registered ones are refused, and the path is left as it was.
	bad := func(ctx context.Context, out string) error {
		writeTree(t, out, map[string]string{"bin/tool": "#!/bin/sh\nother\n", "share/doc": "doc"})
		return nil
	}
	err = s.Repair(ctx, p, 0, bad)
	if !errors.Is(err, store.ErrRepairDiffers) || !strings.Contains(err.Error(), "bin/tool") {
		t.Fatalf("repair with other bytes: %v, want ErrRepairDiffers naming bin/tool", err)
	}
	if b, _ := os.ReadFile(tool); string(b) != "#!/bin/sh\nexfiltrate\n" {
		t.Fatalf("a refused repair changed the path: %q", b)
	}

	if err := s.Repair(ctx, p, 0, good); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(tool); string(b) != "#!/bin/sh\necho ok\n" {
		t.Errorf("after repair: %q", b)
	}
	after, err := s.Info(p)
	if err != nil || after.ContentHash != before.ContentHash || after.Registered != before.Registered {
		t.Errorf("repair changed the record: %+v, was %+v (%v)", after, before, err)
	}
	if !s.IsValid(top) {
		t.Error("the path that refers to the repaired one is no longer valid")
	}
	assertVerifies(t, s)

	// Missing on disk altogether.
	if err := os.RemoveAll(s.Location(p)); err != nil {
		t.Fatal(err)
	}
	if err := s.Repair(ctx, p, 0, good); err != nil {
		t.Fatal(err)
	}
	assertVerifies(t, s)
	if ents, _ := os.ReadDir(filepath.Join(s.Root(), "tmp")); len(ents) != 0 {
		t.Errorf("repair left staging behind: %v", ents)
	}

	// Only a registered path can be repaired.
	unknown, _ := store.MakePath("output", "unknown", s.StoreDir(), "unknown")
	if err := s.Repair(ctx, unknown, 0, good); !errors.Is(err, store.ErrNotExist) {
		t.Errorf("repair of an unregistered path: %v, want ErrNotExist", err)
	}
}

// damagedSource adds a tree and damages one of its files; it returns the path, the source of its
// registered bytes and the damaged file.
func damagedSource(t *testing.T, s *store.Store) (store.Path, string, string) {
	t.Helper()
	src := t.TempDir()
	writeTree(t, src, map[string]string{"bin/x": "x", "lib/y": strings.Repeat("y", 100000)})
	info, err := s.AddDir(context.Background(), src, "src", nil)
	if err != nil {
		t.Fatal(err)
	}
	x := filepath.Join(s.Location(info.Path), "bin", "x")
	os.Chmod(x, 0o644)
	if err := os.WriteFile(x, []byte("damaged"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The source as registered: AddDir clamped its mtimes, so the copy must be clamped too (Repair does it).
	return info.Path, src, x
}

// A crash at any step of a repair leaves the path registered, with either its damaged bytes or
// its good ones (never none, never a mix), and a rerun repairs it; gc then leaves nothing behind.
func TestCrashDuringRepair(t *testing.T) {
	for _, fp := range store.Failpoints {
		if !strings.HasPrefix(fp, "repair-") {
			continue
		}
		t.Run(fp, func(t *testing.T) {
			s := newStore(t)
			p, src, x := damagedSource(t, s)
			before, _ := s.Info(p)
			out, err := helper(t, s.Root(), "repair", "STORE_TEST_PATH="+p.String(), "STORE_TEST_SRC="+src, store.FailpointEnv+"="+fp).CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ProcessState.String() != "signal: killed" {
				t.Fatalf("helper was not killed at %s: %v %s", fp, err, out)
			}
			after, err := s.Info(p)
			if err != nil || after.ContentHash != before.ContentHash {
				t.Fatalf("after a crash at %s: %+v, %v", fp, after, err)
			}
			b, _ := os.ReadFile(x)
			if got := string(b); got != "damaged" && got != "x" {
				t.Fatalf("after a crash at %s, bin/x is %q", fp, got)
			}
			if out, err := helper(t, s.Root(), "repair", "STORE_TEST_PATH="+p.String(), "STORE_TEST_SRC="+src).CombinedOutput(); err != nil {
				t.Fatalf("rerun after crash: %v %s", err, out)
			}
			assertVerifies(t, s)
			s.Close()
			if _, err := s.GC(context.Background(), store.GCOptions{}); err != nil {
				t.Fatal(err)
			}
			if ents, _ := os.ReadDir(filepath.Join(s.Root(), "tmp")); len(ents) != 0 {
				t.Errorf("after gc, tmp/ holds %v", ents)
			}
		})
	}
}

// A repair never deletes bytes another process may have mounted: while a process holds the path
// (a Bench over it), its damaged tree is kept in tmp/, gc keeps it, and gc removes it once the
// holder is gone.
func TestRepairKeepsBytesForHolders(t *testing.T) {
	s := newStore(t)
	p, src, _ := damagedSource(t, s)
	hold := helper(t, s.Root(), "hold", "STORE_TEST_PATH="+p.String())
	stdin, _ := hold.StdinPipe()
	stdout, _ := hold.StdoutPipe()
	if err := hold.Start(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 8)
	if _, err := stdout.Read(buf); err != nil {
		t.Fatal(err)
	}
	if out, err := helper(t, s.Root(), "repair", "STORE_TEST_PATH="+p.String(), "STORE_TEST_SRC="+src).CombinedOutput(); err != nil {
		t.Fatalf("repair: %v %s", err, out)
	}
	assertVerifies(t, s)
	retired := func() []string {
		var names []string
		ents, _ := os.ReadDir(filepath.Join(s.Root(), "tmp"))
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), "retired-") && strings.HasSuffix(e.Name(), "-"+p.String()) {
				b, _ := os.ReadFile(filepath.Join(s.Root(), "tmp", e.Name(), "bin", "x"))
				names = append(names, e.Name()+":"+string(b))
			}
		}
		return names
	}
	if got := retired(); len(got) != 1 || !strings.HasSuffix(got[0], ":damaged") {
		t.Fatalf("while a process holds %s, tmp/ has %v; want its damaged tree, whole", p, got)
	}
	s.Close()
	if _, err := s.GC(context.Background(), store.GCOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := retired(); len(got) != 1 {
		t.Fatalf("gc removed the retired tree while its holder lives: %v", got)
	}
	stdin.Close()
	hold.Wait()
	if _, err := s.GC(context.Background(), store.GCOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := retired(); len(got) != 0 {
		t.Errorf("gc kept the retired tree after its holder exited: %v", got)
	}
}
