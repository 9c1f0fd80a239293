package sandbox_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"toolshed.dev/shed/sandbox"
)

func TestInitIsPid1(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	r := run(t, readOnlySpec(t, "sh", "-c", `echo $$ $PPID; tr '\0' ' ' < /proc/1/cmdline; echo; cat /proc/1/comm`))
	f := strings.Fields(r.stdout)
	if len(f) != 4 {
		t.Fatalf("got %q, want pid, ppid, init's cmdline and comm", r.stdout)
	}
	// The command is init's child; it is not pid 2 because init's Go runtime threads take the first
	// thread ids of the namespace.
	if f[0] == "1" || f[1] != "1" {
		t.Errorf("got pid %s ppid %s, want the command not to be pid 1 and its parent to be pid 1", f[0], f[1])
	}
	if f[2] != "shed-sandbox-init" || f[3] != "shed-sandbox" {
		t.Errorf("got pid 1 %q (comm %q), want shed-sandbox-init", f[2], f[3])
	}
}

func TestHostname(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	spec := readOnlySpec(t, "hostname")
	if got := run(t, spec).stdout; got != "shed\n" {
		t.Errorf("default: got %q, want %q", got, "shed\n")
	}
	spec.Hostname = "bench-7"
	if got := run(t, spec).stdout; got != "bench-7\n" {
		t.Errorf("got %q, want %q", got, "bench-7\n")
	}
}

func TestCredentials(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	spec := readOnlySpec(t, "sh", "-c", "id -u; id -g; id -G")
	spec.UID, spec.GID = 1234, 5678
	if got, want := run(t, spec).stdout, "1234\n5678\n5678\n"; got != want {
		t.Errorf("got %q, want %q (uid, gid, no supplementary groups)", got, want)
	}
	spec.UID, spec.GID = 0, 0
	if got, want := run(t, spec).stdout, "0\n0\n0\n"; got != want {
		t.Errorf("root: got %q, want %q", got, want)
	}
}

func TestEnvIsExact(t *testing.T) {
	requireRoot(t)
	t.Setenv("SHED_TEST_LEAK", "host value") // must not reach the sandbox
	spec := readOnlySpec(t, "env")
	spec.Env = []string{"PATH=/bin", "A=1", "B=two words"}
	got := strings.Split(strings.TrimSpace(run(t, spec).stdout), "\n")
	slices.Sort(got)
	want := slices.Sorted(slices.Values(spec.Env))
	if !slices.Equal(got, want) {
		t.Errorf("got env %q, want exactly %q", got, want)
	}
}

func TestDir(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	spec := readOnlySpec(t, "pwd")
	if got := run(t, spec).stdout; got != "/\n" {
		t.Errorf("default: got %q, want /", got)
	}
	spec.Dir = "/etc"
	if got := run(t, spec).stdout; got != "/etc\n" {
		t.Errorf("got %q, want /etc", got)
	}
	spec.Dir = "/nonexistent"
	_, err := sandbox.Run(context.Background(), spec, sandbox.Stdio{})
	wantSetupError(t, err, "chdir", "/nonexistent", unix.ENOENT)
}

func TestExitCodes(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	for _, tc := range []struct {
		script string
		want   int
	}{
		{"exit 0", 0},
		{"exit 7", 7},
		{"exit 255", 255},
		{"kill -9 $$", 128 + 9},
		{"kill -TERM $$", 128 + 15},
	} {
		if got := run(t, readOnlySpec(t, "sh", "-c", tc.script)).code; got != tc.want {
			t.Errorf("%s: got exit code %d, want %d", tc.script, got, tc.want)
		}
	}
}

func TestExecErrors(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	spec := readOnlySpec(t, "no-such-command")
	_, err := sandbox.Run(context.Background(), spec, sandbox.Stdio{})
	wantSetupError(t, err, "exec", "no-such-command", unix.ENOENT)

	spec = readOnlySpec(t, "/bin/no-such-command")
	_, err = sandbox.Run(context.Background(), spec, sandbox.Stdio{})
	wantSetupError(t, err, "exec", "/bin/no-such-command", unix.ENOENT)

	spec = readOnlySpec(t, "sh", "-c", "true")
	spec.Env = nil // no PATH to look "sh" up in
	_, err = sandbox.Run(context.Background(), spec, sandbox.Stdio{})
	wantSetupError(t, err, "exec", "sh", unix.ENOENT)

	spec = readOnlySpec(t, "/etc/which") // not executable
	_, err = sandbox.Run(context.Background(), spec, sandbox.Stdio{})
	wantSetupError(t, err, "exec", "/etc/which", unix.EACCES)
}

func TestInvalidSpecIsRefusedByStart(t *testing.T) {
	spec := readOnlySpecNoRoot("sh")
	spec.Binds = []sandbox.Bind{{Source: "/tmp", Target: "/proc/x"}}
	_, err := sandbox.Start(context.Background(), spec, sandbox.Stdio{})
	var se *sandbox.SpecError
	if !errors.As(err, &se) || se.Field != "binds[0].target" {
		t.Fatalf("got %v, want a SpecError on binds[0].target", err)
	}
}

func readOnlySpecNoRoot(argv ...string) *sandbox.Spec {
	return &sandbox.Spec{Root: sandbox.Root{Lowers: []string{"/nonexistent/a", "/nonexistent/b"}}, Argv: argv}
}

