package upper

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The btrfs ioctls, written out from linux/btrfs.h: the one Go library (containerd/btrfs) needs cgo and
// the kernel's headers, and shed is built with CGO_ENABLED=0.
const (
	iocSync           = 0x9408     // _IO(0x94, 8)
	iocSubvolCreate   = 0x5000940e // _IOW(0x94, 14, struct btrfs_ioctl_vol_args)
	iocSnapDestroy    = 0x5000940f // _IOW(0x94, 15, struct btrfs_ioctl_vol_args)
	iocSnapCreateV2   = 0x50009417 // _IOW(0x94, 23, struct btrfs_ioctl_vol_args_v2)
	iocSubvolGetflags = 0x80089419 // _IOR(0x94, 25, __u64)
	iocSubvolSetflags = 0x4008941a // _IOW(0x94, 26, __u64)

	subvolRdonly = 1 << 1 // BTRFS_SUBVOL_RDONLY

	// A subvolume's root directory is always inode 256 (BTRFS_FIRST_FREE_OBJECTID).
	subvolIno = 256
)

// volArgs is struct btrfs_ioctl_vol_args (4096 bytes).
type volArgs struct {
	fd   int64
	name [4088]byte
}

// volArgsV2 is struct btrfs_ioctl_vol_args_v2 (4096 bytes).
type volArgsV2 struct {
	fd      int64
	transid uint64
	flags   uint64
	unused  [4]uint64
	name    [4040]byte
}

func ioctl(fd int, req uintptr, arg unsafe.Pointer) error {
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg)); e != 0 {
		return e
	}
	return nil
}

// openDir opens dir for an ioctl, not following a symlink at its end.
func openDir(dir string) (int, error) {
	return unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
}

// subvolCreate makes the empty subvolume path.
func subvolCreate(path string) error {
	parent, err := openDir(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer unix.Close(parent)
	var a volArgs
	copy(a.name[:len(a.name)-1], filepath.Base(path))
	return ioctl(parent, iocSubvolCreate, unsafe.Pointer(&a))
}

// snapCreate makes path a snapshot of the subvolume src, read-only if readonly.
func snapCreate(src, path string, readonly bool) error {
	s, err := openDir(src)
	if err != nil {
		return err
	}
	defer unix.Close(s)
	parent, err := openDir(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer unix.Close(parent)
	a := volArgsV2{fd: int64(s)}
	if readonly {
		a.flags = subvolRdonly
	}
	copy(a.name[:len(a.name)-1], filepath.Base(path))
	return ioctl(parent, iocSnapCreateV2, unsafe.Pointer(&a))
}

// snapDestroy removes the subvolume path with all it holds. A read-only one has its flag cleared
// first: the kernel refuses to delete a read-only subvolume on some versions and mount options.
func snapDestroy(path string) error {
	if fd, err := openDir(path); err == nil {
		var flags uint64
		if ioctl(fd, iocSubvolGetflags, unsafe.Pointer(&flags)) == nil && flags&subvolRdonly != 0 {
			flags &^= subvolRdonly
			_ = ioctl(fd, iocSubvolSetflags, unsafe.Pointer(&flags))
		}
		unix.Close(fd)
	}
	parent, err := openDir(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer unix.Close(parent)
	var a volArgs
	copy(a.name[:len(a.name)-1], filepath.Base(path))
	return ioctl(parent, iocSnapDestroy, unsafe.Pointer(&a))
}

// isSubvol says whether path is the root of a btrfs subvolume.
func isSubvol(path string) (bool, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return false, err
	}
	st := fi.Sys().(*syscall.Stat_t)
	return fi.IsDir() && st.Ino == subvolIno, nil
}

func isBtrfs(dir string) (bool, error) {
	var s unix.Statfs_t
	if err := unix.Statfs(dir, &s); err != nil {
		return false, fmt.Errorf("statfs %s: %w", dir, err)
	}
	return s.Type == unix.BTRFS_SUPER_MAGIC, nil
}
