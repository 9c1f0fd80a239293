package tests

import (
	"archive/tar"
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"toolshed.dev/shed/internal/ptytest"
)

// benchWorkshop realizes a jq Workshop with one grant bound, in the shared
// store, and returns its recipe file and the bound directory.
func benchWorkshop(t *testing.T) (file, bound string) {
	t.Helper()
	root := sharedRoot(t)
	dir := t.TempDir()
	bound = filepath.Join(dir, "project")
	os.MkdirAll(filepath.Join(bound, "sub"), 0o755)
	writeFile(t, filepath.Join(bound, "sub", "data"), "granted data\n")
	// A developer's project: a Bench is its owner in it (a writable grant of root's is refused).
	chownTree(t, bound, developer(t))
	file = writeFile(t, filepath.Join(dir, "workshop.toml"), fmt.Sprintf(`name = "bench-jq"
seed = "debian/bookworm"
[apt]
packages = ["jq"]
[[grant]]
path = %q
mode = "rw"
`, bound))
	realize(t, root, file)
	return file, bound
}

// developerName is the user whose projects the tests grant to Benches: an ordinary user, as on a
// laptop, made by the tests where the host does not have it.
const developerName = "shed-test-dev"

var dev struct {
	once     sync.Once
	uid, gid int
	err      error
}

// developer returns the test developer's uid and primary gid, making the user the first time.
func developer(t *testing.T) account {
	t.Helper()
	dev.once.Do(func() {
		if _, err := user.Lookup(developerName); err != nil {
			if out, err := exec.Command("useradd", "--system", "--user-group", "--no-create-home", "--shell", "/usr/sbin/nologin", developerName).CombinedOutput(); err != nil {
				dev.err = fmt.Errorf("useradd %s: %v %s", developerName, err, out)
				return
			}
		}
		u, err := user.Lookup(developerName)
		if err != nil {
			dev.err = err
			return
		}
		dev.uid, _ = strconv.Atoi(u.Uid)
		dev.gid, _ = strconv.Atoi(u.Gid)
	})
	if dev.err != nil {
		t.Fatal(dev.err)
	}
	return account{dev.uid, dev.gid}
}

// account is a host user's uid and gid.
type account struct{ uid, gid int }

func chownTree(t *testing.T, dir string, u account) {
	t.Helper()
	if err := filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, u.uid, u.gid)
	}); err != nil {
		t.Fatal(err)
	}
}

func TestBenchRun(t *testing.T) {
	parallel(t) // see parallelTests in main_test.go
	requireRoot(t)
	root := sharedRoot(t)
	file, _ := benchWorkshop(t)

	r := mustShed(t, root, "bench", "run", "-f", file, "--", "jq", "--version")
	if !strings.HasPrefix(r.stdout, "jq-1.6") {
		t.Errorf("jq --version in a Bench: %q", r.stdout)
	}
	// The command's exit code is shed's.
	if r := shed(t, root, nil, "bench", "run", "-f", file, "--", "sh", "-c", "exit 7"); r.code != 7 || r.stderr != "" {
		t.Errorf("exit 7: got exit %d, stderr %q", r.code, r.stderr)
	}
	// Writes to /usr change only the Bench's upper; the store stays intact
	// and the next Bench starts clean.
	mustShed(t, root, "bench", "run", "-f", file, "--", "sh", "-c", "echo evil > /usr/bin/jq && echo junk > /root/debris")
	mustShed(t, root, "store", "verify", "--check-contents")
	r = mustShed(t, root, "bench", "run", "-f", file, "--", "sh", "-c", "jq --version; ls /root")
	if !strings.HasPrefix(r.stdout, "jq-1.6") || strings.Contains(r.stdout, "debris") {
		t.Errorf("a second Bench saw the first one's writes: %q", r.stdout)
	}
	// --keep keeps the upper until `bench rm`, with host ids: a setuid-root file of the Bench is a file
	// of an id of its range on the host's disk, not root's.
	mustShed(t, root, "bench", "run", "-f", file, "--keep", "--name", "kept-one", "--", "sh", "-c", "echo kept > /root/note; cp /bin/sh /root/suid; chmod 4755 /root/suid")
	ls := mustShed(t, root, "bench", "ls").stdout
	if !strings.Contains(ls, "kept-one") || !strings.Contains(ls, "exited 0") {
		t.Errorf("bench ls:\n%s", ls)
	}
	suid, _ := filepath.Glob(filepath.Join(root, "benches", "*", "upper", "root", "suid"))
	for _, p := range suid {
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil || st.Uid < 0x70000000 || st.Mode&syscall.S_ISUID == 0 {
			t.Errorf("the kept Bench's setuid file on the host: uid %d mode %o (%v); want an id of its range", st.Uid, st.Mode, err)
		}
	}
	if len(suid) != 1 {
		t.Errorf("kept uppers with the setuid file: %q", suid)
	}
	mustShed(t, root, "bench", "rm", "kept-one")
	if strings.Contains(mustShed(t, root, "bench", "ls").stdout, "kept-one") {
		t.Error("bench rm left the kept Bench")
	}
}

