package tests

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestBuildEscapes: packages whose maintainer scripts try, as root of their build, each way out of
// a build that root on the host would have: make a block device node for the host disk and mount
// it, mount a cgroup v1 hierarchy and set its release agent (which the kernel runs as host root),
// remount the build's read-only inputs writable and change the fetched .debs in place (which other
// recipes install), hard-link an input or a host file into the output, reach init's root and
// environment, write the host's core_pattern, read a key of the caller's keyring, reach a host
// abstract socket, leave a daemon behind that keeps writing its output, plant symlinks where
// capture looks. Each try fails (the script records how); then the store verifies, a recipe that
// shares the fetched input builds its genuine content, and the host's sentinel files are unchanged
// in bytes, mode, owners, times and links.
func TestBuildEscapes(t *testing.T) {
	parallel(t) // see parallelTests in main_test.go
	requireRoot(t)
	root := sharedRoot(t)
	sentinels := newSentinels(t)
	ranFile := filepath.Join(t.TempDir(), "release-agent-ran")
	coreBefore, _ := os.ReadFile("/proc/sys/kernel/core_pattern")
	t.Cleanup(func() {
		if now, _ := os.ReadFile("/proc/sys/kernel/core_pattern"); !bytes.Equal(now, coreBefore) {
			os.WriteFile("/proc/sys/kernel/core_pattern", coreBefore, 0o644)
		}
	})
	// A key of the caller's session keyring, which shed and so every build's init inherit.
	keyID, err := unix.AddKey("user", "shed-hostile-key", []byte("host secret"), unix.KEY_SPEC_SESSION_KEYRING)
	if err != nil {
		t.Fatalf("add a key: %v", err)
	}
	defer unix.KeyctlInt(unix.KEYCTL_INVALIDATE, keyID, 0, 0, 0)
	// A host abstract socket: abstract names are per network namespace.
	abstract := fmt.Sprintf("shed-hostile-%d", os.Getpid())
	al, err := net.Listen("unix", "@"+abstract)
	if err != nil {
		t.Fatal(err)
	}
	defer al.Close()
	reached := make(chan struct{}, 1)
	go func() {
		if c, err := al.Accept(); err == nil {
			reached <- struct{}{}
			c.Close()
		}
	}()
	var disk unix.Stat_t
	if err := unix.Stat("/dev/vda", &disk); err != nil {
		unix.Stat("/dev/sda", &disk)
	}

	tries := fmt.Sprintf(`mkdir -p /var/lib/hostile
exec 3>/var/lib/hostile/results
try() { name=$1; shift; if ( "$@" ) >/dev/null 2>&1; then echo "$name: ESCAPED" >&3; else echo "$name: refused" >&3; fi; }
try mknod-block mknod /tmp/hd b %[1]d %[2]d
try mount-disk sh -c 'mount -t ext4 /tmp/hd /mnt || mount -t ext4 /dev/vda /mnt'
try mount-cgroup1 sh -c 'mkdir -p /tmp/cg && mount -t cgroup -o memory cgroup /tmp/cg'
try mount-cgroup1-userns unshare -Urm sh -c 'mkdir -p /tmp/cg2 && mount -t cgroup -o rdma cgroup /tmp/cg2'
try release-agent sh -c 'for d in /tmp/cg /tmp/cg2; do test -e $d/cgroup.procs && echo "/bin/sh -c \"touch %[3]s\"" > $d/release_agent && exit 0; done; exit 1'
try remount-inputs mount -o remount,bind,rw /run/shed/debs
try poison-inputs sh -c 'for f in /run/shed/debs/*.deb; do echo poison >> $f && exit 0; done; exit 1'
try chmod-inputs sh -c 'chmod 666 /run/shed/debs/*.deb'
try unlink-inputs sh -c 'rm -f /run/shed/debs/*.deb && ! ls /run/shed/debs/*.deb'
try link-input sh -c 'for f in /run/shed/debs/*.deb; do ln $f /var/lib/hostile/stolen-deb && exit 0; done; exit 1'
try link-host ln %[4]s /var/lib/hostile/stolen-host
try init-root sh -c 'ls /proc/1/root/ | grep -q . '
try init-environ cat /proc/1/environ
try init-fds ls /proc/1/fd
try write-init-root sh -c 'echo escaped > /proc/1/root%[5]s/escaped'
try core-pattern sh -c 'echo "|/bin/sh -c touch %[3]s" > /proc/sys/kernel/core_pattern'
try keyring perl -e 'my $id = syscall(250, 10, -3, "user", "shed-hostile-key", 0); exit($id > 0 ? 0 : 1)'
try abstract-socket perl -MSocket -e 'socket(my $s, AF_UNIX, SOCK_STREAM, 0) or die; connect($s, pack_sockaddr_un("\0%[6]s")) or exit 1'
try userns unshare -U true
try netns unshare -n true
try open-by-handle perl -e 'exit(syscall(304, -100, 0, 0) == -1 && $! == 1 ? 1 : 0)'
# A daemon that outlives the script, holding and writing its output.
(setsid sh -c 'exec 3>>/var/lib/hostile/daemon.out; echo shed-hostile-daemon > /dev/null; while :; do echo late >&3; sleep 0.05; done' </dev/null >/dev/null 2>&1 &)
# Symlinks where capture cleans (junk it removes, or whose contents it removes), to the host's
# sentinels: capture that followed one would delete or change them.
ln -s %[5]s /var/tmp/evil
rm -rf /root/.cache && ln -s %[5]s /root/.cache
rm -f /var/log/alternatives.log && ln -s %[4]s /var/log/alternatives.log
rm -rf /var/cache/apt/archives && ln -s %[5]s /var/cache/apt/archives
ln -s %[4]s /var/lib/hostile/host-file
echo done >&3
`, unix.Major(disk.Rdev), unix.Minor(disk.Rdev), ranFile, sentinels.file, sentinels.dir, abstract)
	repo := newAptRepo(t,
		debSpec{name: "shared-dep", version: "1", files: map[string]string{"usr/share/shared-dep/genuine": "genuine shared content\n"}},
		debSpec{name: "hostile-escapes", version: "1", depends: "shared-dep", postinst: tries},
		debSpec{name: "victim", version: "1", depends: "shared-dep", files: map[string]string{"usr/share/victim/ok": "victim\n"}},
		debSpec{name: "hostile-socket", version: "1", postinst: `mkdir -p /var/lib/hostile-socket
(setsid perl -MSocket -e 'socket(my $s, AF_UNIX, SOCK_STREAM, 0) or die; bind($s, pack_sockaddr_un("/var/lib/hostile-socket/s")) or die; listen($s, 1); open(my $o, ">>", "/etc/hostile-socket-held"); sleep 30' </dev/null >/dev/null 2>&1 &)
sleep 0.5`},
		debSpec{name: "hostile-killall", version: "1", postinst: "kill -9 -1; sleep 1"},
	)
	dir := t.TempDir()

	f := repo.recipe(t, filepath.Join(dir, "escapes"), "escapes", "hostile-escapes")
	j := realize(t, root, f)
	layer := j.Layers[1]
	results, err := os.ReadFile(filepath.Join(layer, "var/lib/hostile/results"))
	if err != nil {
		t.Fatalf("the maintainer script left no results: %v", err)
	}
	if !strings.HasSuffix(string(results), "done\n") || strings.Contains(string(results), "ESCAPED") {
		t.Errorf("tries from a build:\n%s", results)
	}
	t.Logf("tries from a build:\n%s", results)
	for _, gone := range []string{"var/lib/hostile/stolen-deb", "var/lib/hostile/stolen-host", "var/tmp/evil", "root/.cache", "var/log/alternatives.log", "var/cache/apt/archives"} {
		if _, err := os.Lstat(filepath.Join(layer, gone)); err == nil {
			t.Errorf("%s is in the layer", gone)
		}
	}
	// The daemon died with the build: nobody writes the layer, now or later.
	daemon := func() []string {
		return procsWhere(func(pid string, argv []string) bool {
			return strings.Contains(strings.Join(argv, " "), "shed-hostile-daemon")
		})
	}
	if left := daemon(); len(left) > 0 {
		t.Errorf("the build's daemon survived it:\n%s", strings.Join(left, "\n"))
	}
	before, _ := os.ReadFile(filepath.Join(layer, "var/lib/hostile/daemon.out"))
	time.Sleep(300 * time.Millisecond)
	if after, _ := os.ReadFile(filepath.Join(layer, "var/lib/hostile/daemon.out")); !bytes.Equal(before, after) {
		t.Error("something still writes the registered layer")
	}
	// Another recipe that installs the shared input gets its genuine bytes.
	v := repo.recipe(t, filepath.Join(dir, "victim"), "victim", "victim")
	vj := realize(t, root, v)
	if b, err := os.ReadFile(filepath.Join(vj.Layers[1], "usr/share/shared-dep/genuine")); err != nil || string(b) != "genuine shared content\n" {
		t.Errorf("the shared input's content in another recipe's layer: %q, %v", b, err)
	}

	// A socket left in the output, and a process holding it: the layer is refused, nothing stays.
	s := repo.recipe(t, filepath.Join(dir, "socket"), "socket", "hostile-socket")
	if r := shed(t, root, nil, "realize", s); r.code != 1 || !strings.Contains(r.stderr, "is a socket") {
		t.Errorf("a socket in the output: exit %d\n%s", r.code, r.stderr)
	}
	// kill -9 -1 reaches the build's own processes only: the build fails, the host goes on.
	victimProc := startSleeper(t)
	k := repo.recipe(t, filepath.Join(dir, "killall"), "killall", "hostile-killall")
	if r := shed(t, root, nil, "realize", k); r.code != 1 || !strings.Contains(r.stderr, "apt-get install") {
		t.Errorf("kill -9 -1 in a build: exit %d\n%s", r.code, r.stderr)
	}
	if err := victimProc.Signal(syscall.Signal(0)); err != nil {
		t.Errorf("a host process died of a build's kill -9 -1: %v", err)
	}

	for _, p := range []string{"socket", "killall"} {
		if strings.Contains(mustShed(t, root, "store", "ls").stdout, "apt-hostile-"+p+"\n") {
			t.Errorf("the refused layer apt-hostile-%s was registered", p)
		}
	}
	mustShed(t, root, "store", "verify", "--check-contents")
	sentinels.check(t)
	if _, err := os.Stat(ranFile); err == nil {
		t.Error("the release agent ran on the host")
	}
	if now, _ := os.ReadFile("/proc/sys/kernel/core_pattern"); !bytes.Equal(now, coreBefore) {
		t.Errorf("the host's core_pattern changed: %q", now)
	}
	if _, err := os.Stat(filepath.Join(sentinels.dir, "escaped")); err == nil {
		t.Error("a build wrote into the host's file system through /proc/1/root")
	}
	select {
	case <-reached:
		t.Error("a build reached a host abstract socket")
	default:
	}
	if left := daemon(); len(left) > 0 {
		t.Errorf("processes of the builds survived:\n%s", strings.Join(left, "\n"))
	}
}

