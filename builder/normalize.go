package builder

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"toolshed.dev/shed/sandbox"
	"toolshed.dev/shed/store"
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

// keptXattrs are the extended attributes a layer keeps, each recorded in its
// manifest (so verify sees them): file capabilities and POSIX ACLs, which
// packages set, and overlayfs's opaque mark on a directory, which the overlay
// itself sets, under the one name this process's overlays write and read
// (opaqueXattr). As root that is trusted.overlay.opaque, which nothing in a
// sandbox can write, and user.overlay.opaque is removed: any file owner can
// set it. Rootless, the overlays are mounted with userxattr and the mark is
// user.overlay.opaque, which a build cannot forge either: the overlay escapes
// a setfattr of user.overlay.* to user.overlay.overlay.* in the upper. Every
// other xattr is removed: overlayfs's private marks (origin is an inode
// handle, uuid is random), their escaped forms (trusted.overlay.overlay.*,
// user.overlay.overlay.*), the other namespace's marks, and whatever else a
// build set.
var keptXattrs = []string{"security.capability", "system.posix_acl_access", "system.posix_acl_default"}

// opaqueXattr is store.OpaqueXattr, a variable so that tests, which run as
// root, can take the rootless branch without a user namespace.
var opaqueXattr = store.OpaqueXattr

// ErrHostileLayer marks a build output that a layer may not hold.
var ErrHostileLayer = errors.New("build output refused")

// Normalize turns a build's output directory (an overlay upper, a seed) into
// layer content. It works from a descriptor of dir and never follows a
// symlink (a hostile package may have made var/log a link to the host's
// /etc). First it looks at everything without changing anything, and refuses
// what a layer may not hold: sockets, device nodes other than overlay
// whiteouts, an inode of another file system, a file hard-linked from outside
// the output (changing its times or xattrs would change a host file), and
// owners outside a Bench's ids. Only then does it remove the junk and the
// xattrs that are not kept.
func Normalize(dir string) error {
	o, err := openOutput(dir)
	if err != nil {
		return err
	}
	defer o.close()
	return o.normalize()
}

// output is a build's output directory, held by a descriptor from the moment
// shed makes it: capture works from that handle, and the directory renamed
// into the store must still be that one.
type output struct {
	path     string
	fd       int
	dev, ino uint64
}

// makeOutput creates the directory path (which must not exist) and holds it.
func makeOutput(path string) (*output, error) {
	if err := os.Mkdir(path, 0o755); err != nil {
		return nil, err
	}
	return openOutput(path)
}

func openOutput(path string) (*output, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open build output %s: %w", path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("open build output %s: %w", path, err)
	}
	return &output{path: path, fd: fd, dev: st.Dev, ino: st.Ino}, nil
}

func (o *output) close() {
	if o.fd >= 0 {
		unix.Close(o.fd)
		o.fd = -1
	}
}

// moveTo renames the output to dst, once sure that its path still names the
// directory held.
func (o *output) moveTo(dst string) error {
	var st unix.Stat_t
	if err := unix.Lstat(o.path, &st); err != nil {
		return fmt.Errorf("build output %s: %w", o.path, err)
	}
	if st.Dev != o.dev || st.Ino != o.ino || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Errorf("%w: %s is no longer the directory the build wrote", ErrHostileLayer, o.path)
	}
	return os.Rename(o.path, dst)
}

// empty truncates the regular file rel of the output, if it is one (not a
// symlink, nothing on the way a symlink).
func (o *output) empty(rel string) error {
	fd, err := unix.Openat2(o.fd, rel, &unix.OpenHow{
		Flags:   unix.O_WRONLY | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	})
	if err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			return nil
		}
		return fmt.Errorf("empty %s of the build output: %w", rel, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return err
	}
	if err := unix.Ftruncate(fd, 0); err != nil {
		return fmt.Errorf("empty %s of the build output: %w", rel, err)
	}
	return nil
}

func (o *output) normalize() error {
	// A descriptor of its own: a directory's read offset is shared by every user of one descriptor.
	root, err := unix.Openat(o.fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("build output %s: %w", o.path, err)
	}
	defer unix.Close(root)
	var st unix.Stat_t
	if err := unix.Fstat(root, &st); err != nil {
		return fmt.Errorf("build output %s: %w", o.path, err)
	}
	c := &capture{dev: st.Dev, links: map[inodeKey]*linked{}, opaque: opaqueXattr()}
	if err := c.check(root, ".", &st); err != nil {
		return err
	}
	for _, l := range c.links {
		if uint64(l.seen) != l.nlink {
			return fmt.Errorf("%w: %s is hard-linked from outside the build's output (%d links, %d inside)", ErrHostileLayer, l.path, l.nlink, l.seen)
		}
	}
	for _, j := range junk {
		if err := removeJunk(root, j); err != nil {
			return err
		}
	}
	for _, x := range c.strip {
		if err := x.remove(root); err != nil {
			return err
		}
	}
	return nil
}

