package upper

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"toolshed.dev/shed/internal/hint"
	"toolshed.dev/shed/internal/userns"
)

// ErrExist is the error of a Create or Branch to a name that already holds an upper.
var ErrExist = errors.New("upper exists")

// FS is a store's uppers: <storeRoot>/uppers.
type FS struct {
	dir     string // <storeRoot>/uppers
	cow     bool
	qgroups string // /sys/fs/btrfs/<fsid>/qgroups when quotas are on, or ""

	mu       sync.Mutex
	syncing  bool // a reclaim is running
	again    bool // and one more is wanted after it
	reclaims sync.WaitGroup
}

// Options are Open's.
type Options struct {
	// Size is the image's size when shed makes it. 0 is a quarter of the free space of the store's
	// filesystem, at most 16 GiB and at least 1 GiB. An image once made keeps its size.
	Size int64

	// copyOnly forces plain directories and copies (the tests of copy mode).
	copyOnly bool
	// noQuotas leaves quotas off in an image made (the benchmarks' baseline).
	noQuotas bool
	// bufferedIO attaches the image without direct I/O (BenchmarkOpen's comparison).
	bufferedIO bool
}

const (
	gib         = 1 << 30
	defaultMax  = 16 * gib
	defaultMin  = 1 * gib
	dirName     = "uppers"
	imageName   = "uppers.img"
	lockName    = "uppers.lock"
	partSuffix  = ".part"
	upperSubdir = "upper"
	workSubdir  = "work"
)

// Open finds or makes the uppers' filesystem of the store at storeRoot: a btrfs image made (mkfs) and
// loop-mounted the first time, and mounted again after a reboot; the store root's own btrfs used as it
// is; plain directories without root or without btrfs in the kernel. It is a statfs when the uppers
// are mounted already, and safe to call from two processes at once (they take a flock to mount).
func Open(storeRoot string, opts Options) (*FS, error) {
	if opts.Size < 0 {
		return nil, fmt.Errorf("open the uppers of %s: size %d is negative", storeRoot, opts.Size)
	}
	dir := filepath.Join(storeRoot, dirName)
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("make the uppers' directory %s: %w", dir, err)
	}
	if opts.copyOnly {
		return &FS{dir: dir}, nil
	}
	if ok, err := isBtrfs(dir); err != nil || ok {
		if err != nil {
			return nil, err
		}
		return withQuotas(storeRoot, dir, opts)
	}
	if os.Geteuid() != 0 || userns.Active() {
		// No loop device or btrfs mount without root (shed without root is root of a user namespace
		// of its own, where neither is allowed): copies.
		return &FS{dir: dir}, nil
	}
	lock, err := os.OpenFile(filepath.Join(storeRoot, lockName), os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock the uppers of %s: %w", storeRoot, err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return nil, fmt.Errorf("lock %s: %w", lock.Name(), err)
	}
	// Another process may have mounted it while this one waited.
	if ok, err := isBtrfs(dir); err != nil || ok {
		if err != nil {
			return nil, err
		}
		return withQuotas(storeRoot, dir, opts)
	}
	// Copies made there before (without btrfs-progs, say) would be hidden under the mount, and the
	// Benches whose uppers they are would lose their files.
	if ents, err := os.ReadDir(dir); err != nil {
		return nil, fmt.Errorf("read the uppers' directory: %w", err)
	} else if len(ents) > 0 {
		return nil, hint.Wrap(fmt.Errorf("the uppers' directory %s holds %d entries made without btrfs (%s...): mounting the uppers' btrfs there would hide them", dir, len(ents), ents[0].Name()),
			"remove the Benches and snapshots kept there, or move the directory aside")
	}
	img := filepath.Join(storeRoot, imageName)
	if _, err := os.Stat(img); errors.Is(err, fs.ErrNotExist) {
		if err := haveBtrfs(); err != nil {
			return &FS{dir: dir}, nil
		}
		size := opts.Size
		if size == 0 {
			size = defaultSize(storeRoot)
		}
		if err := makeImage(img, size); err != nil {
			return nil, err
		}
	} else if err != nil {
		return nil, fmt.Errorf("stat the uppers' image: %w", err)
	}
	if err := mountImage(img, dir, !opts.bufferedIO); err != nil {
		return nil, err
	}
	// The image's root is 0755 from mkfs; the uppers are root's alone, as the mount point was.
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("chmod %s: %w", dir, err)
	}
	return withQuotas(storeRoot, dir, opts)
}

