package cache

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"toolshed.dev/shed/store"
)

const epoch = 1700000000

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: layers keep owners, setuid bits, whiteouts (device nodes) and trusted.* xattrs")
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// A file capability (VFS_CAP_REVISION_2, effective, CAP_NET_RAW permitted).
var netRawCap = []byte{1, 0, 0, 2, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}

// buildTree makes a tree with every kind of entry a store path may hold.
func buildTree(t testing.TB, dir string) {
	t.Helper()
	mkdir := func(p string, mode uint32, uid, gid int) {
		must(t, os.Mkdir(filepath.Join(dir, p), 0o700))
		must(t, os.Lchown(filepath.Join(dir, p), uid, gid))
		must(t, unix.Chmod(filepath.Join(dir, p), mode))
	}
	file := func(p, data string, mode uint32, uid, gid int) {
		must(t, os.WriteFile(filepath.Join(dir, p), []byte(data), 0o600))
		must(t, os.Lchown(filepath.Join(dir, p), uid, gid))
		must(t, unix.Chmod(filepath.Join(dir, p), mode))
	}
	must(t, os.Chmod(dir, 0o755))
	mkdir("bin", 0o755, 0, 0)
	mkdir("home", 0o750, 1000, 1000)
	mkdir("home/private", 0o700, 1000, 1001)
	mkdir("tmp", 0o1777, 0, 0)
	mkdir("opq", 0o755, 0, 0)
	mkdir("lib", 0o755, 0, 0)
	file("a", "hello, world\n", 0o644, 0, 0)
	file("empty", "", 0o600, 0, 0)
	file("bin/tool", "#!/bin/sh\necho hi\n", 0o755, 0, 0)
	file("bin/su", "setuid", 0o4755, 0, 0)
	file("bin/ping", "ping", 0o755, 0, 0)
	must(t, unix.Lsetxattr(filepath.Join(dir, "bin/ping"), "security.capability", netRawCap, 0))
	file("home/private/notes", "mine", 0o600, 1000, 1001)
	file("opq/kept", "inside an opaque directory", 0o644, 0, 0)
	must(t, os.Link(filepath.Join(dir, "a"), filepath.Join(dir, "lib/a-again")))
	must(t, os.Symlink("/etc/passwd", filepath.Join(dir, "passwd")))
	must(t, os.Symlink("../x", filepath.Join(dir, "lib/up")))
	must(t, unix.Mkfifo(filepath.Join(dir, "fifo"), 0o640))
	must(t, unix.Mknod(filepath.Join(dir, "gone"), unix.S_IFCHR, 0))
	must(t, unix.Mknod(filepath.Join(dir, "lib/gone"), unix.S_IFCHR, 0))
	must(t, unix.Lsetxattr(filepath.Join(dir, "opq"), "trusted.overlay.opaque", []byte("y"), 0))
	// Not content: carried by umoci, dropped by ReadLayer, ignored by manifests.
	must(t, unix.Lsetxattr(filepath.Join(dir, "a"), "user.note", []byte("x"), 0))
	must(t, store.ClampTimes(dir, epoch))
}

func writeLayer(t *testing.T, src string) []byte {
	t.Helper()
	var buf bytes.Buffer
	must(t, WriteLayer(context.Background(), &buf, src))
	return buf.Bytes()
}

func tarHeaders(t *testing.T, b []byte) []*tar.Header {
	t.Helper()
	var hdrs []*tar.Header
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return hdrs
		}
		must(t, err)
		hdrs = append(hdrs, hdr)
	}
}

