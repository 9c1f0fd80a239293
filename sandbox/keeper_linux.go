package sandbox

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// The user namespaces kept for idmapped mounts (keptUserns) are bind mounts of their nsfs files. On the
// host's mount table they would be copied into every mount namespace made after them (each sandbox's
// init, each container's, each unshare's) and detached again by every sandbox's pivot: on a host where
// the tests had run, 116 of its 144 mounts were such binds. So they live in a mount namespace of their
// own, the keeper: a tmpfs with the binds on it and nothing of the host's. The host has one mount for
// it, a bind of the keeper's nsfs file at keeperFile, which the kernel copies into no other mount
// namespace (copy_tree leaves binds of mount namespace files out).
const keeperFile = idDir + "/keep.mnt"

// theKeeper is this process's handle of the keeper, opened once.
var theKeeper struct {
	sync.Mutex
	k *keeperNS
}

type keeperNS struct {
	ns   *os.File // the keeper's mount namespace, to enter it (inMountNS)
	root *os.File // its root directory (O_PATH): a lookup through it works from any mount namespace
}

// openKeeper returns the keeper, making it if the host has none, or has at keeperFile anything that
// is not a keeper (a file left by a crash, or planted). Call it without idDir's lock: it takes the lock
// to make one.
func openKeeper() (*keeperNS, error) {
	theKeeper.Lock()
	defer theKeeper.Unlock()
	if theKeeper.k != nil {
		return theKeeper.k, nil
	}
	// Whoever writes idDir decides which ids a sandbox's lowers map to: check it is root's alone
	// before trusting what it holds.
	if err := makeIDDir(); err != nil {
		return nil, err
	}
	k, err := checkKeeper()
	if err != nil {
		lk, lerr := lockDir(idDir, unix.LOCK_EX)
		if lerr != nil {
			return nil, fmt.Errorf("sandbox ids: %w", lerr)
		}
		defer lk.Close()
		if k, err = checkKeeper(); err != nil {
			if err = makeKeeper(); err == nil {
				k, err = checkKeeper()
			}
		}
		if err != nil {
			return nil, fmt.Errorf("sandbox ids: the mount namespace that keeps the user namespaces (%s): %w", keeperFile, err)
		}
	}
	theKeeper.k = k
	return k, nil
}

