package store_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"toolshed.dev/shed/store"
)

var update = flag.Bool("update", false, "rewrite golden files in testdata")

// testEpoch is the clamp epoch of the tests: older than any file they make.
const testEpoch = 1700000000

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: makes device nodes, chowns files and sets trusted.* xattrs")
	}
}

// capNetRaw is a version 2 security.capability value granting cap_net_raw
// (bit 13) permitted and effective; the kernel checks the format.
var capNetRaw = []byte{
	0x01, 0x00, 0x00, 0x02, // VFS_CAP_REVISION_2 | VFS_CAP_FLAGS_EFFECTIVE
	0x00, 0x20, 0x00, 0x00, 0, 0, 0, 0, // permitted, inheritable (low word)
	0, 0, 0, 0, 0, 0, 0, 0, // permitted, inheritable (high word)
}

// aclUser1000 is a system.posix_acl_access value: u::rw-, u:1000:r-x,
// g::r--, m::r-x, o::r-- (so the mode is 0654).
var aclUser1000 = []byte{
	2, 0, 0, 0, // POSIX_ACL_XATTR_VERSION
	0x01, 0, 6, 0, 0xff, 0xff, 0xff, 0xff, // ACL_USER_OBJ
	0x02, 0, 5, 0, 0xe8, 0x03, 0, 0, // ACL_USER 1000
	0x04, 0, 4, 0, 0xff, 0xff, 0xff, 0xff, // ACL_GROUP_OBJ
	0x10, 0, 5, 0, 0xff, 0xff, 0xff, 0xff, // ACL_MASK
	0x20, 0, 4, 0, 0xff, 0xff, 0xff, 0xff, // ACL_OTHER
}

// weirdName holds a space, a newline, a quote and a byte that is not UTF-8.
const weirdName = "a b\nc\"\xff"

// treeFixture makes files under root with exact modes and owners.
type treeFixture struct {
	t    testing.TB
	root string
}

func (f *treeFixture) path(rel string) string { return f.root + "/" + rel }

func (f *treeFixture) parent(rel string) {
	f.t.Helper()
	if err := os.MkdirAll(filepath.Dir(f.path(rel)), 0o755); err != nil {
		f.t.Fatal(err)
	}
}

func (f *treeFixture) chmod(rel string, mode uint32) {
	f.t.Helper()
	if err := unix.Chmod(f.path(rel), mode); err != nil {
		f.t.Fatal(err)
	}
}

func (f *treeFixture) file(rel, data string, mode uint32) {
	f.t.Helper()
	f.parent(rel)
	if err := os.WriteFile(f.path(rel), []byte(data), 0o600); err != nil {
		f.t.Fatal(err)
	}
	f.chmod(rel, mode)
}

func (f *treeFixture) dir(rel string, mode uint32) {
	f.t.Helper()
	if err := os.MkdirAll(f.path(rel), 0o755); err != nil {
		f.t.Fatal(err)
	}
	f.chmod(rel, mode)
}

func (f *treeFixture) symlink(rel, target string) {
	f.t.Helper()
	f.parent(rel)
	if err := os.Symlink(target, f.path(rel)); err != nil {
		f.t.Fatal(err)
	}
}

func (f *treeFixture) link(rel, existing string) {
	f.t.Helper()
	f.parent(rel)
	if err := os.Link(f.path(existing), f.path(rel)); err != nil {
		f.t.Fatal(err)
	}
}

// node makes a device node or fifo; mode includes the type bits.
func (f *treeFixture) node(rel string, mode, major, minor uint32) {
	f.t.Helper()
	f.parent(rel)
	if err := unix.Mknod(f.path(rel), mode, int(unix.Mkdev(major, minor))); err != nil {
		f.t.Fatal(err)
	}
	f.chmod(rel, mode&0o7777)
}

func (f *treeFixture) xattr(rel, name string, value []byte) {
	f.t.Helper()
	if err := unix.Lsetxattr(f.path(rel), name, value, 0); err != nil {
		f.t.Fatalf("set %s on %s: %v", name, rel, err)
	}
}

