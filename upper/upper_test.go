package upper

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"toolshed.dev/shed/internal/hint"
)

const testSize = 512 << 20

// needRoot skips a test that needs root, saying why.
func needRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the uppers' btrfs is loop-mounted")
	}
}

// open opens the uppers of a new store under t.TempDir(), unmounted at the end of the test.
func open(t testing.TB, opts Options) (*FS, string) {
	t.Helper()
	root := t.TempDir()
	f := openAt(t, root, opts)
	return f, root
}

func openAt(t testing.TB, root string, opts Options) *FS {
	t.Helper()
	if opts.Size == 0 {
		opts.Size = testSize
	}
	f, err := Open(root, opts)
	if err != nil {
		t.Fatal(err)
	}
	if !opts.copyOnly && !f.CoW() {
		t.Fatalf("Open(%s) as root: copies, want btrfs", root)
	}
	t.Cleanup(func() {
		f.reclaims.Wait() // its descriptor would keep the uppers busy
		unmount(t, filepath.Join(root, dirName))
	})
	return f
}

// unmount unmounts dir until nothing is mounted there.
func unmount(t testing.TB, dir string) {
	t.Helper()
	for mounts(t, dir) > 0 {
		if err := unix.Unmount(dir, 0); err != nil {
			// A failed test may have left a file open there: detach, and fail.
			unix.Unmount(dir, unix.MNT_DETACH)
			t.Errorf("unmount %s: %v", dir, err)
		}
	}
}

// source is the device mounted at dir.
func source(t testing.TB, dir string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		fields := strings.Fields(l)
		if len(fields) > 4 && fields[4] == dir {
			for i, f := range fields {
				if f == "-" && i+2 < len(fields) {
					return fields[i+2]
				}
			}
		}
	}
	t.Fatalf("nothing mounted at %s", dir)
	return ""
}

// loopAttr reads attribute a of loop device dev ("" when the device is not configured).
func loopAttr(t testing.TB, dev, a string) string {
	b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "loop", a))
	if errors.Is(err, os.ErrNotExist) {
		return ""
	} else if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// mounts counts the mounts at dir.
func mounts(t testing.TB, dir string) int {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := 0
	s := bufio.NewScanner(f)
	for s.Scan() {
		if fields := strings.Fields(s.Text()); len(fields) > 4 && fields[4] == dir {
			n++
		}
	}
	return n
}

