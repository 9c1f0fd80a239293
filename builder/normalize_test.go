package builder

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func needRootT(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (owners, trusted xattrs, mounts)")
	}
}

// TestNormalizeRefuses: what a layer may not hold is refused before anything
// is changed, and what lies outside the output is never touched.
func TestNormalizeRefuses(t *testing.T) {
	needRootT(t)
	old := time.Unix(1_000_000_000, 0)
	cases := []struct {
		name, want string
		plant      func(t *testing.T, out, host string)
	}{
		{"hard link to a host file", "hard-linked from outside", func(t *testing.T, out, host string) {
			if err := os.Link(filepath.Join(host, "precious"), filepath.Join(out, "etc/stolen")); err != nil {
				t.Fatal(err)
			}
		}},
		{"device node", "device node (1:1)", func(t *testing.T, out, host string) {
			if err := unix.Mknod(filepath.Join(out, "etc/mem"), unix.S_IFCHR|0o600, int(unix.Mkdev(1, 1))); err != nil {
				t.Fatal(err)
			}
		}},
		{"block device", "block device (8:0)", func(t *testing.T, out, host string) {
			if err := unix.Mknod(filepath.Join(out, "etc/sda"), unix.S_IFBLK|0o600, int(unix.Mkdev(8, 0))); err != nil {
				t.Fatal(err)
			}
		}},
		{"socket", "is a socket", func(t *testing.T, out, host string) {
			l, err := net.Listen("unix", filepath.Join(out, "etc/sock"))
			if err != nil {
				t.Fatal(err)
			}
			l.(*net.UnixListener).SetUnlinkOnClose(false)
			l.Close()
		}},
		{"another file system", "on another file system", func(t *testing.T, out, host string) {
			mnt := filepath.Join(out, "etc/mnt")
			os.Mkdir(mnt, 0o755)
			if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, ""); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
		}},
		{"an owner beyond a Bench's ids", "is owned by 70000:0", func(t *testing.T, out, host string) {
			f := filepath.Join(out, "etc/far")
			os.WriteFile(f, nil, 0o644)
			if err := os.Lchown(f, 70000, 0); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, host := t.TempDir(), t.TempDir()
			precious := filepath.Join(host, "precious")
			os.WriteFile(precious, []byte("host"), 0o644)
			if err := unix.Lsetxattr(precious, "user.keep", []byte("1"), 0); err != nil {
				t.Fatal(err)
			}
			os.Chtimes(precious, old, old)
			os.MkdirAll(filepath.Join(out, "etc"), 0o755)
			os.MkdirAll(filepath.Join(out, "var/lib/apt/lists"), 0o755)
			os.WriteFile(filepath.Join(out, "var/lib/apt/lists/junk"), []byte("j"), 0o644)
			c.plant(t, out, host)
			err := Normalize(out)
			if !errors.Is(err, ErrHostileLayer) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want ErrHostileLayer saying %q", err, c.want)
			}
			// Refused before any change: the junk is still there, the host file as it was.
			if _, err := os.Stat(filepath.Join(out, "var/lib/apt/lists/junk")); err != nil {
				t.Errorf("the output was changed before the refusal: %v", err)
			}
			fi, err := os.Stat(precious)
			if err != nil || !fi.ModTime().Equal(old) {
				t.Errorf("host file: %v %v, want its mtime unchanged", fi.ModTime(), err)
			}
			if v, err := getxattr(precious, "user.keep"); err != nil || string(v) != "1" {
				t.Errorf("host file's xattr: %q %v, want it kept", v, err)
			}
		})
	}
}

