package tests

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestDaemonBusyE2BPort: a supervisor whose --e2b port another program holds says so before it
// says it is on, and its hint names a port that is free, not the busy one, and port 0.
func TestDaemonBusyE2BPort(t *testing.T) {
	requireRoot(t)
	root := newRoot(t)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	cmd := exec.Command(shedBin, "--root", root, "daemon", "--socket", filepath.Join(t.TempDir(), "s.sock"), "--e2b", busy.Addr().String())
	cmd.SysProcAttr = dieWithTests()
	done := make(chan result, 1)
	go func() { done <- runResult(t, cmd) }()
	var r result
	select {
	case r = <-done:
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("the supervisor started on a busy --e2b port")
	}
	m := regexp.MustCompile(`--e2b (127\.0\.0\.1:[0-9]+)`).FindAllStringSubmatch(r.stderr, -1)
	if r.code != 1 || !strings.Contains(r.stderr, "address already in use") || strings.Contains(r.stderr, "supervisor on") ||
		len(m) < 2 || m[1][1] == busy.Addr().String() || !strings.Contains(r.stderr, "--e2b 127.0.0.1:0") {
		t.Fatalf("a busy --e2b port: exit %d, want 1, the port in use, and a hint naming another port and port 0:\n%s", r.code, r.stderr)
	}
	if l, err := net.Listen("tcp", m[1][1]); err != nil {
		t.Errorf("the port the hint names, %s, is not free: %v", m[1][1], err)
	} else {
		l.Close()
	}
}

// TestNoSpace: a store whose filesystem fills up (a tmpfs of the test's, sized small) says so:
// the error names no space and the filesystem (type, size, where), the hint says what to free,
// whoever hit it: the seed build's tools (mmdebstrap), shed's own writes (store add), a kept Bench's
// command. The store stays valid, and once the filesystem has room again the same command succeeds.
func TestNoSpace(t *testing.T) {
	parallel(t) // see parallelTests in main_test.go
	requireRoot(t)
	mnt := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("shed-test-nospace", mnt, "tmpfs", 0, "size=40m,mode=0755"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Unmount(mnt, syscall.MNT_DETACH) })
	resize := func(size string) {
		t.Helper()
		if err := syscall.Mount("shed-test-nospace", mnt, "tmpfs", syscall.MS_REMOUNT, "size="+size+",mode=0755"); err != nil {
			t.Fatalf("remount %s with size=%s: %v", mnt, size, err)
		}
	}
	root := filepath.Join(mnt, "root")
	mustShed(t, root, "init")
	file := writeFile(t, filepath.Join(t.TempDir(), "workshop.toml"), jqRecipe)
	noSpace := func(what string, r result) {
		t.Helper()
		if r.code != 1 || !strings.Contains(r.stderr, "shed: error: ") ||
			!strings.Contains(r.stderr, "no space left on the filesystem of "+root+" (tmpfs of ") ||
			!strings.Contains(r.stderr, "at "+mnt+", ") ||
			!regexp.MustCompile(`shed: hint: free space there: .shed gc.`).MatchString(r.stderr) {
			t.Errorf("%s on a full filesystem: exit %d, want 1 and an error naming no space on the tmpfs at %s:\n%s", what, r.code, mnt, r.stderr)
		}
	}
	verify := func(when string) {
		t.Helper()
		if r := shed(t, root, nil, "store", "verify"); r.code != 0 {
			t.Errorf("store verify %s: exit %d\n%s%s", when, r.code, r.stdout, r.stderr)
		}
	}

	// The seed (about 130 MB) does not fit in 40 MB: mmdebstrap fails, as do its writes.
	r := shed(t, root, nil, "realize", file)
	noSpace("realize", r)
	t.Logf("realize on 40 MB:\n%s", r.stderr)
	verify("after a build that found no space")
	resize("1g")
	useSeedCache(t, root) // the rerun's seed substituted (8 s), not built again from the mirror (45 s)
	realize(t, root, file)
	verify("after the rerun")

	// shed's own writes: a file of 4 MiB added to a store with 1 MiB left.
	src := t.TempDir()
	writeFile(t, filepath.Join(src, "data"), strings.Repeat("x", 4<<20))
	var st syscall.Statfs_t
	if err := syscall.Statfs(mnt, &st); err != nil {
		t.Fatal(err)
	}
	used := (st.Blocks - st.Bfree) * uint64(st.Bsize)
	resize(fmt.Sprintf("%dk", used/1024+1024))
	noSpace("store add", shed(t, root, nil, "store", "add", src))
	verify("after a store add that found no space")

	// A kept Bench's upper layer is on the store's filesystem: a command that fills it fails, and shed
	// says the disk was full.
	r = shed(t, root, nil, "bench", "run", "--offline", "-f", file, "--keep", "--name", "filler", "--", "sh", "-c", "head -c 8M /dev/zero > /root/big")
	// (Its exit and the audit log's entry are then written if there is room for them, as there is on a
	// filesystem that keeps blocks for root: shed warns; on this tmpfs there is none, and that write's
	// error says so.)
	if r.code == 0 || !regexp.MustCompile(`shed: (warning: the command failed \(exit [0-9]+\) with its disk full|error): (.*: )?no space left on the filesystem of `+regexp.QuoteMeta(root)+` \(tmpfs `).MatchString(r.stderr) {
		t.Errorf("a kept Bench filling the store's filesystem: exit %d, want the full filesystem named:\n%s", r.code, r.stderr)
	}
	// Through a supervisor the kept Bench's own record may be what found no room: then there is none.
	if r := shed(t, root, nil, "bench", "rm", "filler"); r.code != 0 && !strings.Contains(r.stderr, "no such bench: filler") {
		t.Errorf("bench rm filler: exit %d\n%s", r.code, r.stderr)
	}
	// Nothing of it is left: a Bench's state on a full disk is either there to remove or gone.
	if left, _ := filepath.Glob(filepath.Join(root, "benches", "[^.]*")); len(left) != 0 {
		t.Errorf("after bench rm filler, Bench state is left: %v", left)
	}
	// The same for a command exec'd into a running kept Bench, an agent's usual way: it must start,
	// so the filesystem gets its 1 MiB of room again (the audit and logs have grown meanwhile).
	if err := syscall.Statfs(mnt, &st); err != nil {
		t.Fatal(err)
	}
	resize(fmt.Sprintf("%dk", (st.Blocks-st.Bfree)*uint64(st.Bsize)/1024+1024))
	startBench(t, root, "running", "bench", "run", "--offline", "-f", file, "--keep", "--name", "running", "--", "sleep", "1013")
	r = shed(t, root, nil, "bench", "exec", "running", "--", "sh", "-c", "head -c 8M /dev/zero > /root/big")
	if r.code == 0 || !regexp.MustCompile(`shed: (warning: the command failed \(exit [0-9]+\) with its disk full|error): (.*: )?no space left on the filesystem of `+regexp.QuoteMeta(root)+` \(tmpfs `).MatchString(r.stderr) {
		t.Errorf("an exec filling a kept Bench's upper: exit %d, want the full filesystem named:\n%s", r.code, r.stderr)
	}
	mustShed(t, root, "bench", "rm", "running")
	resize("1g")
	mustShed(t, root, "store", "add", src)
	verify("at the end")
}

