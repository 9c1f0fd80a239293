package sandbox_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"toolshed.dev/shed/sandbox"
)

// The limits tests are not parallel: they compare the cgroup directories before and after.

// sandboxCgroups lists the per-sandbox cgroups that exist now, in every hierarchy this host uses.
func sandboxCgroups(t *testing.T) []string {
	t.Helper()
	var all []string
	for _, parent := range []string{"/sys/fs/cgroup/memory/toolshed", "/sys/fs/cgroup/pids/toolshed", "/sys/fs/cgroup/toolshed"} {
		ents, err := os.ReadDir(parent)
		if err != nil {
			continue
		}
		for _, e := range ents {
			if e.IsDir() {
				all = append(all, filepath.Join(parent, e.Name()))
			}
		}
	}
	return all
}

func TestPidsLimit(t *testing.T) {
	requireRoot(t)
	before := sandboxCgroups(t)
	spec := readOnlySpec(t, "sh", "-c", "for i in 1 2 3 4 5 6 7 8 9 10; do sleep 2 & done; wait")
	spec.Limits.Pids = 8
	r := run(t, spec)
	if !strings.Contains(r.stderr, "can't fork") {
		t.Errorf("got code %d, stderr %q, want fork to fail", r.code, r.stderr)
	}
	if after := sandboxCgroups(t); !slices.Equal(after, before) {
		t.Errorf("cgroups left behind: before %q, after %q", before, after)
	}
	// Pids counts the command's tasks only, not init's threads: a limit of 1 still runs one process.
	spec = readOnlySpec(t, "echo", "alone")
	spec.Limits.Pids = 1
	if r := run(t, spec); r.stdout != "alone\n" {
		t.Errorf("pids 1: got %d %q %q", r.code, r.stdout, r.stderr)
	}
}

func TestMemoryLimit(t *testing.T) {
	requireRoot(t)
	before := sandboxCgroups(t)
	// The shell holds a 60 MB string: above a 32 MiB limit, the OOM killer ends it.
	script := `x=$(head -c 60000000 /dev/zero | tr '\0' a); echo ${#x}`
	spec := readOnlySpec(t, "sh", "-c", script)
	spec.Limits.MemoryBytes = 32 << 20
	if r := run(t, spec); r.code != 128+9 || strings.Contains(r.stdout, "60000000") {
		t.Errorf("got code %d, stdout %q, want the command killed (137)", r.code, r.stdout)
	}
	if after := sandboxCgroups(t); !slices.Equal(after, before) {
		t.Errorf("cgroups left behind: before %q, after %q", before, after)
	}
	// Without the limit the same command succeeds: the test can tell.
	spec.Limits.MemoryBytes = 0
	if r := run(t, spec); r.code != 0 || r.stdout != "60000000\n" {
		t.Errorf("unlimited: got code %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
}

func TestCgroupLifetime(t *testing.T) {
	requireRoot(t)
	before := sandboxCgroups(t)
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
	during := sandboxCgroups(t)
	// The command is in the new cgroups; init is not (it is a Go program with threads of its own).
	initCg, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(p.Pid), "cgroup"))
	time.Sleep(50 * time.Millisecond)
	stdinW.Close()
	if code, err := p.Wait(); err != nil || code != 0 {
		t.Fatalf("got %d, %v", code, err)
	}
	if len(during) != len(before)+2 && len(during) != len(before)+1 { // v1: memory and pids; v2: one
		t.Errorf("while running: got cgroups %q, want one new per hierarchy", during)
	}
	for _, c := range during {
		if slices.Contains(before, c) {
			continue
		}
		id := filepath.Base(c)
		if !strings.Contains(out.String(), "/toolshed/"+id) {
			t.Errorf("the command is not in %s:\n%s", c, out.String())
		}
		if strings.Contains(string(initCg), id) {
			t.Errorf("init is in %s:\n%s", c, initCg)
		}
	}
	if after := sandboxCgroups(t); !slices.Equal(after, before) {
		t.Errorf("cgroups left behind: before %q, after %q", before, after)
	}
}
