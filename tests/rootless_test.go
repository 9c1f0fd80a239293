package tests

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
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

	"golang.org/x/sys/unix"

	"toolshed.dev/shed/bench"
)

// These tests run shed as an ordinary user, with no root and no daemon (issue 14, docs/rootless.md):
// a real user the test makes with useradd, with or without subordinate ids, running the tests' shed
// binary with a clean environment.

// subIDsMu serializes this package's changes to /etc/subuid and /etc/subgid (useradd, userdel) with
// TestRootlessNoSubIDs's reading of them: the range its hint names must be free when it is checked.
var subIDsMu sync.Mutex

// idRange is a line of /etc/subuid or /etc/subgid: ids start..start+count-1.
type idRange struct{ start, count uint64 }

func (r idRange) overlaps(o idRange) bool {
	return r.start < o.start+o.count && o.start < r.start+r.count
}

// sandboxPool is root's pool of sandbox ids (sandbox/ids_linux.go: 512 slots of 65536 from 0x70000000),
// which root's shed refuses to use if a subordinate range overlaps it.
var sandboxPool = idRange{0x70000000, 512 * 65536}

// hostUser is a user of the host made by a test, and how the test runs things as that user.
type hostUser struct {
	name           string
	uid, gid       int
	home           string
	subUID, subGID idRange // zero without subordinate ids
	shedBin        string  // a copy of shedBin the user can execute
	shareDir       string  // a 0755 directory of the test's, readable by the user
}

// requireRootless fails without Debian's uidmap (.ci/run installs it) and skips where the kernel
// gives users no user namespaces at all.
func requireRootless(t *testing.T) {
	t.Helper()
	for _, h := range []string{"newuidmap", "newgidmap"} {
		if _, err := exec.LookPath(h); err != nil {
			t.Fatalf("%s is not installed (apt-get install uidmap): .ci/run installs it", h)
		}
	}
	if b, err := os.ReadFile("/proc/sys/user/max_user_namespaces"); err == nil && strings.TrimSpace(string(b)) == "0" {
		t.Skip("this kernel allows no user namespaces (user.max_user_namespaces = 0): shed without root needs them")
	}
	if b, err := os.ReadFile("/proc/sys/kernel/unprivileged_userns_clone"); err == nil && strings.TrimSpace(string(b)) == "0" {
		t.Skip("this kernel gives ordinary users no user namespaces (kernel.unprivileged_userns_clone = 0): shed without root needs them")
	}
}

// newHostUser makes a user with a home (useradd -m) and, if subIDs, the 65536 subordinate uids and
// gids useradd gives a new user, checked to overlap no other line of /etc/subuid or /etc/subgid and
// not root's sandbox pool. The user, its home, its lines and its processes go with the test.
func newHostUser(t *testing.T, prefix string, subIDs bool) *hostUser {
	t.Helper()
	// Unique per run and per test, short (useradd allows 32 characters).
	suffix := make([]byte, 2)
	rand.Read(suffix)
	u := &hostUser{name: fmt.Sprintf("%s%d-%s", prefix, os.Getpid()%1000000, hex.EncodeToString(suffix))}
	count := "0"
	if subIDs {
		count = "65536"
	}
	subIDsMu.Lock()
	out, err := exec.Command("useradd", "--create-home", "--shell", "/bin/sh",
		"-K", "SUB_UID_COUNT="+count, "-K", "SUB_GID_COUNT="+count, u.name).CombinedOutput()
	subIDsMu.Unlock()
	if err != nil {
		t.Fatalf("useradd %s: %v\n%s", u.name, err, out)
	}
	t.Cleanup(func() { u.remove(t) })
	pw, err := user.Lookup(u.name)
	if err != nil {
		t.Fatal(err)
	}
	u.uid, _ = strconv.Atoi(pw.Uid)
	u.gid, _ = strconv.Atoi(pw.Gid)
	u.home = pw.HomeDir

	for _, f := range []struct {
		file string
		r    *idRange
	}{{"/etc/subuid", &u.subUID}, {"/etc/subgid", &u.subGID}} {
		mine, others := subIDLines(t, f.file, u.name)
		switch {
		case !subIDs && len(mine) != 0:
			t.Fatalf("useradd -K SUB_UID_COUNT=0 gave %s ranges in %s: %v", u.name, f.file, mine)
		case !subIDs:
			continue
		case len(mine) != 1 || mine[0].count < 65536:
			t.Fatalf("useradd gave %s %v in %s; want one range of 65536", u.name, mine, f.file)
		}
		*f.r = mine[0]
		for _, o := range others {
			if o.overlaps(*f.r) {
				t.Fatalf("%s's range %v in %s overlaps another line's %v", u.name, *f.r, f.file, o)
			}
		}
		if f.r.overlaps(sandboxPool) {
			t.Fatalf("%s's range %v in %s overlaps root's sandbox ids %v", u.name, *f.r, f.file, sandboxPool)
		}
	}

	// shedBin is under a 0700 directory: the user runs a copy in a 0755 one of its own.
	dir, err := os.MkdirTemp("/var/tmp", "shed-rootless-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	u.shareDir = dir
	u.shedBin = filepath.Join(dir, "shed")
	// Copied by a child, not by this process: a fork of any test while it held the copy open for
	// writing would make exec fail with ETXTBSY (golang.org/issue/22315). The CLI goes beside the
	// small shed, which runs it for most commands, and so does shed-serve, which it runs for the
	// servers.
	bin := filepath.Dir(shedBin)
	if out, err := exec.Command("install", "-m", "0755", shedBin, filepath.Join(bin, "shed-cli"), filepath.Join(bin, "shed-serve"), dir).CombinedOutput(); err != nil {
		t.Fatalf("install %s: %v %s", u.shedBin, err, out)
	}
	return u
}

// subIDLines returns name's ranges in file and everyone else's.
func subIDLines(t *testing.T, file, name string) (mine, others []idRange) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Split(strings.TrimSpace(line), ":")
		if len(f) != 3 {
			continue
		}
		start, err1 := strconv.ParseUint(f[1], 10, 32)
		count, err2 := strconv.ParseUint(f[2], 10, 32)
		if err1 != nil || err2 != nil {
			continue
		}
		if f[0] == name {
			mine = append(mine, idRange{start, count})
		} else {
			others = append(others, idRange{start, count})
		}
	}
	return mine, others
}