func write(t testing.TB, p, s string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func read(t testing.TB, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func modes(t *testing.T, fn func(t *testing.T, opts Options)) {
	needRoot(t)
	t.Run("btrfs", func(t *testing.T) { fn(t, Options{}) })
	t.Run("copy", func(t *testing.T) { fn(t, Options{copyOnly: true}) })
}

// TestBranch: ten writable branches each see the source's files as of the branch, their writes are
// their own, and the source is unchanged.
func TestBranch(t *testing.T) {
	modes(t, func(t *testing.T, opts Options) {
		f, _ := open(t, opts)
		if err := f.Create("benches/a"); err != nil {
			t.Fatal(err)
		}
		src := f.Dir("benches/a")
		for _, d := range []string{"upper", "work"} {
			fi, err := os.Stat(filepath.Join(src, d))
			if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o755 || fi.Sys().(*syscall.Stat_t).Uid != 0 {
				t.Fatalf("%s/%s: %v %v, want a directory 0755 root's", src, d, fi, err)
			}
		}
		write(t, filepath.Join(src, "upper/etc/hello"), "source")
		write(t, filepath.Join(src, "work/left"), "the overlay's")
		var dsts []string
		for i := range 10 {
			dsts = append(dsts, fmt.Sprintf("benches/c%d", i))
		}
		if err := f.Flush(); err != nil {
			t.Fatal(err)
		}
		if err := f.Branch("benches/a", dsts, false); err != nil {
			t.Fatal(err)
		}
		write(t, filepath.Join(src, "upper/etc/later"), "after the branch")
		for i, d := range dsts {
			dir := f.Dir(d)
			if got := read(t, filepath.Join(dir, "upper/etc/hello")); got != "source" {
				t.Errorf("%s: got %q, want %q", d, got, "source")
			}
			if ents, err := os.ReadDir(filepath.Join(dir, "work")); err != nil || len(ents) != 0 {
				t.Errorf("%s/work: %v %v, want empty", d, ents, err)
			}
			if _, err := os.Stat(filepath.Join(dir, "upper/etc/later")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s sees a write to its source after the branch (%v)", d, err)
			}
			write(t, filepath.Join(dir, "upper/etc/hello"), fmt.Sprint("child ", i))
		}
		for i, d := range dsts {
			if got, want := read(t, filepath.Join(f.Dir(d), "upper/etc/hello")), fmt.Sprint("child ", i); got != want {
				t.Errorf("%s: got %q, want %q", d, got, want)
			}
		}
		if got := read(t, filepath.Join(src, "upper/etc/hello")); got != "source" {
			t.Errorf("source: got %q after its branches wrote, want %q", got, "source")
		}
		if got := read(t, filepath.Join(src, "work/left")); got != "the overlay's" {
			t.Errorf("source's work/: got %q, want it untouched", got)
		}
		n, err := f.Usage("benches/c3")
		if err != nil || n <= 0 {
			t.Errorf("Usage: %d, %v; want > 0", n, err)
		}
		// A branch of a branch.
		if err := f.Branch("benches/c3", []string{"snapshots/s"}, true); err != nil {
			t.Fatal(err)
		}
		if got := read(t, filepath.Join(f.Dir("snapshots/s"), "upper/etc/hello")); got != "child 3" {
			t.Errorf("snapshot of c3: got %q, want %q", got, "child 3")
		}
	})
}

// TestReadonly: a sealed snapshot refuses writes, and is removed like any upper, twice.
func TestReadonly(t *testing.T) {
	needRoot(t)
	f, _ := open(t, Options{})
	if err := f.Create("benches/a"); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(f.Dir("benches/a"), "upper/f"), "x")
	if err := f.Branch("benches/a", []string{"snapshots/s"}, true); err != nil {
		t.Fatal(err)
	}
	s := f.Dir("snapshots/s")
	if err := os.WriteFile(filepath.Join(s, "upper/f"), []byte("y"), 0o644); !errors.Is(err, unix.EROFS) {
		t.Errorf("write into a read-only snapshot: %v, want EROFS", err)
	}
	if err := os.Mkdir(filepath.Join(s, "upper/d"), 0o755); !errors.Is(err, unix.EROFS) {
		t.Errorf("mkdir in a read-only snapshot: %v, want EROFS", err)
	}
	if got := read(t, filepath.Join(s, "upper/f")); got != "x" {
		t.Errorf("snapshot: got %q, want %q", got, "x")
	}
	// A writable branch of the snapshot (a reset to it) is writable.
	if err := f.Branch("snapshots/s", []string{"benches/b"}, false); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(f.Dir("benches/b"), "upper/f"), "z")
	for range 2 {
		if err := f.Remove("snapshots/s"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Lstat(s); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("removed snapshot: %v, want it gone", err)
	}
}

// TestRemove: removing an upper twice, or one never made, succeeds, and the name can be used again.
func TestRemove(t *testing.T) {
	modes(t, func(t *testing.T, opts Options) {
		f, _ := open(t, opts)
		if err := f.Remove("benches/never"); err != nil {
			t.Errorf("Remove of an upper never made: %v", err)
		}
		if err := f.Create("benches/a"); err != nil {
			t.Fatal(err)
		}
		write(t, filepath.Join(f.Dir("benches/a"), "upper/deep/er/file"), "x")
		for range 2 {
			if err := f.Remove("benches/a"); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := os.Lstat(f.Dir("benches/a")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("removed upper: %v, want it gone", err)
		}
		if err := f.Create("benches/a"); err != nil {
			t.Fatalf("Create after Remove: %v", err)
		}
		if _, err := os.Stat(filepath.Join(f.Dir("benches/a"), "upper/deep")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a new upper holds the removed one's files (%v)", err)
		}
	})
}

// TestExisting: Create or Branch to a name that holds an upper is refused, and a Branch refused for
// one of its names makes none of them (all or nothing).
func TestExisting(t *testing.T) {
	modes(t, func(t *testing.T, opts Options) {
		f, _ := open(t, opts)
		for _, n := range []string{"benches/a", "benches/b"} {
			if err := f.Create(n); err != nil {
				t.Fatal(err)
			}
		}
		write(t, filepath.Join(f.Dir("benches/b"), "upper/mine"), "b's")
		if err := f.Create("benches/a"); !errors.Is(err, ErrExist) {
			t.Errorf("Create of an existing upper: %v, want ErrExist", err)
		}
		err := f.Branch("benches/a", []string{"benches/x", "benches/b"}, false)
		if !errors.Is(err, ErrExist) || hint.Of(err) == "" || !strings.Contains(err.Error(), f.Dir("benches/b")) {
			t.Errorf("Branch onto an existing upper: %v (hint %q), want ErrExist naming it, with a hint", err, hint.Of(err))
		}
		if _, err := os.Lstat(f.Dir("benches/x")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a refused Branch left benches/x (%v)", err)
		}
		if got := read(t, filepath.Join(f.Dir("benches/b"), "upper/mine")); got != "b's" {
			t.Errorf("benches/b: got %q, want it untouched", got)
		}
		for _, dsts := range [][]string{{"benches/y", "benches/y"}, {"benches/a"}, {"benches/z", "../z"}} {
			if err := f.Branch("benches/a", dsts, false); err == nil {
				t.Errorf("Branch to %q: no error", dsts)
			}
		}
		for _, n := range []string{"benches/y", "benches/z"} {
			if _, err := os.Lstat(f.Dir(n)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("a refused Branch left %s (%v)", n, err)
			}
		}
		if err := f.Branch("benches/none", []string{"benches/w"}, false); err == nil || !strings.Contains(err.Error(), f.Dir("benches/none")) {
			t.Errorf("Branch of a missing upper: %v, want an error naming it", err)
		}
	})
}

// TestCrashLeftover: what a crash left of a Create or Branch (a part, half made) is removed by the next
// Create, Branch or Remove of that name, and never seen as the upper.
func TestCrashLeftover(t *testing.T) {
	modes(t, func(t *testing.T, opts Options) {
		f, _ := open(t, opts)
		if err := f.Create("benches/a"); err != nil {
			t.Fatal(err)
		}
		write(t, filepath.Join(f.Dir("benches/a"), "upper/f"), "a's")
		// A crash after the snapshot, before work/ was emptied and the rename.
		for _, n := range []string{"c", "d", "e"} {
			if err := f.branch(f.Dir("benches/a"), part(f.Dir("benches/"+n)), false); err != nil {
				t.Fatal(err)
			}
			write(t, filepath.Join(part(f.Dir("benches/"+n)), "upper/junk"), "half")
		}
		if err := f.Branch("benches/a", []string{"benches/c"}, false); err != nil {
			t.Fatalf("Branch over a crash's part: %v", err)
		}
		if err := f.Create("benches/d"); err != nil {
			t.Fatalf("Create over a crash's part: %v", err)
		}
		if err := f.Remove("benches/e"); err != nil {
			t.Fatalf("Remove of a crash's part: %v", err)
		}
		for _, n := range []string{"c", "d"} {
			if _, err := os.Lstat(filepath.Join(f.Dir("benches/"+n), "upper/junk")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("benches/%s holds the crash's part (%v)", n, err)
			}
		}
		for _, n := range []string{"c", "d", "e"} {
			if _, err := os.Lstat(part(f.Dir("benches/" + n))); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the part of benches/%s is left (%v)", n, err)
			}
		}
	})
}

// TestReopen: after an unmount (a reboot), Open mounts the same image again and the uppers are there;
// when mounted, Open mounts nothing more.
func TestReopen(t *testing.T) {
	needRoot(t)
	f, root := open(t, Options{})
	if err := f.Create("benches/a"); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(f.Dir("benches/a"), "upper/kept"), "yes")
	if err := f.Branch("benches/a", []string{"snapshots/s"}, true); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, dirName)
	openAt(t, root, Options{})
	if n := mounts(t, dir); n != 1 {
		t.Fatalf("Open when mounted: %d mounts at %s, want 1", n, dir)
	}
	dev := source(t, dir)
	if got := loopAttr(t, dev, "backing_file"); got != filepath.Join(root, imageName) {
		t.Errorf("%s backs onto %q, want the image", dev, got)
	}
	for a, want := range map[string]string{"autoclear": "1", "dio": "1"} {
		if got := loopAttr(t, dev, a); got != want {
			t.Errorf("%s: %s is %q, want %q", dev, a, got, want)
		}
	}
	if err := Unmount(root); err != nil {
		t.Fatal(err)
	}
	if n := mounts(t, dir); n != 0 {
		t.Fatalf("Unmount: %d mounts at %s, want none", n, dir)
	}
	if err := Unmount(root); err != nil {
		t.Errorf("Unmount when unmounted: %v", err)
	}
	// The unmount frees the loop device (autoclear), perhaps a moment later.
	for i := 0; loopAttr(t, dev, "backing_file") == filepath.Join(root, imageName); i++ {
		if i == 100 {
			t.Fatalf("%s still backs onto the image 1 s after the unmount", dev)
		}
		time.Sleep(10 * time.Millisecond)
	}
	var before unix.Stat_t
	if err := unix.Stat(filepath.Join(root, imageName), &before); err != nil {
		t.Fatal(err)
	}
	f = openAt(t, root, Options{Size: 2 * testSize})
	var after unix.Stat_t
	if err := unix.Stat(filepath.Join(root, imageName), &after); err != nil {
		t.Fatal(err)
	}
	if before.Ino != after.Ino || after.Size != testSize {
		t.Errorf("Open after an unmount made a new image (inode %d -> %d, size %d)", before.Ino, after.Ino, after.Size)
	}
	if got := read(t, filepath.Join(f.Dir("benches/a"), "upper/kept")); got != "yes" {
		t.Errorf("after the remount: got %q, want %q", got, "yes")
	}
	if got := read(t, filepath.Join(f.Dir("snapshots/s"), "upper/kept")); got != "yes" {
		t.Errorf("snapshot after the remount: got %q, want %q", got, "yes")
	}
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil || st.Mode&0o777 != 0o700 {
		t.Errorf("%s: mode %o, %v; want 0700", dir, st.Mode&0o777, err)
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs(dir, &sfs); err != nil || sfs.Flags&(unix.ST_NOSUID|unix.ST_NODEV|unix.ST_NOATIME) != unix.ST_NOSUID|unix.ST_NODEV|unix.ST_NOATIME {
		t.Errorf("%s: mount flags %#x, %v; want nosuid, nodev, noatime", dir, sfs.Flags, err)
	}
}

