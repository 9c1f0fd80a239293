package builder

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// junk lists what a build leaves in its overlay upper that is not part of the
// layer: package manager caches and indexes, logs, locks, backups and
// per-build identity. Each entry is a path relative to the upper, or a
// directory whose contents (not itself) are junk when it ends in "/*".
// Removing them makes equal inputs give equal bytes (lab report §3).
var junk = []string{
	"var/lib/apt/lists", "var/cache/apt/archives", "var/cache/apt/pkgcache.bin", "var/cache/apt/srcpkgcache.bin",
	"var/log/apt/*", "var/log/dpkg.log", "var/log/alternatives.log", "var/log/bootstrap.log",
	"var/cache/ldconfig/aux-cache", "var/cache/man", "var/cache/debconf/config.dat-old",
	"var/cache/debconf/templates.dat-old", "var/cache/debconf/passwords.dat-old",
	"var/lib/dpkg/status-old", "var/lib/dpkg/diversions-old", "var/lib/dpkg/statoverride-old",
	"var/lib/dpkg/lock", "var/lib/dpkg/lock-frontend", "var/lib/dpkg/triggers/Lock", "var/lib/dpkg/updates/*",
	"var/lib/apt/extended_states", "var/lib/apt/periodic", "var/lib/apt/lists/lock",
	"etc/machine-id", "var/lib/dbus/machine-id", "etc/ld.so.cache~",
	"tmp/*", "var/tmp/*", "root/.cache", "root/.wget-hsts", "var/cache/pip", "root/.bash_history",
	"etc/shadow-", "etc/gshadow-", "etc/passwd-", "etc/group-", "etc/subuid-", "etc/subgid-",
}

// overlayXattrs are overlayfs's private markers that differ per build or per
// filesystem (origin is an inode handle, uuid is random) and would break reuse
// on another filesystem. Only the opaque marker means something to a layer.
var overlayXattrs = []string{
	"trusted.overlay.origin", "trusted.overlay.impure", "trusted.overlay.uuid", "trusted.overlay.nlink",
	"trusted.overlay.redirect", "trusted.overlay.metacopy", "trusted.overlay.upper", "trusted.overlay.protattr",
	"user.overlay.origin", "user.overlay.impure", "user.overlay.uuid", "user.overlay.nlink",
	"user.overlay.redirect", "user.overlay.metacopy",
}

// ErrHostileLayer marks a build output that a layer may not hold.
var ErrHostileLayer = errors.New("build output refused")

// Normalize turns a build's overlay upper into layer content: junk removed,
// overlay private xattrs stripped, and checked for what a layer may not hold
// (device nodes other than overlay whiteouts, sockets). It never follows a
// symlink: a hostile package may have made var/log a link to the host's /etc.
func Normalize(upper string) error {
	for _, j := range junk {
		if strings.HasSuffix(j, "/*") {
			dir := strings.TrimSuffix(j, "/*")
			ents, err := readDirBeneath(upper, dir)
			if err != nil {
				return err
			}
			for _, e := range ents {
				if err := removeBeneath(upper, dir+"/"+e); err != nil {
					return err
				}
			}
			continue
		}
		if err := removeBeneath(upper, j); err != nil {
			return err
		}
	}
	return filepath.WalkDir(upper, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(upper, p)
		switch d.Type() {
		case fs.ModeSocket:
			return fmt.Errorf("%w: %s is a socket", ErrHostileLayer, rel)
		case fs.ModeDevice | fs.ModeCharDevice, fs.ModeDevice:
			var st unix.Stat_t
			if err := unix.Lstat(p, &st); err != nil {
				return err
			}
			if st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
				return fmt.Errorf("%w: %s is a device node (%d:%d); layers hold files, not devices", ErrHostileLayer, rel, unix.Major(st.Rdev), unix.Minor(st.Rdev))
			}
		}
		names, err := listXattrs(p)
		if err != nil {
			return fmt.Errorf("list xattrs of %s: %w", rel, err)
		}
		for _, x := range names {
			if !slices.Contains(overlayXattrs, x) {
				continue
			}
			if err := unix.Lremovexattr(p, x); err != nil && !errors.Is(err, unix.ENODATA) {
				return fmt.Errorf("strip %s from %s: %w", x, rel, err)
			}
		}
		return nil
	})
}

// listXattrs lists the names of p's extended attributes, not following a symlink.
func listXattrs(p string) ([]string, error) {
	n, err := unix.Llistxattr(p, nil)
	if err != nil || n == 0 {
		if errors.Is(err, unix.ENOTSUP) {
			err = nil
		}
		return nil, err
	}
	buf := make([]byte, n)
	n, err = unix.Llistxattr(p, buf)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, b := range bytes.Split(buf[:n], []byte{0}) {
		if len(b) > 0 {
			names = append(names, string(b))
		}
	}
	return names, nil
}

// beneath resolves rel under root without following any symlink in a parent
// component; ok is false when a parent is a symlink or missing.
func beneath(root, rel string) (string, bool) {
	p := root
	parts := strings.Split(rel, "/")
	for i, part := range parts {
		p = filepath.Join(p, part)
		if i == len(parts)-1 {
			break
		}
		fi, err := os.Lstat(p)
		if err != nil || !fi.IsDir() {
			return "", false
		}
	}
	return p, true
}

func removeBeneath(root, rel string) error {
	p, ok := beneath(root, rel)
	if !ok {
		return nil
	}
	// RemoveAll removes a final symlink itself and works inside with
	// unlinkat on opened directories, so it never leaves root.
	if err := os.RemoveAll(p); err != nil {
		return fmt.Errorf("remove %s from the layer: %w", rel, err)
	}
	return nil
}

func readDirBeneath(root, rel string) ([]string, error) {
	p, ok := beneath(root, rel)
	if !ok {
		return nil, nil
	}
	fi, err := os.Lstat(p)
	if err != nil || !fi.IsDir() {
		return nil, nil
	}
	ents, err := os.ReadDir(p)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(ents))
	for i, e := range ents {
		names[i] = e.Name()
	}
	return names, nil
}