// own chowns rel and restores its mode, which chown strips of setuid bits.
func (f *treeFixture) own(rel string, uid, gid int) {
	f.t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(f.path(rel), &st); err != nil {
		f.t.Fatal(err)
	}
	if err := unix.Lchown(f.path(rel), uid, gid); err != nil {
		f.t.Fatal(err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFLNK {
		f.chmod(rel, st.Mode&0o7777)
	}
}

func (f *treeFixture) mtime(rel string, sec, nsec int64) {
	f.t.Helper()
	ts := []unix.Timespec{{Sec: sec, Nsec: nsec}, {Sec: sec, Nsec: nsec}}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, f.path(rel), ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		f.t.Fatal(err)
	}
}

func (f *treeFixture) clamp() {
	f.t.Helper()
	if err := store.ClampTimes(f.root, testEpoch); err != nil {
		f.t.Fatal(err)
	}
}

func (f *treeFixture) scan() *store.Manifest {
	f.t.Helper()
	m, err := store.ScanTree(context.Background(), f.root)
	if err != nil {
		f.t.Fatal(err)
	}
	return m
}

func newFixture(t testing.TB) *treeFixture {
	return &treeFixture{t: t, root: t.TempDir()}
}

// buildFullTree makes one entry of every kind a store path can hold.
func buildFullTree(f *treeFixture) {
	f.chmod("", 0o755)
	f.dir("bin", 0o755)
	f.file("bin/gzip", "gzip bytes", 0o755)
	f.link("bin/gunzip", "bin/gzip")
	f.file("bin/su", "su bytes", 0o4755)
	f.file("bin/sg", "sg bytes", 0o2755)
	f.file("bin/ping", "ping bytes", 0o755)
	f.xattr("bin/ping", "security.capability", capNetRaw)
	f.node("dev/null", unix.S_IFCHR|0o666, 1, 3)
	f.node("dev/loop0", unix.S_IFBLK|0o660, 7, 0)
	f.own("dev/loop0", 0, 6)
	f.file("etc/passwd", "root:x:0:0::/root:/bin/sh\n", 0o644)
	f.file("etc/empty", "", 0o644)
	f.file("etc/acl", "acl", 0o644)
	f.xattr("etc/acl", "system.posix_acl_access", aclUser1000)
	f.dir("home/u", 0o700)
	f.file("home/u/notes", "mine", 0o600)
	f.own("home/u/notes", 1000, 1000)
	f.own("home/u", 1000, 1000)
	f.file("lib/x.so.1.2", "elf", 0o644)
	f.symlink("lib/x.so", "x.so.1.2")
	f.symlink("lib/dangling", "/nonexistent/target")
	f.dir("opq", 0o755)
	f.xattr("opq", "trusted.overlay.opaque", []byte("y"))
	f.xattr("opq", "trusted.overlay.origin", []byte("ignored"))
	f.file("opq/f", "f", 0o644)
	f.node("run/fifo", unix.S_IFIFO|0o644, 0, 0)
	f.dir("tmp", 0o1777)
	f.node("var/old", unix.S_IFCHR, 0, 0) // whiteout, mode 0000
	f.file("weird/"+weirdName, "weird", 0o644)
	f.mtime("etc/passwd", testEpoch-1000, 123456789)
}

func findEntry(t *testing.T, m *store.Manifest, p string) store.Entry {
	t.Helper()
	for _, e := range m.Entries {
		if e.Path == p {
			return e
		}
	}
	t.Fatalf("no entry %q in manifest", p)
	return store.Entry{}
}

func TestManifestRoundTrip(t *testing.T) {
	requireRoot(t)
	f := newFixture(t)
	buildFullTree(f)
	m := f.scan()

	checks := []struct {
		path string
		want store.Entry
	}{
		{".", store.Entry{Type: store.EntryDir, Mode: 0o755}},
		{"bin/gunzip", store.Entry{Type: store.EntryFile, Mode: 0o755, Size: 10, Digest: store.Sum([]byte("gzip bytes"))}},
		{"bin/gzip", store.Entry{Type: store.EntryHardlink, Mode: 0o755, Target: "bin/gunzip"}},
		{"bin/su", store.Entry{Type: store.EntryFile, Mode: 0o4755, Size: 8, Digest: store.Sum([]byte("su bytes"))}},
		{"bin/sg", store.Entry{Type: store.EntryFile, Mode: 0o2755, Size: 8, Digest: store.Sum([]byte("sg bytes"))}},
		{"bin/ping", store.Entry{Type: store.EntryFile, Mode: 0o755, Size: 10, Digest: store.Sum([]byte("ping bytes")),
			Xattrs: []store.Xattr{{Name: "security.capability", Value: capNetRaw}}}},
		{"dev/null", store.Entry{Type: store.EntryChardev, Mode: 0o666, Major: 1, Minor: 3}},
		{"dev/loop0", store.Entry{Type: store.EntryBlockdev, Mode: 0o660, GID: 6, Major: 7}},
		{"etc/empty", store.Entry{Type: store.EntryFile, Mode: 0o644, Digest: store.Sum(nil)}},
		{"etc/acl", store.Entry{Type: store.EntryFile, Mode: 0o654, Size: 3, Digest: store.Sum([]byte("acl")),
			Xattrs: []store.Xattr{{Name: "system.posix_acl_access", Value: aclUser1000}}}},
		{"home/u", store.Entry{Type: store.EntryDir, Mode: 0o700, UID: 1000, GID: 1000}},
		{"lib/x.so", store.Entry{Type: store.EntrySymlink, Mode: 0o777, Target: "x.so.1.2"}},
		{"lib/dangling", store.Entry{Type: store.EntrySymlink, Mode: 0o777, Target: "/nonexistent/target"}},
		{"opq", store.Entry{Type: store.EntryDir, Mode: 0o755,
			Xattrs: []store.Xattr{{Name: "trusted.overlay.opaque", Value: []byte("y")}}}},
		{"run/fifo", store.Entry{Type: store.EntryFifo, Mode: 0o644}},
		{"tmp", store.Entry{Type: store.EntryDir, Mode: 0o1777}},
		{"var/old", store.Entry{Type: store.EntryWhiteout, Mode: 0}},
		{"weird/" + weirdName, store.Entry{Type: store.EntryFile, Mode: 0o644, Size: 5, Digest: store.Sum([]byte("weird"))}},
	}
	for _, c := range checks {
		got := findEntry(t, m, c.path)
		c.want.Path, c.want.Mtime = c.path, got.Mtime
		if diff := cmp.Diff(c.want, got); diff != "" {
			t.Errorf("entry %q (-want +got):\n%s", c.path, diff)
		}
	}
	if got := findEntry(t, m, "etc/passwd").Mtime; got != testEpoch-1000 {
		t.Errorf("etc/passwd mtime: got %d, want %d", got, testEpoch-1000)
	}
	wantSize := int64(len("gzip bytes") + len("su bytes") + len("sg bytes") + len("ping bytes") +
		len("root:x:0:0::/root:/bin/sh\n") + len("acl") + len("mine") + len("elf") + len("f") + len("weird"))
	if got := m.Size(); got != wantSize {
		t.Errorf("Size: got %d, want %d (hard links once)", got, wantSize)
	}

	enc := m.Encode()
	if !bytes.HasPrefix(enc, []byte("shed-manifest v1\n")) {
		t.Errorf("encoding does not start with the header:\n%s", enc)
	}
	if bytes.Count(enc, []byte("\n")) != len(m.Entries)+1 {
		t.Errorf("encoding has not one line per entry:\n%s", enc)
	}
	back, err := store.ParseManifest(enc)
	if err != nil {
		t.Fatalf("parse own encoding: %v\n%s", err, enc)
	}
	if diff := cmp.Diff(m, back); diff != "" {
		t.Errorf("parse(encode(m)) differs (-scanned +parsed):\n%s", diff)
	}
	if back.Hash() != m.Hash() {
		t.Error("hash changed through encode and parse")
	}
	if d := store.DiffManifests(m, back); len(d) != 0 {
		t.Errorf("DiffManifests of equal manifests: %q", d)
	}
}

// TestScanTreeOrder checks that entries come in depth-first pre-order with
// sorted names, which is not the order of sorted full paths: "a-b" sorts
// before "a/b" as a string but comes after the whole of directory "a".
func TestScanTreeOrder(t *testing.T) {
	f := newFixture(t)
	f.file("a-b", "", 0o644)
	f.file("a/b", "", 0o644)
	f.file("a/c/d", "", 0o644)
	f.file("a.txt", "", 0o644)
	f.file("B", "", 0o644)
	var got []string
	for _, e := range f.scan().Entries {
		got = append(got, e.Path)
	}
	want := []string{".", "B", "a", "a/b", "a/c", "a/c/d", "a-b", "a.txt"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("order (-want +got):\n%s", diff)
	}
}

func TestManifestGolden(t *testing.T) {
	requireRoot(t)
	f := newFixture(t)
	f.chmod("", 0o755)
	f.file("a b", "hello\n", 0o644)
	f.file("bin/su", "su\n", 0o4755)
	f.link("bin/su2", "bin/su")
	f.file("bin/ping", "ping\n", 0o755)
	f.xattr("bin/ping", "security.capability", capNetRaw)
	f.symlink("lib/x.so", "x.so.1")
	f.node("dev/null", unix.S_IFCHR|0o666, 1, 3)
	f.dir("opq", 0o755)
	f.xattr("opq", "trusted.overlay.opaque", []byte("y"))
	f.node("var/old", unix.S_IFCHR, 0, 0)
	f.file("n\xff\n", "", 0o600)
	f.own("", 0, 0)
	f.clamp()
	got := f.scan().Encode()

	golden := filepath.Join("testdata", "manifest.golden")
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("encoding differs from %s (-want +got):\n%s", golden, diff)
	}
}

