package sandbox_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"toolshed.dev/shed/sandbox"
)

// The limits tests check the cgroups of their own sandboxes only: others (other packages' tests, a
// running shed) may come and go under the same parent at the same time.

// cgroupsIn returns the toolshed cgroup directories named in the text of a /proc/PID/cgroup file:
// v1 "7:memory:/toolshed/ID", v2 "0::/toolshed/ID".
func cgroupsIn(text string) []string {
	var dirs []string
	for _, line := range strings.Split(text, "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) == 3 && strings.HasPrefix(f[2], "/toolshed/") {
			dirs = append(dirs, filepath.Join("/sys/fs/cgroup", f[1], f[2]))
		}
	}
	return dirs
}

// checkRemoved fails unless the command's cgroups existed and are gone now.
func checkRemoved(t *testing.T, dirs []string) {
	t.Helper()
	if len(dirs) == 0 {
		t.Error("the command was in no toolshed cgroup")
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("cgroup left behind: %s (%v)", d, err)
		}
	}
}

func TestPidsLimit(t *testing.T) {
	requireRoot(t)
	spec := readOnlySpec(t, "sh", "-c", "cat /proc/self/cgroup; for i in 1 2 3 4 5 6 7 8 9 10; do sleep 2 & done; wait")
	spec.Limits.Pids = 8
	r := run(t, spec)
	if !strings.Contains(r.stderr, "can't fork") {
		t.Errorf("got code %d, stderr %q, want fork to fail", r.code, r.stderr)
	}
	checkRemoved(t, cgroupsIn(r.stdout))
	// Pids counts the command's tasks only, not init's threads: a limit of 1 still runs one process.
	spec = readOnlySpec(t, "echo", "alone")
	spec.Limits.Pids = 1
	if r := run(t, spec); r.stdout != "alone\n" {
		t.Errorf("pids 1: got %d %q %q", r.code, r.stdout, r.stderr)
	}
}

func TestMemoryLimit(t *testing.T) {
	requireRoot(t)
	// The shell holds a 60 MB string: above a 32 MiB limit, the OOM killer ends it.
	script := `cat /proc/self/cgroup; x=$(head -c 60000000 /dev/zero | tr '\0' a); echo ${#x}`
	spec := readOnlySpec(t, "sh", "-c", script)
	spec.Limits.MemoryBytes = 32 << 20
	r := run(t, spec)
	if r.code != 128+9 || strings.Contains(r.stdout, "60000000") {
		t.Errorf("got code %d, stdout %q, want the command killed (137)", r.code, r.stdout)
	}
	checkRemoved(t, cgroupsIn(r.stdout))
	// Without the limit the same command succeeds: the test can tell.
	spec.Limits.MemoryBytes = 0
	if r := run(t, spec); r.code != 0 || !strings.HasSuffix(r.stdout, "\n60000000\n") {
		t.Errorf("unlimited: got code %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
}

func TestCgroupLifetime(t *testing.T) {
	requireRoot(t)
	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdinW.Close()
	spec := readOnlySpec(t, "sh", "-c", "cat /proc/self/cgroup; read x; exit 0")
	spec.Limits = sandbox.Limits{MemoryBytes: 64 << 20, Pids: 16}
	var out bytes.Buffer
	p, err := sandbox.Start(context.Background(), spec, sandbox.Stdio{Stdin: stdinR, Stdout: &out})
	stdinR.Close()
	if err != nil {
		t.Fatal(err)
	}
	// The command is in the new cgroups; init is not (it is a Go program with threads of its own).
	initCg, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(p.Pid), "cgroup"))
	time.Sleep(50 * time.Millisecond)
	stdinW.Close()
	if code, err := p.Wait(); err != nil || code != 0 {
		t.Fatalf("got %d, %v", code, err)
	}
	dirs := cgroupsIn(out.String())
	if len(dirs) != 2 && len(dirs) != 1 { // v1: memory and pids; v2: one
		t.Errorf("the command is in cgroups %q, want one new per hierarchy", dirs)
	}
	for _, c := range dirs {
		if strings.Contains(string(initCg), filepath.Base(c)) {
			t.Errorf("init is in %s:\n%s", c, initCg)
		}
	}
	checkRemoved(t, dirs)
}