func TestRoundTrip(t *testing.T) {
	needRoot(t)
	ctx := context.Background()
	base := t.TempDir()
	src := filepath.Join(base, "src")
	must(t, os.Mkdir(src, 0o700))
	buildTree(t, src)
	m, err := store.ScanTree(ctx, src)
	must(t, err)
	types := map[store.EntryType]int{}
	xattrs := map[string]bool{}
	for _, e := range m.Entries {
		types[e.Type]++
		for _, x := range e.Xattrs {
			xattrs[x.Name] = true
		}
	}
	for _, want := range []store.EntryType{store.EntryDir, store.EntryFile, store.EntryHardlink, store.EntrySymlink, store.EntryFifo, store.EntryWhiteout} {
		if types[want] == 0 {
			t.Fatalf("test tree has no %s: %s", want, m.Encode())
		}
	}
	if !xattrs["trusted.overlay.opaque"] || !xattrs["security.capability"] {
		t.Fatalf("test tree lacks xattrs: %s", m.Encode())
	}

	b1 := writeLayer(t, src)
	b2 := writeLayer(t, src)
	if !bytes.Equal(b1, b2) {
		t.Fatal("two layers of the same tree differ")
	}

	// The layout ReadLayer expects: the root is "content/", whiteouts and
	// opaque directories are OCI marks, hard links name the first path.
	var names []string
	for _, hdr := range tarHeaders(t, b1) {
		names = append(names, hdr.Name)
		if hdr.Name == "content/lib/a-again" && (hdr.Typeflag != tar.TypeLink || hdr.Linkname != "content/a") {
			t.Errorf("hard link header: %+v", hdr)
		}
	}
	for _, want := range []string{"content/", "content/.wh.gone", "content/lib/.wh.gone", "content/opq/", "content/opq/.wh..wh..opq", "content/passwd"} {
		if !slices.Contains(names, want) {
			t.Errorf("layer has no %q: %q", want, names)
		}
	}

	dst := filepath.Join(base, "dst")
	must(t, ReadLayer(ctx, bytes.NewReader(b1), dst, m))
	got, err := store.ScanTree(ctx, dst)
	must(t, err)
	if got.Hash() != m.Hash() {
		t.Fatalf("round trip differs:\n%s", strings.Join(store.DiffManifests(m, got), "\n"))
	}
	// The copy's layer is the original's, but for the xattr that is not
	// content, which ReadLayer dropped.
	must(t, unix.Lremovexattr(filepath.Join(src, "a"), "user.note"))
	if !bytes.Equal(writeLayer(t, src), writeLayer(t, dst)) {
		t.Fatal("layer of the extracted tree differs from the original's")
	}
}

func TestRoundTripSingleFile(t *testing.T) {
	needRoot(t)
	ctx := context.Background()
	base := t.TempDir()
	src := filepath.Join(base, "pkg.deb")
	must(t, os.WriteFile(src, []byte("!<arch>\ndebian-binary\n"), 0o644))
	must(t, store.ClampTimes(src, epoch))
	m, err := store.ScanTree(ctx, src)
	must(t, err)

	b := writeLayer(t, src)
	hdrs := tarHeaders(t, b)
	if len(hdrs) != 1 || hdrs[0].Name != LayerRoot || hdrs[0].Typeflag != tar.TypeReg {
		t.Fatalf("single-file layer: %+v", hdrs)
	}
	dst := filepath.Join(base, "out.deb")
	must(t, ReadLayer(ctx, bytes.NewReader(b), dst, m))
	got, err := store.ScanTree(ctx, dst)
	must(t, err)
	if got.Hash() != m.Hash() {
		t.Fatalf("round trip differs:\n%s", strings.Join(store.DiffManifests(m, got), "\n"))
	}
	if ents, _ := os.ReadDir(base); len(ents) != 2 {
		t.Fatalf("leftovers beside dst: %v", ents)
	}
}

func TestReadLayerKeepsExistingDst(t *testing.T) {
	needRoot(t)
	base := t.TempDir()
	src := filepath.Join(base, "src")
	must(t, os.Mkdir(src, 0o755))
	m, err := store.ScanTree(context.Background(), src)
	must(t, err)
	dst := filepath.Join(base, "dst")
	must(t, os.WriteFile(dst, []byte("someone else's"), 0o644))
	err = ReadLayer(context.Background(), bytes.NewReader(writeLayer(t, src)), dst, m)
	if !errors.Is(err, ErrBadLayer) {
		t.Fatalf("err = %v, want ErrBadLayer", err)
	}
	if b, err := os.ReadFile(dst); err != nil || string(b) != "someone else's" {
		t.Fatalf("existing dst touched: %q, %v", b, err)
	}
}

// Hand-made layers and the manifests their senders claim.

var mtime = time.Unix(epoch, 0)

type tarEntry struct {
	hdr  tar.Header
	data string
}

func dirHdr(name string) tarEntry {
	return tarEntry{hdr: tar.Header{Name: name, Typeflag: tar.TypeDir, Mode: 0o755, ModTime: mtime}}
}