type inodeKey struct{ dev, ino uint64 }

type linked struct {
	path  string
	nlink uint64
	seen  int
}

// stripXattrs are the xattrs of one entry to remove once the output is checked.
type stripXattrs struct {
	dir, name string // the entry: name in the directory dir (relative to the output)
	xattrs    []string
}

type capture struct {
	dev    uint64
	opaque string // the opaque mark's name (opaqueXattr)
	links  map[inodeKey]*linked
	strip  []stripXattrs
}

// check walks the directory fd (rel in the output), whose stat is st.
func (c *capture) check(fd int, rel string, st *unix.Stat_t) error {
	if err := c.entry(fd, "", rel, st); err != nil {
		return err
	}
	names, err := readNames(fd)
	if err != nil {
		return fmt.Errorf("read %s of the build output: %w", rel, err)
	}
	slices.Sort(names)
	for _, name := range names {
		crel := path.Join(rel, name)
		var cst unix.Stat_t
		if err := unix.Fstatat(fd, name, &cst, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("stat %s of the build output: %w", crel, err)
		}
		if cst.Mode&unix.S_IFMT != unix.S_IFDIR {
			if err := c.entry(fd, name, crel, &cst); err != nil {
				return err
			}
			continue
		}
		cfd, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open %s of the build output: %w", crel, err)
		}
		var ost unix.Stat_t
		if err := unix.Fstat(cfd, &ost); err != nil || ost.Ino != cst.Ino || ost.Dev != cst.Dev {
			unix.Close(cfd)
			return fmt.Errorf("%w: %s changed while it was read", ErrHostileLayer, crel)
		}
		err = c.check(cfd, crel, &ost)
		unix.Close(cfd)
		if err != nil {
			return err
		}
	}
	return nil
}

// entry checks one entry: name in the directory dirfd ("" for the directory
// itself), rel in the output.
func (c *capture) entry(dirfd int, name, rel string, st *unix.Stat_t) error {
	if st.Dev != c.dev {
		return fmt.Errorf("%w: %s is on another file system than the build's output", ErrHostileLayer, rel)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFSOCK:
		return fmt.Errorf("%w: %s is a socket", ErrHostileLayer, rel)
	case unix.S_IFBLK:
		return fmt.Errorf("%w: %s is a block device (%d:%d); layers hold files, not devices", ErrHostileLayer, rel, unix.Major(st.Rdev), unix.Minor(st.Rdev))
	case unix.S_IFCHR:
		if st.Rdev != 0 { // 0:0 is an overlay whiteout
			return fmt.Errorf("%w: %s is a device node (%d:%d); layers hold files, not devices", ErrHostileLayer, rel, unix.Major(st.Rdev), unix.Minor(st.Rdev))
		}
	case unix.S_IFREG:
		// Only regular files: overlayfs makes its whiteouts as hard links of one inode of its work
		// directory, so a whiteout's other links are always outside the upper, and harmless.
		if st.Nlink > 1 {
			k := inodeKey{st.Dev, st.Ino}
			l := c.links[k]
			if l == nil {
				l = &linked{path: rel, nlink: st.Nlink}
				c.links[k] = l
			}
			l.seen++
		}
	}
	if st.Uid >= sandbox.IDsPerSandbox || st.Gid >= sandbox.IDsPerSandbox {
		return fmt.Errorf("%w: %s is owned by %d:%d; a Bench has ids 0 to %d only", ErrHostileLayer, rel, st.Uid, st.Gid, sandbox.IDsPerSandbox-1)
	}
	p := procPath(dirfd, name)
	names, err := listXattrs(p, name == "")
	if err != nil {
		return fmt.Errorf("list xattrs of %s: %w", rel, err)
	}
	var drop []string
	for _, x := range names {
		switch {
		case x == c.opaque:
			// Only a directory may be opaque, and overlayfs writes "y".
			if v, err := getXattr(p, x, name == ""); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR || string(v) != "y" {
				drop = append(drop, x)
			}
		case !slices.Contains(keptXattrs, x):
			drop = append(drop, x)
		}
	}
	if len(drop) > 0 {
		dir := rel
		if name != "" {
			dir = path.Dir(rel)
		}
		c.strip = append(c.strip, stripXattrs{dir: dir, name: name, xattrs: drop})
	}
	return nil
}