// TestHostileBench: as root inside a Bench, the usual escapes fail.
func TestHostileBench(t *testing.T) {
	requireRoot(t)
	root := sharedRoot(t)
	file, bound := benchWorkshop(t)
	grant := "--grant=" + filepath.Join(bound, "sub") + ":/work:ro"
	// A server on the host's loopback: a Bench must not reach it.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	// A host process: a Bench must not be able to ptrace it.
	victim := exec.Command("sleep", "1000")
	if err := victim.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { victim.Process.Kill(); victim.Wait() }()
	checks := map[string]string{
		"remount a ro grant rw": "mount -o remount,bind,rw /work && echo x > /work/data",
		"mount the host disk":   "mount -t ext4 /dev/vda /mnt || mount -t ext4 /dev/sda /mnt",
		"mount a cgroup":        "mount -t cgroup -o memory cg /mnt || mount -t cgroup2 cg /mnt",
		"umount a grant":        "umount /work",
		"a network namespace":   "unshare -n true || unshare -U -r -n true",
		"write a ro grant":      "echo x > /work/data",
		"raw socket":            `perl -e 'socket(my $s, 2, 3, 1) or exit 1'`,
		"ptrace":                fmt.Sprintf(`perl -e 'syscall(101, 16, $ARGV[0]+0, 0, 0) == 0 or exit 1' %d`, victim.Process.Pid), // PTRACE_ATTACH (x86_64) to a host process
		"mknod":                 "mknod /root/sda b 8 0",
		"reach the host":        fmt.Sprintf(`perl -MIO::Socket::INET -e 'exit(IO::Socket::INET->new(PeerAddr=>"127.0.0.1:%d",Timeout=>2)?0:1)'`, port),
	}
	// The perl checks must succeed as root on the host (in a chroot of the
	// same seed; they write nothing), so that their failure in a Bench means
	// something.
	seed := realize(t, root, file).Layers[0]
	for _, name := range []string{"raw socket", "ptrace"} {
		// A private mount namespace gives the chroot a /dev without
		// touching the store path.
		cmd := exec.Command("unshare", "-m", "--propagation", "private", "sh", "-c",
			`mount --bind /dev "$0/dev" && exec chroot "$0" sh -c "$1"`, seed, checks[name])
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("control: %q fails even on the host: %v %s", name, err, out)
		}
	}
	for name, cmd := range checks {
		t.Run(name, func(t *testing.T) {
			r := shed(t, root, nil, "bench", "run", "-f", file, "--net", "none", grant, "--", "sh", "-c", cmd)
			if r.code == 0 {
				t.Errorf("%q succeeded inside a Bench", cmd)
			}
		})
	}
	// The grant is still the grant after a failed umount, and /proc shows
	// only the Bench's own processes.
	r := mustShed(t, root, "bench", "run", "-f", file, grant, "--", "sh", "-c", "umount /work 2>/dev/null; cat /work/data; ls /proc | grep -c '^[0-9]'")
	lines := strings.Fields(r.stdout)
	if len(lines) < 3 || lines[0] != "granted" {
		t.Fatalf("output %q", r.stdout)
	}
	if n, _ := strconv.Atoi(lines[len(lines)-1]); n > 5 {
		t.Errorf("a Bench sees %d processes in /proc; want only its own", n)
	}
}