func fileHdr(name, data string) tarEntry {
	return tarEntry{hdr: tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(data)), ModTime: mtime}, data: data}
}

func linkHdr(typ byte, name, target string) tarEntry {
	mode := int64(0o777)
	if typ == tar.TypeLink {
		mode = 0o644 // the file's
	}
	return tarEntry{hdr: tar.Header{Name: name, Typeflag: typ, Linkname: target, Mode: mode, ModTime: mtime}}
}

func whiteoutHdr(name string) tarEntry {
	return tarEntry{hdr: tar.Header{Name: name, Typeflag: tar.TypeReg}}
}

func makeTar(t *testing.T, ents ...tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		must(t, tw.WriteHeader(&e.hdr))
		_, err := io.WriteString(tw, e.data)
		must(t, err)
	}
	must(t, tw.Close())
	return buf.Bytes()
}

var rootEntry = store.Entry{Path: ".", Type: store.EntryDir, Mode: 0o755, Mtime: epoch}

func fileEntry(p, data string) store.Entry {
	return store.Entry{Path: p, Type: store.EntryFile, Mode: 0o644, Mtime: epoch, Size: int64(len(data)), Digest: store.Sum([]byte(data))}
}

func dirEntry(p string) store.Entry {
	return store.Entry{Path: p, Type: store.EntryDir, Mode: 0o755, Mtime: epoch}
}

func capEntry(p, data string) store.Entry {
	e := fileEntry(p, data)
	e.Xattrs = []store.Xattr{{Name: "security.capability", Value: netRawCap}}
	return e
}

func linkEntry(typ store.EntryType, p, target string) store.Entry {
	mode := uint32(0o777)
	if typ == store.EntryHardlink {
		mode = 0o644
	}
	return store.Entry{Path: p, Type: typ, Mode: mode, Mtime: epoch, Target: target}
}

func manifest(ents ...store.Entry) *store.Manifest {
	return &store.Manifest{Entries: append([]store.Entry{rootEntry}, ents...)}
}

// snapshot lists everything under dir with its type and content, to show
// that a failed ReadLayer wrote nothing outside dst.
func snapshot(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	must(t, filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		b.WriteString(p + " " + d.Type().String())
		if d.Type().IsRegular() {
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			b.WriteString(" " + string(data))
		}
		b.WriteString("\n")
		return nil
	}))
	return b.String()
}

