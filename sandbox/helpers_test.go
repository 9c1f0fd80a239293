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
	if mode := os.Getenv(helperEnv); mode != "" {
		os.Exit(runHelper(mode))
	}
	code := m.Run()
	for _, d := range []string{shared.dir, probe.dir} {
		if d != "" {
			os.RemoveAll(d)
		}
	}
	os.Exit(code)
}

// helperEnv makes the test binary, re-executed by a test, play a part instead of running tests; the
// lowers and the probe come in helperLowersEnv and helperProbeEnv.
const (
	helperEnv       = "SHED_SANDBOX_TEST_HELPER"
	helperLowersEnv = "SHED_SANDBOX_TEST_LOWERS"
	helperProbeEnv  = "SHED_SANDBOX_TEST_PROBE"
)

// helperCmd returns the test binary as a helper in mode.
func helperCmd(t *testing.T, mode string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+mode,
		helperLowersEnv+"="+strings.Join(busyboxLowers(t), ":"), helperProbeEnv+"="+probeBind(t).Source)
	return cmd
}

func runHelper(mode string) int {
	spec := &sandbox.Spec{
		Root: sandbox.Root{Lowers: strings.Split(os.Getenv(helperLowersEnv), ":")},
		Env:  []string{"PATH=/bin"},
	}
	switch mode {
	case "limited-sleep":
		// A sandbox with cgroups, for TestSweep to SIGKILL this process under.
		spec.Argv = []string{"sh", "-c", "cat /proc/self/cgroup; echo ready; exec sleep 1000"}
		spec.Limits = sandbox.Limits{MemoryBytes: 64 << 20, Pids: 16}
	case "frozen-sleep":
		return runFrozenHelper(spec) // TestFreezeCreatorKilled
	case "tty":
		// Run by TestNoControllingTerminal on a terminal that is this process's controlling terminal.
		spec.Argv = []string{"sh", "-c", `/run/probe tiocsti; echo "tty_nr=$(cut -d' ' -f7 /proc/self/stat)"`}
		spec.Binds = []sandbox.Bind{{Source: os.Getenv(helperProbeEnv), Target: "/run/probe"}}
	default:
		fmt.Fprintln(os.Stderr, "unknown helper mode", mode)
		return 2
	}
	code, err := sandbox.Run(context.Background(), spec, sandbox.Stdio{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 255
	}
	return code
}

// probe is testdata/probe, built static (the test binary is not: it cannot run on the busybox root).
var probe struct {
	once      sync.Once
	dir, path string
	err       error
}

// probeBind returns a bind of the probe at /run/probe.
func probeBind(t testing.TB) sandbox.Bind {
	t.Helper()
	probe.once.Do(func() { probe.err = buildProbe() })
	if probe.err != nil {
		t.Fatal(probe.err)
	}
	return sandbox.Bind{Source: probe.path, Target: "/run/probe"}
}

func buildProbe() error {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return fmt.Errorf("go not found in PATH, needed to build testdata/probe: %v", err)
	}
	if probe.dir, err = os.MkdirTemp("", "sandbox-test-probe-"); err != nil {
		return err
	}
	// Reachable by other uids: TestExecPeerUID runs it as nobody.
	if err := os.Chmod(probe.dir, 0o755); err != nil {
		return err
	}
	probe.path = filepath.Join(probe.dir, "probe")
	cmd := exec.Command(goBin, "build", "-o", probe.path, "./testdata/probe")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build testdata/probe: %v\n%s", err, out)
	}
	return nil
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