func TestBenchGrants(t *testing.T) {
	requireRoot(t)
	root := sharedRoot(t)
	file, bound := benchWorkshop(t)
	os.Symlink("/etc", filepath.Join(bound, "escape"))
	refused := []struct{ grant, want string }{
		{"/etc", "not within any [[grant]]"},
		{filepath.Join(bound, "escape"), "is a symlink"},
		{filepath.Join(bound, "escape") + "/passwd", "is a symlink"},
		{filepath.Join(bound, "missing"), "no such file"},
		{filepath.Dir(bound), "not within any [[grant]]"},
	}
	for _, c := range refused {
		r := shed(t, root, nil, "bench", "run", "-f", file, "--grant", c.grant, "--", "true")
		if r.code != 2 || !strings.Contains(r.stderr, c.want) || !strings.Contains(r.stderr, "shed: hint:") {
			t.Errorf("--grant %s: exit %d, want 2 with %q:\n%s", c.grant, r.code, c.want, r.stderr)
		}
	}
	// A directory that is not there is to be made, not a matter of the recipe's bounds.
	if r := shed(t, root, nil, "bench", "run", "-f", file, "--grant", filepath.Join(bound, "missing"), "--", "true"); !strings.Contains(r.stderr, "shed: hint: ") ||
		!strings.Contains(r.stderr, "`mkdir -p "+filepath.Join(bound, "missing")+"`") || strings.Contains(r.stderr, "bounds") {
		t.Errorf("--grant of a missing directory: the hint does not say to make it:\n%s", r.stderr)
	}
	// A recipe whose bound is a symlink, or lies under one, opens nothing through it: the bound names
	// a path, and every component of it must be a real directory.
	links := t.TempDir()
	os.Symlink(bound, filepath.Join(links, "project"))              // the bound itself
	os.Symlink(filepath.Dir(bound), filepath.Join(links, "parent")) // a parent of it
	for _, b := range []string{filepath.Join(links, "project"), filepath.Join(links, "parent", "project")} {
		lf := writeFile(t, filepath.Join(t.TempDir(), "workshop.toml"), strings.Replace(string(must(os.ReadFile(file))), fmt.Sprintf("path = %q", bound), fmt.Sprintf("path = %q", b), 1))
		writeFile(t, filepath.Join(filepath.Dir(lf), "workshop.lock"), string(must(os.ReadFile(filepath.Join(filepath.Dir(file), "workshop.lock")))))
		r := shed(t, root, nil, "bench", "run", "-f", lf, "--grant", b+"/sub:/work:rw", "--", "cat", "/work/data")
		if r.code != 2 || !strings.Contains(r.stderr, "is a symlink") || strings.Contains(r.stdout, "granted") {
			t.Errorf("bound %s through a symlink: exit %d\n%s%s", b, r.code, r.stdout, r.stderr)
		}
	}
	// shed starts a Bench's init while it realizes the Workshop: a refused launch leaves none behind
	// (shed ends it, and it would die with shed anyway; sandbox's TestPrestartEnds checks the former).
	// (A supervisor's warm pool keeps inits started on purpose: those are not left by a launch.)
	// An init whose shed ended just now (an earlier test's, a supervisor stopped at its cleanup)
	// ends by its parent-death signal, which a loaded machine may take a moment to deliver: only
	// one still there after 5 s is left behind.
	var left []string
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		left = procsWhere(func(pid string, argv []string) bool {
			exe, _ := os.Readlink(filepath.Join("/proc", pid, "exe"))
			return argv[0] == "shed-sandbox-init" && filepath.Base(exe) == "shed-init" && !ofDaemon(pid)
		})
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(left) != 0 {
		t.Errorf("refused launches left their inits:\n%s", strings.Join(left, "\n"))
	}
	// rw within an rw bound: the write reaches the host directory, as the directory's owner's.
	mustShed(t, root, "bench", "run", "-f", file, "--grant", filepath.Join(bound, "sub")+":/work:rw", "--", "sh", "-c", "echo from-bench > /work/out")
	if b, err := os.ReadFile(filepath.Join(bound, "sub", "out")); err != nil || string(b) != "from-bench\n" {
		t.Errorf("rw grant: %q, %v", b, err)
	}
	if fi, err := os.Stat(filepath.Join(bound, "sub", "out")); err != nil || int(fi.Sys().(*syscall.Stat_t).Uid) != developer(t).uid || int(fi.Sys().(*syscall.Stat_t).Gid) != developer(t).gid {
		t.Errorf("rw grant: the file written is not the directory owner's (%v): %v", developer(t), fi.Sys())
	}
	// A directory whose group is not one of its owner's (here root), or whose owner has no account:
	// the Bench would act as that group, or as nobody knows whom.
	groupRoot, noAccount := filepath.Join(bound, "group-root"), filepath.Join(bound, "no-account")
	os.Mkdir(groupRoot, 0o755)
	os.Chown(groupRoot, developer(t).uid, 0)
	os.Mkdir(noAccount, 0o755)
	os.Chown(noAccount, 4242, 4242)
	for _, c := range []struct{ grant, want string }{
		{groupRoot + ":/work:rw", "is not one of its owner"}, {groupRoot + ":/work:ro", "is not one of its owner"},
		{noAccount + ":/work:ro", "has no account"},
	} {
		if r := shed(t, root, nil, "bench", "run", "-f", file, "--grant", c.grant, "--", "true"); r.code != 2 || !strings.Contains(r.stderr, c.want) || !strings.Contains(r.stderr, "shed: hint:") {
			t.Errorf("--grant %s: exit %d, want 2 with %q:\n%s", c.grant, r.code, c.want, r.stderr)
		}
	}
	// A directory of root's, rw: the Bench would be root there, on the host.
	rootsDir := filepath.Join(bound, "roots")
	os.Mkdir(rootsDir, 0o755)
	if r := shed(t, root, nil, "bench", "run", "-f", file, "--grant", rootsDir+":/work:rw", "--", "true"); r.code != 2 || !strings.Contains(r.stderr, "it is root's") || !strings.Contains(r.stderr, "shed: hint:") {
		t.Errorf("rw grant of root's directory: exit %d\n%s", r.code, r.stderr)
	}
	// Read-only, a directory of root's shows as to any user: its 0600 files stay root's.
	writeFile(t, filepath.Join(rootsDir, "secret"), "root only\n")
	os.Chmod(filepath.Join(rootsDir, "secret"), 0o600)
	writeFile(t, filepath.Join(rootsDir, "public"), "anyone\n")
	if r := shed(t, root, nil, "bench", "run", "-f", file, "--grant", rootsDir+":/work:ro", "--", "sh", "-c", "cat /work/public; cat /work/secret"); r.code == 0 || r.stdout != "anyone\n" {
		t.Errorf("ro grant of root's directory: exit %d, %q %q; want the public file only", r.code, r.stdout, r.stderr)
	}
	// Without --grant, nothing is mounted: grants are bounds, not ambient.
	if r := shed(t, root, nil, "bench", "run", "-f", file, "--", "ls", bound); r.code == 0 {
		t.Errorf("the bound is visible without --grant: %s", r.stdout)
	}
}