// startSleeper starts a host process for a sandbox to try to kill.
func startSleeper(t *testing.T) *os.Process {
	t.Helper()
	p, err := os.StartProcess("/bin/sleep", []string{"sleep", "600"}, &os.ProcAttr{Sys: dieWithTests()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Kill(); p.Wait() })
	return p
}

// sentinels are host files a sandbox must not change: a directory with a file, a setuid file, a
// symlink and a hard link, owned by a user, each stat recorded.
type sentinels struct {
	dir, file string
	before    map[string]sentinelState
}

type sentinelState struct {
	content        string
	mode           uint32
	uid, gid       uint32
	nlink          uint64
	mtime, ctime   unix.Timespec
	xattrs, target string
}

func newSentinels(t *testing.T) *sentinels {
	t.Helper()
	s := &sentinels{dir: t.TempDir()}
	s.file = filepath.Join(s.dir, "precious")
	writeFile(t, s.file, "host data\n")
	writeFile(t, filepath.Join(s.dir, "su"), "#!/bin/sh\n")
	os.Chmod(filepath.Join(s.dir, "su"), 0o4755)
	os.Symlink("precious", filepath.Join(s.dir, "link"))
	os.Link(s.file, filepath.Join(s.dir, "hard"))
	unix.Lsetxattr(s.file, "user.sentinel", []byte("1"), 0)
	os.Lchown(filepath.Join(s.dir, "su"), developer(t).uid, developer(t).gid)
	s.before = s.snapshot(t)
	return s
}