// TestFull: a full uppers' filesystem is ENOSPC inside it (the image was preallocated: no I/O error,
// nothing asked of the host's disk), and removing an upper gives its space back.
func TestFull(t *testing.T) {
	needRoot(t)
	f, root := open(t, Options{Size: 256 << 20})
	var blocks int64
	if fi, err := os.Stat(filepath.Join(root, imageName)); err != nil {
		t.Fatal(err)
	} else if blocks = fi.Sys().(*syscall.Stat_t).Blocks * 512; blocks < 256<<20 {
		t.Errorf("image holds %d bytes on disk, want all of its 256 MiB preallocated", blocks)
	}
	if err := f.Create("benches/a"); err != nil {
		t.Fatal(err)
	}
	fill := func() error {
		w, err := os.Create(filepath.Join(f.Dir("benches/a"), "upper/big"))
		if err != nil {
			return err
		}
		defer w.Close()
		buf := make([]byte, 1<<20)
		for i := 0; i < 512; i++ {
			buf[0] = byte(i)
			if _, err := w.Write(buf); err != nil {
				return err
			}
		}
		return w.Sync()
	}
	if err := fill(); !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("512 MiB into 256 MiB: %v, want ENOSPC", err)
	}
	if fi, err := os.Stat(filepath.Join(root, imageName)); err != nil || fi.Sys().(*syscall.Stat_t).Blocks*512 != blocks {
		t.Errorf("the image grew on the host's disk when its filesystem filled up (%v)", err)
	}
	if err := f.Remove("benches/a"); err != nil {
		t.Fatal(err)
	}
	if err := f.Create("benches/b"); err != nil {
		t.Fatalf("Create after the full upper was removed: %v", err)
	}
	// The space of a removed subvolume comes back once btrfs's cleaner has run (Remove wakes it; on
	// its own it runs every 30 s); a write of half the filesystem must succeed within 5 s.
	var err error
	for i := 0; i < 50; i++ {
		err = os.WriteFile(filepath.Join(f.Dir("benches/b"), "upper/half"), make([]byte, 100<<20), 0o644)
		if err == nil {
			t.Logf("written after %d tries", i)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Errorf("write after the full upper was removed: %v", err)
	}
}

