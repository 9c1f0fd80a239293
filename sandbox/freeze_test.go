package sandbox_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
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

// counterScript appends 1, 2, 3... to /root/count every 10 ms, in the background, then says ready and
// waits on stdin (startControlled).
const counterScript = `(i=0; while :; do i=$((i+1)); echo $i >> /root/count; usleep 10000; done) </dev/null >/dev/null 2>&1 &
echo ready; read x; exit 0`

// TestFreeze is not parallel: it makes cgroups, which the limits tests count.
func TestFreeze(t *testing.T) {
	requireRoot(t)
	spec, upper := writableSpec(t, "sh", "-c", counterScript)
	spec.Pausable = true
	c := startControlled(t, spec)
	count, execd := filepath.Join(upper, "root/count"), filepath.Join(upper, "root/exec")
	// A command Exec'd into the sandbox, which leaves a counter of its own running.
	r := execIn(c, sh(`(while :; do echo x >> /root/exec; usleep 10000; done) </dev/null >/dev/null 2>&1 &`), "")
	if r.err != nil || r.code != 0 {
		t.Fatalf("exec: %d, %v (stderr %q)", r.code, r.err, r.stderr)
	}
	waitGrow(t, count, 0)
	waitGrow(t, execd, 0)

	start := time.Now()
	if err := sandbox.Freeze(c.p.Pid); err != nil {
		t.Fatal(err)
	}
	t.Logf("Freeze: %v", time.Since(start))
	if err := sandbox.Freeze(c.p.Pid); err != nil {
		t.Fatalf("second Freeze: %v", err)
	}
	if frozen, err := sandbox.Frozen(c.p.Pid); err != nil || !frozen {
		t.Fatalf("Frozen: %v, %v, want true", frozen, err)
	}
	before, beforeExec := size(t, count), size(t, execd)
	time.Sleep(300 * time.Millisecond)
	if after, afterExec := size(t, count), size(t, execd); after != before || afterExec != beforeExec {
		t.Fatalf("frozen, the counters grew: %d -> %d bytes, Exec'd %d -> %d", before, after, beforeExec, afterExec)
	}

	start = time.Now()
	if err := sandbox.Thaw(c.p.Pid); err != nil {
		t.Fatal(err)
	}
	t.Logf("Thaw: %v", time.Since(start))
	if err := sandbox.Thaw(c.p.Pid); err != nil {
		t.Fatalf("second Thaw: %v", err)
	}
	if frozen, err := sandbox.Frozen(c.p.Pid); err != nil || frozen {
		t.Fatalf("Frozen after Thaw: %v, %v, want false", frozen, err)
	}
	waitGrow(t, count, before+20) // some lines more
	waitGrow(t, execd, beforeExec)
	// The count goes on where it stopped: the loop kept its memory.
	b, err := os.ReadFile(count)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Fields(string(b))
	for i, l := range lines {
		if l != strconv.Itoa(i+1) {
			t.Fatalf("line %d of the count is %q, want %d:\n%s", i+1, l, i+1, b)
		}
	}
	c.stdin.Close()
	if code, err := c.p.Wait(); err != nil || code != 0 {
		t.Fatalf("Wait: %d, %v", code, err)
	}
}

// TestFreezeKilled: a frozen sandbox whose init is SIGKILLed (a Bench's kill, ctx) still ends: its
// frozen tasks would otherwise keep the pid namespace, and Wait, for ever.
func TestFreezeKilled(t *testing.T) {
	requireRoot(t)
	spec, _ := writableSpec(t, "sh", "-c", counterScript)
	spec.Pausable = true
	c := startControlled(t, spec)
	if err := sandbox.Freeze(c.p.Pid); err != nil {
		t.Fatal(err)
	}
	dir := freezerDir(t, c.p.Pid)
	if err := unix.Kill(c.p.Pid, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := c.p.Wait(); done <- err }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		thawDir(dir) // let the test end
		t.Fatal("Wait of a frozen sandbox whose init was killed did not return in 10 s")
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("freezer %s after Wait: %v, want it removed", dir, err)
	}
}

// TestKillFrozen: Kill ends a sandbox that another process froze (here: the freezer written directly,
// so no watcher of Freeze's runs).
func TestKillFrozen(t *testing.T) {
	requireRoot(t)
	spec, _ := writableSpec(t, "sh", "-c", counterScript)
	spec.Pausable = true
	c := startControlled(t, spec)
	dir := freezerDir(t, c.p.Pid)
	defer thawDir(dir)
	file, value := "freezer.state", "FROZEN"
	if !strings.Contains(dir, "/freezer/") {
		file, value = "cgroup.freeze", "1"
	}
	if err := os.WriteFile(filepath.Join(dir, file), []byte(value), 0); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if s := freezerState(dir); s == "FROZEN" || s == "frozen 1" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not freeze: %s", dir, freezerState(dir))
		}
	}
	if err := sandbox.Kill(c.p.Pid); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := c.p.Wait(); done <- err }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		thawDir(dir)
		t.Fatal("Wait of a frozen sandbox after Kill did not return in 10 s")
	}
}

