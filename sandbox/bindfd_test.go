package sandbox_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	"toolshed.dev/shed/sandbox"
)

// openBeneath opens name inside dir as a caller of SourceFD would: O_PATH, without leaving dir and
// without following any symlink.
func openBeneath(t *testing.T, dir, name string) *os.File {
	t.Helper()
	d, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(d)
	fd, err := unix.Openat2(d, name, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS,
	})
	if err != nil {
		t.Fatalf("openat2 %s in %s: %v", name, dir, err)
	}
	f := os.NewFile(uintptr(fd), filepath.Join(dir, name))
	t.Cleanup(func() { f.Close() })
	return f
}

func TestBindSourceFD(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	base := t.TempDir()
	grant := filepath.Join(base, "grant")
	if err := os.Mkdir(grant, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(grant, "marker"), []byte("grant\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(base, "file"), []byte("a file\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	dirFD, fileFD := openBeneath(t, base, "grant"), openBeneath(t, base, "file")
	// After the check, the directory is moved away and a symlink to /etc takes its place: a bind by
	// path would now be refused (or, following the link, show /etc); by descriptor it is the directory
	// that was checked.
	if err := os.Rename(grant, filepath.Join(base, "moved")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc", grant); err != nil {
		t.Fatal(err)
	}
	spec := readOnlySpec(t, "sh", "-c", "cat /run/grant/marker; ls /run/grant | wc -l; test -e /run/grant/passwd && echo ETC; cat /tmp/file")
	spec.Binds = []sandbox.Bind{{SourceFD: dirFD, Target: "/run/grant"}, {SourceFD: fileFD, Target: "/tmp/file"}}
	if r := run(t, spec); r.stdout != "grant\n1\na file\n" {
		t.Errorf("got %q %q, want the original directory's content and the file", r.stdout, r.stderr)
	}
	// Start duplicated the descriptors; the caller's are still open.
	var st unix.Stat_t
	if err := unix.Fstat(int(dirFD.Fd()), &st); err != nil {
		t.Errorf("the caller's descriptor was closed: %v", err)
	}
	// The same bind by path meets the symlink and is refused.
	spec.Binds = []sandbox.Bind{{Source: grant, Target: "/run/grant"}}
	_, err := sandbox.Run(context.Background(), spec, sandbox.Stdio{})
	wantSetupError(t, err, "open bind source", grant, unix.ELOOP)
	// A closed descriptor is an error, not a bind of something else.
	closed := openBeneath(t, base, "file")
	closed.Close()
	spec.Binds = []sandbox.Bind{{SourceFD: closed, Target: "/run/x"}}
	_, err = sandbox.Run(context.Background(), spec, sandbox.Stdio{})
	wantSetupError(t, err, "open bind source", closed.Name(), unix.EBADF)
}

func TestBindCannotBeUnmounted(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	// The grant covers /etc/which, which the lowers have ("top"): unmounting it would reveal that.
	file := filepath.Join(t.TempDir(), "which")
	if err := os.WriteFile(file, []byte("grant\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("grant dir\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The command is root of its own user namespace: in a mount namespace of its own it may mount (and
	// unmount) what it mounted itself, which shows that the refusals are the kernel's locks.
	script := `umount /etc/which; echo "umount $?"; umount -l /etc/which; echo "umount -l $?"
		umount -l /run/grant; echo "umount dir $?"
		unshare -U -m sh -c 'umount -l /etc/which' 2>/dev/null; echo "userns umount $?"
		mkdir /tmp/own && unshare -m sh -c 'mount -t tmpfs own /tmp/own && umount /tmp/own && umount /etc/which'; echo "own mount $?"
		unshare -m sh -c 'mount -t tmpfs own /tmp/own && umount /tmp/own'; echo "own mount $?"
		cat /etc/which; cat /run/grant/f 2>&1`
	spec := readOnlySpec(t, "sh", "-c", script)
	spec.Binds = []sandbox.Bind{{Source: file, Target: "/etc/which"}, {Source: dir, Target: "/run/grant", Writable: true, IDs: sandbox.IDsSandbox}}
	r := run(t, spec)
	for _, want := range []string{"umount 1\n", "umount -l 1\n", "umount dir 1\n", "userns umount 1\n", "own mount 1\nown mount 0\n", "grant\ngrant dir\n"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("missing %q in %q (stderr %q)", want, r.stdout, r.stderr)
		}
	}
}