// TestOpenFilesLimit: shed run under a low limit on open files (RLIMIT_NOFILE) either works or says
// that it ran out of them, with the limit and `ulimit -n`: never a bare "too many open files".
func TestOpenFilesLimit(t *testing.T) {
	requireRoot(t)
	prlimit, err := exec.LookPath("prlimit")
	if err != nil {
		t.Fatalf("prlimit (util-linux) is needed: %v", err)
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	for i := range 40 {
		writeFile(t, filepath.Join(src, fmt.Sprintf("d%d", i%4), fmt.Sprintf("f%d", i)), "x\n")
	}
	failed := 0
	for n := 8; n <= 24; n++ {
		root := filepath.Join(dir, fmt.Sprintf("root%d", n))
		for _, args := range [][]string{{"init"}, {"store", "add", src}} {
			r := runResult(t, exec.Command(prlimit, append([]string{fmt.Sprintf("--nofile=%d:%d", n, n), shedBin, "--root", root}, args...)...))
			if r.code == 0 || strings.Contains(r.stderr, "fatal error: runtime:") {
				continue // it fit, or Go's runtime could not start at all
			}
			failed++
			if !strings.Contains(r.stderr, "too many open files") || !strings.Contains(r.stderr, fmt.Sprintf("at most %d open files", n)) || !strings.Contains(r.stderr, "ulimit -n") {
				t.Errorf("shed %s with %d open files: exit %d, want the limit named:\n%s", strings.Join(args, " "), n, r.code, r.stderr)
			}
			break
		}
	}
	if failed == 0 {
		t.Fatal("no limit from 8 to 24 open files made shed fail: the test tests nothing")
	}
}

// TestExecOOM: a command exec'd into a running Bench and killed at the Bench's memory limit is
// named as killed for memory, with the limit; a kill -9 that is not the limit says nothing of memory.
func TestExecOOM(t *testing.T) {
	parallel(t) // see parallelTests in main_test.go
	requireRoot(t)
	root := sharedRoot(t)
	file, _ := benchWorkshop(t)
	startBench(t, root, "oom-exec-target", "bench", "run", "-f", file, "--memory", "64M", "--name", "oom-exec-target", "--", "sleep", "1013")
	defer shed(t, root, nil, "bench", "rm", "oom-exec-target")
	r := shed(t, root, nil, "bench", "exec", "oom-exec-target", "--", "perl", "-e", `$x = "a" x 200_000_000; print length($x)`)
	if r.code != 137 || !strings.Contains(r.stderr, "out of memory: the kernel killed a process of the command at the Bench's memory limit (64.0 MiB)") {
		t.Errorf("exec of 200 MB under --memory 64M: exit %d, stderr %q, want 137 and the limit named", r.code, r.stderr)
	}
	if r := shed(t, root, nil, "bench", "exec", "oom-exec-target", "--", "sh", "-c", "kill -9 $$"); r.code != 137 || strings.Contains(r.stderr, "out of memory") {
		t.Errorf("exec of kill -9: exit %d, stderr %q, want 137 and no word of memory", r.code, r.stderr)
	}
}

// startBench starts `shed ARGS...` (a bench run of a long command) and returns once the Bench name
// answers an exec; the run is killed when the test ends. It waits as long as the run lasts: a
// loaded machine may take long to start a Bench, and that is no failure (a deadline here would be
// a timed assertion), while a run that ends first is.
func startBench(t *testing.T, root, name string, args ...string) {
	t.Helper()
	cmd := shedCmd(t, root, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 1)
	go func() { ended <- cmd.Wait() }()
	t.Cleanup(func() { cmd.Process.Kill(); <-ended })
	for shed(t, root, nil, "bench", "exec", name, "--", "true").code != 0 {
		select {
		case err := <-ended:
			ended <- err
			t.Fatalf("the run of Bench %s ended before it answered: %v\n%s", name, err, stderr.String())
		case <-time.After(100 * time.Millisecond):
		}
	}
}