func TestFreezeNotPausable(t *testing.T) {
	requireRoot(t)
	for _, account := range []bool{false, true} {
		spec, _ := writableSpec(t, "sh", "-c", "echo ready; read x")
		spec.Account = account
		c := startControlled(t, spec)
		for name, f := range map[string]func(int) error{"Freeze": sandbox.Freeze, "Thaw": sandbox.Thaw,
			"Frozen": func(pid int) error { _, err := sandbox.Frozen(pid); return err }} {
			if err := f(c.p.Pid); !errors.Is(err, sandbox.ErrNoFreezer) {
				t.Errorf("Account %v: %s: %v, want ErrNoFreezer", account, name, err)
			}
		}
		c.stdin.Close()
		c.p.Wait()
		if err := sandbox.Freeze(c.p.Pid); !errors.Is(err, sandbox.ErrNotRunning) {
			t.Errorf("Freeze of an ended sandbox: %v, want ErrNotRunning", err)
		}
	}
}

// TestFreezeTimes measures Freeze and Thaw of a sandbox running 1 and 50 processes.
func TestFreezeTimes(t *testing.T) {
	requireRoot(t)
	for _, n := range []int{1, 50} {
		spec, _ := writableSpec(t, "sh", "-c", fmt.Sprintf("for i in $(seq %d); do sleep 1000 & done; echo ready; read x", n-1))
		spec.Pausable = true
		c := startControlled(t, spec)
		var freeze, thaw time.Duration
		const rounds = 20
		for range rounds {
			start := time.Now()
			if err := sandbox.Freeze(c.p.Pid); err != nil {
				t.Fatal(err)
			}
			freeze += time.Since(start)
			start = time.Now()
			if err := sandbox.Thaw(c.p.Pid); err != nil {
				t.Fatal(err)
			}
			thaw += time.Since(start)
		}
		t.Logf("%d processes: Freeze %v, Thaw %v (mean of %d)", n, freeze/rounds, thaw/rounds, rounds)
		c.stdin.Close()
		c.p.Wait()
	}
}

// TestFreezeCreatorKilled: the process that started a sandbox and froze it is SIGKILLed (a
// supervisor's kill -9). Nothing of the sandbox may stay, frozen, for ever: on cgroup v1 a frozen
// task ignores SIGKILL, so init's parent-death SIGKILL alone would leave its tasks in D state and
// init a zombie until someone thaws them.
func TestFreezeCreatorKilled(t *testing.T) {
	requireRoot(t)
	cmd := helperCmd(t, "frozen-sleep")
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
	initPid := 0
	lines := bufio.NewScanner(out)
	for lines.Scan() {
		if v, ok := strings.CutPrefix(lines.Text(), "frozen "); ok {
			initPid, _ = strconv.Atoi(v)
			break
		}
		dirs = append(dirs, cgroupsIn(lines.Text())...)
	}
	if initPid == 0 || len(dirs) == 0 {
		t.Fatalf("the helper did not freeze its sandbox (init %d, cgroups %q)", initPid, dirs)
	}
	var freezer string
	for _, d := range dirs {
		if isFreezer(d) {
			freezer = d
		}
	}
	if freezer == "" {
		t.Fatalf("no freezer among the sandbox's cgroups %q", dirs)
	}
	// Whatever happens, thaw it at the end so that no test run leaves a frozen pid namespace.
	defer thawDir(freezer)
	pids := descendantsOf(initPid)
	if len(pids) < 4 { // init, sh's exec'd sleep, two sleeps
		t.Fatalf("sandbox processes %v, want init and 3", pids)
	}
	if state := freezerState(freezer); state != "FROZEN" && state != "frozen 1" {
		t.Fatalf("%s is %q, want it frozen", freezer, state)
	}
	cmd.Process.Kill()
	cmd.Wait()
	killed := time.Now()
	deadline := killed.Add(5 * time.Second)
	for {
		var left []string
		for _, p := range pids {
			// A zombie is dead: init, orphaned, waits to be reaped by the host's init.
			if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p)); err == nil && !strings.Contains(string(st), ") Z ") {
				left = append(left, string(st))
			}
		}
		if len(left) == 0 {
			t.Logf("the sandbox was dead %v after its creator's kill", time.Since(killed))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("5 s after its creator's kill -9, the frozen sandbox's processes remain:\n%s", strings.Join(left, "\n"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := sandbox.Sweep(); err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s after Sweep: %v, want it removed", d, err)
		}
	}
}