// TestBenchOffline: once realized, a Bench launches with no network at all:
// shed itself runs inside `unshare --net`.
func TestBenchOffline(t *testing.T) {
	parallel(t) // see parallelTests in main_test.go
	requireRoot(t)
	root := sharedRoot(t)
	file, _ := benchWorkshop(t)
	out, err := exec.Command("unshare", "--net", shedBin, "--root", root, "bench", "run", "--offline", "-f", file, "--", "jq", "-n", "1+1").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "2" {
		t.Fatalf("offline bench: %v\n%s", err, out)
	}
}

// TestBenchGCAndCleanup: gc in a loop during 50 launches breaks none of them;
// afterwards no mount, process or state is left; a SIGKILLed shed's Bench is
// swept by the next command.
func TestBenchGCAndCleanup(t *testing.T) {
	requireRoot(t)
	root := sharedRoot(t)
	file, _ := benchWorkshop(t)
	mounts0 := countMounts(t, root)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if r := shed(t, root, nil, "gc"); r.code != 0 {
				t.Errorf("gc: %s", r.stderr)
				return
			}
		}
	}()
	for i := 0; i < 50; i++ {
		if r := shed(t, root, nil, "bench", "run", "--offline", "-f", file, "--", "jq", "-n", "1"); r.code != 0 {
			t.Errorf("launch %d during gc: exit %d\n%s", i, r.code, r.stderr)
		}
	}
	close(stop)
	wg.Wait()

	// SIGKILL a shed running a Bench.
	cmd := shedCmd(t, root, "bench", "run", "-f", file, "--name", "doomed", "--", "sleep", "1007")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	initPid := waitBench(t, root, "doomed")
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	// Directly, the Bench dies with its shed (Pdeathsig); through the supervisor, the supervisor sees
	// its client gone and stops it. Either way it is gone in moments, not at once: wait up to 5 s.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		ls := mustShed(t, root, "bench", "ls").stdout
		if !strings.Contains(ls, "doomed") {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("a killed shed's Bench is still listed 5 s later:\n%s", ls)
			break
		}
	}
	ents, _ := os.ReadDir(filepath.Join(root, "benches"))
	var left []string
	for _, e := range ents {
		if e.Name() != ".names.lock" { // the names' lock is the directory's, not a Bench's
			left = append(left, e.Name())
		}
	}
	if len(left) != 0 {
		t.Errorf("bench state left after the sweep: %v", left)
	}
	// The kernel tears the pid namespace down asynchronously (SIGKILL to init by Pdeathsig, then to
	// the rest), so a loaded machine may need a moment; a survivor is one still there after 10 s.
	// Only shed's own processes and mounts count: other tests and the machine's own come and go.
	// A survivor is matched exactly: other packages' tests run at the same time
	// (go test -p), and their sandboxes' inits are "shed-sandbox-init" too.
	// The tests' own supervisors (SHED_TEST_VIA=daemon) are meant to outlive the Benches.
	isShed := func(pid string, argv []string) bool {
		return (argv[0] == shedBin && !slices.Contains(argv, "daemon")) || (len(argv) == 2 && argv[0] == "sleep" && argv[1] == "1007") ||
			(pid == strconv.Itoa(initPid) && argv[0] == "shed-sandbox-init")
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(procsWhere(isShed)) != 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if left := procsWhere(isShed); len(left) != 0 {
		t.Errorf("processes of shed or its Benches survive the Benches:\n%s", strings.Join(left, "\n"))
	}
	if m := countMounts(t, root); m > mounts0 {
		t.Errorf("mountinfo has %d lines under %s, %d before the Benches", m, root, mounts0)
	}
}

// countMounts counts the host's mounts that involve dir: only those are shed's
// (other packages' tests mount and unmount their own at the same time).
func countMounts(t *testing.T, dir string) int {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, dir) {
			n++
		}
	}
	return n
}

// waitBench returns the host pid of the init of the Bench called name, once it is listed.
func waitBench(t *testing.T, root, name string) int {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		var recs []struct {
			Name string `json:"name"`
			Pid  int    `json:"pid"`
		}
		json.Unmarshal([]byte(shed(t, root, nil, "--json", "bench", "ls").stdout), &recs)
		for _, r := range recs {
			if r.Name == name && r.Pid != 0 {
				return r.Pid
			}
		}
	}
	t.Fatalf("the Bench %s did not show up within 10s", name)
	return 0
}

// ofDaemon says whether process pid is a child of a shed daemon (a warm pool's init).
func ofDaemon(pid string) bool {
	b, err := os.ReadFile(filepath.Join("/proc", pid, "stat"))
	if err != nil {
		return false
	}
	// pid (comm) state ppid ...: comm may hold spaces, so count from its closing parenthesis.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 2 {
		return false
	}
	cmd, _ := os.ReadFile(filepath.Join("/proc", f[1], "cmdline"))
	return slices.Contains(strings.Split(string(cmd), "\x00"), "daemon")
}

// procsWhere lists "PID: argv" of every process that satisfies match.
func procsWhere(match func(pid string, argv []string) bool) []string {
	ents, _ := os.ReadDir("/proc")
	var found []string
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		argv := strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
		if len(b) > 0 && match(e.Name(), argv) {
			found = append(found, e.Name()+": "+strings.Join(argv, " "))
		}
	}
	return found
}