// remove ends the user's processes (they are this test's: no one else runs as this user or its
// subordinate ids), then deletes the user, its home (with the stores in it, whose files are owned by
// the subordinate ids: root removes them) and its lines in /etc/subuid and /etc/subgid.
func (u *hostUser) remove(t *testing.T) {
	for _, p := range u.procs() {
		pid, _ := strconv.Atoi(strings.SplitN(p, ":", 2)[0])
		syscall.Kill(pid, syscall.SIGKILL)
	}
	for i := 0; i < 100 && len(u.procs()) > 0; i++ {
		time.Sleep(50 * time.Millisecond)
	}
	subIDsMu.Lock()
	defer subIDsMu.Unlock()
	if out, err := exec.Command("userdel", "--remove", u.name).CombinedOutput(); err != nil {
		t.Errorf("userdel --remove %s: %v\n%s", u.name, err, out)
	}
	if u.home != "" {
		os.RemoveAll(u.home)
	}
	for _, file := range []string{"/etc/subuid", "/etc/subgid"} {
		b, err := os.ReadFile(file)
		if err != nil {
			continue
		}
		var keep []string
		for _, line := range strings.SplitAfter(string(b), "\n") {
			if !strings.HasPrefix(line, u.name+":") {
				keep = append(keep, line)
			}
		}
		if kept := strings.Join(keep, ""); kept != string(b) {
			t.Logf("userdel left %s's lines in %s: removed", u.name, file)
			os.WriteFile(file, []byte(kept), 0o644)
		}
	}
}

// procs lists the processes whose real or effective uid is the user's or one of its subordinate
// ids: its shed, shed's user namespace, its sandboxes.
func (u *hostUser) procs() []string {
	ents, _ := os.ReadDir("/proc")
	var found []string
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) < 3 || f[0] != "Uid:" {
				continue
			}
			for _, s := range f[1:3] {
				id, _ := strconv.ParseUint(s, 10, 32)
				if id == uint64(u.uid) || u.subUID.count > 0 && u.subUID.overlaps(idRange{id, 1}) {
					cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
					found = append(found, e.Name()+": "+strings.ReplaceAll(strings.TrimSuffix(string(cmdline), "\x00"), "\x00", " "))
					break
				}
			}
		}
	}
	return found
}

// command is name with args run as the user, in its home, with a clean environment: HOME, USER,
// a standard PATH and no SHED_* variable but SHED_SOCKET=none (no supervisor), plus env. It is
// killed if it outlives the test or runs longer than any step here should (a hang fails, it does
// not stall the package).
func (u *hostUser) command(t *testing.T, stdin string, env []string, name string, args ...string) (*exec.Cmd, context.CancelFunc) {
	base := t.Context()
	if base.Err() != nil {
		base = context.Background() // in a Cleanup: t.Context() is done by then
	}
	ctx, cancel := context.WithTimeout(base, 5*time.Minute)
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = u.home
	cmd.Env = append([]string{
		"HOME=" + u.home, "USER=" + u.name, "LOGNAME=" + u.name, "LANG=C.UTF-8",
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"SHED_SOCKET=none",
	}, env...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	cmd.SysProcAttr = dieWithTests()
	cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(u.uid), Gid: uint32(u.gid), Groups: []uint32{uint32(u.gid)}}
	return cmd, cancel
}

// run runs name with args as the user.
func (u *hostUser) run(t *testing.T, stdin string, env []string, name string, args ...string) result {
	t.Helper()
	cmd, cancel := u.command(t, stdin, env, name, args...)
	defer cancel()
	return runResult(t, cmd)
}

// shed runs the user's shed with args (on its default store unless args say --root).
func (u *hostUser) shed(t *testing.T, stdin string, args ...string) result {
	t.Helper()
	return u.run(t, stdin, nil, u.shedBin, args...)
}