func TestReadLayerRefuses(t *testing.T) {
	needRoot(t)
	const hello = "hello"
	// Each case gets a fresh base directory holding a canary directory next
	// to dst; {canary} in a name or target stands for its path.
	cases := []struct {
		name string
		tar  func(canary string) []tarEntry
		m    func(canary string) *store.Manifest
		want string // in the error
	}{
		{"dotdot", func(string) []tarEntry {
			return []tarEntry{dirHdr("content/"), fileHdr("../escape", hello)}
		}, func(string) *store.Manifest { return manifest(fileEntry("escape", hello)) }, "not a path under content/"},
		{"absolute", func(c string) []tarEntry {
			return []tarEntry{dirHdr("content/"), fileHdr(filepath.Join(c, "abs"), hello)}
		}, func(string) *store.Manifest { return manifest(fileEntry("abs", hello)) }, "not a path under content/"},
		{"dotdot inside", func(string) []tarEntry {
			return []tarEntry{dirHdr("content/"), fileHdr("content/../../x", hello)}
		}, func(string) *store.Manifest { return manifest(fileEntry("x", hello)) }, "not a path under content/"},
		{"unclean name", func(string) []tarEntry {
			return []tarEntry{dirHdr("content/"), fileHdr("content//f", hello)}
		}, func(string) *store.Manifest { return manifest(fileEntry("f", hello)) }, "not a path under content/"},
		{"write through symlink", func(c string) []tarEntry {
			return []tarEntry{dirHdr("content/"), linkHdr(tar.TypeSymlink, "content/link", c), fileHdr("content/link/pwned", hello)}
		}, func(c string) *store.Manifest {
			// Even a manifest that lists it (ScanTree never would) does not
			// let a file go beneath a symlink.
			return manifest(linkEntry(store.EntrySymlink, "link", c), fileEntry("link/pwned", hello))
		}, `parent "link" is not a directory`},
		{"write through symlink, unlisted", func(c string) []tarEntry {
			return []tarEntry{dirHdr("content/"), linkHdr(tar.TypeSymlink, "content/link", c), fileHdr("content/link/pwned", hello)}
		}, func(c string) *store.Manifest {
			return manifest(linkEntry(store.EntrySymlink, "link", c))
		}, "not in the manifest"},
		{"hard link to /etc/passwd", func(string) []tarEntry {
			return []tarEntry{dirHdr("content/"), fileHdr("content/f", hello), linkHdr(tar.TypeLink, "content/h", "/etc/passwd")}
		}, func(string) *store.Manifest {
			return manifest(fileEntry("f", hello), linkEntry(store.EntryHardlink, "h", "f"))
		}, "hard link to"},
		{"hard link outside", func(string) []tarEntry {
			return []tarEntry{dirHdr("content/"), fileHdr("content/f", hello), linkHdr(tar.TypeLink, "content/h", "../../canary/file")}
		}, func(string) *store.Manifest {
			return manifest(fileEntry("f", hello), linkEntry(store.EntryHardlink, "h", "f"))
		}, "hard link to"},
		{"hard link forward", func(string) []tarEntry {
			return []tarEntry{dirHdr("content/"), linkHdr(tar.TypeLink, "content/a", "content/b"), fileHdr("content/b", hello)}
		}, func(string) *store.Manifest {
			return manifest(linkEntry(store.EntryHardlink, "a", "b"), fileEntry("b", hello))
		}, "not a file extracted before it"},
		{"whiteout under symlink", func(c string) []tarEntry {
			return []tarEntry{dirHdr("content/"), linkHdr(tar.TypeSymlink, "content/sym", c), whiteoutHdr("content/sym/.wh.file")}
		}, func(c string) *store.Manifest {
			return manifest(linkEntry(store.EntrySymlink, "sym", c),
				store.Entry{Path: "sym/file", Type: store.EntryWhiteout, Mtime: epoch})
		}, `parent "sym" is not a directory`},
		{"unlisted whiteout", func(string) []tarEntry {
			return []tarEntry{dirHdr("content/"), fileHdr("content/f", hello), whiteoutHdr("content/.wh.f")}
		}, func(string) *store.Manifest { return manifest(fileEntry("f", hello)) }, "a whiteout in the layer, a file in the manifest"},
		{"unlisted opaque marker", func(string) []tarEntry {
			return []tarEntry{dirHdr("content/"), whiteoutHdr("content/.wh..wh..opq")}
		}, func(string) *store.Manifest { return manifest() }, "not an opaque directory"},
		{"unlisted device", func(string) []tarEntry {
			return []tarEntry{dirHdr("content/"), {hdr: tar.Header{Name: "content/null", Typeflag: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 3, ModTime: mtime}}}
		}, func(string) *store.Manifest { return manifest() }, "not in the manifest"},
		{"unlisted entry", func(string) []tarEntry {
			return []tarEntry{dirHdr("content/"), fileHdr("content/f", hello), fileHdr("content/g", hello)}
		}, func(string) *store.Manifest { return manifest(fileEntry("f", hello)) }, "not in the manifest"},
		{"size differs", func(string) []tarEntry {
			return []tarEntry{dirHdr("content/"), fileHdr("content/f", hello+"!")}
		}, func(string) *store.Manifest { return manifest(fileEntry("f", hello)) }, "size 6, manifest says 5"},
		{"mode differs", func(string) []tarEntry {
			e := fileHdr("content/f", hello)
			e.hdr.Mode = 0o4755
			return []tarEntry{dirHdr("content/"), e}
		}, func(string) *store.Manifest { return manifest(fileEntry("f", hello)) }, "mode"},
		{"type change", func(string) []tarEntry {
			return []tarEntry{dirHdr("content/"), linkHdr(tar.TypeSymlink, "content/f", "/etc/shadow")}
		}, func(string) *store.Manifest { return manifest(fileEntry("f", hello)) }, "a symlink in the layer, a file in the manifest"},
		{"duplicate", func(string) []tarEntry {
			return []tarEntry{dirHdr("content/"), fileHdr("content/f", hello), fileHdr("content/f", hello)}
		}, func(string) *store.Manifest { return manifest(fileEntry("f", hello)) }, "duplicate entry"},
		{"parent not in the manifest", func(string) []tarEntry {
			return []tarEntry{dirHdr("content/"), fileHdr("content/d/f", hello)}
		}, func(string) *store.Manifest { return manifest(fileEntry("d/f", hello)) }, `parent "d" is not a directory`},
		{"root not first", func(string) []tarEntry {
			return []tarEntry{fileHdr("content/f", hello), dirHdr("content/")}
		}, func(string) *store.Manifest { return manifest(fileEntry("f", hello)) }, `parent "." is not a directory extracted before it`},
		{"missing entry", func(string) []tarEntry {
			return []tarEntry{dirHdr("content/")}
		}, func(string) *store.Manifest { return manifest(fileEntry("f", hello)) }, `entry "f" of the manifest is not in the layer`},
		{"same size, other bytes", func(string) []tarEntry {
			return []tarEntry{dirHdr("content/"), fileHdr("content/f", "HELLO")}
		}, func(string) *store.Manifest { return manifest(fileEntry("f", hello)) }, "differs from its manifest"},
		{"directory entered again", func(string) []tarEntry {
			return []tarEntry{dirHdr("content/"), dirHdr("content/a/"), dirHdr("content/b/"), fileHdr("content/a/f", hello)}
		}, func(string) *store.Manifest {
			return manifest(dirEntry("a"), fileEntry("a/f", hello), dirEntry("b"))
		}, `directory "a" was complete before this entry`},
		{"opaque directory without its marker", func(string) []tarEntry {
			return []tarEntry{dirHdr("content/"), dirHdr("content/o/")}
		}, func(string) *store.Manifest {
			o := dirEntry("o")
			o.Xattrs = []store.Xattr{{Name: "trusted.overlay.opaque", Value: []byte("y")}}
			return manifest(o)
		}, "without its marker"},
		{"capability not carried", func(string) []tarEntry {
			return []tarEntry{dirHdr("content/"), fileHdr("content/f", hello)}
		}, func(string) *store.Manifest { return manifest(capEntry("f", hello)) }, "xattr security.capability is not the manifest's"},
		{"other capability", func(string) []tarEntry {
			f := fileHdr("content/f", hello)
			f.hdr.PAXRecords = map[string]string{"SCHILY.xattr.security.capability": "other"}
			return []tarEntry{dirHdr("content/"), f}
		}, func(string) *store.Manifest { return manifest(capEntry("f", hello)) }, "xattr security.capability is not the manifest's"},
		{"hard link with other metadata", func(string) []tarEntry {
			h := linkHdr(tar.TypeLink, "content/h", "content/f")
			h.hdr.ModTime = mtime.Add(time.Second)
			return []tarEntry{dirHdr("content/"), fileHdr("content/f", hello), h}
		}, func(string) *store.Manifest {
			h := linkEntry(store.EntryHardlink, "h", "f")
			h.Mtime++
			return manifest(fileEntry("f", hello), h)
		}, "other metadata than its file"},
		{"symlink of another mode", func(string) []tarEntry {
			l := linkHdr(tar.TypeSymlink, "content/l", "x")
			l.hdr.Mode = 0o755
			return []tarEntry{dirHdr("content/"), l}
		}, func(string) *store.Manifest {
			l := linkEntry(store.EntrySymlink, "l", "x")
			l.Mode = 0o755
			return manifest(l)
		}, "a symlink's is 0777"},
		{"xattrs on a symlink", func(string) []tarEntry {
			l := linkHdr(tar.TypeSymlink, "content/l", "x")
			l.hdr.PAXRecords = map[string]string{"SCHILY.xattr.security.capability": string(netRawCap)}
			return []tarEntry{dirHdr("content/"), l}
		}, func(string) *store.Manifest {
			l := linkEntry(store.EntrySymlink, "l", "x")
			l.Xattrs = []store.Xattr{{Name: "security.capability", Value: netRawCap}}
			return manifest(l)
		}, "which a layer does not carry"},
		{"headers beyond the bound", func(string) []tarEntry {
			e := dirHdr("content/")
			e.hdr.PAXRecords = map[string]string{"comment": strings.Repeat("x", 512<<10)}
			return []tarEntry{e}
		}, func(string) *store.Manifest { return manifest() }, "larger than the"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			base := t.TempDir()
			canary := filepath.Join(base, "canary")
			must(t, os.Mkdir(canary, 0o755))
			must(t, os.WriteFile(filepath.Join(canary, "file"), []byte("canary"), 0o644))
			before := snapshot(t, base)
			dst := filepath.Join(base, "dst")
			err := ReadLayer(context.Background(), bytes.NewReader(makeTar(t, tc.tar(canary)...)), dst, tc.m(canary))
			checkRefused(t, err, tc.want, dst)
			if after := snapshot(t, base); after != before {
				t.Fatalf("outside dst changed:\nbefore:\n%s\nafter:\n%s", before, after)
			}
		})
	}
}