// TestOpenAtOnce: two Opens of a new store at once make one image and one mount, and both can use it.
func TestOpenAtOnce(t *testing.T) {
	needRoot(t)
	root := t.TempDir()
	dir := filepath.Join(root, dirName)
	t.Cleanup(func() { unmount(t, dir) })
	fs := make([]*FS, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range fs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fs[i], errs[i] = Open(root, Options{Size: testSize})
		}()
	}
	wg.Wait()
	for i := range fs {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if !fs[i].CoW() {
			t.Errorf("Open %d: copies, want btrfs", i)
		}
	}
	if n := mounts(t, dir); n != 1 {
		t.Errorf("two Opens at once: %d mounts at %s, want 1", n, dir)
	}
	if err := fs[0].Create("benches/a"); err != nil {
		t.Fatal(err)
	}
	if err := fs[1].Branch("benches/a", []string{"benches/b"}, false); err != nil {
		t.Fatal(err)
	}
}

// TestNoMkfs: without mkfs.btrfs, Open says so and what to install, and leaves no image.
func TestNoMkfs(t *testing.T) {
	needRoot(t)
	t.Setenv("PATH", t.TempDir())
	root := t.TempDir()
	_, err := Open(root, Options{Size: testSize})
	if err == nil || !strings.Contains(err.Error(), "mkfs.btrfs") || !strings.Contains(hint.Of(err), "btrfs-progs") {
		t.Fatalf("Open without mkfs.btrfs: %v (hint %q), want one naming it, hint btrfs-progs", err, hint.Of(err))
	}
	for _, n := range []string{imageName, imageName + partSuffix} {
		if _, err := os.Lstat(filepath.Join(root, n)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left (%v)", n, err)
		}
	}
}