// TestNormalizeXattrs: a layer keeps file capabilities, ACLs and overlayfs's
// opaque mark on directories, and nothing else. The mark is kept under the
// name this process's overlays write: trusted.overlay.opaque as root,
// user.overlay.opaque rootless, where user.overlay.overlay.* is what a
// build's own setfattr of the mark becomes.
func TestNormalizeXattrs(t *testing.T) {
	needRootT(t)
	for _, tc := range []struct {
		name string
		mark string // what opaqueXattr returns
	}{{"root", "trusted.overlay.opaque"}, {"rootless", "user.overlay.opaque"}} {
		t.Run(tc.name, func(t *testing.T) {
			old := opaqueXattr
			opaqueXattr = func() string { return tc.mark }
			t.Cleanup(func() { opaqueXattr = old })
			out := t.TempDir()
			dir, notY, file, link := filepath.Join(out, "d"), filepath.Join(out, "x"), filepath.Join(out, "f"), filepath.Join(out, "l")
			os.Mkdir(dir, 0o755)
			os.Mkdir(notY, 0o755)
			os.WriteFile(file, []byte("x"), 0o755)
			os.Symlink("f", link)
			vfsCap := []byte{0, 0, 0, 2, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0} // v2, cap_net_raw
			set := map[string][]string{
				dir: {"trusted.overlay.opaque=y", "trusted.overlay.origin=o", "trusted.overlay.overlay.opaque=y",
					"user.overlay.opaque=y", "user.overlay.origin=o", "user.overlay.overlay.opaque=y", "user.foo=bar", "trusted.foo=bar"},
				notY: {"trusted.overlay.opaque=x", "user.overlay.opaque=x"},
				file: {"trusted.overlay.opaque=y", "trusted.overlay.impure=y", "user.overlay.opaque=y", "user.overlay.redirect=/x"},
				link: {"trusted.overlay.origin=o"},
			}
			for p, xs := range set {
				for _, x := range xs {
					name, value, _ := strings.Cut(x, "=")
					if err := unix.Lsetxattr(p, name, []byte(value), 0); err != nil {
						t.Fatalf("set %s on %s: %v", name, p, err)
					}
				}
			}
			if err := unix.Lsetxattr(file, "security.capability", vfsCap, 0); err != nil {
				t.Fatal(err)
			}
			if err := Normalize(out); err != nil {
				t.Fatal(err)
			}
			for p, want := range map[string][]string{dir: {tc.mark}, notY: nil, file: {"security.capability"}, link: nil} {
				got, err := listXattrs(p, false)
				if err != nil {
					t.Fatal(err)
				}
				slices.Sort(got)
				if !slices.Equal(got, want) {
					t.Errorf("%s: xattrs %q, want %q", filepath.Base(p), got, want)
				}
			}
		})
	}
}

// TestNormalizeNeverLeavesTheUpper: junk paths behind a symlinked parent are
// left alone rather than followed onto the host, and a seed's resolv.conf
// that is a symlink is not emptied through it.
func TestNormalizeNeverLeavesTheUpper(t *testing.T) {
	upper, host := t.TempDir(), t.TempDir()
	os.MkdirAll(filepath.Join(host, "apt"), 0o755)
	os.WriteFile(filepath.Join(host, "apt", "precious"), []byte("x"), 0o644)
	os.WriteFile(filepath.Join(host, "resolv.conf"), []byte("nameserver 1.2.3.4\n"), 0o644)
	os.MkdirAll(filepath.Join(upper, "var"), 0o755)
	os.MkdirAll(filepath.Join(upper, "etc"), 0o755)
	if err := os.Symlink(host, filepath.Join(upper, "var", "log")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(host, "resolv.conf"), filepath.Join(upper, "etc", "resolv.conf")); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(upper, "var/lib/apt/lists"), 0o755)
	os.WriteFile(filepath.Join(upper, "var/lib/apt/lists/junk"), []byte("j"), 0o644)
	o, err := openOutput(upper)
	if err != nil {
		t.Fatal(err)
	}
	defer o.close()
	if err := o.normalize(); err != nil {
		t.Fatal(err)
	}
	if err := o.empty("etc/resolv.conf"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(host, "apt", "precious")); err != nil {
		t.Errorf("Normalize followed var/log onto the host: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(host, "resolv.conf")); string(b) != "nameserver 1.2.3.4\n" {
		t.Errorf("the host's file behind a symlink was emptied: %q", b)
	}
	if _, err := os.Lstat(filepath.Join(upper, "var/lib/apt/lists")); err == nil {
		t.Error("apt lists were kept")
	}
	// The output renamed must be the one held: a directory put in its place is refused.
	os.Rename(upper, upper+".moved")
	os.Mkdir(upper, 0o755)
	if err := o.moveTo(upper + ".out"); !errors.Is(err, ErrHostileLayer) {
		t.Errorf("moveTo after a swap: got %v, want ErrHostileLayer", err)
	}
}

func getxattr(p, name string) ([]byte, error) {
	b := make([]byte, 64)
	n, err := unix.Getxattr(p, name, b)
	if err != nil {
		return nil, err
	}
	return b[:n], nil
}
