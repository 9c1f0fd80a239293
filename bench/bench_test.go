package bench_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"toolshed.dev/shed/bench"
	"toolshed.dev/shed/recipe"
	"toolshed.dev/shed/sandbox"
	"toolshed.dev/shed/store"
)

func TestMain(m *testing.M) {
	sandbox.Init() // a Bench's init is this test binary, re-executed
	os.Exit(m.Run())
}

// busyboxLayer adds a root of busybox-static's applets to s as a layer.
func busyboxLayer(t *testing.T, s *store.Store) store.Path {
	t.Helper()
	bb, err := exec.LookPath("busybox")
	if err != nil {
		t.Skipf("busybox not found: apt-get install busybox-static (%v)", err)
	}
	dir := t.TempDir()
	for _, d := range []string{"bin", "proc", "dev", "tmp", "run", "etc", "sys", "root"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bin", "busybox"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("busybox", filepath.Join(dir, "bin", "sh")); err != nil {
		t.Fatal(err)
	}
	info, err := s.AddDir(context.Background(), dir, "busybox-root", nil)
	if err != nil {
		t.Fatal(err)
	}
	return info.Path
}

// TestRecord: a Bench's record is written when it starts and, kept, again with its exit code; nothing
// temporary is left beside it.
func TestRecord(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: sandboxes (CI runs as root)")
	}
	s, err := store.Init(filepath.Join(t.TempDir(), "root"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	layer := busyboxLayer(t, s)
	r, err := recipe.Parse(filepath.Join(t.TempDir(), "workshop.toml"), []byte("name = \"rec\"\nseed = \"debian/bookworm\"\n"), recipe.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	code, err := bench.Run(context.Background(), s, r, []store.Path{layer}, bench.Options{
		Name: "rec-1", Net: "none", Keep: true, Argv: []string{"/bin/sh", "-c", "echo running; exit 3"},
		Stdio: sandbox.Stdio{Stdout: &out},
	})
	if err != nil || code != 3 || out.String() != "running\n" {
		t.Fatalf("run: exit %d, %v, output %q", code, err, out.String())
	}
	rec, err := bench.Find(s, "rec-1")
	if err != nil {
		t.Fatal(err)
	}
	if rec.Exit == nil || *rec.Exit != 3 || rec.Pid != 0 || rec.Running {
		t.Errorf("the kept Bench's record: %+v", rec)
	}
	dir := filepath.Join(bench.Dir(s), rec.ID)
	b, err := os.ReadFile(filepath.Join(dir, "bench.json"))
	if err != nil {
		t.Fatal(err)
	}
	var onDisk bench.Record
	if err := json.Unmarshal(b, &onDisk); err != nil || onDisk.Name != "rec-1" {
		t.Errorf("bench.json: %+v %v", onDisk, err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") || strings.Contains(e.Name(), "tmp") {
			t.Errorf("left in the Bench's directory: %s", e.Name())
		}
	}
	if err := bench.Remove(s, "rec-1"); err != nil {
		t.Fatal(err)
	}
}
