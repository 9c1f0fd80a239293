package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"

	"toolshed.dev/shed/internal/hint"
	"toolshed.dev/shed/internal/sibling"
)

// InitName is the small program a sandbox's init runs (cmd/shed-init): it links this package and
// nothing else, so it starts in a fraction of the time of the program that uses this package, whose
// libraries' package initialization it would pay on every launch. It is looked for beside the
// running executable, then in ../libexec/shed/ (where `make install` puts it); without one, init is
// this executable itself, which then must call Init first in main, as shed and the tests do.
const InitName = "shed-init"

// The init is executed from a handle that no one can write (the runc CVE-2019-5736 guard): a process
// inside that reaches /proc/1/exe finds that handle, never a writable host file. The handle is made
// once per process and reused.
//
// Two ways, cheapest first (runc 1.2 does the same, see libcontainer/exeseal):
//   - sealedOverlay: the binary opened through a private, read-only overlayfs mount of its own
//     directory that is attached nowhere. Overlay without an upper layer has no way to write, and
//     the mount cannot be remounted read-write because nothing can reach it. No copy: the page
//     cache is shared with the host binary, so it costs a mount (about 0.2 ms), not a copy of the
//     binary (about 10 ms for shed's 20 MB) per shed process.
//   - sealedCopy: a copy in a memfd sealed against writes, for kernels that cannot give an
//     overlayfs layer by file descriptor (before 6.13) or a binary on a file system overlayfs
//     refuses as a layer.
var selfExe struct {
	once sync.Once
	f    *os.File
	err  error
}

func sealedSelf() (*os.File, error) {
	selfExe.once.Do(func() {
		exe, err := initProgram()
		if err != nil {
			selfExe.err = err
			return
		}
		selfExe.f, selfExe.err = sealedOverlay(exe)
		if selfExe.err != nil {
			selfExe.f, selfExe.err = sealedCopy(exe)
		}
	})
	return selfExe.f, selfExe.err
}

// InitProgram is the file a sandbox's init is executed from: InitName where it is found, else this
// executable.
func InitProgram() (string, error) { return initProgram() }

func initProgram() (string, error) {
	if p, err := sibling.Find(InitName); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			return real, nil // opened with O_NOFOLLOW: a packaged symlink is followed here, once
		}
	}
	return os.Readlink("/proc/self/exe")
}

// checkInit refuses an init program that someone other than root or this process's user could have
// written: init runs as the sandbox's root, so whoever may change the file owns every sandbox.
func checkInit(fd int, name string) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return fmt.Errorf("%s is not a regular file", name)
	case st.Uid != 0 && int(st.Uid) != os.Geteuid():
		return hint.Wrap(fmt.Errorf("%s belongs to uid %d, not to root or to this user", name, st.Uid), "reinstall it as root or as this user: `make install`")
	case st.Mode&0o022 != 0:
		return fmt.Errorf("%s is writable by others (mode %#o): chmod go-w it", name, st.Mode&0o7777)
	}
	return nil
}

// sealedOverlay opens exe through a detached read-only overlayfs whose layers are the binary's
// directory and an empty tmpfs: overlay needs two layers to mount without an upper, and the tmpfs,
// given by file descriptor, is reachable from no path either.
func sealedOverlay(exe string) (*os.File, error) {
	dir, name := filepath.Split(exe)
	empty, err := detachedMount("tmpfs", nil, unix.MOUNT_ATTR_RDONLY)
	if err != nil {
		return nil, err
	}
	defer unix.Close(empty)
	ovl, err := detachedMount("overlay", func(ctx int) error {
		if err := unix.FsconfigSetString(ctx, "lowerdir+", dir); err != nil {
			return fmt.Errorf("lowerdir+=%s: %w", dir, err)
		}
		if err := unix.FsconfigSetFd(ctx, "lowerdir+", empty); err != nil {
			return fmt.Errorf("lowerdir+ by fd: %w", err)
		}
		// Inode numbers do not matter here; without this, mixed file systems log a warning.
		_ = unix.FsconfigSetString(ctx, "xino", "off")
		return nil
	}, unix.MOUNT_ATTR_RDONLY|unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV)
	if err != nil {
		return nil, err
	}
	defer unix.Close(ovl)
	fd, err := unix.Openat(ovl, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s through the sealing overlay: %w", name, err)
	}
	f := os.NewFile(uintptr(fd), "shed-sandbox-init")
	if err := checkOpened(fd, exe); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// checkOpened checks the file opened as exe: this executable must be the same file, not whatever was
// renamed over its path since this process started; another init program must pass checkInit.
func checkOpened(fd int, exe string) error {
	if self, _ := os.Readlink("/proc/self/exe"); exe != self {
		return checkInit(fd, exe)
	}
	var a, b unix.Stat_t
	if unix.Fstat(fd, &a) != nil || unix.Stat("/proc/self/exe", &b) != nil || a.Size != b.Size || a.Mtim != b.Mtim {
		return errors.New("the executable changed on disk since shed started")
	}
	return nil
}

// detachedMount creates a file system and returns a mount of it that is attached nowhere.
func detachedMount(fstype string, config func(ctx int) error, attrs int) (int, error) {
	ctx, err := unix.Fsopen(fstype, unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("fsopen %s: %w", fstype, err)
	}
	defer unix.Close(ctx)
	if config != nil {
		if err := config(ctx); err != nil {
			return -1, fmt.Errorf("%s: %w", fstype, err)
		}
	}
	if err := unix.FsconfigCreate(ctx); err != nil {
		return -1, fmt.Errorf("create %s: %w", fstype, err)
	}
	m, err := unix.Fsmount(ctx, unix.FSMOUNT_CLOEXEC, attrs)
	if err != nil {
		return -1, fmt.Errorf("fsmount %s: %w", fstype, err)
	}
	return m, nil
}

func sealedCopy(exe string) (*os.File, error) {
	self, _ := os.Readlink("/proc/self/exe")
	var src *os.File
	var err error
	if exe == self {
		src, err = os.Open("/proc/self/exe") // the running file, whatever its path names now
	} else {
		src, err = os.OpenFile(exe, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	}
	if err != nil {
		return nil, fmt.Errorf("open the init program: %w", err)
	}
	defer src.Close()
	if exe != self {
		if err := checkInit(int(src.Fd()), exe); err != nil {
			return nil, err
		}
	}
	fd, err := unix.MemfdCreate("shed-sandbox-init", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), "shed-sandbox-init")
	if err := copyAll(f, src); err != nil {
		f.Close()
		return nil, fmt.Errorf("copy the init program: %w", err)
	}
	seals := unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
		f.Close()
		return nil, fmt.Errorf("seal the copy of the init program: %w", err)
	}
	return f, nil
}

// copyAll copies src into the empty memfd dst. Sizing dst first and copying in the kernel (sendfile)
// measured about twice as fast as io.Copy here.
func copyAll(dst, src *os.File) error {
	st, err := src.Stat()
	if err != nil {
		return err
	}
	n := st.Size()
	if err := unix.Ftruncate(int(dst.Fd()), n); err != nil {
		return err
	}
	var off int64
	for off < n {
		k, err := unix.Sendfile(int(dst.Fd()), int(src.Fd()), &off, int(min(n-off, 1<<30)))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("sendfile: %w", err)
		}
		if k == 0 {
			return fmt.Errorf("sendfile: %s shrank to %d bytes while copying", src.Name(), off)
		}
	}
	return nil
}
