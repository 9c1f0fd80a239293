package upper

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"

	"golang.org/x/sys/unix"

	"toolshed.dev/shed/internal/hint"
)

// mountFlags: no setuid programs or device nodes of a sandbox's making act on the host through the
// uppers, and reads write nothing.
const mountFlags = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOATIME

// makeImage makes a btrfs of size bytes in the file img: written aside, preallocated (the host's disk
// filling up must not become the btrfs's I/O errors: a full uppers is ENOSPC inside it), formatted,
// renamed into place.
func makeImage(img string, size int64) error {
	mkfs, err := exec.LookPath("mkfs.btrfs")
	if err != nil {
		return hint.Wrap(fmt.Errorf("make the uppers' filesystem %s: mkfs.btrfs not found", img),
			"apt-get install btrfs-progs")
	}
	tmp := img + ".part"
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("make the uppers' image %s: %w", tmp, err)
	}
	err = unix.Fallocate(int(f.Fd()), 0, 0, size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return hint.Wrap(fmt.Errorf("preallocate %d bytes for the uppers' image %s: %w", size, tmp, err),
			"free space there, or give the uppers a smaller size")
	}
	// -f: tmp may hold an older, interrupted attempt's filesystem.
	if out, err := exec.Command(mkfs, "-q", "-f", tmp).CombinedOutput(); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("mkfs.btrfs %s: %w: %s", tmp, err, out)
	}
	if err := os.Rename(tmp, img); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("make the uppers' image %s: %w", img, err)
	}
	return nil
}

// mountImage attaches img to a free loop device and mounts its btrfs on dir. The device clears itself
// when the filesystem is unmounted (LO_FLAGS_AUTOCLEAR), or when this process ends before the mount.
func mountImage(img, dir string, directIO bool) error {
	f, err := os.OpenFile(img, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open the uppers' image %s: %w", img, err)
	}
	defer f.Close()
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return hint.Wrap(fmt.Errorf("mount the uppers' image %s: %w", img, err), "load the loop module (modprobe loop)")
	}
	defer ctl.Close()
	for try := 0; ; try++ {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return fmt.Errorf("find a free loop device for %s: %w", img, err)
		}
		dev := "/dev/loop" + strconv.Itoa(n)
		d, err := attach(dev, n, f, directIO)
		if errors.Is(err, unix.EBUSY) && try < 10 {
			continue // another process took it between GET_FREE and CONFIGURE
		}
		if err != nil {
			return fmt.Errorf("attach %s to %s: %w", img, dev, err)
		}
		err = unix.Mount(dev, dir, "btrfs", mountFlags, "")
		d.Close() // the mount holds the device now; without one, autoclear frees it
		if err != nil {
			return fmt.Errorf("mount %s (%s) on %s: %w", img, dev, dir, err)
		}
		return nil
	}
}

// attach configures loop device n (path dev) over f and returns it open: with autoclear, the device
// is freed on its last close, so it must stay open until it is mounted.
func attach(dev string, n int, f *os.File, directIO bool) (*os.File, error) {
	d, err := os.OpenFile(dev, os.O_RDWR|unix.O_CLOEXEC, 0)
	if errors.Is(err, os.ErrNotExist) {
		// A /dev without udev (a container's) has no node for a device the kernel just made.
		if err := unix.Mknod(dev, unix.S_IFBLK|0o600, int(unix.Mkdev(7, uint32(n)))); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, err
		}
		d, err = os.OpenFile(dev, os.O_RDWR|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return nil, err
	}
	cfg := unix.LoopConfig{Fd: uint32(f.Fd()), Size: 4096}
	cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
	if directIO {
		cfg.Info.Flags |= unix.LO_FLAGS_DIRECT_IO
	}
	copy(cfg.Info.File_name[:len(cfg.Info.File_name)-1], f.Name())
	err = unix.IoctlLoopConfigure(int(d.Fd()), &cfg)
	if err != nil && directIO && errors.Is(err, unix.EINVAL) {
		// A backing filesystem without O_DIRECT: buffered I/O, cached twice but correct.
		cfg.Info.Flags &^= unix.LO_FLAGS_DIRECT_IO
		err = unix.IoctlLoopConfigure(int(d.Fd()), &cfg)
	}
	if err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}
