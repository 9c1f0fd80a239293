package sandbox_test

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"toolshed.dev/shed/sandbox"
)

// TestSweep is not parallel: Sweep would remove the cgroups of other tests' sandboxes between their
// creation and their command's start were it not for the creators' locks, which this also tests.
func TestSweep(t *testing.T) {
	requireRoot(t)
	// A child process (this binary, as a helper) starts a sandbox with limits; it prints the cgroups
	// its command is in.
	cmd := helperCmd(t, "limited-sleep")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	var dirs []string
	lines := bufio.NewScanner(out)
	for lines.Scan() && lines.Text() != "ready" {
		dirs = append(dirs, cgroupsIn(lines.Text())...)
	}
	if len(dirs) == 0 {
		t.Fatal("the helper's sandbox is in no toolshed cgroup")
	}
	// While its creator lives (and its command runs), Sweep keeps it.
	if _, err := sandbox.Sweep(); err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); err != nil {
			t.Fatalf("Sweep removed the cgroup of a live sandbox: %v", err)
		}
	}
	// SIGKILL: the sandbox dies with its creator (Pdeathsig), and nobody removes its cgroups.
	cmd.Process.Kill()
	cmd.Wait()
	for _, d := range dirs {
		waitEmpty(t, d)
		if _, err := os.Stat(d); err != nil {
			t.Fatalf("%s is gone already; the test would prove nothing: %v", d, err)
		}
	}
	n, err := sandbox.Sweep()
	if err != nil {
		t.Fatal(err)
	}
	if n < len(dirs) {
		t.Errorf("Sweep removed %d, want at least %d", n, len(dirs))
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s after Sweep: %v, want it removed", d, err)
		}
	}
}

// waitEmpty waits until the cgroup dir has no tasks.
func waitEmpty(t *testing.T, dir string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		if err != nil || len(strings.TrimSpace(string(b))) == 0 {
			return
		}
	}
	t.Fatalf("%s still has tasks", dir)
}

func TestSweepKeepsBusyCgroup(t *testing.T) {
	requireRoot(t)
	// A cgroup that nobody holds but that has a task is kept; once the task is gone, it is removed.
	parent := "/sys/fs/cgroup/pids/toolshed"
	if _, err := os.Stat("/sys/fs/cgroup/pids"); err != nil {
		parent = "/sys/fs/cgroup/toolshed" // unified hierarchy
	}
	if err := os.MkdirAll(parent, 0o755); err != nil {
		t.Fatal(err)
	}
	var id [8]byte
	rand.Read(id[:])
	dir := filepath.Join(parent, hex.EncodeToString(id[:]))
	sleep := exec.Command("sleep", "1000")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	defer sleep.Process.Kill()
	// Made as a sandbox's are, under the parent's shared lock until it has its task: a Sweep of
	// another process (the e2e tests' run beside this package's) would remove it empty before.
	lk, err := os.Open(parent)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(lk.Fd()), unix.LOCK_SH); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(dir)
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(sleep.Process.Pid)), 0); err != nil {
		t.Fatal(err)
	}
	lk.Close()
	if _, err := sandbox.Sweep(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("Sweep removed a cgroup with a task: %v", err)
	}
	sleep.Process.Kill()
	sleep.Wait()
	waitEmpty(t, dir)
	if n, err := sandbox.Sweep(); err != nil || n < 1 {
		t.Errorf("got %d, %v, want the empty cgroup removed", n, err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s after Sweep: %v, want it removed", dir, err)
	}
}