// TestBranchOverlay: a branch of an upper an overlay is mounted on (a running Bench) holds what was
// written through the overlay, whiteouts included, and an overlay mounts on the branch.
func TestBranchOverlay(t *testing.T) {
	needRoot(t)
	f, _ := open(t, Options{})
	if err := f.Create("benches/a"); err != nil {
		t.Fatal(err)
	}
	lower := t.TempDir()
	write(t, filepath.Join(lower, "from-lower"), "lower")
	write(t, filepath.Join(lower, "deleted"), "lower")
	mnt := t.TempDir()
	src := f.Dir("benches/a")
	overlay := func(dir, mnt string) {
		t.Helper()
		data := fmt.Sprintf("lowerdir=%s,upperdir=%s/upper,workdir=%s/work", lower, dir, dir)
		if err := unix.Mount("overlay", mnt, "overlay", 0, data); err != nil {
			t.Fatalf("mount overlay %s: %v", data, err)
		}
		t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
	}
	overlay(src, mnt)
	write(t, filepath.Join(mnt, "written"), "through the overlay")
	if err := os.Remove(filepath.Join(mnt, "deleted")); err != nil {
		t.Fatal(err)
	}
	if err := f.Branch("benches/a", []string{"benches/b", "benches/c"}, false); err != nil {
		t.Fatal(err)
	}
	if got := read(t, filepath.Join(f.Dir("benches/b"), "upper/written")); got != "through the overlay" {
		t.Errorf("branch: got %q, want %q", got, "through the overlay")
	}
	mnt2 := t.TempDir()
	overlay(f.Dir("benches/c"), mnt2)
	if got := read(t, filepath.Join(mnt2, "written")); got != "through the overlay" {
		t.Errorf("overlay on the branch: got %q, want %q", got, "through the overlay")
	}
	if got := read(t, filepath.Join(mnt2, "from-lower")); got != "lower" {
		t.Errorf("overlay on the branch: got %q, want %q", got, "lower")
	}
	if _, err := os.Lstat(filepath.Join(mnt2, "deleted")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a file deleted before the branch is back in it (%v)", err)
	}
	write(t, filepath.Join(mnt2, "written"), "the child's")
	if got := read(t, filepath.Join(mnt, "written")); got != "through the overlay" {
		t.Errorf("source overlay: got %q after the child wrote, want %q", got, "through the overlay")
	}
}

func TestCheck(t *testing.T) {
	for _, n := range []string{"benches/abc", "snapshots/x-1_2.3", "a"} {
		if err := Check(n); err != nil {
			t.Errorf("Check(%q): %v", n, err)
		}
	}
	for _, n := range []string{"", "/abs", "a/../b", "..", "a//b", "a/", ".hidden", "a/.b.part", "-x", "a b", "a/\x00"} {
		if err := Check(n); err == nil {
			t.Errorf("Check(%q): no error", n)
		}
	}
}