func (s *sentinels) snapshot(t *testing.T) map[string]sentinelState {
	t.Helper()
	m := map[string]sentinelState{}
	ents, _ := os.ReadDir(s.dir)
	names := []string{"."}
	for _, e := range ents {
		names = append(names, e.Name())
	}
	for _, n := range names {
		p := filepath.Join(s.dir, n)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			t.Fatal(err)
		}
		ss := sentinelState{mode: st.Mode, uid: st.Uid, gid: st.Gid, nlink: st.Nlink, mtime: st.Mtim, ctime: st.Ctim}
		if st.Mode&unix.S_IFMT == unix.S_IFREG {
			b, _ := os.ReadFile(p)
			ss.content = string(b)
		}
		ss.target, _ = os.Readlink(p)
		buf := make([]byte, 1024)
		if n, err := unix.Llistxattr(p, buf); err == nil {
			names := strings.Split(string(buf[:n]), "\x00")
			slices.Sort(names)
			ss.xattrs = strings.Join(names, ",")
		}
		m[n] = ss
	}
	return m
}

func (s *sentinels) check(t *testing.T) {
	t.Helper()
	now := s.snapshot(t)
	for n, b := range s.before {
		if a, ok := now[n]; !ok || a != b {
			t.Errorf("host sentinel %s changed:\nbefore %+v\nafter  %+v", n, b, a)
		}
	}
	if len(now) != len(s.before) {
		t.Errorf("host sentinel directory has %d entries, had %d", len(now), len(s.before))
	}
}