// checkKeeper opens keeperFile and its root, refusing anything that is not a keeper: not a mount
// namespace, this process's own, or one whose root is not a tmpfs (the host's tree, say).
func checkKeeper() (*keeperNS, error) {
	f, err := os.OpenFile(keeperFile, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	if t, err := unix.IoctlRetInt(int(f.Fd()), unix.NS_GET_NSTYPE); err != nil || t != unix.CLONE_NEWNS {
		f.Close()
		return nil, fmt.Errorf("%s is not a mount namespace (%v)", keeperFile, err)
	}
	var ks, own unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &ks); err != nil || unix.Stat("/proc/thread-self/ns/mnt", &own) != nil || ks.Ino == own.Ino {
		f.Close()
		return nil, fmt.Errorf("%s is this process's own mount namespace, not a keeper", keeperFile)
	}
	var root *os.File
	if err := inMountNS(f, func() error {
		var err error
		root, err = os.OpenFile("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		return err
	}); err != nil {
		f.Close()
		return nil, fmt.Errorf("enter %s: %w", keeperFile, err)
	}
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(int(root.Fd()), &sfs); err != nil || sfs.Type != unix.TMPFS_MAGIC {
		f.Close()
		root.Close()
		return nil, fmt.Errorf("%s is a mount namespace whose root is not a tmpfs: not a keeper", keeperFile)
	}
	return &keeperNS{ns: f, root: root}, nil
}

// makeKeeper makes the keeper's mount namespace and binds it at keeperFile; then it lets go of the
// binds an older shed kept on the host's table. Call it with idDir's lock held.
func makeKeeper() error {
	type made struct {
		ns  *os.File
		err error
	}
	c := make(chan made, 1)
	onOwnThread(func() {
		ns, err := func() (*os.File, error) {
			if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
				return nil, fmt.Errorf("unshare: %w", err)
			}
			ns, err := os.Open("/proc/thread-self/ns/mnt")
			if err != nil {
				return nil, err
			}
			// A tmpfs alone, pivoted into: the host's tree is detached, so the keeper holds no copy of it.
			for _, step := range []struct {
				what string
				do   func() error
			}{
				{"make mounts private", func() error { return unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, "") }},
				{"mount tmpfs", func() error {
					return unix.Mount("tmpfs", idDir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0700,size=64k")
				}},
				{"chdir", func() error { return unix.Chdir(idDir) }},
				{"pivot_root", func() error { return unix.PivotRoot(".", ".") }},
				{"detach the host's tree", func() error { return unix.Unmount(".", unix.MNT_DETACH) }},
				{"chdir /", func() error { return unix.Chdir("/") }},
			} {
				if err := step.do(); err != nil {
					ns.Close()
					return nil, fmt.Errorf("%s: %w", step.what, err)
				}
			}
			return ns, nil
		}()
		c <- made{ns, err}
	})
	m := <-c
	if m.err != nil {
		return m.err
	}
	defer m.ns.Close()
	tree, err := unix.OpenTree(int(m.ns.Fd()), "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH)
	if err != nil {
		return fmt.Errorf("open_tree: %w", err)
	}
	defer unix.Close(tree)
	// Whatever is there is not a keeper (checkKeeper): a file left by a crash between creating the
	// mount point and mounting on it, or something planted. Mounts on it are detached, all of them.
	for unix.Unmount(keeperFile, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW) == nil {
	}
	if err := os.RemoveAll(keeperFile); err != nil {
		return err
	}
	if err := attachFile(tree, unix.AT_FDCWD, keeperFile); err != nil {
		return err
	}
	dropHostBinds()
	return nil
}

// attachFile attaches a detached tree of a file (an nsfs file) on a new empty file at path, relative
// to dir.
func attachFile(tree, dir int, path string) error {
	fd, err := unix.Openat(dir, path, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	unix.Close(fd)
	if err := unix.MoveMount(tree, "", dir, path, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		_ = unix.Unlinkat(dir, path, 0)
		return fmt.Errorf("move_mount: %w", err)
	}
	return nil
}

// dropHostBinds detaches and removes the user namespaces an older shed kept on the host's mount table
// (idDir/userns-*): each lives on as long as a descriptor or a mount of it does, and the keeper's
// are made again as they are needed.
func dropHostBinds() {
	ents, err := os.ReadDir(idDir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "userns-") {
			continue
		}
		p := filepath.Join(idDir, e.Name())
		for unix.Unmount(p, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW) == nil {
		}
		_ = os.Remove(p)
	}
}

// inMountNS runs fn on a thread of its own in the mount namespace ns; the thread ends after.
func inMountNS(ns *os.File, fn func() error) error {
	errc := make(chan error, 1)
	onOwnThread(func() {
		// setns into a mount namespace wants a thread that shares its root and cwd with no other.
		if err := unix.Unshare(unix.CLONE_FS); err != nil {
			errc <- fmt.Errorf("unshare: %w", err)
			return
		}
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNS); err != nil {
			errc <- fmt.Errorf("setns: %w", err)
			return
		}
		errc <- fn()
	})
	return <-errc
}

// onOwnThread runs fn on a locked thread of its own and ends that thread after fn: fn may leave it in
// another namespace. Not the main thread (the runtime never ends that one: it parks it for good, and
// /proc/self is its view), and not a thread with children: the sandboxes' inits are started with
// Pdeathsig, which the kernel sends when the thread that forked them ends, not the process.
func onOwnThread(fn func()) { go ownThread(fn, func() {}) }

// ownThread runs fn on this goroutine's thread if it is fit to end; if not, it holds the thread (so the
// scheduler gives the next goroutine another, or a new one) and tries again on another goroutine, until
// fn has a thread; then it lets its own go, and calls onThread.
func ownThread(fn, onThread func()) {
	runtime.LockOSThread()
	if unix.Gettid() == unix.Getpid() || hasChildren() {
		held := make(chan struct{})
		go ownThread(fn, func() { close(held) })
		<-held
		runtime.UnlockOSThread()
		onThread()
		return
	}
	onThread()
	fn() // and the thread ends with the goroutine, still locked
}

// hasChildren reports whether this thread forked a process that is still alive (or cannot tell).
func hasChildren() bool {
	b, err := os.ReadFile("/proc/thread-self/children")
	return err != nil || len(strings.TrimSpace(string(b))) > 0
}