func checkRefused(t *testing.T, err error, want, dst string) {
	t.Helper()
	if !errors.Is(err, ErrBadLayer) {
		t.Fatalf("err = %v, want ErrBadLayer", err)
	}
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("err = %v, want it to say %q", err, want)
	}
	t.Log(err)
	if _, err := os.Lstat(dst); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("dst left behind: %v", err)
	}
}

// A default ACL on the directory a layer is read into is not inherited: the
// tree is still exactly its manifest.
func TestReadLayerDropsInheritedACL(t *testing.T) {
	needRoot(t)
	ctx := context.Background()
	base := t.TempDir()
	src := filepath.Join(base, "src")
	must(t, os.Mkdir(src, 0o700))
	buildTree(t, src)
	m, err := store.ScanTree(ctx, src)
	must(t, err)
	into := filepath.Join(base, "into")
	must(t, os.Mkdir(into, 0o755))
	// user::rwx group::r-x other::r-x
	acl := []byte{2, 0, 0, 0, 1, 0, 7, 0, 0xff, 0xff, 0xff, 0xff, 4, 0, 5, 0, 0xff, 0xff, 0xff, 0xff, 0x20, 0, 5, 0, 0xff, 0xff, 0xff, 0xff}
	if err := unix.Setxattr(into, "system.posix_acl_default", acl, 0); errors.Is(err, unix.ENOTSUP) {
		t.Skip("no ACLs on this file system")
	} else {
		must(t, err)
	}
	for _, dst := range []string{filepath.Join(into, "dir"), filepath.Join(into, "file")} {
		b, want := writeLayer(t, src), m
		if filepath.Base(dst) == "file" {
			f := filepath.Join(src, "a")
			fm, err := store.ScanTree(ctx, f)
			must(t, err)
			b, want = writeLayer(t, f), fm
		}
		must(t, ReadLayer(ctx, bytes.NewReader(b), dst, want))
		got, err := store.ScanTree(ctx, dst)
		must(t, err)
		if got.Hash() != want.Hash() {
			t.Errorf("%s: differs from its manifest:\n%s", dst, strings.Join(store.DiffManifests(want, got), "\n"))
		}
	}
}