func TestStdio(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	// A reader that is not a file goes through a pipe; an *os.File is passed as is.
	out, err := os.Create(filepath.Join(t.TempDir(), "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	var errb bytes.Buffer
	spec := readOnlySpec(t, "sh", "-c", "cat; echo to-stderr >&2")
	code, err := sandbox.Run(context.Background(), spec, sandbox.Stdio{Stdin: strings.NewReader("from stdin\n"), Stdout: out, Stderr: &errb})
	if err != nil || code != 0 {
		t.Fatalf("got %d, %v", code, err)
	}
	if b, _ := os.ReadFile(out.Name()); string(b) != "from stdin\n" {
		t.Errorf("stdout: got %q, want %q", b, "from stdin\n")
	}
	if errb.String() != "to-stderr\n" {
		t.Errorf("stderr: got %q", errb.String())
	}
	// nil stdin reads as empty, nil stdout and stderr discard.
	spec = readOnlySpec(t, "sh", "-c", `test "$(cat)" = "" && echo discarded`)
	if code, err := sandbox.Run(context.Background(), spec, sandbox.Stdio{}); err != nil || code != 0 {
		t.Errorf("nil stdio: got %d, %v", code, err)
	}
}

func TestMounts(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	r := run(t, readOnlySpec(t, "sh", "-c", `cat /proc/mounts; ls -l /dev; ls -ld /tmp /run`))
	for _, want := range []string{
		" /proc proc rw,nosuid,nodev,noexec",
		" /dev tmpfs rw,nosuid,noexec",
		" /dev/pts devpts rw,nosuid,noexec",
		" /dev/shm tmpfs rw,nosuid,nodev,noexec",
		" /tmp tmpfs rw,nosuid,nodev",
		" /run tmpfs rw,nosuid,nodev",
		"crw-rw-rw-    1 0        0           1,   3", // null
		"crw-rw-rw-    1 0        0           1,   9", // urandom
		"crw-rw-rw-    1 0        0           5,   0", // tty
		"ptmx -> pts/ptmx",
		"fd -> /proc/self/fd",
		"drwxrwxrwt", // /tmp 1777
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("missing %q in:\n%s", want, r.stdout)
		}
	}
	if strings.Contains(r.stdout, " /sys ") {
		t.Errorf("/sys is mounted:\n%s", r.stdout)
	}
	// The root is a read-only overlay of the two lowers, nosuid and nodev.
	if !strings.Contains(r.stdout, "overlay / overlay ro,nosuid,nodev,") {
		t.Errorf("root is not a read-only nosuid,nodev overlay:\n%s", r.stdout)
	}
}

func TestDevicesWork(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	script := `echo x > /dev/null && head -c 4 /dev/zero | wc -c && head -c 5 /dev/urandom | wc -c && ls /dev/pts/ptmx`
	r := run(t, readOnlySpec(t, "sh", "-c", script))
	if r.code != 0 || r.stdout != "4\n5\n/dev/pts/ptmx\n" {
		t.Errorf("got %d %q %q", r.code, r.stdout, r.stderr)
	}
}

func TestOverlayWritesGoToUpper(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	spec, upper := writableSpec(t, "sh", "-c", "echo new > /etc/new && rm /etc/lowerfile && echo scratch > /tmp/s && echo run > /run/r")
	if r := run(t, spec); r.code != 0 {
		t.Fatalf("got %d: %s", r.code, r.stderr)
	}
	if b, err := os.ReadFile(filepath.Join(upper, "etc/new")); err != nil || string(b) != "new\n" {
		t.Errorf("upper/etc/new: got %q, %v", b, err)
	}
	for _, l := range busyboxLowers(t) {
		if _, err := os.Lstat(filepath.Join(l, "etc/new")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s/etc/new: got %v, want no such file: a lower was written", l, err)
		}
	}
	// A deleted lower file is a whiteout: a character device 0:0.
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(upper, "etc/lowerfile"), &st); err != nil {
		t.Fatalf("whiteout: %v", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Errorf("upper/etc/lowerfile: got mode %o rdev %d, want a 0:0 character device", st.Mode, st.Rdev)
	}
	if _, err := os.Stat(filepath.Join(busyboxLowers(t)[0], "etc/lowerfile")); err != nil {
		t.Errorf("the lower's file is gone: %v", err)
	}
	// /tmp and /run are tmpfs: nothing of them in the upper.
	ents, _ := os.ReadDir(upper)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if !slices.Equal(names, []string{"etc"}) {
		t.Errorf("upper holds %q, want only etc", names)
	}
}

func TestOverlayLowerOrder(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	// Lowers are bottom first: the top lower's /etc/which wins.
	r := run(t, readOnlySpec(t, "cat", "/etc/which", "/etc/toponly"))
	if r.stdout != "top\ntop only\n" {
		t.Errorf("got %q, want the top layer's files", r.stdout)
	}
	ls := busyboxLowers(t)
	// Only the bottom lower: no /etc/toponly, and /etc/which from the bottom (single lower: a bind).
	spec := readOnlySpec(t, "cat", "/etc/which")
	spec.Root.Lowers = ls[:1]
	if r := run(t, spec); r.stdout != "bottom\n" {
		t.Errorf("single lower: got %q, want bottom", r.stdout)
	}
}

func TestReadOnlyRoot(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	for _, lowers := range [][]string{busyboxLowers(t), busyboxLowers(t)[:1]} {
		spec := readOnlySpec(t, "sh", "-c", "echo x > /etc/x; echo $?; echo y > /tmp/y && echo tmp-ok")
		spec.Root.Lowers = lowers
		r := run(t, spec)
		if r.stdout != "1\ntmp-ok\n" || !strings.Contains(r.stderr, "Read-only file system") {
			t.Errorf("%d lowers: got %q %q, want EROFS on /etc and a writable /tmp", len(lowers), r.stdout, r.stderr)
		}
	}
}

func TestManyLowers(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	// 300 lowers with long absolute paths: far beyond the 4 KiB of legacy mount options.
	base := filepath.Join(t.TempDir(), strings.Repeat("long-directory-name-", 3))
	lowers := []string{busyboxLowers(t)[0]}
	for i := 1; i < 300; i++ {
		d := filepath.Join(base, fmt.Sprintf("layer-%03d", i))
		if err := os.MkdirAll(filepath.Join(d, "etc"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "etc", fmt.Sprintf("f%03d", i)), []byte(strconv.Itoa(i)), 0o644); err != nil {
			t.Fatal(err)
		}
		// Each layer also shadows /etc/which: the last one must win.
		if err := os.WriteFile(filepath.Join(d, "etc/which"), []byte(strconv.Itoa(i)), 0o644); err != nil {
			t.Fatal(err)
		}
		lowers = append(lowers, d)
	}
	if n := len(strings.Join(lowers, ":")); n < 8192 {
		t.Fatalf("lowerdir would be only %d bytes; the test must exceed a page", n)
	}
	spec := readOnlySpec(t, "sh", "-c", "cat /etc/f001 /etc/f150 /etc/f299; echo; cat /etc/which; echo; ls /etc | wc -l")
	spec.Root.Lowers = lowers
	r := run(t, spec)
	if want := "1150299\n299\n301\n"; r.stdout != want { // 299 files, which, lowerfile
		t.Errorf("got %q, want %q (stderr %q)", r.stdout, want, r.stderr)
	}
}

func TestMissingMountPoint(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	// A root without /run: the sandbox refuses rather than create /run in the upper.
	bare := t.TempDir()
	for _, d := range []string{"proc", "dev", "tmp"} {
		if err := os.Mkdir(filepath.Join(bare, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	spec, upper := writableSpec(t, "/bin/true")
	spec.Root.Lowers = []string{busyboxLowers(t)[0], bare}
	// busybox's bottom layer has /run: hide it with an opaque-free trick, a lower whose /run is a file.
	if err := os.WriteFile(filepath.Join(bare, "run"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := sandbox.Run(context.Background(), spec, sandbox.Stdio{})
	wantSetupError(t, err, "mount tmpfs", "/run", unix.ENOTDIR)
	if ents, _ := os.ReadDir(upper); len(ents) != 0 {
		t.Errorf("upper is not empty after a failed setup: %d entries", len(ents))
	}
}

func TestOverlaySetupError(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	spec := readOnlySpec(t, "/bin/true")
	missing := filepath.Join(t.TempDir(), "missing")
	spec.Root.Lowers = []string{busyboxLowers(t)[0], missing}
	_, err := sandbox.Run(context.Background(), spec, sandbox.Stdio{})
	se := wantSetupError(t, err, "mount overlay", missing, unix.ENOENT)
	if se != nil && !strings.Contains(se.Detail, "root.lowers[1]") {
		t.Errorf("detail %q does not name root.lowers[1]", se.Detail)
	}
}

func TestBinds(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	ro, rw := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(ro, "in"), []byte("input\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(file, []byte("nameserver 127.0.0.1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	spec, upper := writableSpec(t, "sh", "-c", `
		cat /run/in/in
		echo x > /run/in/new; echo "ro write: $?"
		echo output > /run/deep/out/made && echo rw-ok
		cat /tmp/resolv.conf
		grep -E ' /run/(in|deep/out) ' /proc/mounts`)
	spec.Binds = []sandbox.Bind{
		{Source: ro, Target: "/run/in"},
		{Source: rw, Target: "/run/deep/out", Writable: true, IDs: sandbox.IDsSandbox},
		{Source: file, Target: "/tmp/resolv.conf"},
	}
	r := run(t, spec)
	for _, want := range []string{"input\n", "ro write: 1\n", "rw-ok\n", "nameserver 127.0.0.1\n",
		" /run/in ext4 ro,nosuid,nodev", " /run/deep/out ext4 rw,nosuid,nodev"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("missing %q in stdout:\n%s", want, r.stdout)
		}
	}
	if !strings.Contains(r.stderr, "Read-only file system") {
		t.Errorf("read-only bind: stderr %q, want EROFS", r.stderr)
	}
	if b, err := os.ReadFile(filepath.Join(rw, "made")); err != nil || string(b) != "output\n" {
		t.Errorf("writable bind: host file %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(ro, "new")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("read-only bind was written: %v", err)
	}
	// Targets under /run and /tmp are created on tmpfs: the upper stays empty.
	if ents, _ := os.ReadDir(upper); len(ents) != 0 {
		t.Errorf("upper has %d entries, want none", len(ents))
	}
}

// TestBindIDs: how a bind's host owners appear inside, and whose files the sandbox's writes are.
func TestBindIDs(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	// dirs: root's (0755), anyone's (1777), and a user's (1000:1000), each with a file of root's.
	mk := func(mode os.FileMode, uid int) string {
		d := t.TempDir()
		if err := os.WriteFile(filepath.Join(d, "roots"), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(d, uid, uid); err != nil {
			t.Fatal(err)
		}
		return d
	}
	owner := func(p string) string {
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err.Error()
		}
		return fmt.Sprintf("%d:%d", st.Uid, st.Gid)
	}
	script := `stat -c '%u:%g' /run/b /run/b/roots; echo w > /run/b/new && echo wrote; chown 1000:1000 /run/b/new 2>/dev/null && echo chowned`
	for _, c := range []struct {
		name     string
		ids      sandbox.BindIDs
		writable bool
		dir      string
		want     string // what the sandbox prints
		newOwner string // host owner of what it wrote ("" = nothing written)
	}{
		// Read-only: a writable bind with host ids is refused by Validate (spec_test.go).
		{"host ids", sandbox.IDsHost, false, mk(0o1777, 0), "65534:65534\n65534:65534\n", ""},
		{"sandbox ids", sandbox.IDsSandbox, true, mk(0o755, 0), "0:0\n0:0\nwrote\nchowned\n", "1000:1000"},
		{"owner ids", sandbox.IDsOwner, true, mk(0o755, 1000), "0:0\n65534:65534\nwrote\n", "1000:1000"},
	} {
		spec := readOnlySpec(t, "sh", "-c", script)
		spec.Binds = []sandbox.Bind{{Source: c.dir, Target: "/run/b", Writable: c.writable, IDs: c.ids}}
		if r := run(t, spec); r.stdout != c.want {
			t.Errorf("%s: got %q (%q), want %q", c.name, r.stdout, r.stderr, c.want)
		}
		got := owner(filepath.Join(c.dir, "new"))
		switch {
		case c.newOwner != "" && got != c.newOwner:
			t.Errorf("%s: the new file is %s's on the host, want %s", c.name, got, c.newOwner)
		case c.newOwner == "" && !strings.Contains(got, "no such file"):
			t.Errorf("%s: a file was written (%s)", c.name, got)
		}
	}
	// The owner's ids of a writable bind that root owns would make the sandbox root there.
	spec := readOnlySpec(t, "true")
	spec.Binds = []sandbox.Bind{{Source: mk(0o755, 0), Target: "/run/b", Writable: true, IDs: sandbox.IDsOwner}}
	_, err := sandbox.Run(context.Background(), spec, sandbox.Stdio{})
	var se *sandbox.SetupError
	if !errors.As(err, &se) || !errors.Is(err, unix.EPERM) || !strings.Contains(se.Detail, "setgid-root files") {
		t.Errorf("writable owner-mapped bind of root's: got %v, want a SetupError (EPERM) that says why", err)
	}
	// Group root's, too: the sandbox would be group root there.
	groupRoots := mk(0o755, 1000)
	os.Chown(groupRoots, 1000, 0)
	spec.Binds = []sandbox.Bind{{Source: groupRoots, Target: "/run/b", Writable: true, IDs: sandbox.IDsOwner}}
	if _, err := sandbox.Run(context.Background(), spec, sandbox.Stdio{}); !errors.Is(err, unix.EPERM) {
		t.Errorf("writable owner-mapped bind of group root's: got %v, want EPERM", err)
	}
	// Read-only, it is root's to read, and locked read-only.
	ro := mk(0o755, 0)
	spec = readOnlySpec(t, "sh", "-c", "stat -c %u /run/b/roots; echo x > /run/b/x || echo refused")
	spec.Binds = []sandbox.Bind{{Source: ro, Target: "/run/b", IDs: sandbox.IDsOwner}}
	if r := run(t, spec); r.stdout != "0\nrefused\n" {
		t.Errorf("read-only owner-mapped bind: got %q %q", r.stdout, r.stderr)
	}
}

func TestBindsNestedAndOverLowerFiles(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	outer, inner := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(inner, "f"), []byte("inner\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	which := filepath.Join(t.TempDir(), "which")
	if err := os.WriteFile(which, []byte("bound\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	spec, upper := writableSpec(t, "sh", "-c", "cat /run/a/b/f /etc/which; echo x > /run/a/top && echo outer-rw")
	// Child first: the executor mounts parents first, so the inner bind lands on top of the outer one.
	spec.Binds = []sandbox.Bind{
		{Source: inner, Target: "/run/a/b"},
		{Source: outer, Target: "/run/a", Writable: true, IDs: sandbox.IDsSandbox},
		{Source: which, Target: "/etc/which"}, // exists in the lowers: mounted over, not copied up
	}
	r := run(t, spec)
	if r.stdout != "inner\nbound\nouter-rw\n" {
		t.Errorf("got %q %q", r.stdout, r.stderr)
	}
	if ents, _ := os.ReadDir(upper); len(ents) != 0 {
		t.Errorf("upper has %d entries, want none", len(ents))
	}
}

func TestBindSymlinkSourceRefused(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	dir := t.TempDir()
	link := filepath.Join(dir, "link")
	if err := os.Symlink("/etc", link); err != nil {
		t.Fatal(err)
	}
	spec := readOnlySpec(t, "/bin/true")
	spec.Binds = []sandbox.Bind{{Source: link, Target: "/run/x"}}
	_, err := sandbox.Run(context.Background(), spec, sandbox.Stdio{})
	wantSetupError(t, err, "open bind source", link, unix.ELOOP)

	spec.Binds = []sandbox.Bind{{Source: filepath.Join(dir, "missing"), Target: "/run/x"}}
	_, err = sandbox.Run(context.Background(), spec, sandbox.Stdio{})
	wantSetupError(t, err, "open bind source", filepath.Join(dir, "missing"), unix.ENOENT)
}

func TestNetworkOnlyLoopback(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	r := run(t, readOnlySpec(t, "sh", "-c", "cat /proc/net/dev; echo; ip link show lo"))
	dev, link, _ := strings.Cut(r.stdout, "\n\n")
	var ifaces []string
	for _, l := range strings.Split(dev, "\n")[2:] {
		if name, _, ok := strings.Cut(l, ":"); ok {
			ifaces = append(ifaces, strings.TrimSpace(name))
		}
	}
	if !slices.Equal(ifaces, []string{"lo"}) {
		t.Errorf("got interfaces %q, want only lo:\n%s", ifaces, dev)
	}
	if !strings.Contains(link, "<LOOPBACK,UP,LOWER_UP>") {
		t.Errorf("lo is not up:\n%s", link)
	}
}

func TestNetworkHostIsUnreachable(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	// A server on the host's loopback: the sandbox's 127.0.0.1 is another namespace's.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "host") }))
	// (nc rather than wget: busybox-static's wget crashes on an unreachable address.)
	host, port, _ := net.SplitHostPort(ln.Addr().String())
	r := run(t, readOnlySpec(t, "nc", host, port))
	if r.code == 0 || !strings.Contains(r.stderr, "Connection refused") {
		t.Errorf("host's server: code %d, stderr %q, want connection refused", r.code, r.stderr)
	}
	// Nor any other address: there is no route.
	r = run(t, readOnlySpec(t, "nc", "192.0.2.1", "80"))
	if r.code == 0 || !strings.Contains(r.stderr, "Network is unreachable") {
		t.Errorf("outside address: code %d, stderr %q, want network unreachable", r.code, r.stderr)
	}
}

func TestNetworkListen(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	spec := readOnlySpec(t, "sh", "-c", "wget -qO- http://127.0.0.1:3128/hello && wget -qO- http://[::1]:8080/v6")
	spec.Network.Listen = []string{"127.0.0.1:3128", "[::1]:8080"}
	var out, errb bytes.Buffer
	p, err := sandbox.Start(context.Background(), spec, sandbox.Stdio{Stdout: &out, Stderr: &errb})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Listeners) != 2 {
		t.Fatalf("got %d listeners, want 2", len(p.Listeners))
	}
	for i, want := range spec.Network.Listen {
		if got := p.Listeners[i].Addr().String(); got != want {
			t.Errorf("listener %d: got %s, want %s", i, got, want)
		}
		// Served from the host side: this goroutine runs in the host's network namespace.
		go http.Serve(p.Listeners[i], http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "served "+r.URL.Path+"\n")
		}))
	}
	code, err := p.Wait()
	if err != nil || code != 0 {
		t.Fatalf("got %d, %v; stderr %q", code, err, errb.String())
	}
	if want := "served /hello\nserved /v6\n"; out.String() != want {
		t.Errorf("got %q, want %q", out.String(), want)
	}
	// The listeners are not in the host's namespace: the same port is free here.
	if l, err := net.Listen("tcp", "127.0.0.1:3128"); err == nil {
		l.Close()
	} else if !errors.Is(err, unix.EADDRINUSE) {
		t.Logf("host port 3128: %v", err)
	}
	// Wait closed them.
	if _, err := p.Listeners[0].Accept(); err == nil {
		t.Error("listener still open after Wait")
	}
}

func TestNoInheritedDescriptors(t *testing.T) {
	requireRoot(t)
	// A descriptor the caller leaked without O_CLOEXEC reaches neither the command nor init.
	marker, err := os.Create(filepath.Join(t.TempDir(), "leaked-marker"))
	if err != nil {
		t.Fatal(err)
	}
	defer marker.Close()
	leaked, err := syscall.Dup(int(marker.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(leaked)
	if flags, _ := unix.FcntlInt(uintptr(leaked), unix.F_GETFD, 0); flags&unix.FD_CLOEXEC != 0 {
		t.Fatal("dup'd descriptor is close-on-exec; the test would prove nothing")
	}
	r := run(t, readOnlySpec(t, "sh", "-c", "ls /proc/self/fd; echo; ls -l /proc/1/fd"))
	cmdFDs, initFDs, _ := strings.Cut(r.stdout, "\n\n")
	// ls lists 0, 1, 2 and the directory it is reading.
	if got := strings.Fields(cmdFDs); !slices.Equal(got, []string{"0", "1", "2", "3"}) {
		t.Errorf("command's descriptors: got %q, want 0 1 2 and ls's own 3", got)
	}
	if strings.Contains(initFDs, "leaked-marker") || strings.Contains(initFDs, "memfd") {
		t.Errorf("init holds an inherited descriptor:\n%s", initFDs)
	}
}

func TestNoNewPrivs(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	r := run(t, readOnlySpec(t, "grep", "NoNewPrivs", "/proc/self/status"))
	if got := strings.Fields(r.stdout); !slices.Equal(got, []string{"NoNewPrivs:", "1"}) {
		t.Errorf("got %q, want NoNewPrivs: 1", r.stdout)
	}
}

func TestExecutableGuard(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	before := fileHash(t, exe)
	// init is host root and not dumpable: root of the sandbox is neither, so /proc/1/exe (the sealed
	// handle, selfexe_internal_test.go), its descriptors and its environment are out of reach.
	r := run(t, readOnlySpec(t, "sh", "-c", `readlink /proc/1/exe || echo no-exe; readlink /proc/1/fd/0 || echo no-fd; cat /proc/1/environ || echo no-environ
		echo x > /proc/1/exe && echo WROTE; grep -c . /proc/1/status >/dev/null && echo status-ok`))
	if r.stdout != "no-exe\nno-fd\nno-environ\nstatus-ok\n" {
		t.Errorf("got %q %q, want /proc/1/exe, fd and environ refused (and /proc/1/status readable)", r.stdout, r.stderr)
	}
	if after := fileHash(t, exe); after != before {
		t.Error("the test binary changed on disk")
	}
}

func fileHash(t *testing.T, p string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

func TestTeardownKillsEverything(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	// The command leaves a background process and waits for stdin; when it exits, the pid namespace
	// takes the orphan with it, and Wait returns only once it is gone.
	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdinW.Close()
	var out bytes.Buffer
	p, err := sandbox.Start(context.Background(), readOnlySpec(t, "sh", "-c", "sleep 1001 & echo started; read x; exit 0"),
		sandbox.Stdio{Stdin: stdinR, Stdout: &out})
	stdinR.Close()
	if err != nil {
		t.Fatal(err)
	}
	orphan := findProcess(t, "sleep\x001001\x00", 5*time.Second)
	stdinW.Close() // the command exits
	start := time.Now()
	code, err := p.Wait()
	if err != nil || code != 0 {
		t.Fatalf("got %d, %v", code, err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("Wait took %v after the command exited", d)
	}
	if cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", orphan)); err == nil && string(cmdline) == "sleep\x001001\x00" {
		t.Errorf("the background sleep (host pid %d) survived the sandbox", orphan)
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", p.Pid)); err == nil {
		t.Errorf("init (pid %d) still exists", p.Pid)
	}
	if out.String() != "started\n" {
		t.Errorf("got %q", out.String())
	}
}

// findProcess returns the host pid of the process whose /proc/PID/cmdline is cmdline.
func findProcess(t *testing.T, cmdline string, timeout time.Duration) int {
	t.Helper()
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil && string(b) == cmdline {
				return pid
			}
		}
	}
	t.Fatalf("no process %q within %v", cmdline, timeout)
	return 0
}

func TestCancelKills(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	p, err := sandbox.Start(ctx, readOnlySpec(t, "sleep", "1000"), sandbox.Stdio{})
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	start := time.Now()
	code, err := p.Wait()
	if err != nil || code != 128+9 {
		t.Errorf("got %d, %v, want 137 and no error", code, err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("cancel took %v", d)
	}
	// A context already done refuses to start.
	if _, err := sandbox.Start(ctx, readOnlySpec(t, "true"), sandbox.Stdio{}); !errors.Is(err, context.Canceled) {
		t.Errorf("start with a done context: got %v, want context.Canceled", err)
	}
}

func TestSignalsAreForwarded(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer outR.Close()
	p, err := sandbox.Start(context.Background(),
		readOnlySpec(t, "sh", "-c", `trap 'echo got TERM; exit 3' TERM; echo ready; sleep 1000 & wait`),
		sandbox.Stdio{Stdout: outW})
	outW.Close()
	if err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(outR)
	if !lines.Scan() || lines.Text() != "ready" {
		t.Fatalf("got %q, want ready", lines.Text())
	}
	// A signal to init (from the host) reaches the command.
	if err := syscall.Kill(p.Pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code, err := p.Wait()
	if err != nil || code != 3 {
		t.Errorf("got %d, %v, want the trap's exit 3", code, err)
	}
	if !lines.Scan() || lines.Text() != "got TERM" {
		t.Errorf("got %q, want the trap's output", lines.Text())
	}
}

// TestMountsLocked: root of the sandbox has every capability of its own user namespace, but none over
// the sandbox's mount namespace (the host's user namespace owns it): it can change no mount of it. In
// a mount namespace of its own it may mount over its view; every mount init made is locked there:
// none can be unmounted (to show what it covers) or made writable again.
func TestMountsLocked(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	in := t.TempDir()
	tries := `mount -o remount,rw / && echo ROOT-RW; touch /rootfile 2>/dev/null && echo ROOT-WRITTEN
		mount -o remount,bind,rw /run/in && echo BIND-RW; touch /run/in/x 2>/dev/null && echo BIND-WRITTEN
		mount -o remount,bind,suid /run/in && echo BIND-SUID
		umount /proc && echo PROC-UNMOUNTED; umount -l /dev && echo DEV-UNMOUNTED; umount -l /run/in && echo BIND-UNMOUNTED
		mount -t proc proc /tmp/m && echo NEW-PROC; mount -t sysfs sys /tmp/m && echo SYSFS
		mount -t cgroup -o memory cg /tmp/m && echo CGROUP1; mount -t cgroup2 cg /tmp/m && echo CGROUP2
		mount -t tmpfs none /tmp/m && echo SHARED-MOUNT`
	script := `grep CapEff /proc/self/status; mkdir /tmp/m
		` + tries + `
		unshare -m sh -c 'mount -t tmpfs none /tmp/m && echo own-mount && umount /tmp/m
			` + strings.ReplaceAll(tries, "SHARED-MOUNT", "own-mount-again") + `'
		true`
	spec := readOnlySpec(t, "sh", "-c", script)
	spec.Binds = []sandbox.Bind{{Source: in, Target: "/run/in"}}
	r := run(t, spec)
	if !strings.Contains(r.stdout, "CapEff:\t000001ffffffffff") || !strings.Contains(r.stdout, "own-mount\nown-mount-again\n") {
		t.Errorf("got %q %q, want every capability (of the user namespace) and mounts of its own in a mount namespace of its own", r.stdout, r.stderr)
	}
	for _, bad := range []string{"ROOT-RW", "ROOT-WRITTEN", "BIND-RW", "BIND-WRITTEN", "BIND-SUID", "PROC-UNMOUNTED", "DEV-UNMOUNTED", "BIND-UNMOUNTED", "NEW-PROC", "SYSFS", "CGROUP1", "CGROUP2", "SHARED-MOUNT"} {
		if strings.Contains(r.stdout, bad) {
			t.Errorf("%s: the sandbox did it:\n%s", bad, r.stdout)
		}
	}
	if ents, _ := os.ReadDir(in); len(ents) != 0 {
		t.Errorf("the read-only bind's source has %d entries", len(ents))
	}
}

func TestHostRoot(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	out := t.TempDir()
	spec := &sandbox.Spec{
		Root:  sandbox.Root{Host: true},
		Binds: []sandbox.Bind{{Source: out, Target: "/run/out", Writable: true, IDs: sandbox.IDsSandbox}},
		Argv:  []string{"/bin/sh", "-c", "echo built > /run/out/seed; touch /etc/shed-test-x; echo $?; test -x /usr/bin/env && echo host-tools"},
		Env:   []string{"PATH=/usr/bin:/bin"},
	}
	r := run(t, spec)
	if !strings.Contains(r.stdout, "host-tools") || !strings.HasPrefix(r.stdout, "1\n") {
		t.Errorf("got %q %q, want host tools and a read-only /etc", r.stdout, r.stderr)
	}
	if b, err := os.ReadFile(filepath.Join(out, "seed")); err != nil || string(b) != "built\n" {
		t.Errorf("writable bind: %q, %v", b, err)
	}
	if _, err := os.Stat("/etc/shed-test-x"); err == nil {
		os.Remove("/etc/shed-test-x")
		t.Error("the host's /etc was written")
	}
}

// TestHostRootHide: a host root shows the hidden directories empty and read-only (a world-readable
// file in one, even through a symlink to it, is not there), skips a hidden path that does not
// exist, and the bind made under a hidden directory's sibling still works.
func TestHostRootHide(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	private := t.TempDir()
	if err := os.Chmod(private, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(private, "secret"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(private, link); err != nil {
		t.Fatal(err)
	}
	spec := &sandbox.Spec{
		Root: sandbox.Root{Host: true, Hide: []string{private, "/nonexistent-shed-hide"}},
		Argv: []string{"/bin/sh", "-c", "cat " + private + "/secret " + link + "/secret; ls -A " + private + " | wc -l; touch " + private + "/new; echo $?"},
		Env:  []string{"PATH=/usr/bin:/bin"},
	}
	r := run(t, spec)
	if r.stdout != "0\n1\n" || !strings.Contains(r.stderr, "No such file") {
		t.Errorf("got stdout %q, stderr %q; want no secret, an empty directory, and a refused write", r.stdout, r.stderr)
	}
	if _, err := os.Stat(filepath.Join(private, "new")); err == nil {
		t.Error("the hidden directory was written")
	}
	bad := &sandbox.Spec{Root: sandbox.Root{Lowers: []string{"/x"}, Hide: []string{"/home"}}, Argv: []string{"/bin/true"}}
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "root.hide") {
		t.Errorf("hide without a host root: %v", err)
	}
}

func TestConcurrentSandboxes(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	errs := make(chan error, 8)
	for i := 0; i < 8; i++ {
		go func() {
			spec, upper := writableSpec(t, "sh", "-c", fmt.Sprintf("echo %d > /etc/n; cat /etc/n", i))
			var out bytes.Buffer
			code, err := sandbox.Run(context.Background(), spec, sandbox.Stdio{Stdout: &out})
			if err == nil && (code != 0 || out.String() != fmt.Sprintf("%d\n", i)) {
				err = fmt.Errorf("sandbox %d: code %d, out %q", i, code, out.String())
			}
			if b, rerr := os.ReadFile(filepath.Join(upper, "etc/n")); err == nil && (rerr != nil || string(b) != fmt.Sprintf("%d\n", i)) {
				err = fmt.Errorf("sandbox %d: upper has %q, %v", i, b, rerr)
			}
			errs <- err
		}()
	}
	for i := 0; i < 8; i++ {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// wantSetupError checks that err is a *SetupError with this op, path and errno, and returns it.
func wantSetupError(t *testing.T, err error, op, path string, errno unix.Errno) *sandbox.SetupError {
	t.Helper()
	var se *sandbox.SetupError
	if !errors.As(err, &se) {
		t.Errorf("got %v (%T), want a *SetupError %s %s", err, err, op, path)
		return nil
	}
	if se.Op != op || se.Path != path || !errors.Is(err, errno) {
		t.Errorf("got %q (op %q, path %q), want op %q path %q errno %v", err, se.Op, se.Path, op, path, errno)
	}
	return se
}

// TestUserNamespace: the command is root of a user namespace whose ids are a range of host ids that no
// other live sandbox has; the layers are idmapped, so files on disk keep their owners both ways.
func TestUserNamespace(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	// Four sandboxes at once, each with its own range.
	type started struct {
		p    *sandbox.Process
		out  *bufio.Scanner
		in   *os.File
		base uint64
	}
	var all []started
	for range 4 {
		spec, _ := writableSpec(t, "sh", "-c", "tr -s ' ' < /proc/self/uid_map; tr -s ' ' < /proc/self/gid_map; echo ready; read x")
		var s started
		s.p, s.out, s.in = startPiped(t, spec)
		var maps []string
		for s.out.Scan() && s.out.Text() != "ready" {
			maps = append(maps, s.out.Text())
		}
		if len(maps) != 2 || maps[0] != maps[1] {
			t.Fatalf("uid and gid maps: %q", maps)
		}
		if _, err := fmt.Sscanf(maps[0], " 0 %d 65536", &s.base); err != nil || s.base < 0x70000000 {
			t.Fatalf("uid_map %q: want 0 mapped to 65536 ids of the sandbox range", maps[0])
		}
		all = append(all, s)
	}
	for i, a := range all {
		for _, b := range all[:i] {
			if a.base < b.base+65536 && b.base < a.base+65536 {
				t.Errorf("two live sandboxes share host ids: %d and %d", a.base, b.base)
			}
		}
	}
	for _, s := range all {
		s.in.Write([]byte("\n"))
		s.in.Close()
		if code, err := s.p.Wait(); code != 0 || err != nil {
			t.Errorf("exit %d, %v", code, err)
		}
	}

	// Idmapped layers: the lowers' root-owned files are root's inside, and what the sandbox writes and
	// chowns lands in the upper with those same ids.
	spec, upper := writableSpec(t, "sh", "-c", `stat -c %u:%g /bin/busybox /etc/which
		echo x > /etc/new && mkdir /etc/d && touch /etc/d/f && chown 1234:5678 /etc/d/f && chmod 4755 /etc/d/f
		rm /etc/lowerfile`)
	if r := run(t, spec); r.stdout != "0:0\n0:0\n" || r.code != 0 {
		t.Fatalf("got %q %q (exit %d)", r.stdout, r.stderr, r.code)
	}
	for _, c := range []struct {
		path       string
		uid, gid   uint32
		mode, kind uint32
	}{
		{"etc", 0, 0, 0o755, unix.S_IFDIR},
		{"etc/new", 0, 0, 0o644, unix.S_IFREG},
		{"etc/d/f", 1234, 5678, 0o4755, unix.S_IFREG},
		{"etc/lowerfile", 0, 0, 0, unix.S_IFCHR}, // a whiteout, made by the overlay as its creator
	} {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(upper, c.path), &st); err != nil {
			t.Errorf("%s: %v", c.path, err)
			continue
		}
		if st.Uid != c.uid || st.Gid != c.gid || st.Mode&0o7777 != c.mode || st.Mode&unix.S_IFMT != c.kind {
			t.Errorf("%s on disk: %d:%d mode %o, want %d:%d mode %o type %o", c.path, st.Uid, st.Gid, st.Mode, c.uid, c.gid, c.mode, c.kind)
		}
	}
}

// TestUpperHostIDs: an upper kept with host ids holds the sandbox's files with its range's host ids, so
// nothing of it is root's on the host; inside, it is the sandbox root's as ever.
func TestUpperHostIDs(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	spec, upper := writableSpec(t, "sh", "-c", `stat -c %u:%g /; echo x > /etc/new && cp /bin/busybox /etc/suid && chmod 4755 /etc/suid
		touch /etc/f && chown 1234:5678 /etc/f; tr -s ' ' < /proc/self/uid_map`)
	spec.Root.UpperHostIDs = true
	r := run(t, spec)
	var base uint32
	if _, err := fmt.Sscanf(strings.SplitN(r.stdout, "\n", 2)[1], " 0 %d", &base); err != nil || !strings.HasPrefix(r.stdout, "0:0\n") || r.code != 0 {
		t.Fatalf("got %q %q (exit %d)", r.stdout, r.stderr, r.code)
	}
	for _, c := range []struct {
		path     string
		uid, gid uint32
	}{{".", base, base}, {"etc/new", base, base}, {"etc/suid", base, base}, {"etc/f", base + 1234, base + 5678}} {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(upper, c.path), &st); err != nil || st.Uid != c.uid || st.Gid != c.gid {
			t.Errorf("%s on disk: %d:%d (%v), want %d:%d", c.path, st.Uid, st.Gid, err, c.uid, c.gid)
		}
	}
}

// TestSetuid: a Root.Setuid sandbox honours setuid bits (sudo in a Bench whose Workshop declares an
// account with sudo): its root is mounted without nosuid and its commands have no no_new_privs; a
// sandbox without it keeps both.
func TestSetuid(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	for _, setuid := range []bool{false, true} {
		spec := readOnlySpec(t, "sh", "-c", `grep NoNewPrivs /proc/self/status; grep " / / " /proc/self/mountinfo`)
		spec.Root.UpperTmpfs, spec.Root.Setuid = true, setuid
		r := run(t, spec)
		nnp, nosuid := strings.Contains(r.stdout, "NoNewPrivs:\t1"), strings.Contains(r.stdout, "nosuid")
		if nnp == setuid || nosuid == setuid {
			t.Errorf("setuid %v: no_new_privs %v, nosuid root %v:\n%s%s", setuid, nnp, nosuid, r.stdout, r.stderr)
		}
	}
	if err := (&sandbox.Spec{Root: sandbox.Root{Host: true, Setuid: true}, Argv: []string{"/bin/true"}}).Validate(); err == nil || !strings.Contains(err.Error(), "root.setuid") {
		t.Errorf("a host root with setuid: %v", err)
	}
}

// TestBootID: every start of a sandbox is a boot of it: /proc/sys/kernel/random/boot_id is its own,
// a fresh version-4 UUID per start (with a tmpfs upper, and over lowers alone), not the host's, and
// the command can neither write over it, nor unmount it, nor mount over it. E2B's SDK tells a cold boot from a resumed one by it.
func TestBootID(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	host, err := os.ReadFile(sandbox.BootIDPath)
	if err != nil {
		t.Fatal(err)
	}
	uuid := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}\n$`)
	seen := map[string]bool{string(host): true}
	for _, tmpfs := range []bool{false, true, false, true} {
		// As an attacker would: write over it, unmount it to reach the host's, mount over it.
		spec := readOnlySpec(t, "sh", "-c", "cat "+sandbox.BootIDPath+"; echo x > "+sandbox.BootIDPath+" && echo written; umount "+sandbox.BootIDPath+
			" 2>/dev/null && echo unmounted; mount --bind /dev/null "+sandbox.BootIDPath+" 2>/dev/null && echo mounted; cat "+sandbox.BootIDPath)
		spec.Root.UpperTmpfs = tmpfs
		r := run(t, spec)
		id, rest, _ := strings.Cut(r.stdout, "\n")
		id += "\n"
		if !uuid.MatchString(id) {
			t.Errorf("tmpfs upper %v: boot id %q, want a version-4 UUID", tmpfs, id)
		}
		if seen[id] {
			t.Errorf("tmpfs upper %v: boot id %q seen before (the host's, or another start's)", tmpfs, id)
		}
		seen[id] = true
		if rest != id || strings.Contains(r.stdout, "written") || strings.Contains(r.stdout, "mounted") {
			t.Errorf("tmpfs upper %v: the boot id could be written over, unmounted or covered: %q", tmpfs, r.stdout)
		}
	}
	if now, _ := os.ReadFile(sandbox.BootIDPath); string(now) != string(host) {
		t.Errorf("the host's boot id changed: %q, was %q", now, host)
	}
}