// withQuotas is the uppers on the btrfs at dir, with quotas: simple quotas turned on in an image shed
// made (once; then a mutex in the kernel), those a store root's own btrfs has on used, none otherwise
// (shed does not change how the host accounts its own filesystem). A kernel without simple quotas
// (before 6.7): none, and per-user disk bounds cannot be kept (SetGroupLimit says so).
func withQuotas(storeRoot, dir string, opts Options) (*FS, error) {
	f := &FS{dir: dir, cow: true}
	if os.Geteuid() != 0 || opts.noQuotas {
		return f, nil
	}
	if _, err := os.Lstat(filepath.Join(storeRoot, imageName)); err == nil {
		if enableQuotas(dir) != nil {
			return f, nil
		}
	}
	q, err := qgroupsDir(dir)
	if err != nil {
		return f, nil
	}
	if _, err := os.Stat(q); err == nil {
		f.qgroups = q
	}
	return f, nil
}

// Unmount unmounts the uppers of the store at storeRoot if shed mounted its image there (the loop
// device frees itself), after which Open mounts them again: for removing a store, and for tests,
// whose temporary directories cannot be removed with a filesystem mounted in them. A store root's own
// btrfs, and copies, are left as they are.
func Unmount(storeRoot string) error {
	dir := filepath.Join(storeRoot, dirName)
	var a, b unix.Stat_t
	if err := unix.Lstat(dir, &a); errors.Is(err, unix.ENOENT) {
		return nil
	} else if err != nil {
		return fmt.Errorf("unmount the uppers: %w", err)
	}
	if err := unix.Lstat(storeRoot, &b); err != nil {
		return fmt.Errorf("unmount the uppers: %w", err)
	}
	if a.Dev == b.Dev {
		return nil // not a mount
	}
	if err := unix.Unmount(dir, 0); err != nil {
		return fmt.Errorf("unmount the uppers %s: %w", dir, err)
	}
	return nil
}

// haveBtrfs says whether the kernel can mount a btrfs (or could load its module): without it, copies.
func haveBtrfs() error {
	b, err := os.ReadFile("/proc/filesystems")
	if err == nil && strings.Contains(string(b), "\tbtrfs\n") {
		return nil
	}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		if _, err := os.Stat(filepath.Join("/lib/modules", unix.ByteSliceToString(u.Release[:]), "kernel/fs/btrfs")); err == nil {
			return nil
		}
	}
	return errors.New("no btrfs in the kernel")
}

// defaultSize is a quarter of the free space where the image goes, within [1 GiB, 16 GiB].
func defaultSize(storeRoot string) int64 {
	var s unix.Statfs_t
	if unix.Statfs(storeRoot, &s) != nil {
		return defaultMin
	}
	return min(max(int64(s.Bavail)*s.Bsize/4, defaultMin), defaultMax)
}

// CoW says whether branches are btrfs snapshots (true) or copies.
func (f *FS) CoW() bool { return f.cow }

// Dir is the directory of upper name (it holds upper/ and work/). name must be valid (Check): it
// panics on one that is not, a caller's bug, since names are ids the supervisor makes. Names are
// the caller's to keep unique: two Creates or Branches to one name at once fail, one or both, and
// leave no half upper.
func (f *FS) Dir(name string) string {
	if err := Check(name); err != nil {
		panic(err) // a caller's bug: names come from ids shed makes
	}
	return filepath.Join(f.dir, name)
}

// Check says whether name can name an upper: relative, slash-separated parts of letters, digits and
// "._-", none starting with a dot (the parts of changes under way are ".<base>.part").
func Check(name string) error {
	if name == "" {
		return fmt.Errorf("upper name is empty")
	}
	for _, p := range strings.Split(name, "/") {
		if p == "" || p[0] == '.' || p[0] == '-' || len(p) > 200 {
			return fmt.Errorf("upper name %q: bad part %q", name, p)
		}
		for _, c := range p {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
				return fmt.Errorf("upper name %q: bad character %q", name, c)
			}
		}
	}
	return nil
}