// mustShed runs the user's shed and fails the test unless it exits 0.
func (u *hostUser) mustShed(t *testing.T, args ...string) result {
	t.Helper()
	r := u.shed(t, "", args...)
	if r.code != 0 {
		t.Fatalf("%s: shed %s: exit %d\nstdout:\n%s\nstderr:\n%s", u.name, strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return r
}

// give writes content to name (under the user's home) as the user's, with mode.
func (u *hostUser) give(t *testing.T, name, content string, mode os.FileMode) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(name, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	for p := name; p != u.home && strings.HasPrefix(p, u.home); p = filepath.Dir(p) {
		if err := os.Lchown(p, u.uid, u.gid); err != nil {
			t.Fatal(err)
		}
	}
	return name
}

// pathInfo is what `shed store info --json` says of a path that the tests here compare.
type pathInfo struct {
	Path        string `json:"path"`
	ContentHash string `json:"content_hash"`
	BuildInputs []struct {
		Path    string `json:"path"`
		Present bool   `json:"present"`
	} `json:"build_inputs"`
}

func parseInfo(t *testing.T, who string, r result) pathInfo {
	t.Helper()
	var i pathInfo
	if err := json.Unmarshal([]byte(r.stdout), &i); r.code != 0 || err != nil || i.ContentHash == "" {
		t.Fatalf("%s: store info: exit %d %v\n%s%s", who, r.code, err, r.stdout, r.stderr)
	}
	return i
}

func parseRealize(t *testing.T, who string, r result) realizeJSON {
	t.Helper()
	var j realizeJSON
	if err := json.Unmarshal([]byte(r.stdout), &j); r.code != 0 || err != nil {
		t.Fatalf("%s: realize --json: exit %d %v\nstdout:\n%s\nstderr:\n%s", who, r.code, err, r.stdout, r.stderr)
	}
	return j
}

func baseNames(paths []string) []string {
	var b []string
	for _, p := range paths {
		b = append(b, filepath.Base(p))
	}
	return b
}

// manifestDiff is, for a failure's message, how two stores' manifests of one path differ: the lines
// only in a, then those only in b (the stores' own records, db/HA/HASH.manifest).
func manifestDiff(a, b, base string) string {
	read := func(root string) []string {
		hash := strings.SplitN(base, "-", 2)[0]
		data, err := os.ReadFile(filepath.Join(root, "db", hash[:2], hash+".manifest"))
		if err != nil {
			return []string{"(" + err.Error() + ")"}
		}
		return strings.Split(strings.TrimSpace(string(data)), "\n")
	}
	la, lb := read(a), read(b)
	var out []string
	for _, side := range []struct {
		sign     string
		from, in []string
	}{{"- ", la, lb}, {"+ ", lb, la}} {
		n := 0
		for _, l := range side.from {
			if !slices.Contains(side.in, l) {
				if n++; n <= 30 {
					out = append(out, side.sign+l)
				}
			}
		}
		if n > 30 {
			out = append(out, fmt.Sprintf("%s... %d lines in all", side.sign, n))
		}
	}
	return strings.Join(out, "\n")
}

// opaqueDirs lists the directories of a layer on disk whose xattr name (an overlayfs opaque mark)
// is "y", relative to the layer.
func opaqueDirs(t *testing.T, layer, name string) []string {
	t.Helper()
	var dirs []string
	err := filepath.WalkDir(layer, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		buf := make([]byte, 8)
		if n, err := unix.Lgetxattr(p, name, buf); err == nil && string(buf[:n]) == "y" {
			rel, _ := filepath.Rel(layer, p)
			dirs = append(dirs, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return dirs
}

// fileState is what a test compares of a file before and after something that must not touch it.
type fileState struct {
	content  string
	mode     uint32
	uid, gid uint32
	mtime    unix.Timespec
}

func stateOf(t *testing.T, name string) fileState {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(name, &st); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(name)
	return fileState{string(b), st.Mode, st.Uid, st.Gid, st.Mtim}
}

func ownerOf(t *testing.T, name string) (uid, gid uint32, mode fs.FileMode) {
	t.Helper()
	fi, err := os.Lstat(name)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	return st.Uid, st.Gid, fi.Mode()
}

// keyringAttack is a Bench's try at a key of the user's (argv: the user keyring's serial, the key's
// serial, the key's payload): in a session keyring of its own, link the user keyring (whose owner is
// the Bench root's uid, rootless) to possess its keys, then read the key. Exit 0 if it read it.
const keyringAttack = `my ($ukr, $key, $want) = @ARGV;
syscall(250, 1, 0);                                  # KEYCTL_JOIN_SESSION_KEYRING, anonymous
syscall(250, 8, $ukr + 0, -3);                       # KEYCTL_LINK the user keyring into the session
my $buf = "\0" x 256;
my $n = syscall(250, 11, $key + 0, $buf, 256);       # KEYCTL_READ
exit($n > 0 && substr($buf, 0, $n) eq $want ? 0 : 1);`

// hostileScript is what an attacker in a rootless Bench tries, one line of output per try
// ("NAME: refused" or "NAME: ESCAPED"); @USER@, @CANARY@, @KEYDESC@, @UKR@, @KEY@, @KEYDATA@ and
// @ATTACK@ are filled in.
const hostileScript = `try() { name=$1; shift; if ( "$@" ) >/dev/null 2>&1; then echo "$name: ESCAPED"; else echo "$name: refused"; fi; }
# The user's files: the canary ~/secret (0600, the user's: the Bench's root is the user's uid).
try home-visible test -e /home/@USER@
try find-canary grep -rqsF @CANARY@ / --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev
try init-cwd cat /proc/1/cwd/secret
try init-root ls /proc/1/root/
try init-environ cat /proc/1/environ
try inherited-fds sh -c 'for f in /proc/self/fd/*; do cat "$f/secret" && exit 0; done; exit 1'
try write-canary sh -c 'echo pwned > /proc/1/cwd/secret || echo pwned > /proc/1/root/home/@USER@/secret'
# The store's files (the user's and its subordinate ids' on disk: the Bench's ids).
try store-host-path sh -c 'for f in /home/@USER@/.local/share/toolshed/store/*/usr/bin/jq; do echo evil >> "$f" && exit 0; done; exit 1'
try store-from-mountinfo sh -c 'p=$(awk "\$5 == \"/run/shed/propose.sock\" {print \$4}" /proc/self/mountinfo); test -n "$p" || exit 1; for f in "${p%/benches/*}"/store/*/usr/bin/jq; do echo evil >> "$f" && exit 0; done; exit 1'
try open-by-handle perl -e 'exit(syscall(304, -100, 0, 0) == -1 && $! == 1 ? 1 : 0)'
try mount-tmpfs mount -t tmpfs none /mnt
try bind-root mount --bind / /mnt
try remount-suid mount -o remount,suid /
echo evil >> /usr/bin/jq && echo "append-jq: in the Bench's upper"
# Other namespaces.
try unshare-user unshare -U true
try unshare-net unshare -n true
# The user's keyring (the Bench's root is the user's uid on the host).
try proc-keys grep -qF @KEYDESC@ /proc/keys
try read-key perl -e 'my $b = "\0" x 256; my $n = syscall(250, 11, $ARGV[0] + 0, $b, 256); exit($n > 0 ? 0 : 1)' @KEY@
try link-user-keyring perl -e '@ATTACK@' @UKR@ @KEY@ @KEYDATA@
# The control socket of another of the user's Benches (running): an abstract socket of shed's network.
try control-socket perl -MSocket -e 'socket(my $s, AF_UNIX, SOCK_STREAM, 0) or exit 1; exit(connect($s, pack_sockaddr_un("\0@CONTROL@")) ? 0 : 1)'
# Init: trace it; signal it with what it must survive (KILL and STOP: the kernel; the rest: caught).
try ptrace-init perl -e 'exit(syscall(101, 16, 1, 0, 0) == 0 ? 0 : 1)'
for s in KILL STOP QUIT ABRT USR1 USR2 SEGV BUS FPE ILL TRAP SYS; do kill -$s 1 2>/dev/null; done
# A daemon that would outlive the Bench.
(setsid sleep 86421 </dev/null >/dev/null 2>&1 &)
sleep 0.3
echo done
`

// TestRootless: an ordinary user with subordinate ids, made by the test, runs shed with no root and
// no daemon, end to end: init makes a private store in ~/.local/share/toolshed; the jq example
// realizes from Debian's mirror (the seed built by mmdebstrap in shed's sandbox) to root's store
// paths and root's content hashes; jq runs in a Bench with no network, and realize --offline needs
// nothing; a hostile Bench reaches none of the user's files, keys or store, nor init; resource
// limits are refused, not ignored; the Workshop travels root's store → OCI layout → a second store
// of the user's (opaque directories included) and back; gc frees the .debs, and the store verifies.
func TestRootless(t *testing.T) {
	parallel(t) // see parallelTests in main_test.go: its own user, stores and files; the shared store only read
	requireRoot(t)
	requireRootless(t)
	u := newHostUser(t, "shed-rl-", true)
	store := filepath.Join(u.home, ".local", "share", "toolshed")

	// init: the user's store, private, the user's.
	r := u.mustShed(t, "init")
	if !strings.HasPrefix(r.stdout, "initialized store at "+store+"\n") {
		t.Errorf("init: %q, want the store at %s", r.stdout, store)
	}
	for _, d := range []string{filepath.Join(u.home, ".local"), filepath.Dir(store), store} {
		if uid, gid, mode := ownerOf(t, d); uid != uint32(u.uid) || gid != uint32(u.gid) || !mode.IsDir() {
			t.Errorf("%s: owner %d:%d, mode %v; want a directory of %d:%d", d, uid, gid, mode, u.uid, u.gid)
		}
	}
	if _, _, mode := ownerOf(t, store); mode.Perm() != 0o700 {
		t.Errorf("the store %s has mode %v, want 0700", store, mode.Perm())
	}
	// $XDG_DATA_HOME, when set, is the store's place instead.
	xdg := filepath.Join(u.home, "xdg")
	if r := u.run(t, "", []string{"XDG_DATA_HOME=" + xdg}, u.shedBin, "init"); r.code != 0 || !strings.HasPrefix(r.stdout, "initialized store at "+filepath.Join(xdg, "toolshed")+"\n") {
		t.Errorf("init with XDG_DATA_HOME=%s: exit %d\n%s%s", xdg, r.code, r.stdout, r.stderr)
	} else if uid, _, mode := ownerOf(t, filepath.Join(xdg, "toolshed")); uid != uint32(u.uid) || mode.Perm() != 0o700 {
		t.Errorf("%s/toolshed: owner %d, mode %v", xdg, uid, mode.Perm())
	}

	// The jq example in one of root's stores: root realizes it (its seed from the tests' seed cache,
	// root's build of it) and locks it; then the same recipe and lock in the user's home.
	recipe := string(must(os.ReadFile("../examples/jq/workshop.toml")))
	rootFile := writeFile(t, filepath.Join(t.TempDir(), "jq", "workshop.toml"), recipe)
	rootStore := seededRoot(t)
	rootJ := realize(t, rootStore, rootFile)
	lock := string(must(os.ReadFile(filepath.Join(filepath.Dir(rootFile), "workshop.lock"))))
	file := u.give(t, filepath.Join(u.home, "jq", "workshop.toml"), recipe, 0o644)
	u.give(t, filepath.Join(u.home, "jq", "workshop.lock"), lock, 0o644)

	// Realize rootless: the seed from the mirror (about 40 s), the layer from root's lock.
	r = u.shed(t, "", "--json", "realize", file)
	userJ := parseRealize(t, u.name, r)
	t.Logf("rootless realize: %s", strings.TrimSpace(r.stderr))
	if len(userJ.Layers) != 2 || !strings.HasSuffix(userJ.Layers[0], "-debian-bookworm") || !strings.HasSuffix(userJ.Layers[1], "-apt-curl-jq") || len(userJ.Fetched) == 0 {
		t.Fatalf("rootless realize: layers %v, fetched %d; want the seed and apt-curl-jq, built here", userJ.Layers, len(userJ.Fetched))
	}
	for _, p := range userJ.Layers {
		if !strings.HasPrefix(p, filepath.Join(store, "store")+"/") {
			t.Errorf("rootless layer %s is not in %s/store", p, store)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(u.home, "jq", "workshop.lock")); string(b) != lock {
		t.Errorf("realize changed the committed lock:\n%s", b)
	}
	// The user locks the recipe itself (apt's resolver in shed's sandbox, the mirror through the
	// proxy): root's lock, byte for byte.
	lockFile := u.give(t, filepath.Join(u.home, "jq-lock", "workshop.toml"), recipe, 0o644)
	if r := u.shed(t, "", "lock", lockFile); r.code != 0 {
		t.Errorf("lock as %s: exit %d\n%s", u.name, r.code, r.stderr)
	} else if b, _ := os.ReadFile(filepath.Join(filepath.Dir(lockFile), "workshop.lock")); string(b) != lock {
		t.Errorf("the user's lock differs from root's:\n%s\nroot's:\n%s", b, lock)
	}
	// Owners on disk: root's files of the seed are the user's, group shadow (42) its subordinate gid 42.
	if uid, gid, _ := ownerOf(t, filepath.Join(userJ.Layers[0], "etc", "shadow")); uid != uint32(u.uid) || uint64(gid) != u.subGID.start+41 {
		t.Errorf("the seed's /etc/shadow is %d:%d on disk; want %d:%d (the user, and its subordinate gid 42)", uid, gid, u.uid, u.subGID.start+41)
	}
	if uid, gid, _ := ownerOf(t, filepath.Join(userJ.Layers[1], "usr", "bin", "jq")); uid != uint32(u.uid) || gid != uint32(u.gid) {
		t.Errorf("the layer's /usr/bin/jq is %d:%d on disk; want the user's %d:%d", uid, gid, u.uid, u.gid)
	}

	// Same recipe, same hashes: root's store path names, and root's content hashes.
	if got, want := baseNames(userJ.Layers), baseNames(rootJ.Layers); !slices.Equal(got, want) {
		t.Errorf("store paths: rootless %v, root %v", got, want)
	}
	hashes := map[string]string{} // root's content hash of each layer, by base name
	for i, p := range rootJ.Layers {
		rootHash := parseInfo(t, "root", mustShed(t, rootStore, "store", "info", "--json", p)).ContentHash
		hashes[filepath.Base(p)] = rootHash
		if i >= len(userJ.Layers) {
			continue
		}
		userHash := parseInfo(t, u.name, u.mustShed(t, "store", "info", "--json", userJ.Layers[i])).ContentHash
		if userHash != rootHash {
			t.Errorf("%s: rootless content hash %s, root's %s; the manifests differ (- root, + rootless):\n%s",
				filepath.Base(p), userHash, rootHash, manifestDiff(rootStore, store, filepath.Base(p)))
		}
	}
	// On disk, each store keeps the opaque mark under the name its own overlays read: root's as
	// trusted.overlay.opaque, the user's as user.overlay.opaque (a userxattr overlay obeys no other).
	rootOpaque := opaqueDirs(t, rootJ.Layers[1], "trusted.overlay.opaque")
	if len(rootOpaque) == 0 {
		t.Logf("root's %s has no opaque directory: the opaque checks below compare nothing", filepath.Base(rootJ.Layers[1]))
	}
	if got := opaqueDirs(t, userJ.Layers[1], "user.overlay.opaque"); !slices.Equal(got, rootOpaque) {
		t.Errorf("directories marked user.overlay.opaque in the rootless layer:\n%v\nwant those root's marks trusted.overlay.opaque:\n%v", got, rootOpaque)
	}

	// jq in a Bench with no network, on stdin; realize --offline needs nothing more.
	if r := u.shed(t, `{"tools": ["jq", "curl"]}`, "bench", "run", "--net", "none", "-f", file, "--", "jq", "-c", ".tools | length"); r.code != 0 || r.stdout != "2\n" {
		t.Errorf("jq in a Bench: exit %d, stdout %q\n%s", r.code, r.stdout, r.stderr)
	}
	if j := parseRealize(t, u.name, u.shed(t, "", "--json", "realize", "--offline", file)); len(j.Built) != 0 || len(j.Fetched) != 0 || !slices.Equal(j.Layers, userJ.Layers) {
		t.Errorf("realize --offline: built %v, fetched %v, layers %v; want a cache hit", j.Built, j.Fetched, j.Layers)
	}

	// The recipe's network profile, through shed's proxy as for root: Debian's mirror (profile debian)
	// answers, a host the recipe does not allow gets the proxy's refusal.
	r = u.shed(t, "", "bench", "run", "-f", file, "--", "sh", "-c",
		"curl -s -o /dev/null -w '%{http_code} ' http://deb.debian.org/debian/dists/bookworm/Release; curl -s -o /dev/null -w '%{http_code}' http://example.com/")
	if r.code != 0 || r.stdout != "200 403" {
		t.Errorf("a Bench's network profile: exit %d, stdout %q (want \"200 403\": the mirror, then a refused host)\n%s", r.code, r.stdout, r.stderr)
	}

	// A hostile Bench.
	hostileBench(t, u, file)

	// SIGTERM to the shed the user started (the parent of the one in its user namespace) stops the
	// Bench as it does root's: passed on, "interrupted", exit 143, and the command is gone.
	cmd, cancel := u.command(t, "", nil, u.shedBin, "bench", "run", "--net", "none", "-f", file, "--", "sleep", "86422")
	defer cancel()
	var termErr bytes.Buffer
	cmd.Stderr = &termErr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	isSleep := func(_ string, argv []string) bool { return slices.Equal(argv, []string{"sleep", "86422"}) }
	for i := 0; i < 200 && len(procsWhere(isSleep)) == 0; i++ {
		time.Sleep(50 * time.Millisecond)
	}
	if len(procsWhere(isSleep)) == 0 {
		t.Fatalf("the Bench's sleep never started: %s", termErr.String())
	}
	cmd.Process.Signal(syscall.SIGTERM)
	cmd.Wait()
	if code := cmd.ProcessState.ExitCode(); code != 143 || !strings.Contains(termErr.String(), "shed: error: interrupted (SIGTERM)") {
		t.Errorf("SIGTERM to the user's shed: exit %d, stderr:\n%s\nwant 143 and interrupted (SIGTERM)", code, termErr.String())
	}
	for i := 0; i < 100 && len(procsWhere(isSleep)) > 0; i++ {
		time.Sleep(50 * time.Millisecond)
	}
	if left := procsWhere(isSleep); len(left) > 0 {
		t.Errorf("the Bench's command outlived its SIGTERMed shed:\n%s", strings.Join(left, "\n"))
	}

	// The same for a server (`shed mcp`, which runs in shed-serve): the process the user started is
	// the one that enters the user namespace, so the signal reaches the server, and none outlives it.
	mcp, cancelMCP := u.command(t, "", nil, u.shedBin, "mcp")
	defer cancelMCP()
	stdin, err := mcp.StdinPipe() // open: the server waits for requests
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	var mcpErr bytes.Buffer
	mcp.Stderr = &mcpErr
	if err := mcp.Start(); err != nil {
		t.Fatal(err)
	}
	isMCP := func(_ string, argv []string) bool { return slices.Equal(argv, []string{u.shedBin, "mcp"}) }
	for i := 0; i < 200 && len(procsWhere(isMCP)) < 2; i++ { // it and its copy in the user namespace
		time.Sleep(50 * time.Millisecond)
	}
	if n := len(procsWhere(isMCP)); n < 2 {
		t.Fatalf("shed mcp: %d processes, want it and its copy in the user namespace: %s", n, mcpErr.String())
	}
	mcp.Process.Signal(syscall.SIGTERM)
	mcp.Wait()
	if code := mcp.ProcessState.ExitCode(); code != 143 || !strings.Contains(mcpErr.String(), "shed: error: interrupted (SIGTERM)") {
		t.Errorf("SIGTERM to the user's shed mcp: exit %d, stderr:\n%s\nwant 143 and interrupted (SIGTERM)", code, mcpErr.String())
	}
	for i := 0; i < 100 && len(procsWhere(isMCP)) > 0; i++ {
		time.Sleep(50 * time.Millisecond)
	}
	if left := procsWhere(isMCP); len(left) > 0 {
		t.Errorf("shed mcp outlived its SIGTERM:\n%s", strings.Join(left, "\n"))
	}

	// Resource limits need root: refused, and the command does not run without them.
	for _, limit := range [][]string{{"--memory", "64M"}, {"--pids", "16"}} {
		args := append(append([]string{"bench", "run"}, limit...), "-f", file, "--", "sh", "-c", "echo ran")
		r := u.shed(t, "", args...)
		if r.code == 0 || strings.Contains(r.stdout, "ran") || !strings.Contains(r.stderr, "resource limits need root") ||
			!strings.Contains(r.stderr, limit[0]) || !strings.Contains(r.stderr, "shed: hint:") {
			t.Errorf("bench run %s %s as %s: exit %d, stdout %q\n%s\nwant a refusal naming %s", limit[0], limit[1], u.name, r.code, r.stdout, r.stderr, limit[0])
		}
	}

	// root's store → an OCI layout → a second store of the user's: root's hashes, opaque marks as
	// user.overlay.opaque, and a Bench works.
	layout := filepath.Join(u.shareDir, "root-layout")
	mustShed(t, rootStore, "export", "--oci", layout, rootFile)
	if out, err := exec.Command("chmod", "-R", "a+rX", layout).CombinedOutput(); err != nil {
		t.Fatalf("chmod: %v %s", err, out)
	}
	store2 := filepath.Join(u.home, "store2")
	u.mustShed(t, "--root", store2, "init")
	// The layout's seed is signed by the shared store that seededRoot's seed came from, its layer by rootStore.
	u.mustShed(t, "--root", store2, "key", "trust", strings.TrimSpace(mustShed(t, rootStore, "key", "export").stdout))
	u.mustShed(t, "--root", store2, "key", "trust", seedCache.key)
	if r := u.shed(t, "", "--root", store2, "import", layout); r.code != 0 {
		t.Errorf("import root's export into %s: exit %d\n%s%s", store2, r.code, r.stdout, r.stderr)
	} else {
		for _, p := range rootJ.Layers {
			base := filepath.Base(p)
			if got := parseInfo(t, u.name, u.mustShed(t, "--root", store2, "store", "info", "--json", base)).ContentHash; got != hashes[base] {
				t.Errorf("%s imported from root's store: content hash %s, root's %s", base, got, hashes[base])
			}
		}
		if got := opaqueDirs(t, filepath.Join(store2, "store", filepath.Base(rootJ.Layers[1])), "user.overlay.opaque"); !slices.Equal(got, rootOpaque) {
			t.Errorf("directories marked user.overlay.opaque after the import:\n%v\nwant root's opaque ones:\n%v", got, rootOpaque)
		}
		if r := u.shed(t, "", "--root", store2, "bench", "run", "--net", "none", "-f", file, "--", "jq", "--version"); r.code != 0 || !strings.HasPrefix(r.stdout, "jq-1.6") {
			t.Errorf("jq --version in a Bench of the imported Workshop: exit %d %q\n%s", r.code, r.stdout, r.stderr)
		}
		if r := u.shed(t, "", "--root", store2, "store", "verify", "--check-contents"); r.code != 0 || !strings.Contains(r.stdout, " 0 problems") {
			t.Errorf("store verify of %s: exit %d\n%s%s", store2, r.code, r.stdout, r.stderr)
		}
	}
	// And back: the user's store → an OCI layout in its home → a new store of root's.
	userLayout := filepath.Join(u.home, "oci")
	u.mustShed(t, "export", "--oci", userLayout, file)
	back := newRoot(t)
	mustShed(t, back, "key", "trust", strings.TrimSpace(u.mustShed(t, "key", "export").stdout))
	if r := shed(t, back, nil, "import", userLayout); r.code != 0 {
		t.Errorf("import the user's export into root's store: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	} else {
		for _, p := range userJ.Layers {
			base := filepath.Base(p)
			if got := parseInfo(t, "root", mustShed(t, back, "store", "info", "--json", base)).ContentHash; got != hashes[base] {
				t.Errorf("%s imported from the user's store into root's: content hash %s, root's own build %s", base, got, hashes[base])
			}
		}
		if got := opaqueDirs(t, filepath.Join(back, "store", filepath.Base(userJ.Layers[1])), "trusted.overlay.opaque"); !slices.Equal(got, rootOpaque) {
			t.Errorf("directories marked trusted.overlay.opaque in root's store after the import:\n%v\nwant:\n%v", got, rootOpaque)
		}
		mustShed(t, back, "store", "verify", "--check-contents")
		if r := shed(t, back, nil, "bench", "run", "--net", "none", "-f", rootFile, "--", "jq", "--version"); r.code != 0 || !strings.HasPrefix(r.stdout, "jq-1.6") {
			t.Errorf("jq --version in root's Bench of the user's Workshop: exit %d %q\n%s", r.code, r.stdout, r.stderr)
		}
	}

	// The user's store → a registry (on loopback) → a root store that trusts the user's key, which
	// substitutes the Workshop rather than building it.
	reg := startRegistry(t, "")
	if r := u.shed(t, "", "--json", "copy", "--to", reg.url("rootless/cache"), file); r.code != 0 || !strings.Contains(r.stdout, `"pushed"`) {
		t.Errorf("copy --to a registry as %s: exit %d\n%s%s", u.name, r.code, r.stdout, r.stderr)
	} else {
		pulled := newRoot(t)
		mustShed(t, pulled, "key", "trust", strings.TrimSpace(u.mustShed(t, "key", "export").stdout))
		j := realize(t, pulled, rootFile, "--offline", "--substituter", reg.url("rootless/cache"))
		if len(j.Built) != 0 || !slices.Equal(baseNames(j.Layers), baseNames(userJ.Layers)) {
			t.Errorf("realize from the user's cache: built %v, layers %v", j.Built, j.Layers)
		}
		for _, p := range j.Layers {
			if got := parseInfo(t, "root", mustShed(t, pulled, "store", "info", "--json", p)).ContentHash; got != hashes[filepath.Base(p)] {
				t.Errorf("%s substituted from the user's cache: content hash %s, root's %s", filepath.Base(p), got, hashes[filepath.Base(p)])
			}
		}
		mustShed(t, pulled, "store", "verify", "--check-contents")
	}

	// gc frees the build inputs (files of the subordinate ids, removed in U); what is left verifies
	// and is still all a realize needs.
	var gc struct {
		Locations []string `json:"locations"` // the deleted paths, where they were
		Freed     int64    `json:"freed"`
	}
	r = u.mustShed(t, "--json", "gc")
	if err := json.Unmarshal([]byte(r.stdout), &gc); err != nil {
		t.Fatalf("gc --json: %v\n%s", err, r.stdout)
	}
	for _, deb := range userJ.Fetched {
		if !slices.Contains(gc.Locations, deb) {
			t.Errorf("gc did not delete %s", deb)
		}
		if _, err := os.Lstat(deb); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s is still on disk after gc: %v", deb, err)
		}
	}
	if gc.Freed <= 0 {
		t.Errorf("gc freed %d bytes", gc.Freed)
	}
	for _, in := range parseInfo(t, u.name, u.mustShed(t, "store", "info", "--json", userJ.Layers[1])).BuildInputs {
		if in.Present {
			t.Errorf("build input %s is present after gc", in.Path)
		}
	}
	for _, p := range userJ.Layers {
		if _, err := os.Lstat(filepath.Join(p, "usr")); err != nil {
			t.Errorf("gc removed a layer of the Workshop: %v", err)
		}
	}
	if r := u.shed(t, "", "store", "verify"); r.code != 0 || !strings.Contains(r.stdout, " 0 problems") {
		t.Errorf("store verify after gc: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if j := parseRealize(t, u.name, u.shed(t, "", "--json", "realize", "--offline", file)); len(j.Built) != 0 || !slices.Equal(j.Layers, userJ.Layers) {
		t.Errorf("realize --offline after gc: built %v, layers %v", j.Built, j.Layers)
	}

	// Nothing of the user's keeps running once its commands have returned.
	left := u.procs()
	for i := 0; i < 100 && len(left) > 0; i++ {
		time.Sleep(100 * time.Millisecond)
		left = u.procs()
	}
	if len(left) > 0 {
		t.Errorf("processes of %s (or its subordinate ids) outlived its commands:\n%s", u.name, strings.Join(left, "\n"))
	}
}

// hostileBench runs, rootless, what an attacker in a Bench would try against the user: read or
// change the canary ~/secret, read a key of the user's keyring, write the store's files, trace or
// kill init, mount, make a user namespace, leave a daemon. Each try is refused; then the canary,
// the host's sentinel files and the store are as they were, and no process is left.
func hostileBench(t *testing.T, u *hostUser, file string) {
	tag := make([]byte, 6)
	rand.Read(tag)
	canary := "shed-rootless-canary-" + hex.EncodeToString(tag)
	secret := u.give(t, filepath.Join(u.home, "secret"), canary+"\n", 0o600)
	canaryBefore := stateOf(t, secret)
	sentinels := newSentinels(t)

	// A key in the user's user keyring (perl's syscall: the host has perl-base, the seed too), and
	// the control: the same attack as the user on the host reads it.
	keyDesc, keyData := "shed-rootless-key-"+hex.EncodeToString(tag), "shed-rootless-keydata-"+hex.EncodeToString(tag)
	r := u.run(t, "", nil, "perl", "-e", `my ($t, $d, $p) = ("user", @ARGV);
my $k = syscall(248, $t, $d, $p, length($p), -4);     # add_key to KEY_SPEC_USER_KEYRING
my $u = syscall(250, 0, -4, 1);                       # KEYCTL_GET_KEYRING_ID
die "keyctl: $!\n" if $k < 0 || $u < 0;
print "$u $k\n";`, keyDesc, keyData)
	ids := strings.Fields(r.stdout)
	if r.code != 0 || len(ids) != 2 {
		t.Fatalf("add a key to %s's keyring: exit %d %q %s", u.name, r.code, r.stdout, r.stderr)
	}
	// KEYCTL_INVALIDATE the key, KEYCTL_CLEAR the user keyring: keyrings outlive the user, and its uid
	// will be another's.
	t.Cleanup(func() { u.run(t, "", nil, "perl", "-e", `syscall(250, 21, $ARGV[0] + 0); syscall(250, 7, -4)`, ids[1]) })
	if r := u.run(t, "", nil, "perl", "-e", keyringAttack, ids[0], ids[1], keyData); r.code != 0 {
		t.Fatalf("control: the keyring attack fails even as %s on the host: exit %d %s", u.name, r.code, r.stderr)
	}

	// Another Bench of the user's, running, whose control socket the hostile one looks for; the
	// control: the user reaches it from the host.
	holder, cancelHolder := u.command(t, "", nil, u.shedBin, "bench", "run", "--net", "none", "--name", "rl-holder", "-f", file, "--", "sleep", "86423")
	defer cancelHolder()
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { holder.Process.Signal(syscall.SIGTERM); holder.Wait() }()
	var control string
	for i := 0; i < 200 && control == ""; i++ {
		var benches []struct{ ID, Name string }
		if json.Unmarshal([]byte(u.shed(t, "", "--json", "bench", "ls").stdout), &benches) == nil {
			for _, b := range benches {
				if b.Name == "rl-holder" {
					control = bench.AbstractControl(uint32(u.uid), b.ID)
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	if control == "" {
		t.Fatal("the holder Bench never showed in bench ls")
	}
	connect := `socket(my $s, AF_UNIX, SOCK_STREAM, 0) or exit 1; exit(connect($s, pack_sockaddr_un("\0` + control + `")) ? 0 : 1)`
	for i := 0; ; i++ {
		if r := u.run(t, "", nil, "perl", "-MSocket", "-e", connect); r.code == 0 {
			break
		} else if i == 100 {
			t.Fatalf("control: the user cannot reach the holder Bench's control socket @%s from the host: %s", control, r.stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}

	script := strings.NewReplacer("@USER@", u.name, "@CANARY@", canary, "@KEYDESC@", keyDesc, "@UKR@", ids[0],
		"@KEY@", ids[1], "@KEYDATA@", keyData, "@ATTACK@", keyringAttack, "@CONTROL@", control).Replace(hostileScript)
	r = u.shed(t, "", "bench", "run", "--net", "none", "-f", file, "--", "sh", "-c", script)
	t.Logf("tries from a rootless Bench (exit %d):\n%s%s", r.code, r.stdout, r.stderr)
	lines := strings.Split(r.stdout, "\n")
	for _, m := range regexp.MustCompile(`(?m)^try ([a-z0-9-]+) `).FindAllStringSubmatch(hostileScript, -1) {
		if !slices.Contains(lines, m[1]+": refused") {
			t.Errorf("a rootless Bench: %s was not refused", m[1])
		}
	}
	if r.code != 0 || !strings.HasSuffix(r.stdout, "done\n") || strings.Contains(r.stderr, "goroutine ") {
		t.Errorf("the hostile Bench did not run to its end (init must survive its signals): exit %d\n%s", r.code, r.stderr)
	}

	// Stdout to a file of the user's: the Bench gets a pipe, and its chmod of fd 1 (a setuid copy of a
	// shell, runnable by every user as the user) changes nothing of the file's.
	outFile := u.give(t, filepath.Join(u.home, "out.bin"), "", 0o644)
	f, err := os.OpenFile(outFile, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	cmd, cancel := u.command(t, "", nil, u.shedBin, "bench", "run", "--net", "none", "-f", file, "--", "sh", "-c", "cat /bin/dash; chmod 4755 /proc/self/fd/1; chown 0:0 /proc/self/fd/1")
	cmd.Stdout = f
	err = cmd.Run()
	cancel()
	f.Close()
	if uid, _, mode := ownerOf(t, outFile); err != nil || mode != 0o644 || uid != uint32(u.uid) {
		t.Errorf("a Bench's stdout file: %v, mode %v, owner %d; want the user's 0644 file unchanged", err, mode, uid)
	}
	if fi, err := os.Stat(outFile); err != nil || fi.Size() == 0 {
		t.Errorf("the Bench's output did not reach its file: %v", err)
	}

	// A signal Go would turn into a crash, sent by kill: init catches it (no stack dump on the user's
	// terminal) and the command goes on.
	if r := u.shed(t, "", "bench", "run", "--net", "none", "-f", file, "--", "sh", "-c", "kill -SEGV 1; kill -BUS 1; sleep 0.3; echo survived"); r.code != 0 || r.stdout != "survived\n" || strings.Contains(r.stderr, "goroutine ") {
		t.Errorf("kill -SEGV 1 and -BUS 1 from the command: exit %d, stdout %q\n%s", r.code, r.stdout, r.stderr)
	}

	// The effects: none on the canary, the host, the store; no process left.
	if now := stateOf(t, secret); now != canaryBefore {
		t.Errorf("the user's ~/secret changed:\nbefore %+v\nafter  %+v", canaryBefore, now)
	}
	sentinels.check(t)
	if r := u.shed(t, "", "store", "verify", "--check-contents"); r.code != 0 || !strings.Contains(r.stdout, " 0 problems") {
		t.Errorf("store verify after the hostile Bench: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := u.shed(t, "", "bench", "run", "--net", "none", "-f", file, "--", "sh", "-c", `jq --version && test "$(tail -c 5 /usr/bin/jq)" != evil`); r.code != 0 || !strings.HasPrefix(r.stdout, "jq-1.6\n") {
		t.Errorf("a Bench after the hostile one: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if left := procsWhere(func(_ string, argv []string) bool { return slices.Equal(argv, []string{"sleep", "86421"}) }); len(left) > 0 {
		t.Errorf("the hostile Bench's daemon outlived it:\n%s", strings.Join(left, "\n"))
	}
}

// TestRootlessNoSubIDs: a user with no subordinate ids gets one error and one hint that names the
// usermod command and a free range, exit 1, and nothing is made; in --json too. Commands that need
// no store still work.
func TestRootlessNoSubIDs(t *testing.T) {
	parallel(t) // see parallelTests in main_test.go: its own user; no store
	requireRoot(t)
	requireRootless(t)
	u := newHostUser(t, "shed-rl0-", false)
	homeBefore := dirNames(t, u.home)
	hint := regexp.MustCompile("`usermod --add-subuids (\\d+)-(\\d+) --add-subgids (\\d+)-(\\d+) " + regexp.QuoteMeta(u.name) + "`")

	// checkHint: the hint's range is 65536 ids that no line of /etc/subuid or /etc/subgid has (read
	// while no test here changes them), nor root's sandbox pool.
	checkHint := func(form, text string) {
		t.Helper()
		m := hint.FindStringSubmatch(text)
		if m == nil {
			t.Errorf("%s: the hint names no `usermod --add-subuids A-B --add-subgids A-B %s`:\n%s", form, u.name, text)
			return
		}
		for i, file := range []string{"/etc/subuid", "/etc/subgid"} {
			lo, _ := strconv.ParseUint(m[1+2*i], 10, 32)
			hi, _ := strconv.ParseUint(m[2+2*i], 10, 32)
			r := idRange{lo, hi - lo + 1}
			if hi < lo || r.count != 65536 {
				t.Errorf("%s: the hint's range %d-%d in %s is not 65536 ids", form, lo, hi, file)
			}
			_, others := subIDLines(t, file, u.name)
			for _, o := range append(others, sandboxPool) {
				if r.overlaps(o) {
					t.Errorf("%s: the hint's range %d-%d overlaps %v (%s or root's sandbox ids)", form, lo, hi, o, file)
				}
			}
		}
	}

	for _, args := range [][]string{{"init"}, {"store", "verify"}} {
		subIDsMu.Lock()
		r := u.shed(t, "", args...)
		checkHint(strings.Join(args, " "), r.stderr)
		subIDsMu.Unlock()
		lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
		want := "shed: error: " + u.name + " has 0 subordinate ids in /etc/subuid, and shed without root needs 65535"
		if r.code != 1 || r.stdout != "" || len(lines) != 2 || !strings.HasPrefix(lines[0], want) ||
			!strings.HasPrefix(lines[1], "shed: hint: as root, give "+u.name+" a range of 65536 ids") || !strings.Contains(lines[1], "usermod --add-subuids") {
			t.Errorf("shed %s as %s: exit %d, stdout %q, stderr:\n%s\nwant exit 1 and two lines: %q... and a hint with usermod --add-subuids",
				strings.Join(args, " "), u.name, r.code, r.stdout, r.stderr, want)
		}
	}

	// --json: one object on stderr.
	subIDsMu.Lock()
	r := u.shed(t, "", "--json", "init")
	subIDsMu.Unlock()
	var j struct {
		Error, Hint, Code string
		Exit              int
	}
	if err := json.Unmarshal([]byte(r.stderr), &j); err != nil || r.code != 1 || r.stdout != "" || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 ||
		!strings.Contains(j.Error, u.name+" has 0 subordinate ids") || !strings.Contains(j.Hint, "usermod --add-subuids") || j.Code != "failed" || j.Exit != 1 {
		t.Errorf("--json init as %s: exit %d, stdout %q, stderr %q (%v)", u.name, r.code, r.stdout, r.stderr, err)
	}

	// Nothing was made: no store, nothing new in the home.
	if _, err := os.Lstat(filepath.Join(u.home, ".local", "share", "toolshed")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a store exists after the refusal: %v", err)
	}
	if now := dirNames(t, u.home); !slices.Equal(now, homeBefore) {
		t.Errorf("the home changed: %v, was %v", now, homeBefore)
	}

	// What needs no store needs no user namespace either.
	f := u.give(t, filepath.Join(u.home, "jq", "workshop.toml"), string(must(os.ReadFile("../examples/jq/workshop.toml"))), 0o644)
	for _, args := range [][]string{{"--version"}, {"recipe", "check", f}} {
		if r := u.shed(t, "", args...); r.code != 0 {
			t.Errorf("shed %s as %s: exit %d\n%s%s", strings.Join(args, " "), u.name, r.code, r.stdout, r.stderr)
		}
	}
}

// dirNames lists a directory's entries.
func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}