// TestBenchFDs walks /proc/PID/fd of a running Bench's processes from the
// host and fails on any descriptor that points outside the Bench.
func TestBenchFDs(t *testing.T) {
	requireRoot(t)
	root := sharedRoot(t)
	file, _ := benchWorkshop(t)
	cmd := shedCmd(t, root, "bench", "run", "-f", file, "--name", "fdwalk", "--", "sleep", "1011")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	pid := waitBench(t, root, "fdwalk")
	time.Sleep(200 * time.Millisecond)
	// The Bench's init is the small program beside shed (cmd/shed-init), not a second shed.
	small, err := os.Stat(filepath.Join(filepath.Dir(shedBin), "shed-init"))
	if err != nil {
		t.Fatal(err)
	}
	if exe, err := os.Stat(fmt.Sprintf("/proc/%d/exe", pid)); err != nil {
		t.Error(err)
	} else if exe.Size() != small.Size() {
		t.Errorf("the Bench's init runs a file of %d bytes, want shed-init's %d", exe.Size(), small.Size())
	}
	// The Bench's propose socket is on a tmpfs attached nowhere (no host path names it, nor the
	// Bench's id), mode 0600.
	if socks, _ := filepath.Glob(filepath.Join(root, "benches", "*", "propose.sock")); len(socks) != 0 {
		t.Errorf("a propose socket in the Bench's state: %s", socks)
	}
	sock := fmt.Sprintf("/proc/%d/root/run/shed/propose.sock", pid)
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o600 || fi.Mode().Type() != os.ModeSocket {
		t.Errorf("%s: %v, want a socket of mode 0600", sock, err)
	}
	for _, p := range descendants(pid) {
		fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", p))
		for _, fd := range fds {
			target, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", p, fd.Name()))
			if err != nil {
				continue
			}
			switch {
			case strings.HasPrefix(target, "pipe:"), strings.HasPrefix(target, "socket:"), strings.HasPrefix(target, "anon_inode:"),
				target == "/dev/null", strings.HasPrefix(target, "/dev/pts/"):
			case p == pid && cgroupProcs.MatchString(target):
				// init holds its Bench's own cgroups' cgroup.procs, write-only, to place each command it
				// starts in them (sandbox/cgroup_linux.go), and a Pausable one's freezer file, to thaw it
				// (sandbox/freeze_linux.go); it is not dumpable, and no command holds one.
				info, _ := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%s", p, fd.Name()))
				if m := regexp.MustCompile(`(?m)^flags:\s+([0-7]+)$`).FindSubmatch(info); m == nil || !strings.HasSuffix(string(m[1]), "1") {
					t.Errorf("init's fd %s → %s is not write-only:\n%s", fd.Name(), target, info)
				}
			default:
				t.Errorf("process %d (a Bench process) has fd %s → %s", p, fd.Name(), target)
			}
		}
	}
}

// cgroupProcs is the cgroup.procs of a sandbox's own cgroup, in any v1 hierarchy or in v2, and the
// file of a Pausable sandbox's freezer that init thaws it through should shed die (v1 freezer.state,
// v2 cgroup.freeze of a cgroup whose name ends in "p").
var cgroupProcs = regexp.MustCompile(`^/sys/fs/cgroup/(([a-z,_]+/)?toolshed/[0-9a-f]{16}/cgroup\.procs|freezer/toolshed/[0-9a-f]{16}/freezer\.state|toolshed/[0-9a-f]{16}p/cgroup\.(procs|freeze))$`)

// descendants returns pid and its descendants (host pids).
func descendants(pid int) []int {
	out := []int{pid}
	for i := 0; i < len(out); i++ {
		tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", out[i]))
		for _, task := range tasks {
			f, err := os.Open(fmt.Sprintf("/proc/%d/task/%s/children", out[i], task.Name()))
			if err != nil {
				continue
			}
			sc := bufio.NewScanner(f)
			sc.Split(bufio.ScanWords)
			for sc.Scan() {
				if c, err := strconv.Atoi(sc.Text()); err == nil {
					out = append(out, c)
				}
			}
			f.Close()
		}
	}
	return out
}