func (f *FS) path(name string) (string, error) {
	if err := Check(name); err != nil {
		return "", err
	}
	return filepath.Join(f.dir, name), nil
}

// part is where a change to dir is made before it is renamed to dir.
func part(dir string) string {
	return filepath.Join(filepath.Dir(dir), "."+filepath.Base(dir)+partSuffix)
}

// Create makes the new, empty upper name: a subvolume (or a directory) with upper/ and work/, 0755,
// root's.
func (f *FS) Create(name string) error {
	dir, err := f.path(name)
	if err != nil {
		return err
	}
	if err := f.prepare(dir); err != nil {
		return err
	}
	p := part(dir)
	if f.cow {
		err = subvolCreate(p)
	} else {
		err = os.Mkdir(p, 0o755)
	}
	if err == nil {
		err = os.Chmod(p, 0o755)
	}
	for _, d := range []string{upperSubdir, workSubdir} {
		if err == nil {
			err = os.Mkdir(filepath.Join(p, d), 0o755)
		}
	}
	if err == nil {
		err = rename(p, dir)
	}
	if err != nil {
		f.removeDir(p)
		return fmt.Errorf("create upper %s: %w", dir, err)
	}
	return nil
}

// prepare makes dir's parents and removes a part of dir that a crash left; dir itself must not exist.
func (f *FS) prepare(dir string) error {
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return fmt.Errorf("make %s: %w", filepath.Dir(dir), err)
	}
	if _, err := os.Lstat(dir); err == nil {
		return hint.Wrap(fmt.Errorf("%s: %w", dir, ErrExist), "remove it first, or pick another name")
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := f.removeDir(part(dir)); err != nil {
		return fmt.Errorf("remove what a crash left of %s: %w", dir, err)
	}
	return nil
}

// rename moves the finished part p to dir, refusing to replace anything there (a racing Create).
func rename(p, dir string) error {
	err := unix.Renameat2(unix.AT_FDCWD, p, unix.AT_FDCWD, dir, unix.RENAME_NOREPLACE)
	if errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("%s: %w", dir, ErrExist)
	}
	return err
}

// Branch makes each of dsts a copy of src as of one instant: btrfs snapshots made in parallel (so that
// they share one transaction commit), or copies. A read-only branch is a sealed snapshot; a writable
// one has its work/ emptied (what the source's overlay left there is not the branch's). The caller
// keeps src at rest while Branch runs (a frozen Bench): the branches are then its state at one
// instant. All or nothing: on error none of dsts is left.
func (f *FS) Branch(src string, dsts []string, readonly bool) error {
	s, err := f.path(src)
	if err != nil {
		return err
	}
	if f.cow {
		if ok, err := isSubvol(s); err != nil {
			return fmt.Errorf("branch upper %s: %w", s, err)
		} else if !ok {
			return fmt.Errorf("branch upper %s: not a subvolume", s)
		}
	} else if _, err := os.Lstat(s); err != nil {
		return fmt.Errorf("branch upper: %w", err)
	}
	dirs := make([]string, len(dsts))
	seen := map[string]bool{src: true}
	for i, d := range dsts {
		if dirs[i], err = f.path(d); err != nil {
			return err
		}
		if seen[d] {
			return fmt.Errorf("branch upper %s: %s named twice", s, d)
		}
		seen[d] = true
		if err := f.prepare(dirs[i]); err != nil {
			return err
		}
	}
	errs := make([]error, len(dirs))
	var wg sync.WaitGroup
	// At once, so that the snapshots share transaction commits; bounded, each holding a thread.
	sem := make(chan struct{}, 32)
	for i, d := range dirs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			errs[i] = f.branch(s, part(d), readonly)
		}()
	}
	wg.Wait()
	err = errors.Join(errs...)
	done := 0
	for ; err == nil && done < len(dirs); done++ {
		err = rename(part(dirs[done]), dirs[done])
	}
	if err != nil {
		for i, d := range dirs {
			f.removeDir(part(d))
			if i < done {
				f.removeDir(d)
			}
		}
		return fmt.Errorf("branch upper %s: %w", s, err)
	}
	return nil
}