func TestReadLayerTruncated(t *testing.T) {
	needRoot(t)
	data := strings.Repeat("0123456789", 1000)
	m := manifest(fileEntry("f", data), fileEntry("g", data))
	full := makeTar(t, dirHdr("content/"), fileHdr("content/f", data), fileHdr("content/g", data))
	// Inside f's data, at g's header, in g's padding, in the end-of-archive
	// marker (all entries there: Go's tar reader would call that a clean end).
	for _, n := range []int{700, 512 + 512 + 10240, len(full) - 1030, len(full) - 512} {
		dst := filepath.Join(t.TempDir(), "dst")
		err := ReadLayer(context.Background(), bytes.NewReader(full[:n]), dst, m)
		checkRefused(t, err, "", dst)
	}
}

func TestReadLayerSingleFileRefused(t *testing.T) {
	needRoot(t)
	m := &store.Manifest{Entries: []store.Entry{fileEntry(".", "hello")}}
	for name, ents := range map[string][]tarEntry{
		"other bytes": {fileHdr("content", "HELLO")},
		"a directory": {dirHdr("content/")},
		"more":        {fileHdr("content", "hello"), fileHdr("content/x", "hello")},
	} {
		t.Run(name, func(t *testing.T) {
			base := t.TempDir()
			dst := filepath.Join(base, "out.deb")
			err := ReadLayer(context.Background(), bytes.NewReader(makeTar(t, ents...)), dst, m)
			checkRefused(t, err, "", dst)
			if ents, _ := os.ReadDir(base); len(ents) != 0 {
				t.Fatalf("leftovers beside dst: %v", ents)
			}
		})
	}
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// A gzip stream of a tar whose one file claims and holds 1 GiB of zeros,
// where the manifest says 10 bytes, is refused at the header.
func TestReadLayerBomb(t *testing.T) {
	needRoot(t)
	pr, pw := io.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		gz, _ := gzip.NewWriterLevel(pw, gzip.BestSpeed)
		tw := tar.NewWriter(gz)
		root := dirHdr("content/").hdr
		err := tw.WriteHeader(&root)
		if err == nil {
			err = tw.WriteHeader(&tar.Header{Name: "content/f", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1 << 30, ModTime: mtime})
		}
		zeros := make([]byte, 1<<20)
		for i := 0; i < 1024 && err == nil; i++ {
			_, err = tw.Write(zeros)
		}
		if err == nil {
			err = errors.Join(tw.Close(), gz.Close())
		}
		pw.CloseWithError(err)
	}()
	zr, err := gzip.NewReader(pr)
	must(t, err)
	cr := &countingReader{r: zr}
	m := manifest(fileEntry("f", "0123456789"))
	dst := filepath.Join(t.TempDir(), "dst")
	start := time.Now()
	err = ReadLayer(context.Background(), cr, dst, m)
	elapsed := time.Since(start)
	pr.CloseWithError(errors.New("reader gone")) // stops the writer
	<-done
	checkRefused(t, err, "size 1073741824, manifest says 10", dst)
	if cr.n > 64<<10 || elapsed > 5*time.Second {
		t.Fatalf("read %d bytes in %v before refusing", cr.n, elapsed)
	}
}