// TestBenchExecAndLimits: exec joins a running Bench; --memory and --pids
// limit what its command may use.
func TestBenchExecAndLimits(t *testing.T) {
	parallel(t) // see parallelTests in main_test.go
	requireRoot(t)
	root := sharedRoot(t)
	file, _ := benchWorkshop(t)
	cmd := shedCmd(t, root, "bench", "run", "-f", file, "--name", "exec-target", "--", "sh", "-c", "echo main > /root/mark; sleep 1013")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	deadline := time.Now().Add(10 * time.Second)
	var r result
	for time.Now().Before(deadline) {
		if r = shed(t, root, nil, "bench", "exec", "exec-target", "--", "cat", "/root/mark"); r.code == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if r.code != 0 || r.stdout != "main\n" {
		t.Fatalf("bench exec: exit %d, %q %s", r.code, r.stdout, r.stderr)
	}
	if r := shed(t, root, nil, "bench", "exec", "exec-target", "--", "sh", "-c", "exit 5"); r.code != 5 {
		t.Errorf("bench exec exit code: %d, want 5", r.code)
	}
	// A one-shot run is measured only when asked (--metrics): its commands are then in cgroups of
	// their own, which `bench ls` reads; exec-target's are in none of shed's, so its launch paid
	// for none (docs/agents.md#metrics).
	startBench(t, root, "measured", "bench", "run", "-f", file, "--metrics", "--name", "measured", "--", "sh", "-c", "exec sleep 1013")
	measured, plain := benchMetrics(t, root, "measured"), benchMetrics(t, root, "exec-target")
	if measured == nil || measured.MemUsed <= 0 || measured.CPUCount < 1 {
		t.Errorf("bench ls --json: the metrics of a --metrics run: %+v, want its memory and cpus", measured)
	}
	if plain != nil {
		t.Errorf("bench ls --json: a run without --metrics has metrics %+v, want none (it has no cgroups)", plain)
	}
	cg := commandCgroups(t, root, "exec-target")
	if strings.Contains(cg, "toolshed") {
		t.Errorf("a run without --metrics and limits: its command is in shed's cgroups:\n%s", cg)
	}
	if cg := commandCgroups(t, root, "measured"); !regexp.MustCompile(`(?m):memory:/toolshed/[0-9a-f]{16}$`).MatchString(cg) {
		t.Errorf("a --metrics run: its command's cgroups:\n%s\nwant a memory cgroup of shed's", cg)
	}
	mustShed(t, root, "bench", "rm", "measured")
	mustShed(t, root, "bench", "rm", "exec-target")
	if r := shed(t, root, nil, "bench", "exec", "exec-target", "--", "true"); r.code == 0 || !strings.Contains(r.stderr, "no such bench") {
		t.Errorf("exec into a removed Bench: exit %d %s", r.code, r.stderr)
	}

	// Limits: a process that holds 200 MB is killed under --memory 64M; a
	// Bench with --pids 8 cannot start 20 processes.
	// The kill says which limit it was; a kill -9 that is not the limit does not.
	if r := shed(t, root, nil, "bench", "run", "-f", file, "--memory", "64M", "--", "perl", "-e", `$x = "a" x 200_000_000; print length($x)`); r.code != 137 ||
		!strings.Contains(r.stderr, "out of memory: the kernel killed a process of the command at the Bench's memory limit (64.0 MiB)") {
		t.Errorf("200 MB under --memory 64M: exit %d, stderr %q, want 137 and the limit named", r.code, r.stderr)
	}
	if r := shed(t, root, nil, "bench", "run", "-f", file, "--memory", "64M", "--", "sh", "-c", "kill -9 $$"); r.code != 137 || strings.Contains(r.stderr, "out of memory") {
		t.Errorf("kill -9 under --memory 64M: exit %d, stderr %q, want 137 and no word of memory", r.code, r.stderr)
	}
	mustShed(t, root, "bench", "run", "-f", file, "--memory", "512M", "--", "perl", "-e", `$x = "a" x 200_000_000; print length($x)`)
	if r := shed(t, root, nil, "bench", "run", "-f", file, "--pids", "8", "--", "sh", "-c", "for i in $(seq 20); do sleep 2 & done; wait"); r.code == 0 {
		t.Errorf("20 processes under --pids 8 succeeded")
	}
}

// TestBenchShell: `shed bench shell` under a terminal (script(1) provides
// one) is an interactive shell on a terminal of the Bench's own /dev/pts,
// with our window size, and its exit code is shed's.
func TestBenchShell(t *testing.T) {
	requireRoot(t)
	root := sharedRoot(t)
	file, _ := benchWorkshop(t)
	if _, err := exec.LookPath("script"); err != nil {
		t.Fatalf("script(1) (bsdutils) is needed to give shed a terminal: %v", err)
	}
	cmd := exec.Command("script", "-qec", fmt.Sprintf("stty rows 33 cols 99; %s --root %s bench shell --offline -f %s", shedBin, root, file), "/dev/null")
	cmd.Stdin = strings.NewReader("tty\necho $((6*7))\nstty size\nexit 5\n")
	out, err := cmd.Output()
	// bash's prompt and bracketed-paste switches surround the output lines.
	text := regexp.MustCompile(`\x1b\[[0-9;?]*[A-Za-z]|\r`).ReplaceAllString(string(out), "")
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 5 {
		t.Errorf("exit: %v, want 5\n%s", err, text)
	}
	for _, want := range []string{"\n/dev/pts/0\n", "\n42\n", "\n33 99\n"} {
		if !strings.Contains(text, want) {
			t.Errorf("shell output lacks %q:\n%s", want, text)
		}
	}
}

// TestBenchResize: the window size of the terminal shed runs at follows into
// a Bench run with -t, when the window changes during the run; directly, and
// through the daemon (which gets no SIGWINCH: the client passes it on).
func TestBenchResize(t *testing.T) {
	requireRoot(t)
	root := sharedRoot(t)
	file, _ := benchWorkshop(t)
	sock := daemon(t, root)
	for _, mode := range []string{"direct", "daemon"} {
		t.Run(mode, func(t *testing.T) {
			master, slave := ptytest.Open(t, 20, 60)
			// bash prints the size it starts with and each one a SIGWINCH brings.
			cmd := exec.Command(shedBin, "bench", "run", "-t", "--offline", "-f", file, "--",
				"bash", "-c", `trap 'echo "size $(stty size)"' WINCH; echo "size $(stty size)"; while :; do sleep 0.05; done`)
			cmd.Env = append(os.Environ(), "SHED_ROOT="+root, "SHED_SOCKET=none")
			if mode == "daemon" {
				cmd.Env = append(os.Environ(), "SHED_ROOT=/nonexistent", "SHED_SOCKET="+sock)
			}
			cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
			// shed is the terminal's foreground process, as at a shell: the kernel sends it SIGWINCH.
			cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { cmd.Process.Kill(); cmd.Wait() }()
			out := make(chan string, 16)
			go func() {
				lines := bufio.NewScanner(master)
				for lines.Scan() {
					out <- strings.TrimSpace(lines.Text())
				}
				close(out)
			}()
			expect := func(want string) {
				t.Helper()
				timeout := time.After(20 * time.Second)
				for {
					select {
					case line, ok := <-out:
						if !ok {
							t.Fatalf("the terminal closed before %q", want)
						}
						if line == want {
							return
						}
					case <-timeout:
						t.Fatalf("no %q within 20s", want)
					}
				}
			}
			expect("size 20 60")
			ptytest.Resize(t, master, 33, 99)
			expect("size 33 99")
		})
	}
}

// TestBenchGrantSwaps: while Benches launch with a grant, another process keeps swapping the bound,
// a parent of it and the granted directory itself for symlinks to another directory. Every launch
// gets the real directory or a clear refusal, never the other one.
func TestBenchGrantSwaps(t *testing.T) {
	requireRoot(t)
	root := sharedRoot(t)
	orig, bound := benchWorkshop(t)
	writeFile(t, filepath.Join(bound, "sub", "marker"), "real\n")
	// The recipe and its lock, out of the tree that is swapped.
	file := filepath.Join(t.TempDir(), "workshop.toml")
	for _, f := range []string{"workshop.toml", "workshop.lock"} {
		writeFile(t, filepath.Join(filepath.Dir(file), f), string(must(os.ReadFile(filepath.Join(filepath.Dir(orig), f)))))
	}
	other := t.TempDir()
	writeFile(t, filepath.Join(other, "sub", "marker"), "other\n")
	writeFile(t, filepath.Join(other, "project", "sub", "marker"), "other\n")
	chownTree(t, other, developer(t))
	parent := filepath.Dir(bound)
	swaps := []struct{ path, target string }{
		{bound, other},                // the bound itself
		{parent, filepath.Dir(other)}, // a parent of it (other/project/sub exists there too)
		{filepath.Join(bound, "sub"), filepath.Join(other, "sub")}, // the granted directory
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			s := swaps[i%len(swaps)]
			aside := s.path + ".real"
			if os.Rename(s.path, aside) != nil {
				continue
			}
			os.Symlink(s.target, s.path)
			time.Sleep(2 * time.Millisecond)
			os.Remove(s.path)
			os.Rename(aside, s.path)
			time.Sleep(time.Millisecond)
		}
	}()
	counts := map[string]int{}
	for i := 0; i < 40; i++ {
		r := shed(t, root, nil, "bench", "run", "-f", file, "--grant", filepath.Join(bound, "sub")+":/work", "--", "cat", "/work/marker")
		switch {
		case r.code == 0 && r.stdout == "real\n":
			counts["real"]++
		case r.code == 2 && strings.Contains(r.stderr, "grant refused") && strings.Contains(r.stderr, "shed: hint:"):
			counts["refused"]++
		default:
			close(stop)
			<-done
			t.Fatalf("launch %d while the grant was swapped: exit %d\n%s%s", i, r.code, r.stdout, r.stderr)
		}
	}
	close(stop)
	<-done
	if counts["real"] == 0 {
		t.Errorf("no launch got the directory: %v", counts)
	}
	t.Logf("launches: %v", counts)
}

