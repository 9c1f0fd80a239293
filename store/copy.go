package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// CopyTree copies src, a directory or regular file, to dst, which must not
// exist. It follows no symlink (a symlink as src is refused) and keeps what a
// manifest records: type, mode incl. setuid bits, owners, mtimes (with
// nanoseconds), the xattrs manifests record (the opaque mark under
// OpaqueXattr, whichever name it has in src), device nodes, fifos, whiteouts
// and hard links between regular files of the tree. Sockets are an error.
// ctx is checked between files.
func CopyTree(ctx context.Context, src, dst string) error {
	var st unix.Stat_t
	if err := unix.Lstat(src, &st); err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	if t := st.Mode & unix.S_IFMT; t != unix.S_IFDIR && t != unix.S_IFREG {
		return fmt.Errorf("copy %s: not a directory or regular file", src)
	}
	if _, err := os.Lstat(dst); err == nil {
		return fmt.Errorf("copy to %s: %w", dst, fs.ErrExist)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("copy to %s: %w", dst, err)
	}
	c := &copier{links: make(map[inodeKey]string)}
	return c.copy(ctx, src, dst, &st)
}

type copier struct {
	links map[inodeKey]string // copy of each multiply linked file seen
}

// copy copies one entry, then its children if it is a directory. Every
// creation is exclusive (mkdir, O_EXCL, mknod, symlink, link), so nothing
// that appears under dst meanwhile is written through.
func (c *copier) copy(ctx context.Context, src, dst string, st *unix.Stat_t) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	var err error
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		// Owner, mode and times are set after the children: adding them
		// changes the mtime, and a read-only mode would be in the way.
		if err := unix.Mkdir(dst, 0o700); err != nil {
			return fmt.Errorf("copy %s: %w", src, err)
		}
		names, err := readDirNames(src, st)
		if err != nil {
			return fmt.Errorf("copy %s: %w", src, err)
		}
		for _, name := range names {
			child := src + "/" + name
			var cst unix.Stat_t
			if err := unix.Lstat(child, &cst); err != nil {
				return fmt.Errorf("copy %s: %w", child, err)
			}
			if err := c.copy(ctx, child, dst+"/"+name, &cst); err != nil {
				return err
			}
		}
	case unix.S_IFREG:
		key := inodeKey{st.Dev, st.Ino}
		if first, ok := c.links[key]; ok {
			// The inode is complete already (attributes included).
			if err := os.Link(first, dst); err != nil {
				return fmt.Errorf("copy %s: %w", src, err)
			}
			return nil
		}
		err = copyFileData(src, dst, st)
		if err == nil && st.Nlink > 1 {
			c.links[key] = dst
		}
	case unix.S_IFLNK:
		var target string
		if target, err = os.Readlink(src); err == nil {
			err = os.Symlink(target, dst)
		}
	case unix.S_IFCHR, unix.S_IFBLK, unix.S_IFIFO:
		err = unix.Mknod(dst, st.Mode&unix.S_IFMT|0o600, int(st.Rdev))
	case unix.S_IFSOCK:
		err = errors.New("a socket is not store content")
	default:
		err = fmt.Errorf("unknown file type %#o", st.Mode&unix.S_IFMT)
	}
	if err == nil {
		err = copyAttrs(src, dst, st)
	}
	if err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	return nil
}

// copyFileData copies a regular file's bytes into a new file dst; io.Copy
// uses copy_file_range(2), so the data need not pass through user space.
func copyFileData(src, dst string, st *unix.Stat_t) error {
	in, err := openNoFollow(src, inodeKey{st.Dev, st.Ino})
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	n, err := io.Copy(out, in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if n != st.Size {
		return fmt.Errorf("size %d, then copied %d bytes: %w", st.Size, n, errTreeChanged)
	}
	return nil
}

// copyAttrs gives dst, a fresh copy of src, src's owners, xattrs, mode and
// times, in that order: chown clears setuid bits and security.capability,
// and every change but utimes touches the times.
func copyAttrs(src, dst string, st *unix.Stat_t) error {
	isLink := st.Mode&unix.S_IFMT == unix.S_IFLNK
	if err := unix.Lchown(dst, int(st.Uid), int(st.Gid)); err != nil {
		return err
	}
	xs, err := readManifestXattrs(src)
	if err != nil {
		return err
	}
	for _, x := range xs {
		name := x.Name
		if name == opaqueXattr {
			// Under the name this store's overlays read; the manifest is the same.
			name = OpaqueXattr()
		}
		if err := unix.Lsetxattr(dst, name, x.Value, 0); err != nil {
			return fmt.Errorf("set xattr %s: %w", name, err)
		}
	}
	// A symlink's mode is always 0777 and chmod would follow it.
	if !isLink {
		if err := unix.Chmod(dst, st.Mode&0o7777); err != nil {
			return err
		}
	}
	ts := []unix.Timespec{st.Atim, st.Mtim}
	return unix.UtimesNanoAt(unix.AT_FDCWD, dst, ts, unix.AT_SYMLINK_NOFOLLOW)
}
