package sandbox_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"toolshed.dev/shed/sandbox"
)

func TestMain(m *testing.M) {
	sandbox.Init() // the sandbox's init is this test binary, re-executed
	code := m.Run()
	if shared.dir != "" {
		os.RemoveAll(shared.dir)
	}
	os.Exit(code)
}

// requireRoot skips a test that needs root; CI runs as root, so there these tests run.
func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (namespaces, mounts, cgroups)")
	}
}

// shared holds the busybox root, built once per test binary: lowers are never written.
var shared struct {
	once        sync.Once
	dir         string
	bottom, top string
	err         error
}

// busyboxLowers returns two lower directories, bottom first: a tiny root made of busybox-static and its
// applet links, and a layer above it.
func busyboxLowers(t testing.TB) []string {
	t.Helper()
	shared.once.Do(func() { shared.err = buildBusyboxRoot() })
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return []string{shared.bottom, shared.top}
}

func buildBusyboxRoot() error {
	bb, err := exec.LookPath("busybox")
	if err != nil {
		return fmt.Errorf("busybox not found: apt-get install busybox-static (%v)", err)
	}
	dir, err := os.MkdirTemp("", "sandbox-test-root-")
	if err != nil {
		return err
	}
	shared.dir = dir
	shared.bottom, shared.top = filepath.Join(dir, "bottom"), filepath.Join(dir, "top")
	for _, d := range []string{"bin", "proc", "dev", "tmp", "run", "etc", "sys", "root"} {
		if err := os.MkdirAll(filepath.Join(shared.bottom, d), 0o755); err != nil {
			return err
		}
	}
	if err := os.Chmod(filepath.Join(shared.bottom, "tmp"), 0o1777); err != nil {
		return err
	}
	b, err := os.ReadFile(bb)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(shared.bottom, "bin/busybox"), b, 0o755); err != nil {
		return err
	}
	list, err := exec.Command(bb, "--list").Output()
	if err != nil {
		return fmt.Errorf("busybox --list: %w (is it busybox-static?)", err)
	}
	for _, name := range strings.Fields(string(list)) {
		if name == "busybox" {
			continue
		}
		if err := os.Symlink("busybox", filepath.Join(shared.bottom, "bin", name)); err != nil {
			return err
		}
	}
	files := map[string]string{
		"bottom/etc/which":     "bottom\n",
		"bottom/etc/lowerfile": "delete me\n",
		"top/etc/which":        "top\n",
		"top/etc/toponly":      "top only\n",
	}
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// writableSpec returns a spec over the busybox lowers with a fresh upper and work dir.
func writableSpec(t testing.TB, argv ...string) (*sandbox.Spec, string) {
	t.Helper()
	d := t.TempDir()
	upper, work := filepath.Join(d, "upper"), filepath.Join(d, "work")
	for _, p := range []string{upper, work} {
		if err := os.Mkdir(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return &sandbox.Spec{
		Root: sandbox.Root{Lowers: busyboxLowers(t), Upper: upper, Work: work},
		Argv: argv,
		Env:  []string{"PATH=/bin", "HOME=/root"},
	}, upper
}

// readOnlySpec returns a spec over the busybox lowers with no upper.
func readOnlySpec(t testing.TB, argv ...string) *sandbox.Spec {
	t.Helper()
	return &sandbox.Spec{
		Root: sandbox.Root{Lowers: busyboxLowers(t)},
		Argv: argv,
		Env:  []string{"PATH=/bin", "HOME=/root"},
	}
}

type result struct {
	stdout, stderr string
	code           int
}

// run runs spec to completion and fails the test on a sandbox error.
func run(t testing.TB, spec *sandbox.Spec) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out, errb bytes.Buffer
	code, err := sandbox.Run(ctx, spec, sandbox.Stdio{Stdout: &out, Stderr: &errb})
	if err != nil {
		t.Fatalf("run %q: %v (stderr %q)", spec.Argv, err, errb.String())
	}
	return result{out.String(), errb.String(), code}
}