// branch makes p a copy of the upper s.
func (f *FS) branch(s, p string, readonly bool) error {
	if f.cow {
		if readonly {
			return snapCreate(s, p, true)
		}
		if err := snapCreate(s, p, false); err != nil {
			return err
		}
		return emptyDir(filepath.Join(p, workSubdir))
	}
	// --reflink=auto: a reflink copy where the filesystem has them (xfs), a copy elsewhere.
	if out, err := exec.Command("cp", "-a", "--reflink=auto", "--", s, p).CombinedOutput(); err != nil {
		return fmt.Errorf("cp -a %s %s: %w: %s", s, p, err, strings.TrimSpace(string(out)))
	}
	if readonly {
		return nil
	}
	return emptyDir(filepath.Join(p, workSubdir))
}

// emptyDir removes what dir holds (overlayfs's work/work, mode 000, root's), not dir.
func emptyDir(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// Remove removes the upper name and what a crash left of a change to it; removing what is not there
// succeeds. An overlay still mounted on the upper keeps working on it (btrfs frees a removed
// subvolume once nothing holds it): stop the Bench first.
func (f *FS) Remove(name string) error {
	dir, err := f.path(name)
	if err != nil {
		return err
	}
	for _, d := range []string{dir, part(dir)} {
		if err := f.removeDir(d); err != nil {
			return fmt.Errorf("remove upper %s: %w", d, err)
		}
	}
	return nil
}

// removeDir removes the subvolume or directory dir; not there is done.
func (f *FS) removeDir(dir string) error {
	if f.cow {
		ok, err := isSubvol(dir)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if ok {
			if err := snapDestroy(dir); err != nil {
				return err
			}
			f.reclaim()
			return nil
		}
	}
	return os.RemoveAll(dir)
}

// Flush commits what has been written to the uppers so far (syncfs). A btrfs snapshot commits the
// writes not yet committed, so a Branch of an upper just written costs their writing (a snapshot of
// 100,000 files just made: 0.28 s, against 3 ms once flushed): a caller that freezes a Bench for a
// Branch flushes first, while it runs, and the freeze then holds only the writes after.
func (f *FS) Flush() error {
	d, err := openDir(f.dir)
	if err != nil {
		return fmt.Errorf("flush the uppers: %w", err)
	}
	defer unix.Close(d)
	if err := unix.Syncfs(d); err != nil {
		return fmt.Errorf("flush the uppers %s: %w", f.dir, err)
	}
	return nil
}

// reclaim has btrfs free the space of removed subvolumes now, in the background. btrfs drops a
// deleted subvolume's extents in its cleaner thread, which it wakes at its periodic commit (30 s): a
// Bench reset after it filled the uppers would see ENOSPC until then. BTRFS_IOC_SYNC commits and
// wakes the cleaner; it waits for the commit, hence the goroutine, and Removes while one runs share
// the next.
func (f *FS) reclaim() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.syncing {
		f.again = true
		return
	}
	f.syncing = true
	f.reclaims.Add(1)
	go func() {
		defer f.reclaims.Done()
		for {
			if d, err := openDir(f.dir); err == nil {
				_ = ioctl(d, iocSync, nil) // at worst, the space comes back at the next commit
				unix.Close(d)
			}
			f.mu.Lock()
			if !f.again {
				f.syncing = false
				f.mu.Unlock()
				return
			}
			f.again = false
			f.mu.Unlock()
		}
	}()
}

// Usage is the bytes upper name's files take (their allocated blocks, each hard-linked file once).
// On btrfs this counts the extents a branch shares with its source as its own (a walk; btrfs's
// exclusive figure needs quotas on, which cost every write).
func (f *FS) Usage(name string) (int64, error) {
	dir, err := f.path(name)
	if err != nil {
		return 0, err
	}
	var n int64
	type key struct{ dev, ino uint64 }
	links := map[key]bool{}
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		if st.Nlink > 1 && !d.IsDir() {
			k := key{st.Dev, st.Ino}
			if links[k] {
				return nil
			}
			links[k] = true
		}
		n += st.Blocks * 512
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("usage of upper %s: %w", dir, err)
	}
	return n, nil
}