func TestWriteLayerCanceled(t *testing.T) {
	src := t.TempDir()
	must(t, os.WriteFile(filepath.Join(src, "f"), bytes.Repeat([]byte("x"), 1<<20), 0o644))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := WriteLayer(ctx, io.Discard, src); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

// setRootless makes onDisk answer as in shed's user namespace (or as on the
// host) until the test ends.
func setRootless(t *testing.T, on bool) {
	old := diskOpaque
	diskOpaque = func() string {
		if on {
			return "user.overlay.opaque"
		}
		return "trusted.overlay.opaque"
	}
	t.Cleanup(func() { diskOpaque = old })
}

// getXattr returns the value of name on p, or nil if p has none.
func getXattr(t *testing.T, p, name string) []byte {
	t.Helper()
	buf := make([]byte, 64)
	n, err := unix.Lgetxattr(p, name, buf)
	if errors.Is(err, unix.ENODATA) {
		return nil
	}
	must(t, err)
	return buf[:n]
}

// TestRoundTripRootless: a rootless store keeps the opaque mark as
// user.overlay.opaque. Its layer of a tree is root's, byte for byte (the mark
// is a ".wh..wh..opq" marker, never an xattr), and either store reads it into
// a tree of the canonical hash with the mark under its own name.
func TestRoundTripRootless(t *testing.T) {
	needRoot(t)
	ctx := context.Background()
	base := t.TempDir()
	rootSrc, userSrc := filepath.Join(base, "root"), filepath.Join(base, "user")
	for _, src := range []string{rootSrc, userSrc} {
		must(t, os.Mkdir(src, 0o700))
		buildTree(t, src)
	}
	must(t, unix.Lremovexattr(filepath.Join(userSrc, "opq"), "trusted.overlay.opaque"))
	must(t, unix.Lsetxattr(filepath.Join(userSrc, "opq"), "user.overlay.opaque", []byte("y"), 0))
	m, err := store.ScanTree(ctx, rootSrc)
	must(t, err)
	if um, err := store.ScanTree(ctx, userSrc); err != nil || um.Hash() != m.Hash() {
		t.Fatalf("the tree with user.overlay.opaque hashes differently (%v):\n%s", err, strings.Join(store.DiffManifests(m, um), "\n"))
	}

	setRootless(t, false)
	rootLayer := writeLayer(t, rootSrc)
	setRootless(t, true)
	userLayer := writeLayer(t, userSrc)
	if !bytes.Equal(rootLayer, userLayer) {
		t.Error("the rootless store's layer differs from root's")
	}
	var names []string
	for _, hdr := range tarHeaders(t, userLayer) {
		names = append(names, hdr.Name)
		for key := range hdr.PAXRecords {
			if strings.Contains(key, ".overlay.") {
				t.Errorf("%s carries %s", hdr.Name, key)
			}
		}
	}
	if !slices.Contains(names, "content/opq/.wh..wh..opq") {
		t.Errorf("rootless layer has no opaque marker for opq: %q", names)
	}

	for _, tc := range []struct {
		rootless   bool
		own, other string
	}{
		{false, "trusted.overlay.opaque", "user.overlay.opaque"},
		{true, "user.overlay.opaque", "trusted.overlay.opaque"},
	} {
		setRootless(t, tc.rootless)
		dst := filepath.Join(base, tc.own)
		must(t, ReadLayer(ctx, bytes.NewReader(userLayer), dst, m))
		got, err := store.ScanTree(ctx, dst)
		must(t, err)
		if got.Hash() != m.Hash() {
			t.Errorf("rootless %v: round trip differs:\n%s", tc.rootless, strings.Join(store.DiffManifests(m, got), "\n"))
		}
		if v := getXattr(t, filepath.Join(dst, "opq"), tc.own); string(v) != "y" {
			t.Errorf("rootless %v: extracted opq has %s = %q, want \"y\"", tc.rootless, tc.own, v)
		}
		if v := getXattr(t, filepath.Join(dst, "opq"), tc.other); v != nil {
			t.Errorf("rootless %v: extracted opq has %s = %q, want none", tc.rootless, tc.other, v)
		}
	}
}

// TestWriteLayerRefusesOverlayXattrs: an overlayfs xattr that umoci would put
// in the tar (the other namespace's, or an escaped one it unescapes) fails
// the push rather than reach a cache.
func TestWriteLayerRefusesOverlayXattrs(t *testing.T) {
	needRoot(t)
	for _, tc := range []struct {
		rootless   bool
		set, inTar string
	}{
		{false, "user.overlay.opaque", "user.overlay.opaque"},
		{false, "trusted.overlay.overlay.opaque", "trusted.overlay.opaque"},
		{true, "user.overlay.overlay.opaque", "user.overlay.opaque"},
		{true, "trusted.overlay.opaque", "trusted.overlay.opaque"},
	} {
		setRootless(t, tc.rootless)
		src := t.TempDir()
		must(t, os.Mkdir(filepath.Join(src, "d"), 0o755))
		must(t, unix.Lsetxattr(filepath.Join(src, "d"), tc.set, []byte("y"), 0))
		err := WriteLayer(context.Background(), io.Discard, src)
		if err == nil || !strings.Contains(err.Error(), "content/d/ has the overlayfs xattr "+tc.inTar) {
			t.Errorf("rootless %v, %s on a directory: err = %v, want it refused, naming %s", tc.rootless, tc.set, err, tc.inTar)
		}
	}
}

// FuzzReadLayer: whatever the stream, ReadLayer either writes exactly the
// manifest's tree at dst or fails and leaves nothing, at dst or beside it.
func FuzzReadLayer(f *testing.F) {
	if os.Geteuid() != 0 {
		f.Skip("needs root: layers keep owners, setuid bits, whiteouts (device nodes) and trusted.* xattrs")
	}
	ctx := context.Background()
	src := filepath.Join(f.TempDir(), "src")
	if err := os.Mkdir(src, 0o700); err != nil {
		f.Fatal(err)
	}
	buildTree(f, src)
	m, err := store.ScanTree(ctx, src)
	if err != nil {
		f.Fatal(err)
	}
	var buf bytes.Buffer
	if err := WriteLayer(ctx, &buf, src); err != nil {
		f.Fatal(err)
	}
	f.Add(buf.Bytes())
	f.Add(buf.Bytes()[:len(buf.Bytes())/2])
	f.Fuzz(func(t *testing.T, b []byte) {
		base := t.TempDir()
		dst := filepath.Join(base, "dst")
		if err := ReadLayer(ctx, bytes.NewReader(b), dst, m); err != nil {
			if ents, _ := os.ReadDir(base); len(ents) != 0 {
				t.Fatalf("a refused layer (%v) left %d entries", err, len(ents))
			}
			return
		}
		got, err := store.ScanTree(ctx, dst)
		if err != nil {
			t.Fatal(err)
		}
		if got.Hash() != m.Hash() {
			t.Fatalf("accepted a layer whose tree differs:\n%s", strings.Join(store.DiffManifests(m, got), "\n"))
		}
	})
}