// remove strips the entry's xattrs, reaching it from the output's root
// descriptor without following a symlink. An entry removed as junk is gone.
func (x stripXattrs) remove(root int) error {
	dfd, err := openBeneath(root, x.dir)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	p := procPath(dfd, x.name)
	remove := unix.Lremovexattr
	if x.name == "" {
		remove = unix.Removexattr
	}
	for _, name := range x.xattrs {
		if err := remove(p, name); err != nil && !errors.Is(err, unix.ENODATA) && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("strip %s from %s: %w", name, path.Join(x.dir, x.name), err)
		}
	}
	return nil
}

// procPath names the entry name of the open directory dirfd (the directory
// itself if name is ""), for the xattr calls, which take paths: the directory
// by its descriptor, then the entry, whose last component the l* calls do not
// follow. The directory itself is reached by following its descriptor's
// magic link (the non-l calls), which names exactly the directory opened.
func procPath(dirfd int, name string) string {
	p := "/proc/self/fd/" + strconv.Itoa(dirfd)
	if name != "" {
		p += "/" + name
	}
	return p
}

// openBeneath opens the directory rel under root with no symlink, no "..",
// no other file system on the way.
func openBeneath(root int, rel string) (int, error) {
	if rel == "." || rel == "" {
		// Not dup: a directory's read offset is shared by duplicates.
		return unix.Openat(root, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	}
	fd, err := unix.Openat2(root, rel, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	})
	if err != nil {
		return -1, fmt.Errorf("open %s of the build output: %w", rel, err)
	}
	return fd, nil
}

// removeJunk removes one junk entry (see junk) beneath root. A junk path
// whose parent is missing, or is a symlink or not a directory, is left alone.
func removeJunk(root int, j string) error {
	children := strings.HasSuffix(j, "/*")
	j = strings.TrimSuffix(j, "/*")
	dir, name := path.Split(j)
	if children {
		dir, name = j, ""
	}
	dfd, err := openBeneath(root, strings.TrimSuffix(dir, "/"))
	if err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.EXDEV) {
			return nil
		}
		return err
	}
	defer unix.Close(dfd)
	if !children {
		return removeAt(dfd, name, j)
	}
	names, err := readNames(dfd)
	if err != nil {
		return fmt.Errorf("read %s of the build output: %w", j, err)
	}
	for _, n := range names {
		if err := removeAt(dfd, n, path.Join(j, n)); err != nil {
			return err
		}
	}
	return nil
}

// removeAt removes name (rel in the output) from the directory dirfd, with
// everything under it, following no symlink.
func removeAt(dirfd int, name, rel string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("remove %s from the layer: %w", rel, err)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("remove %s from the layer: %w", rel, err)
		}
		names, err := readNames(fd)
		if err == nil {
			for _, n := range names {
				if err = removeAt(fd, n, path.Join(rel, n)); err != nil {
					break
				}
			}
		}
		unix.Close(fd)
		if err != nil {
			return err
		}
		if err := unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR); err != nil {
			return fmt.Errorf("remove %s from the layer: %w", rel, err)
		}
		return nil
	}
	if err := unix.Unlinkat(dirfd, name, 0); err != nil {
		return fmt.Errorf("remove %s from the layer: %w", rel, err)
	}
	return nil
}

// readNames lists the entries of the open directory fd (not "." and ".."),
// reading from its current offset: fd must be freshly opened. (os.NewFile
// would take the descriptor over and close it when collected.)
func readNames(fd int) ([]string, error) {
	var names []string
	buf := make([]byte, 32<<10)
	for {
		n, err := unix.ReadDirent(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n <= 0 {
			return names, nil
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
	}
}

// listXattrs lists the names of p's extended attributes, not following a
// symlink at p unless follow.
func listXattrs(p string, follow bool) ([]string, error) {
	list := unix.Llistxattr
	if follow {
		list = unix.Listxattr
	}
	n, err := list(p, nil)
	if err != nil || n == 0 {
		if errors.Is(err, unix.ENOTSUP) {
			err = nil
		}
		return nil, err
	}
	buf := make([]byte, n)
	n, err = list(p, buf)
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

func getXattr(p, name string, follow bool) ([]byte, error) {
	get := unix.Lgetxattr
	if follow {
		get = unix.Getxattr
	}
	buf := make([]byte, 64)
	n, err := get(p, name, buf)
	if err != nil {
		return nil, err
	}
	return buf[:n], nil
}