// runFrozenHelper starts spec as a Pausable sandbox with limits, copies its output to stdout, freezes
// it once it is ready, says "frozen <init pid>" and waits (TestFreezeCreatorKilled kills it).
func runFrozenHelper(spec *sandbox.Spec) int {
	spec.Argv = []string{"sh", "-c", "cat /proc/self/cgroup; sleep 1000 & sleep 1000 & echo ready; exec sleep 1000"}
	spec.Limits = sandbox.Limits{MemoryBytes: 64 << 20, Pids: 16}
	spec.Pausable = true
	r, w, err := os.Pipe()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 255
	}
	p, err := sandbox.Start(context.Background(), spec, sandbox.Stdio{Stdout: w, Stderr: os.Stderr})
	w.Close()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 255
	}
	lines := bufio.NewScanner(r)
	for lines.Scan() && lines.Text() != "ready" {
		fmt.Println(lines.Text())
	}
	if err := sandbox.Freeze(p.Pid); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 255
	}
	fmt.Printf("frozen %d\n", p.Pid)
	code, _ := p.Wait()
	return code
}

// waitGrow waits until the file p is larger than n bytes.
func waitGrow(t *testing.T, p string, n int64) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if fi, err := os.Stat(p); err == nil && fi.Size() > n {
			return
		}
	}
	t.Fatalf("%s did not grow past %d bytes in 10 s", p, n)
}

func size(t *testing.T, p string) int64 {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// isFreezer tells a Pausable sandbox's freezer cgroup from its others: v1's freezer hierarchy, or
// the unified one's name ending in "p".
func isFreezer(dir string) bool {
	return strings.Contains(dir, "/freezer/") || !strings.Contains(strings.TrimPrefix(dir, "/sys/fs/cgroup/"), "/toolshed/") && strings.HasSuffix(dir, "p")
}

// freezerState is v1's freezer.state or v2's "frozen N" line of cgroup.events.
func freezerState(dir string) string {
	if b, err := os.ReadFile(filepath.Join(dir, "freezer.state")); err == nil {
		return strings.TrimSpace(string(b))
	}
	b, _ := os.ReadFile(filepath.Join(dir, "cgroup.events"))
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "frozen ") {
			return l
		}
	}
	return ""
}

// thawDir thaws the freezer cgroup dir, v1 or v2.
func thawDir(dir string) {
	if os.WriteFile(filepath.Join(dir, "freezer.state"), []byte("THAWED"), 0) != nil {
		os.WriteFile(filepath.Join(dir, "cgroup.freeze"), []byte("0"), 0)
	}
}

// freezerDir is the freezer cgroup of a command of the sandbox of init's pid.
func freezerDir(t *testing.T, initPid int) string {
	t.Helper()
	for _, p := range descendantsOf(initPid)[1:] {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", p))
		for _, d := range cgroupsIn(string(b)) {
			if isFreezer(d) {
				return d
			}
		}
	}
	t.Fatal("no freezer cgroup")
	return ""
}

// descendantsOf returns pid and its descendants (host pids).
func descendantsOf(pid int) []int {
	out := []int{pid}
	for i := 0; i < len(out); i++ {
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", out[i]))
		for _, task := range tasks {
			b, _ := os.ReadFile(task)
			for _, f := range strings.Fields(string(b)) {
				if c, err := strconv.Atoi(f); err == nil {
					out = append(out, c)
				}
			}
		}
	}
	return out
}

// TestSweepThawsOrphan: a frozen freezer that nobody holds (its creator and the sandbox's init both
// died) is thawed by Sweep, so that its tasks, killed but frozen, die, and it is removed.
func TestSweepThawsOrphan(t *testing.T) {
	requireRoot(t)
	parent := "/sys/fs/cgroup/freezer/toolshed"
	if _, err := os.Stat("/sys/fs/cgroup/freezer"); err != nil {
		t.Skip("no cgroup v1 freezer hierarchy") // the unified hierarchy's freezer lets SIGKILL through
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
	// Made under the parent's shared lock until it has its task, as a sandbox's is (TestSweepKeepsBusyCgroup).
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
	defer os.WriteFile(filepath.Join(dir, "freezer.state"), []byte("THAWED"), 0)
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(sleep.Process.Pid)), 0); err != nil {
		t.Fatal(err)
	}
	lk.Close()
	if err := os.WriteFile(filepath.Join(dir, "freezer.state"), []byte("FROZEN"), 0); err != nil {
		t.Fatal(err)
	}
	for state := ""; state != "FROZEN"; time.Sleep(time.Millisecond) {
		b, _ := os.ReadFile(filepath.Join(dir, "freezer.state"))
		state = strings.TrimSpace(string(b))
	}
	sleep.Process.Kill() // pending: a frozen task does not die
	time.Sleep(100 * time.Millisecond)
	if _, err := sandbox.Sweep(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		b, _ := os.ReadFile(filepath.Join(dir, "freezer.state"))
		t.Errorf("%s after Sweep: %v (state %s), want it thawed and removed", dir, err, b)
		os.WriteFile(filepath.Join(dir, "freezer.state"), []byte("THAWED"), 0) // else Wait waits for ever
	}
	sleep.Wait()
}
