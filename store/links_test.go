package store_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"toolshed.dev/shed/store"
)

func inode(t *testing.T, name string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(name, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// checkHashes rescans each path and compares its manifest's hash with the record: storing files
// once must change none.
func checkHashes(t *testing.T, s *store.Store, infos ...*store.PathInfo) {
	t.Helper()
	for _, info := range infos {
		m, err := store.ScanTree(context.Background(), s.Location(info.Path))
		if err != nil {
			t.Fatal(err)
		}
		if m.Hash() != info.ContentHash {
			want, _ := s.Manifest(info.Path)
			t.Errorf("%s: content hash changed: %v", info.Path, store.DiffManifests(want, m))
		}
	}
}

// linkEntries lists links/'s entries.
func linkEntries(t *testing.T, s *store.Store) []string {
	t.Helper()
	got, _ := filepath.Glob(filepath.Join(s.Root(), "links", "??", "*"))
	return got
}

func TestFilesStoredOnce(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	shared := strings.Repeat("S", 4096)
	src1, src2 := t.TempDir(), t.TempDir()
	writeTree(t, src1, map[string]string{"a/shared": shared, "a/twin": shared, "b/own": "one", "empty": "",
		"bin/su": "setuid", "g/x": "group"})
	writeTree(t, src2, map[string]string{"c/shared": shared, "d/own": "two", "empty": "", "bin/su": "setuid", "g2/z": "group"})
	for _, src := range []string{src1, src2} {
		if err := os.Chmod(filepath.Join(src, "bin/su"), os.ModeSetuid|0o755); err != nil {
			t.Fatal(err)
		}
	}
	// g/x and g/y are one file in the first path: a hardlink entry its manifest records.
	if err := os.Link(filepath.Join(src1, "g/x"), filepath.Join(src1, "g/y")); err != nil {
		t.Fatal(err)
	}
	p1, err := s.AddDir(ctx, src1, "one", nil)
	if err != nil {
		t.Fatal(err)
	}
	p2, err := s.AddDir(ctx, src2, "two", nil)
	if err != nil {
		t.Fatal(err)
	}
	l1, l2 := s.Location(p1.Path), s.Location(p2.Path)
	if inode(t, l1+"/a/shared") != inode(t, l2+"/c/shared") {
		t.Error("a file both paths have is two files on disk")
	}
	if inode(t, l1+"/a/twin") == inode(t, l1+"/a/shared") {
		t.Error("two identical files of one path were made one: a rescan would see a hardlink")
	}
	for _, f := range [][2]string{{"/bin/su", "/bin/su"}, {"/empty", "/empty"}, {"/g/x", "/g2/z"}} {
		if inode(t, l1+f[0]) == inode(t, l2+f[1]) {
			t.Errorf("%s and %s were stored once: setuid, empty and hard-linked files stay apart", f[0], f[1])
		}
	}
	if inode(t, l1+"/g/x") != inode(t, l1+"/g/y") {
		t.Error("the first path's own hard link was split")
	}
	checkHashes(t, s, p1, p2)
	assertVerifies(t, s)

	stats, err := s.Links(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if stats.Saved != int64(len(shared)) || stats.Unused != 0 {
		t.Errorf("links: %+v, want %d bytes saved, none unused", stats, len(shared))
	}
	for _, info := range []*store.PathInfo{p1, p2} {
		if n, err := s.SharedBytes(info.Path); err != nil || n != int64(len(shared)) {
			t.Errorf("%s: shared %d, %v; want %d", info.Path, n, err, len(shared))
		}
	}

	// gc of the second path frees only what the first does not share.
	if err := s.AddRoot(ctx, "one", p1.Path); err != nil {
		t.Fatal(err)
	}
	s.Close()
	res, err := s.GC(ctx, store.GCOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Deleted) != 1 || res.Deleted[0] != p2.Path || res.Size != p2.Size || res.Freed != p2.Size-int64(len(shared)) {
		t.Errorf("gc: %+v; want %s deleted, %d bytes of files, %d freed", res, p2.Path, p2.Size, p2.Size-int64(len(shared)))
	}
	if res.Links == 0 {
		t.Error("gc removed no entry of links/, though the second path's own files were there")
	}
	if n, _ := s.SharedBytes(p1.Path); n != 0 {
		t.Errorf("after gc the first path shares %d bytes with no other path", n)
	}
	assertVerifies(t, s)
	checkHashes(t, s, p1)

	if err := s.RemoveRoot("one"); err != nil {
		t.Fatal(err)
	}
	res, err = s.GC(ctx, store.GCOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Freed != p1.Size {
		t.Errorf("last gc freed %d bytes, want the first path's %d", res.Freed, p1.Size)
	}
	if left := linkEntries(t, s); len(left) != 0 {
		t.Errorf("links/ keeps %v after every path is gone", left)
	}
}

// TestStoredOnceDamage: a file damaged in one path is damaged in every path that shares it. A new
// path with the file must not link to the damaged bytes, and a repair puts good ones back for it
// and for the next paths.
func TestStoredOnceDamage(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	good := strings.Repeat("G", 8192)
	src := t.TempDir()
	writeTree(t, src, map[string]string{"lib/x.so": good})
	p1, err := s.AddDir(ctx, src, "one", nil)
	if err != nil {
		t.Fatal(err)
	}
	// Damage in place, keeping the size and times, as a bit flip would.
	f1 := s.Location(p1.Path) + "/lib/x.so"
	f, err := os.OpenFile(f1, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte("EVIL"), 0)
	f.Close()
	setMtime(t, f1, store.DefaultEpoch)

	// The same file in another path (another name: another path).
	writeTree(t, src, map[string]string{"other": "o"})
	p2, err := s.AddDir(ctx, src, "two", nil)
	if err != nil {
		t.Fatal(err)
	}
	f2 := s.Location(p2.Path) + "/lib/x.so"
	if b, _ := os.ReadFile(f2); !bytes.Equal(b, []byte(good)) {
		t.Fatalf("the new path has the damaged bytes: %.16q", b)
	}
	if inode(t, f1) == inode(t, f2) {
		t.Fatal("the new path was linked to the damaged file")
	}
	res, err := s.Verify(ctx, store.VerifyOptions{CheckContents: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Problems) != 1 || res.Problems[0].Path != p1.Path {
		t.Fatalf("verify: %v; want only %s damaged", res.Problems, p1.Path)
	}
	// The entry in links/ is the new path's good file now: a repair of the first links to it.
	err = s.Repair(ctx, p1.Path, 0, func(ctx context.Context, out string) error { return store.CopyTree(ctx, filepath.Join(src), out) })
	if err == nil {
		t.Fatal("a repair from a tree with another file succeeded")
	}
	os.Remove(filepath.Join(src, "other"))
	if err := s.Repair(ctx, p1.Path, 0, func(ctx context.Context, out string) error { return store.CopyTree(ctx, src, out) }); err != nil {
		t.Fatal(err)
	}
	f1 = s.Location(p1.Path) + "/lib/x.so"
	if inode(t, f1) != inode(t, f2) {
		t.Error("the repaired path was not linked to the good entry")
	}
	assertVerifies(t, s)
	checkHashes(t, s, p1, p2)
}

// TestOptimiseExistingStore: paths registered while the store kept copies are stored once by
// Optimise, with no content hash changed, and a damaged copy is never what others link to.
func TestOptimiseExistingStore(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	off := false
	if err := s.UpdateConfig(func(c *store.Config) error { c.StoreFilesOnce = &off; return nil }); err != nil {
		t.Fatal(err)
	}
	shared, other := strings.Repeat("A", 5000), strings.Repeat("B", 3000)
	src1, src2 := t.TempDir(), t.TempDir()
	writeTree(t, src1, map[string]string{"usr/share/a": shared, "usr/share/b": other, "one": "1"})
	writeTree(t, src2, map[string]string{"opt/a": shared, "opt/deep/b": other, "two": "2"})
	p1, err := s.AddDir(ctx, src1, "one", nil)
	if err != nil {
		t.Fatal(err)
	}
	p2, err := s.AddDir(ctx, src2, "two", nil)
	if err != nil {
		t.Fatal(err)
	}
	l1, l2 := s.Location(p1.Path), s.Location(p2.Path)
	if inode(t, l1+"/usr/share/a") == inode(t, l2+"/opt/a") || len(linkEntries(t, s)) != 0 {
		t.Fatal("files were stored once with store_files_once = false")
	}
	// The second path's b is damaged: whichever path Optimise takes first, the first path's b
	// must never become a link of it.
	b2 := l2 + "/opt/deep/b"
	if err := os.WriteFile(b2, []byte(strings.Repeat("X", 3000)), 0o644); err != nil {
		t.Fatal(err)
	}
	setMtime(t, b2, store.DefaultEpoch)
	setMtime(t, l2+"/opt/deep", store.DefaultEpoch)

	res, err := s.Optimise(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Paths != 2 || res.Linked < 1 || res.Saved < int64(len(shared)) {
		t.Errorf("optimise: %+v; want 2 paths, a's copy freed", res)
	}
	if inode(t, l1+"/usr/share/a") != inode(t, l2+"/opt/a") {
		t.Error("optimise did not store the shared file once")
	}
	if b, _ := os.ReadFile(l1 + "/usr/share/b"); string(b) != other {
		t.Fatalf("the first path's b took the damaged bytes: %.16q", b)
	}
	checkHashes(t, s, p1)
	vr, err := s.Verify(ctx, store.VerifyOptions{CheckContents: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range vr.Problems {
		if p.Path != p2.Path {
			t.Errorf("verify after optimise: %v", p)
		}
	}
	if b, _ := os.ReadFile(b2); string(b) == other {
		t.Error("optimise replaced a damaged file: that is a repair's to do, and verify's to report first")
	}
	again, err := s.Optimise(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if again.Linked != 0 {
		t.Errorf("a second optimise linked %d files", again.Linked)
	}
	stats, err := s.Links(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if stats.Saved < int64(len(shared)) {
		t.Errorf("links: %+v, want at least %d saved", stats, len(shared))
	}
}

func setMtime(t *testing.T, name string, sec int64) {
	t.Helper()
	ts := []unix.Timespec{{Sec: sec}, {Sec: sec}}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, name, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		t.Fatal(err)
	}
}