// baseTree is a small tree for changing one attribute at a time; each step
// makes one file, so the steps can run in any order.
var baseTree = []func(f *treeFixture){
	func(f *treeFixture) { f.file("bin/sh", "#!sh", 0o755) },
	func(f *treeFixture) { f.file("bin/tool", "tool", 0o755) },
	func(f *treeFixture) { f.file("etc/conf", "conf=1\n", 0o644) },
	func(f *treeFixture) { f.file("etc/copy", "conf=1\n", 0o644) },
	func(f *treeFixture) { f.symlink("lib/x.so", "x.so.1") },
	func(f *treeFixture) { f.file("lib/x.so.1", "elf", 0o644) },
	func(f *treeFixture) { f.dir("var", 0o755) },
}

func buildBase(t testing.TB, reverse bool) *treeFixture {
	f := newFixture(t)
	f.chmod("", 0o755)
	steps := slices.Clone(baseTree)
	if reverse {
		slices.Reverse(steps)
	}
	for _, step := range steps {
		step(f)
	}
	return f
}

func TestManifestHashChanges(t *testing.T) {
	requireRoot(t)
	base := buildBase(t, false)
	base.clamp()
	want := base.scan()
	if again := base.scan(); again.Hash() != want.Hash() {
		t.Fatal("scanning the same tree twice gave two hashes")
	}
	rev := buildBase(t, true)
	rev.clamp()
	if got := rev.scan(); got.Hash() != want.Hash() {
		t.Fatalf("creation order changed the hash:\n%s", strings.Join(store.DiffManifests(want, got), "\n"))
	}

	tests := []struct {
		name   string
		change func(f *treeFixture)
		diff   []string
	}{
		{"content byte", func(f *treeFixture) { f.file("etc/conf", "conf=2\n", 0o644) },
			[]string{"etc/conf: content differs"}},
		{"content size", func(f *treeFixture) { f.file("etc/conf", "conf=10\n", 0o644) },
			[]string{"etc/conf: content differs (size 7 → 8)"}},
		{"mode bit", func(f *treeFixture) { f.chmod("etc/conf", 0o664) },
			[]string{"etc/conf: mode 0644 → 0664"}},
		{"setuid bit", func(f *treeFixture) { f.chmod("bin/tool", 0o4755) },
			[]string{"bin/tool: mode 0755 → 4755"}},
		{"sticky bit on dir", func(f *treeFixture) { f.chmod("var", 0o1755) },
			[]string{"var: mode 0755 → 1755"}},
		{"uid", func(f *treeFixture) { f.own("etc/conf", 1, 0) },
			[]string{"etc/conf: uid 0 → 1"}},
		{"gid", func(f *treeFixture) { f.own("etc/conf", 0, 1) },
			[]string{"etc/conf: gid 0 → 1"}},
		{"symlink owner", func(f *treeFixture) { f.own("lib/x.so", 5, 0) },
			[]string{"lib/x.so: uid 0 → 5"}},
		{"mtime", func(f *treeFixture) { f.mtime("etc/conf", testEpoch-100, 0) },
			[]string{"etc/conf: mtime 1700000000 → 1699999900"}},
		{"symlink target", func(f *treeFixture) {
			os.Remove(f.path("lib/x.so"))
			f.symlink("lib/x.so", "x.so.2")
		}, []string{`lib/x.so: target "x.so.1" → "x.so.2"`}},
		{"opaque xattr", func(f *treeFixture) { f.xattr("var", "trusted.overlay.opaque", []byte("y")) },
			[]string{"var: xattr trusted.overlay.opaque only in second"}},
		// A rootless store's name for the same mark (TestOpaqueMarkNames).
		{"user opaque xattr", func(f *treeFixture) { f.xattr("var", "user.overlay.opaque", []byte("y")) },
			[]string{"var: xattr trusted.overlay.opaque only in second"}},
		{"capability xattr", func(f *treeFixture) { f.xattr("bin/tool", "security.capability", capNetRaw) },
			[]string{"bin/tool: xattr security.capability only in second"}},
		{"copy becomes hard link", func(f *treeFixture) {
			os.Remove(f.path("etc/copy"))
			f.link("etc/copy", "etc/conf")
		}, []string{"etc/copy: type file → hardlink"}},
		{"rename", func(f *treeFixture) {
			if err := os.Rename(f.path("etc/copy"), f.path("etc/copy2")); err != nil {
				f.t.Fatal(err)
			}
		}, []string{"etc/copy: only in first", "etc/copy2: only in second"}},
		{"empty dir added", func(f *treeFixture) { f.dir("var/empty", 0o755) },
			[]string{"var/empty: only in second"}},
		{"file becomes symlink", func(f *treeFixture) {
			os.Remove(f.path("lib/x.so.1"))
			f.symlink("lib/x.so.1", "elf")
		}, []string{"lib/x.so.1: type file → symlink", "lib/x.so.1: mode 0644 → 0777"}},
		{"whiteout added", func(f *treeFixture) { f.node("var/gone", unix.S_IFCHR, 0, 0) },
			[]string{"var/gone: only in second"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := buildBase(t, false)
			tt.change(f)
			f.clamp()
			got := f.scan()
			if got.Hash() == want.Hash() {
				t.Errorf("hash did not change")
			}
			if diff := cmp.Diff(tt.diff, store.DiffManifests(want, got)); diff != "" {
				t.Errorf("DiffManifests (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDiffManifestsQuotesOddPaths(t *testing.T) {
	a := &store.Manifest{Entries: []store.Entry{{Path: ".", Type: store.EntryDir}}}
	b := &store.Manifest{Entries: []store.Entry{{Path: ".", Type: store.EntryDir}, {Path: "x\ny", Type: store.EntryFifo}}}
	want := []string{`"x\ny": only in second`}
	if diff := cmp.Diff(want, store.DiffManifests(a, b)); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

// validManifest is hand-written so that the parser is checked against the
// format, not only against Encode.
const validManifest = "shed-manifest v1\n" +
	`"." dir 0755 0 0 1700000000` + "\n" +
	`"a" dir 0755 0 0 1700000000 xattr "trusted.overlay.opaque" 79` + "\n" +
	`"a/b" file 4755 0 0 1700000000 5 6c8f2e0d85dd0f0a8b6b4fd6e8f6a0bd6e8bd3e16a0c1b9e5ff1b6ad0e5d9a6c` + "\n" +
	`"a/c d" chardev 0666 0 0 1700000000 1 3` + "\n" +
	`"a-b" hardlink 4755 0 0 1700000000 "a/b"` + "\n" +
	`"c\n\xff" symlink 0777 1000 1000 -5 "a/b"` + "\n" +
	`"d" whiteout 0000 0 0 1700000000 xattr "security.capability" -` + "\n"

func TestParseManifest(t *testing.T) {
	m, err := store.ParseManifest([]byte(validManifest))
	if err != nil {
		t.Fatalf("valid manifest: %v", err)
	}
	if got := string(m.Encode()); got != validManifest {
		t.Errorf("Encode(Parse(b)) != b:\n%s", got)
	}
	if got := m.Entries[5]; got.Path != "c\n\xff" || got.Mtime != -5 || got.UID != 1000 {
		t.Errorf("entry 5: got %+v", got)
	}
	if got := m.Entries[6].Xattrs; len(got) != 1 || got[0].Value == nil || len(got[0].Value) != 0 {
		t.Errorf("empty xattr value: got %#v", got)
	}
	if got := m.Size(); got != 5 {
		t.Errorf("Size: got %d, want 5", got)
	}

	// The walk order puts all of "a" before "a-b", although "a-b" < "a/b".
	walkOrder := "shed-manifest v1\n" + `"." dir 0755 0 0 1` + "\n" + `"a" dir 0755 0 0 1` + "\n" +
		`"a/b" fifo 0644 0 0 1` + "\n" + `"a-b" fifo 0644 0 0 1` + "\n"
	if _, err := store.ParseManifest([]byte(walkOrder)); err != nil {
		t.Errorf("walk order: %v", err)
	}
}

func TestParseManifestRejects(t *testing.T) {
	lines := strings.SplitAfter(validManifest, "\n")
	lines = lines[:len(lines)-1] // after the final newline
	join := func(ls ...string) string { return strings.Join(ls, "") }
	replace := func(old, new string) string {
		if !strings.Contains(validManifest, old) {
			t.Fatalf("test bug: %q not in validManifest", old)
		}
		return strings.Replace(validManifest, old, new, 1)
	}
	tests := []struct{ name, in string }{
		{"empty", ""},
		{"header only", lines[0]},
		{"bad header", replace("v1", "v2")},
		{"no header", join(lines[1:]...)},
		{"header without newline", "shed-manifest v1"},
		{"unsorted", join(lines[0], lines[1], lines[2], lines[4], lines[3], lines[5], lines[6], lines[7])},
		{"sorted as strings, not as a walk", join(lines[0], lines[1], lines[2], `"a-b" fifo 0644 0 0 1`+"\n", `"a/b" fifo 0644 0 0 1`+"\n")},
		{"duplicate", join(lines[0], lines[1], lines[2], lines[3], lines[3])},
		{"duplicate root", join(lines[0], lines[1], lines[1])},
		{"root not first", join(lines[0], lines[2], lines[1])},
		{"trailing garbage", validManifest + "x"},
		{"trailing garbage line", validManifest + "junk\n"},
		{"trailing empty line", validManifest + "\n"},
		{"missing final newline", strings.TrimSuffix(validManifest, "\n")},
		{"crlf", strings.ReplaceAll(validManifest, "\n", "\r\n")},
		{"hex escape for a plain byte", replace(`"a/b" file`, `"\x61/b" file`)},
		{"unicode escape for a space", replace(`"a/c d"`, `"a/c\u0020d"`)},
		{"raw string", replace(`"a/c d"`, "`a/c d`")},
		{"unquoted path", replace(`"a/c d"`, `a/c_d`)},
		{"octal escape", replace(`"c\n\xff"`, `"c\n\377"`)},
		{"hardlink forward reference", replace(`"a-b" hardlink 4755 0 0 1700000000 "a/b"`, `"a-b" hardlink 4755 0 0 1700000000 "d"`)},
		{"hardlink to itself", replace(`"a-b" hardlink 4755 0 0 1700000000 "a/b"`, `"a-b" hardlink 4755 0 0 1700000000 "a-b"`)},
		{"hardlink to a dir", replace(`"a-b" hardlink 4755 0 0 1700000000 "a/b"`, `"a-b" hardlink 4755 0 0 1700000000 "a"`)},
		{"hardlink to a device", replace(`"a-b" hardlink 4755 0 0 1700000000 "a/b"`, `"a-b" hardlink 4755 0 0 1700000000 "a/c d"`)},
		{"unknown type", replace("whiteout", "socket")},
		{"empty symlink target", replace(`-5 "a/b"`, `-5 ""`)},
		{"three-digit mode", replace("0777", "777")},
		{"five-digit mode", replace("0777", "00777")},
		{"non-octal mode", replace("0777", "0778")},
		{"leading zero uid", replace("0777 1000", "0777 01000")},
		{"plus sign", replace("-5", "+5")},
		{"negative zero", replace("-5", "-0")},
		{"uid too big", replace("0777 1000", "0777 4294967296")},
		{"negative size", replace(" 5 6c8f", " -5 6c8f")},
		{"uppercase digest", replace("6c8f2e0d", "6C8F2E0D")},
		{"short digest", replace("6c8f2e0d", "6c8f2e0")},
		{"double space", replace("0755 0", "0755  0")},
		{"tab", replace("0755 0", "0755\t0")},
		{"trailing space", replace(" 1 3\n", " 1 3 \n")},
		{"missing field", replace(" 1 3\n", " 1\n")},
		{"extra field", replace(" 1 3\n", " 1 3 4\n")},
		{"device fields on fifo", replace("chardev 0666 0 0 1700000000 1 3", "fifo 0666 0 0 1700000000 1 3")},
		{"dot slash path", replace(`"a/b" file`, `"./a/b" file`)},
		{"double slash", replace(`"a/b" file`, `"a//b" file`)},
		{"trailing slash", replace(`"a/c d"`, `"a/c d/"`)},
		{"dot dot", replace(`"d" whiteout`, `"a/../d" whiteout`)},
		{"absolute", replace(`"d" whiteout`, `"/d" whiteout`)},
		{"nul in name", replace(`"d" whiteout`, `"d\x00" whiteout`)},
		{"parent missing", replace(`"d" whiteout`, `"x/d" whiteout`)},
		{"child of a file", replace(`"d" whiteout`, `"c\n\xff/d" whiteout`)},
		{"unknown xattr", replace(`"security.capability" -`, `"security.selinux" -`)},
		{"xattr empty value as nothing", replace(`"security.capability" -`, `"security.capability" `)},
		{"xattr bad hex", replace(`"trusted.overlay.opaque" 79`, `"trusted.overlay.opaque" 7`)},
		{"xattr uppercase hex", replace(`"trusted.overlay.opaque" 79`, `"trusted.overlay.opaque" 7A`)},
		{"xattr unsorted", replace(`xattr "trusted.overlay.opaque" 79`, `xattr "trusted.overlay.opaque" 79 xattr "system.posix_acl_access" 79`)},
		// Recorded as trusted.overlay.opaque whichever name it has on disk.
		{"xattr user opaque", replace(`"trusted.overlay.opaque" 79`, `"user.overlay.opaque" 79`)},
		{"xattr duplicate", replace(`xattr "trusted.overlay.opaque" 79`, `xattr "trusted.overlay.opaque" 79 xattr "trusted.overlay.opaque" 79`)},
		{"xattr keyword", replace(`xattr "trusted.overlay.opaque" 79`, `xattrs "trusted.overlay.opaque" 79`)},
		{"file root with children", replace(`"." dir 0755 0 0 1700000000`, `"." file 0755 0 0 1700000000 0 `+store.Sum(nil).Hex())},
		{"symlink root", join(lines[0], `"." symlink 0777 0 0 1 "x"`+"\n")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if m, err := store.ParseManifest([]byte(tt.in)); err == nil {
				t.Errorf("parsed, want an error; entries: %+v", m.Entries)
			}
		})
	}
}

func TestCopyTree(t *testing.T) {
	requireRoot(t)
	src := newFixture(t)
	buildFullTree(src)
	src.mtime("opq", testEpoch+5, 987654321)
	src.mtime("lib/x.so", testEpoch+6, 111)
	dst := filepath.Join(t.TempDir(), "copy")
	if err := store.CopyTree(context.Background(), src.root, dst); err != nil {
		t.Fatal(err)
	}
	want := src.scan()
	got, err := store.ScanTree(context.Background(), dst)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("manifest of the copy (-src +dst):\n%s", diff)
	}
	if got.Hash() != want.Hash() {
		t.Error("copy hashes differently")
	}
	// Manifests record seconds only; the copy keeps nanoseconds too.
	for _, rel := range []string{"etc/passwd", "opq", "lib/x.so", "."} {
		var a, b unix.Stat_t
		if err := unix.Lstat(src.path(rel), &a); err != nil {
			t.Fatal(err)
		}
		if err := unix.Lstat(dst+"/"+rel, &b); err != nil {
			t.Fatal(err)
		}
		if a.Mtim != b.Mtim {
			t.Errorf("%s: mtime %v, copy has %v", rel, a.Mtim, b.Mtim)
		}
	}
	var a, b unix.Stat_t
	unix.Lstat(dst+"/bin/gzip", &a)
	unix.Lstat(dst+"/bin/gunzip", &b)
	if a.Ino != b.Ino || a.Nlink != 2 {
		t.Errorf("hard link not kept: inodes %d, %d, nlink %d", a.Ino, b.Ino, a.Nlink)
	}
	if _, err := unix.Lgetxattr(dst+"/opq", "trusted.overlay.origin", nil); !errors.Is(err, unix.ENODATA) {
		t.Errorf("trusted.overlay.origin copied (err %v); only recorded xattrs should be", err)
	}
}

func TestCopyTreeFile(t *testing.T) {
	requireRoot(t)
	f := newFixture(t)
	f.file("su", "su bytes", 0o4750)
	f.own("su", 0, 42)
	f.xattr("su", "security.capability", capNetRaw)
	dst := filepath.Join(t.TempDir(), "su")
	if err := store.CopyTree(context.Background(), f.path("su"), dst); err != nil {
		t.Fatal(err)
	}
	want, err := store.ScanTree(context.Background(), f.path("su"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := store.ScanTree(context.Background(), dst)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-src +dst):\n%s", diff)
	}
}

func TestCopyTreeRefuses(t *testing.T) {
	f := newFixture(t)
	f.file("d/f", "x", 0o644)
	f.symlink("link", "d")
	out := t.TempDir()
	ctx := context.Background()

	if err := store.CopyTree(ctx, f.path("d"), out); !errors.Is(err, os.ErrExist) {
		t.Errorf("existing dst: got %v, want ErrExist", err)
	}
	if err := store.CopyTree(ctx, f.path("link"), out+"/l"); err == nil {
		t.Error("symlink src: copied, want an error")
	}
	if _, err := os.Lstat(out + "/l"); err == nil {
		t.Error("symlink src: dst was created")
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if err := store.CopyTree(cancelled, f.path("d"), out+"/c"); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: got %v, want context.Canceled", err)
	}

	listenUnix(t, f.path("d/sock"))
	err := store.CopyTree(ctx, f.path("d"), out+"/s")
	if err == nil || !strings.Contains(err.Error(), "d/sock") {
		t.Errorf("socket: got %v, want an error naming d/sock", err)
	}
}

// listenUnix makes a socket file at p, removed when the test ends.
func listenUnix(t *testing.T, p string) net.Listener {
	t.Helper()
	l, err := net.Listen("unix", p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func TestClampTimes(t *testing.T) {
	f := newFixture(t)
	outside := newFixture(t)
	outside.file("target", "t", 0o644)
	outside.mtime("target", testEpoch+500, 42)
	f.file("new", "n", 0o644)
	f.mtime("new", testEpoch+100, 5)
	f.file("old", "o", 0o644)
	f.mtime("old", testEpoch-1000, 123456789)
	f.file("sub/deep", "d", 0o644)
	f.symlink("sub/link", outside.path("target"))
	f.mtime("sub/link", testEpoch+200, 7)
	if err := store.ClampTimes(f.root, testEpoch); err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{
		".": testEpoch, "new": testEpoch, "old": testEpoch - 1000,
		"sub": testEpoch, "sub/deep": testEpoch, "sub/link": testEpoch,
	}
	for rel, sec := range want {
		var st unix.Stat_t
		if err := unix.Lstat(f.path(rel), &st); err != nil {
			t.Fatal(err)
		}
		if w := (unix.Timespec{Sec: sec}); st.Mtim != w || st.Atim != w {
			t.Errorf("%s: mtime %v atime %v, want %v for both", rel, st.Mtim, st.Atim, w)
		}
	}
	var st unix.Stat_t
	if err := unix.Lstat(outside.path("target"), &st); err != nil {
		t.Fatal(err)
	}
	if w := (unix.Timespec{Sec: testEpoch + 500, Nsec: 42}); st.Mtim != w {
		t.Errorf("symlink target outside the tree: mtime %v, want %v untouched", st.Mtim, w)
	}
	if err := store.ClampTimes(f.path("missing"), testEpoch); err == nil {
		t.Error("missing root: no error")
	}
}

func TestScanTreeRefuses(t *testing.T) {
	f := newFixture(t)
	f.file("d/f", "x", 0o644)
	f.symlink("link", "d")
	ctx := context.Background()
	if _, err := store.ScanTree(ctx, f.path("link")); err == nil {
		t.Error("symlink root: scanned, want an error")
	}
	if _, err := store.ScanTree(ctx, f.path("missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing root: got %v, want ErrNotExist", err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := store.ScanTree(cancelled, f.root); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: got %v, want context.Canceled", err)
	}

	listenUnix(t, f.path("d/sock"))
	_, err := store.ScanTree(ctx, f.root)
	if err == nil || !strings.Contains(err.Error(), "d/sock") {
		t.Errorf("socket: got %v, want an error naming d/sock", err)
	}
}

func TestScanTreeFileRoot(t *testing.T) {
	f := newFixture(t)
	f.file("f", "contents", 0o640)
	m, err := store.ScanTree(context.Background(), f.path("f"))
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Entries) != 1 {
		t.Fatalf("got %d entries, want 1", len(m.Entries))
	}
	e := m.Entries[0]
	if e.Path != "." || e.Type != store.EntryFile || e.Mode != 0o640 || e.Size != 8 || e.Digest != store.Sum([]byte("contents")) {
		t.Errorf("got %+v", e)
	}
	if _, err := store.ParseManifest(m.Encode()); err != nil {
		t.Errorf("parse a file root's manifest: %v", err)
	}
}

func TestSyncTree(t *testing.T) {
	f := newFixture(t)
	f.file("a/b", "x", 0o644)
	if err := store.SyncTree(f.root); err != nil {
		t.Fatal(err)
	}
	if err := store.SyncTree(f.path("a/b")); err != nil {
		t.Fatal(err)
	}
	if err := store.SyncTree(f.path("missing")); err == nil {
		t.Error("missing root: no error")
	}
}