// benchUse is a Bench's newest reading, as `bench ls --json` shows it.
type benchUse struct {
	CPUCount int   `json:"cpu_count"`
	MemUsed  int64 `json:"mem_used"`
}

// benchMetrics is the running Bench name's reading in `bench ls --json` (nil: none).
func benchMetrics(t *testing.T, root, name string) *benchUse {
	t.Helper()
	var recs []struct {
		Name    string    `json:"name"`
		Metrics *benchUse `json:"metrics"`
	}
	r := mustShed(t, root, "--json", "bench", "ls")
	if err := json.Unmarshal([]byte(r.stdout), &recs); err != nil {
		t.Fatalf("bench ls --json: %v\n%s", err, r.stdout)
	}
	for _, rec := range recs {
		if rec.Name == name {
			return rec.Metrics
		}
	}
	t.Fatalf("bench ls --json does not list %s:\n%s", name, r.stdout)
	return nil
}

// commandCgroups is /proc/PID/cgroup of the command init of the running Bench name runs (its child).
func commandCgroups(t *testing.T, root, name string) string {
	t.Helper()
	initPid := waitBench(t, root, name)
	kids, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", initPid, initPid))
	f := strings.Fields(string(kids))
	if err != nil || len(f) == 0 {
		t.Fatalf("the command of Bench %s (init %d): %v %q", name, initPid, err, kids)
	}
	b, err := os.ReadFile("/proc/" + f[0] + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestWorkdirAndEnv: a recipe's workdir and [env] are what a Bench's commands start with (made in
// the upper when the layers lack the directory), over shed's variables and under the command's; a
// command that names a directory gets it. Nothing of them reaches a layer.
func TestWorkdirAndEnv(t *testing.T) {
	parallel(t)
	requireRoot(t)
	root := sharedRoot(t)
	file := writeFile(t, filepath.Join(t.TempDir(), "workshop.toml"), "name = \"workdir-env\"\nseed = \"debian/bookworm\"\n"+
		"workdir = \"/testbed/app\"\n[env]\nGREETING = \"hi there\"\nLANG = \"C\"\n")
	r := mustShed(t, root, "bench", "run", "-f", file, "--", "sh", "-c", `pwd; echo "$GREETING|$LANG|$HOME"; stat -c %U /testbed/app`)
	if r.stdout != "/testbed/app\nhi there|C|/root\nroot\n" {
		t.Errorf("a Bench of a recipe with workdir and env: %q", r.stdout)
	}
	cmd := shedCmd(t, root, "bench", "run", "-f", file, "--name", "wd-env", "--", "sleep", "1014")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if shed(t, root, nil, "bench", "exec", "wd-env", "--", "true").code == 0 {
			break
		}
	}
	if r := mustShed(t, root, "bench", "exec", "-e", "GREETING=mine", "wd-env", "--", "sh", "-c", `pwd; echo "$GREETING"`); r.stdout != "/testbed/app\nmine\n" {
		t.Errorf("bench exec: %q, want the workdir and the command's own variable", r.stdout)
	}
	if r := mustShed(t, root, "bench", "exec", "-w", "/tmp", "wd-env", "--", "pwd"); r.stdout != "/tmp\n" {
		t.Errorf("bench exec -w /tmp: %q", r.stdout)
	}
	j := realize(t, root, file)
	if _, err := os.Lstat(filepath.Join(j.Layers[len(j.Layers)-1], "testbed")); err == nil {
		t.Error("the workdir was made in a layer")
	}
}

// TestWorkdirMagicLinkRefused: an image's symlink /workN -> /proc/self/fd/N names, inside the
// sandbox, a descriptor its init may hold of the host (the host's /proc while it sets up). A recipe
// whose workdir goes through one is refused at launch (no magic link is followed to make or enter
// the workdir), whichever descriptor it names; and a workdir under a mount (a grant) is not made.
func TestWorkdirMagicLinkRefused(t *testing.T) {
	parallel(t)
	requireRoot(t)
	root := sharedRoot(t)
	var hdrs []*tar.Header
	for n := 0; n <= 12; n++ {
		hdrs = append(hdrs, &tar.Header{Name: fmt.Sprintf("work%d", n), Typeflag: tar.TypeSymlink, Linkname: fmt.Sprintf("/proc/self/fd/%d", n), Mode: 0o777})
	}
	reg := startRegistry(t, "")
	image := fmt.Sprintf("127.0.0.1:%d/escape/workdir:v1", reg.port)
	pushImage(t, image, debianLayer(t, root), tarLayer(t, hdrs...))
	dir := t.TempDir()
	for n := 0; n <= 12; n++ {
		file := writeFile(t, filepath.Join(dir, strconv.Itoa(n), "workshop.toml"), fmt.Sprintf("name = \"escape-%d\"\nseed = \"oci://%s\"\nworkdir = \"/work%d\"\n", n, image, n))
		r := shed(t, root, nil, "bench", "run", "-f", file, "--", "sh", "-c", "pwd -P; ls ../.. | wc -l")
		if r.code == 0 || !strings.Contains(r.stderr, fmt.Sprintf("/work%d", n)) {
			t.Errorf("workdir /work%d -> /proc/self/fd/%d: exit %d, stdout %q, stderr %q; want the launch refused", n, n, r.code, r.stdout, r.stderr)
		}
	}
	// Under a grant (a bind mount of a host directory): entered if it is there, never made.
	host := filepath.Join(t.TempDir(), "project")
	os.MkdirAll(filepath.Join(host, "there"), 0o755)
	chownTree(t, host, developer(t))
	for _, c := range []struct {
		workdir string
		ok      bool
	}{{"/mnt/data/there", true}, {"/mnt/data/new", false}} {
		grant := writeFile(t, filepath.Join(dir, "grant"+strings.ReplaceAll(c.workdir, "/", "-"), "workshop.toml"),
			fmt.Sprintf("name = \"grant-workdir\"\nseed = \"debian/bookworm\"\nworkdir = %q\n[[grant]]\npath = %q\nmode = \"rw\"\n", c.workdir, host))
		r := shed(t, root, nil, "bench", "run", "-f", grant, "--grant", host+":/mnt/data:rw", "--", "pwd")
		if c.ok && (r.code != 0 || r.stdout != c.workdir+"\n") {
			t.Errorf("workdir %s in a grant, there: exit %d, %q %s", c.workdir, r.code, r.stdout, r.stderr)
		}
		if !c.ok && r.code == 0 {
			t.Errorf("workdir %s in a grant, missing: launched (%q)", c.workdir, r.stdout)
		}
	}
	if _, err := os.Lstat(filepath.Join(host, "new")); err == nil {
		t.Error("the workdir was made in the granted host directory")
	}
	mustShed(t, root, "store", "verify")
}