// TestOpenInUserns: shed without root is root of a user namespace of its own, where no loop device or
// btrfs can be mounted: Open gives copies there, which work, and makes no image.
func TestOpenInUserns(t *testing.T) {
	if root := os.Getenv("UPPER_TEST_USERNS"); root != "" {
		f, err := Open(root, Options{Size: testSize})
		if err != nil {
			t.Fatal(err)
		}
		if f.CoW() {
			t.Fatal("Open in a user namespace: btrfs, want copies")
		}
		if err := f.Create("benches/a"); err != nil {
			t.Fatal(err)
		}
		write(t, filepath.Join(f.Dir("benches/a"), "upper/f"), "x")
		if err := f.Branch("benches/a", []string{"benches/b"}, false); err != nil {
			t.Fatal(err)
		}
		if got := read(t, filepath.Join(f.Dir("benches/b"), "upper/f")); got != "x" {
			t.Fatalf("branch: got %q, want %q", got, "x")
		}
		return
	}
	needRoot(t)
	root := t.TempDir()
	cmd := exec.Command("unshare", "--user", "--map-root-user", os.Args[0], "-test.run=^TestOpenInUserns$", "-test.v")
	cmd.Env = append(os.Environ(), "UPPER_TEST_USERNS="+root)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestOpenInUserns") {
		t.Fatalf("in a user namespace: %v\n%s", err, out)
	}
	if _, err := os.Lstat(filepath.Join(root, imageName)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Open in a user namespace made %s (%v)", imageName, err)
	}
	if n := mounts(t, filepath.Join(root, dirName)); n != 0 {
		t.Errorf("Open in a user namespace: %d mounts", n)
	}
}

// TestOpenOverCopies: uppers made as copies in <root>/uppers (before btrfs-progs was installed) are not
// hidden under a mount: Open refuses, naming the directory, with a hint, and they stay.
func TestOpenOverCopies(t *testing.T) {
	needRoot(t)
	root := t.TempDir()
	f, err := Open(root, Options{copyOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Create("benches/a"); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(f.Dir("benches/a"), "upper/f"), "kept")
	dir := filepath.Join(root, dirName)
	t.Cleanup(func() { unmount(t, dir) })
	_, err = Open(root, Options{Size: testSize})
	if err == nil || !strings.Contains(err.Error(), dir) || hint.Of(err) == "" {
		t.Errorf("Open over copies: %v (hint %q), want an error naming %s, with a hint", err, hint.Of(err), dir)
	}
	if got := read(t, filepath.Join(dir, "benches/a/upper/f")); got != "kept" {
		t.Errorf("after Open: got %q, want %q", got, "kept")
	}
}

// TestRootOnBtrfs: a store whose root is on btrfs keeps its uppers as subvolumes there, with no image
// and no mount of its own.
func TestRootOnBtrfs(t *testing.T) {
	needRoot(t)
	outer, _ := open(t, Options{})
	if err := outer.Create("host"); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(outer.Dir("host"), "store")
	if err := os.Mkdir(root, 0o700); err != nil {
		t.Fatal(err)
	}
	f, err := Open(root, Options{Size: testSize})
	if err != nil {
		t.Fatal(err)
	}
	if !f.CoW() {
		t.Fatal("Open on btrfs: copies, want subvolumes")
	}
	if _, err := os.Lstat(filepath.Join(root, imageName)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Open on btrfs made %s (%v)", imageName, err)
	}
	if n := mounts(t, filepath.Join(root, dirName)); n != 0 {
		t.Errorf("Open on btrfs: %d mounts at its uppers, want none", n)
	}
	if err := f.Create("benches/a"); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(f.Dir("benches/a"), "upper/f"), "x")
	if err := f.Branch("benches/a", []string{"snapshots/s"}, true); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"benches/a", "snapshots/s"} {
		if ok, err := isSubvol(f.Dir(n)); !ok || err != nil {
			t.Errorf("%s: subvolume %v, %v; want one", n, ok, err)
		}
	}
	if err := os.WriteFile(filepath.Join(f.Dir("snapshots/s"), "upper/f"), nil, 0o644); !errors.Is(err, unix.EROFS) {
		t.Errorf("write into a read-only snapshot: %v, want EROFS", err)
	}
	for _, n := range []string{"snapshots/s", "benches/a"} {
		if err := f.Remove(n); err != nil {
			t.Fatal(err)
		}
	}
	f.reclaims.Wait()
	if err := Unmount(root); err != nil {
		t.Errorf("Unmount of a store on btrfs: %v", err)
	}
}
