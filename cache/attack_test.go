package cache

// Hostile layers: streams a registry could serve for a path whose manifest is
// trusted. Each is either refused, leaving nothing at dst, or accepted as
// exactly its manifest's tree; either way nothing outside dst changes (a
// canary directory beside it, and a few host files, are compared stat for
// stat, ctime and link count included, so that even a hard link or chmod
// undone by the cleanup shows).

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/pgzip"
	"golang.org/x/sys/unix"

	"toolshed.dev/shed/store"
)

// rawTar builds tar streams byte by byte, for what archive/tar's writer will
// not write (sparse files, NULs in names, typeflags, ustar prefixes).
type rawTar struct{ bytes.Buffer }

type rawHdr struct {
	name, linkname, prefix string
	typ                    byte
	mode, uid, gid, size   int64
	devmajor, devminor     int64
}

func (r *rawTar) header(h rawHdr) *rawTar {
	var b [blockSize]byte
	copy(b[0:100], h.name)
	octal := func(f []byte, v int64) { copy(f, fmt.Sprintf("%0*o\x00", len(f)-1, v)) }
	octal(b[100:108], h.mode)
	octal(b[108:116], h.uid)
	octal(b[116:124], h.gid)
	octal(b[124:136], h.size)
	octal(b[136:148], epoch)
	b[156] = h.typ
	copy(b[157:257], h.linkname)
	copy(b[257:265], "ustar\x0000")
	if h.typ == tar.TypeGNUSparse {
		copy(b[257:265], "ustar  \x00") // GNU's magic, which its sparse headers need
	}
	octal(b[329:337], h.devmajor)
	octal(b[337:345], h.devminor)
	copy(b[345:500], h.prefix)
	copy(b[148:156], "        ")
	var sum int64
	for _, c := range b {
		sum += int64(c)
	}
	copy(b[148:156], fmt.Sprintf("%06o\x00 ", sum))
	r.Write(b[:])
	return r
}

// data writes d and pads it to a block.
func (r *rawTar) data(d string) *rawTar {
	r.WriteString(d)
	r.Write(make([]byte, (blockSize-len(d)%blockSize)%blockSize))
	return r
}

// pax writes a PAX extended header holding recs ("key=value"), for the next entry.
func (r *rawTar) pax(recs ...string) *rawTar {
	var d strings.Builder
	for _, kv := range recs {
		n := len(kv) + 3 // " ", "\n" and the length's digits, which count themselves
		for n != len(fmt.Sprint(n))+len(kv)+2 {
			n = len(fmt.Sprint(n)) + len(kv) + 2
		}
		fmt.Fprintf(&d, "%d %s\n", n, kv)
	}
	return r.header(rawHdr{name: "PaxHeaders/x", typ: tar.TypeXHeader, mode: 0o644, size: int64(d.Len())}).data(d.String())
}

// gnuLong writes a GNU long name (typ 'L') or long link ('K') for the next entry.
func (r *rawTar) gnuLong(typ byte, name string) *rawTar {
	return r.header(rawHdr{name: "././@LongLink", typ: typ, mode: 0o644, size: int64(len(name))}).data(name)
}

func (r *rawTar) dir(name string) *rawTar {
	return r.header(rawHdr{name: name, typ: tar.TypeDir, mode: 0o755})
}

func (r *rawTar) file(name, d string) *rawTar {
	return r.header(rawHdr{name: name, typ: tar.TypeReg, mode: 0o644, size: int64(len(d))}).data(d)
}

func (r *rawTar) end() []byte {
	r.Write(make([]byte, 2*blockSize))
	return r.Bytes()
}

// hostState is what must not change outside dst: every file under the canary
// directory and a few of the host's own, stat by stat, with contents and
// xattrs.
func hostState(t *testing.T, base string) string {
	t.Helper()
	var b strings.Builder
	add := func(p string) {
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			fmt.Fprintf(&b, "%s: %v\n", p, err)
			return
		}
		fmt.Fprintf(&b, "%s mode=%o uid=%d gid=%d", p, st.Mode, st.Uid, st.Gid)
		if p != base { // dst's parent: making (and removing) dst changes its times and link count
			fmt.Fprintf(&b, " nlink=%d size=%d mtime=%d.%d ctime=%d.%d", st.Nlink, st.Size, st.Mtim.Sec, st.Mtim.Nsec, st.Ctim.Sec, st.Ctim.Nsec)
		}
		buf := make([]byte, 4096)
		if n, err := unix.Llistxattr(p, buf); err == nil {
			fmt.Fprintf(&b, " xattrs=%q", buf[:n])
		}
		if st.Mode&unix.S_IFMT == unix.S_IFREG {
			d, _ := os.ReadFile(p)
			fmt.Fprintf(&b, " data=%s", store.Sum(d))
		}
		b.WriteString("\n")
	}
	must(t, filepath.WalkDir(base, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == filepath.Join(base, "dst") {
			return filepath.SkipDir // its own: the test checks it apart
		}
		add(p)
		return nil
	}))
	for _, p := range []string{"/etc/passwd", "/etc/shadow", "/etc/hostname"} {
		add(p)
	}
	return b.String()
}

// attackBase makes a base directory holding a canary directory (with a file,
// and a dir) where dst will be; dst is base/dst.
func attackBase(t *testing.T) (base, canary, dst string) {
	base = t.TempDir()
	canary = filepath.Join(base, "canary")
	must(t, os.Mkdir(canary, 0o755))
	must(t, os.WriteFile(filepath.Join(canary, "file"), []byte("canary"), 0o644))
	must(t, os.Mkdir(filepath.Join(canary, "dir"), 0o755))
	return base, canary, filepath.Join(base, "dst")
}

type attack struct {
	name string
	// stream and manifest; canary is the canary directory's path
	tar func(canary string) []byte
	m   func(canary string) *store.Manifest
	// want: "" if the layer must be accepted (as exactly m's tree, with no
	// xattr on disk that m lacks), else what the refusal says
	want string
}

func runAttacks(t *testing.T, attacks []attack) {
	t.Helper()
	for _, a := range attacks {
		t.Run(a.name, func(t *testing.T) {
			base, canary, dst := attackBase(t)
			m := a.m(canary)
			stream := a.tar(canary)
			before := hostState(t, base)
			err := ReadLayer(context.Background(), bytes.NewReader(stream), dst, m)
			if a.want != "" {
				checkRefused(t, err, a.want, dst)
			} else {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				checkExactly(t, dst, m)
			}
			if after := hostState(t, base); after != before {
				t.Fatalf("outside dst changed:\nbefore:\n%s\nafter:\n%s", before, after)
			}
		})
	}
}

// checkExactly checks that dst is m's tree, and that no entry carries an
// xattr m does not list (ScanTree ignores some that are not content).
func checkExactly(t *testing.T, dst string, m *store.Manifest) {
	t.Helper()
	got, err := store.ScanTree(context.Background(), dst)
	must(t, err)
	if got.Hash() != m.Hash() {
		t.Fatalf("tree differs from its manifest:\n%s", strings.Join(store.DiffManifests(m, got), "\n"))
	}
	for _, e := range m.Entries {
		p := filepath.Join(dst, e.Path)
		buf := make([]byte, 4096)
		n, err := unix.Llistxattr(p, buf)
		must(t, err)
		for name := range strings.SplitSeq(string(buf[:n]), "\x00") {
			if name == "" {
				continue
			}
			ok := slices.ContainsFunc(e.Xattrs, func(x store.Xattr) bool {
				return x.Name == name || (x.Name == opaqueXattr && name == diskOpaque())
			})
			if !ok {
				t.Errorf("%s has xattr %s, which its manifest entry lacks", e.Path, name)
			}
		}
	}
}

func tarOf(ents ...tarEntry) func(string) []byte {
	return func(string) []byte {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, e := range ents {
			if err := tw.WriteHeader(&e.hdr); err != nil {
				panic(err)
			}
			if _, err := io.WriteString(tw, e.data); err != nil {
				panic(err)
			}
		}
		if err := tw.Close(); err != nil {
			panic(err)
		}
		return buf.Bytes()
	}
}

func manifestOf(ents ...store.Entry) func(string) *store.Manifest {
	return func(string) *store.Manifest { return manifest(ents...) }
}

func withPAX(e tarEntry, kv ...string) tarEntry {
	e.hdr.PAXRecords = map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		e.hdr.PAXRecords[kv[i]] = kv[i+1]
	}
	return e
}

func withMode(e tarEntry, mode int64) tarEntry { e.hdr.Mode = mode; return e }

const hello = "hello"

func TestAttackTraversal(t *testing.T) {
	needRoot(t)
	long := "content/" + strings.Repeat("d/", 60) + "../../../" + strings.Repeat("../", 60) + "canary/pwned"
	runAttacks(t, []attack{
		{"dotdot", tarOf(dirHdr("content/"), fileHdr("../canary/pwned", hello)), manifestOf(fileEntry("pwned", hello)), "not a path under content/"},
		{"absolute", func(c string) []byte {
			return tarOf(dirHdr("content/"), fileHdr(filepath.Join(c, "pwned"), hello))(c)
		}, manifestOf(fileEntry("pwned", hello)), "not a path under content/"},
		{"./ prefix", tarOf(dirHdr("./content/"), fileHdr("./content/f", hello)), manifestOf(fileEntry("f", hello)), "not a path under content/"},
		{"dot component", tarOf(dirHdr("content/"), fileHdr("content/./f", hello)), manifestOf(fileEntry("f", hello)), "not a path under content/"},
		{"./a/../../x", tarOf(dirHdr("content/"), dirHdr("content/a/"), fileHdr("content/./a/../../canary/pwned", hello)),
			manifestOf(dirEntry("a"), fileEntry("pwned", hello)), "not a path under content/"},
		{"a/../f resolving into the manifest", tarOf(dirHdr("content/"), dirHdr("content/a/"), fileHdr("content/a/../f", hello)),
			manifestOf(dirEntry("a"), fileEntry("f", hello)), "not a path under content/"},
		{"backslashes", tarOf(dirHdr("content/"), fileHdr(`content\..\..\canary\pwned`, hello)), manifestOf(fileEntry("f", hello)), "not a path under content/"},
		{"PAX path traversal", func(string) []byte {
			var r rawTar
			r.dir("content/").pax("path=content/../../canary/pwned").file("content/f", hello)
			return r.end()
		}, manifestOf(fileEntry("f", hello)), "not a path under content/"},
		{"PAX long path traversal", tarOf(dirHdr("content/"), fileHdr(long, hello)), manifestOf(fileEntry("f", hello)), "not a path under content/"},
		{"GNU long name traversal", func(string) []byte {
			var r rawTar
			r.dir("content/").gnuLong(tar.TypeGNULongName, long).file("content/f", hello)
			return r.end()
		}, manifestOf(fileEntry("f", hello)), "not a path under content/"},
		{"ustar prefix traversal", func(string) []byte {
			var r rawTar
			r.dir("content/").header(rawHdr{prefix: "content/../../canary", name: "pwned", typ: tar.TypeReg, mode: 0o644, size: 5}).data(hello)
			return r.end()
		}, manifestOf(fileEntry("pwned", hello)), "not a path under content/"},
		{"PAX path with a NUL", func(string) []byte {
			var r rawTar
			r.dir("content/").pax("path=content/f\x00/../../../canary/pwned").file("content/f", hello)
			return r.end()
		}, manifestOf(fileEntry("f", hello)), "read tar"},
		// GNU long names end at their first NUL: what is left is a name of
		// the manifest, written as the manifest says.
		{"GNU long name with a NUL", func(string) []byte {
			var r rawTar
			r.dir("content/").gnuLong(tar.TypeGNULongName, "content/f\x00/../../canary/pwned").file("content/f", hello)
			return r.end()
		}, manifestOf(fileEntry("f", hello)), ""},
		{"trailing slash on a file", func(string) []byte {
			var r rawTar
			return r.dir("content/").file("content/f/", hello).end()
		}, manifestOf(fileEntry("f", hello)), "not a path under content/"},
		{"empty name", func(string) []byte {
			var r rawTar
			return r.dir("content/").file("content/", hello).end()
		}, manifestOf(fileEntry("f", hello)), "not a path under content/"},
		{"root only by another name", tarOf(dirHdr("."), fileHdr("f", hello)), manifestOf(fileEntry("f", hello)), "not a path under content/"},
	})
}

func TestAttackSymlinks(t *testing.T) {
	needRoot(t)
	sym := func(name string) func(string) tarEntry {
		return func(c string) tarEntry { return linkHdr(tar.TypeSymlink, name, c) }
	}
	symE := func(p string) func(string) store.Entry {
		return func(c string) store.Entry { return linkEntry(store.EntrySymlink, p, c) }
	}
	runAttacks(t, []attack{
		{"file through a symlink", func(c string) []byte {
			return tarOf(dirHdr("content/"), sym("content/l")(c), fileHdr("content/l/pwned", hello))(c)
		}, func(c string) *store.Manifest { return manifest(symE("l")(c)) }, "not in the manifest"},
		{"symlink, then a directory of its name", func(c string) []byte {
			return tarOf(dirHdr("content/"), sym("content/d")(c), dirHdr("content/d/"), fileHdr("content/d/pwned", hello))(c)
		}, manifestOf(dirEntry("d"), fileEntry("d/pwned", hello)), "a symlink in the layer, a dir in the manifest"},
		{"symlink twice, the second inside it", func(c string) []byte {
			return tarOf(dirHdr("content/"), sym("content/d")(c), sym("content/d/")(c), fileHdr("content/d/pwned", hello))(c)
		}, func(c string) *store.Manifest { return manifest(symE("d")(c)) }, "not a path under content/"},
		{"directory replaced by a symlink", func(c string) []byte {
			return tarOf(dirHdr("content/"), dirHdr("content/d/"), sym("content/d")(c), fileHdr("content/d/pwned", hello))(c)
		}, manifestOf(dirEntry("d"), fileEntry("d/pwned", hello)), "a symlink in the layer, a dir in the manifest"},
		{"directory, then a symlink of its name that the manifest has", func(c string) []byte {
			return tarOf(dirHdr("content/"), dirHdr("content/d/"), sym("content/d")(c), fileHdr("content/d/pwned", hello))(c)
		}, func(c string) *store.Manifest { return manifest(symE("d")(c)) }, "a dir in the layer, a symlink in the manifest"},
		{"file replaced by a symlink", func(c string) []byte {
			return tarOf(dirHdr("content/"), fileHdr("content/f", hello), sym("content/f")(c))(c)
		}, manifestOf(fileEntry("f", hello)), "a symlink in the layer, a file in the manifest"},
		{"symlink, then a file of its name", func(c string) []byte {
			return tarOf(dirHdr("content/"), sym("content/f")(c), fileHdr("content/f", hello))(c)
		}, func(c string) *store.Manifest { return manifest(symE("f")(c)) }, "a file in the layer, a symlink in the manifest"},
		{"symlink twice", func(c string) []byte {
			return tarOf(dirHdr("content/"), sym("content/l")(c), sym("content/l")(c))(c)
		}, func(c string) *store.Manifest { return manifest(symE("l")(c)) }, "duplicate entry"},
		{"hard link through a symlink", func(c string) []byte {
			return tarOf(dirHdr("content/"), sym("content/l")(c), linkHdr(tar.TypeLink, "content/h", "content/l/file"))(c)
		}, func(c string) *store.Manifest {
			return manifest(linkEntry(store.EntryHardlink, "h", "l/file"), symE("l")(c))
		}, "hard link to"},
		{"opaque marker under a symlink", func(c string) []byte {
			return tarOf(dirHdr("content/"), sym("content/l")(c), whiteoutHdr("content/l/.wh..wh..opq"))(c)
		}, func(c string) *store.Manifest { return manifest(symE("l")(c)) }, "not an opaque directory"},
		// A symlink pointing outside is content: written, never followed.
		{"symlinks out, listed", func(c string) []byte {
			return tarOf(dirHdr("content/"), sym("content/abs")(c), linkHdr(tar.TypeSymlink, "content/up", "../../canary/file"))(c)
		}, func(c string) *store.Manifest {
			return manifest(symE("abs")(c), linkEntry(store.EntrySymlink, "up", "../../canary/file"))
		}, ""},
	})
}

func TestAttackHardlinks(t *testing.T) {
	needRoot(t)
	h := func(target string) tarEntry { return linkHdr(tar.TypeLink, "content/h", target) }
	hE := func(target string) store.Entry { return linkEntry(store.EntryHardlink, "h", target) }
	f, fE := fileHdr("content/f", hello), fileEntry("f", hello)
	runAttacks(t, []attack{
		{"to /etc/passwd", tarOf(dirHdr("content/"), f, h("/etc/passwd")), manifestOf(fE, hE("f")), "hard link to"},
		{"to the canary", func(c string) []byte {
			return tarOf(dirHdr("content/"), f, h(filepath.Join(c, "file")))(c)
		}, manifestOf(fE, hE("f")), "hard link to"},
		{"to ../", tarOf(dirHdr("content/"), f, h("content/../canary/file")), manifestOf(fE, hE("f")), "hard link to"},
		{"to the canary, listed", func(c string) []byte {
			return tarOf(dirHdr("content/"), h(filepath.Join(c, "file")))(c)
		}, func(c string) *store.Manifest { return manifest(hE(filepath.Join(c, "file"))) }, "hard link to"},
		{"to ../, listed", tarOf(dirHdr("content/"), h("content/../canary/file")), manifestOf(hE("../canary/file")), "not a file extracted before it"},
		{"forward", tarOf(dirHdr("content/"), h("content/f"), f), manifestOf(hE("f"), fE), "not a file extracted before it"},
		{"to itself", tarOf(dirHdr("content/"), h("content/h")), manifestOf(hE("h")), "not a file extracted before it"},
		{"to a directory", tarOf(dirHdr("content/"), dirHdr("content/d/"), h("content/d")), manifestOf(dirEntry("d"), hE("d")), "not a file extracted before it"},
		{"to the root", tarOf(dirHdr("content/"), h("content/.")), manifestOf(hE(".")), "not a file extracted before it"},
		{"to a directory, the manifest's to a file", tarOf(dirHdr("content/"), dirHdr("content/d/"), f, h("content/d")), manifestOf(dirEntry("d"), fE, hE("f")), "hard link to"},
		{"to a symlink", func(c string) []byte {
			return tarOf(dirHdr("content/"), linkHdr(tar.TypeSymlink, "content/l", filepath.Join(c, "file")), h("content/l"))(c)
		}, func(c string) *store.Manifest {
			return manifest(hE("l"), linkEntry(store.EntrySymlink, "l", filepath.Join(c, "file")))
		}, "not a file extracted before it"},
		{"to a hard link", tarOf(dirHdr("content/"), f, linkHdr(tar.TypeLink, "content/g", "content/f"), h("content/g")),
			manifestOf(fE, linkEntry(store.EntryHardlink, "g", "f"), hE("g")), "not a file extracted before it"},
		{"to a whiteout", tarOf(dirHdr("content/"), whiteoutHdr("content/.wh.w"), h("content/w")),
			manifestOf(hE("w"), store.Entry{Path: "w", Type: store.EntryWhiteout, Mtime: epoch}), "not a file extracted before it"},
		{"with data", func(string) []byte {
			var r rawTar
			r.dir("content/").file("content/f", hello).header(rawHdr{name: "content/h", linkname: "content/f", typ: tar.TypeLink, mode: 0o644, size: 512})
			r.data(string(make([]byte, 512)))
			return r.end()
		}, manifestOf(fE, hE("f")), "size 512, manifest says 0"},
		{"PAX linkpath with a NUL", func(string) []byte {
			var r rawTar
			r.dir("content/").file("content/f", hello).pax("linkpath=content/f\x00../../canary/file").header(rawHdr{name: "content/h", linkname: "content/f", typ: tar.TypeLink, mode: 0o644})
			return r.end()
		}, manifestOf(fE, hE("f")), "read tar"},
		{"GNU long link elsewhere", func(string) []byte {
			var r rawTar
			r.dir("content/").file("content/f", hello).gnuLong(tar.TypeGNULongLink, "/etc/passwd").header(rawHdr{name: "content/h", linkname: "content/f", typ: tar.TypeLink, mode: 0o644})
			return r.end()
		}, manifestOf(fE, hE("f")), "hard link to"},
		{"in a directory left, to a file in another", tarOf(dirHdr("content/"), dirHdr("content/a/"), fileHdr("content/a/f", hello), dirHdr("content/b/"), linkHdr(tar.TypeLink, "content/b/h", "content/a/f")),
			manifestOf(dirEntry("a"), fileEntry("a/f", hello), dirEntry("b"), linkEntry(store.EntryHardlink, "b/h", "a/f")), ""},
	})
}

func TestAttackEntries(t *testing.T) {
	needRoot(t)
	f, fE := fileHdr("content/f", hello), fileEntry("f", hello)
	opq := dirEntry("o")
	opq.Xattrs = []store.Xattr{{Name: opaqueXattr, Value: []byte("y")}}
	wE := store.Entry{Path: "w", Type: store.EntryWhiteout, Mtime: epoch}
	dev := func(name string, typ byte, major, minor int64) tarEntry {
		return tarEntry{hdr: tar.Header{Name: name, Typeflag: typ, Mode: 0o644, Devmajor: major, Devminor: minor, ModTime: mtime}}
	}
	runAttacks(t, []attack{
		// Duplicates and order.
		{"root twice", tarOf(dirHdr("content/"), dirHdr("content/")), manifestOf(), "duplicate entry"},
		{"directory twice", tarOf(dirHdr("content/"), dirHdr("content/d/"), dirHdr("content/d/")), manifestOf(dirEntry("d")), "duplicate entry"},
		{"file twice, other bytes", tarOf(dirHdr("content/"), f, fileHdr("content/f", "HELLO")), manifestOf(fE), "duplicate entry"},
		{"file, then a hard link of its name", tarOf(dirHdr("content/"), f, linkHdr(tar.TypeLink, "content/f", "content/f")), manifestOf(fE), "a hardlink in the layer, a file in the manifest"},
		{"whiteout twice", tarOf(dirHdr("content/"), whiteoutHdr("content/.wh.w"), whiteoutHdr("content/.wh.w")), manifestOf(wE), "duplicate entry"},
		{"opaque marker twice", tarOf(dirHdr("content/"), dirHdr("content/o/"), whiteoutHdr("content/o/.wh..wh..opq"), whiteoutHdr("content/o/.wh..wh..opq")), manifestOf(opq), "duplicate entry"},
		{"child before its directory", tarOf(dirHdr("content/"), fileHdr("content/d/f", hello), dirHdr("content/d/")), manifestOf(dirEntry("d"), fileEntry("d/f", hello)), `parent "d" is not a directory extracted before it`},
		{"opaque marker before its directory", tarOf(dirHdr("content/"), whiteoutHdr("content/o/.wh..wh..opq"), dirHdr("content/o/")), manifestOf(opq), "not an opaque directory extracted before it"},
		{"opaque marker after its directory is left", tarOf(dirHdr("content/"), dirHdr("content/o/"), dirHdr("content/p/"), whiteoutHdr("content/o/.wh..wh..opq")),
			manifestOf(opq, dirEntry("p")), "without its marker"},
		{"opaque marker after a sibling directory is left", tarOf(dirHdr("content/"), dirHdr("content/o/"), dirHdr("content/o/p/"), dirHdr("content/q/"), whiteoutHdr("content/o/.wh..wh..opq")),
			manifestOf(opq, dirEntry("o/p"), dirEntry("q")), "without its marker"},
		// Sizes.
		{"header size below the manifest's", tarOf(dirHdr("content/"), fileHdr("content/f", "hell")), manifestOf(fE), "size 4, manifest says 5"},
		{"header size the manifest's, data short", func(string) []byte {
			var r rawTar
			r.dir("content/").header(rawHdr{name: "content/f", typ: tar.TypeReg, mode: 0o644, size: 5})
			r.WriteString("hel") // and the end-of-archive marker as the rest
			return r.end()
		}, manifestOf(fE), "differs from its manifest"},
		{"PAX size over the ustar size", func(string) []byte {
			var r rawTar
			r.dir("content/").pax("size=5").header(rawHdr{name: "content/f", typ: tar.TypeReg, mode: 0o644, size: 1 << 20}).data(hello)
			return r.end()
		}, manifestOf(fE), ""}, // the PAX size is the size: the stream is exactly m's
		{"PAX size beyond the manifest's", func(string) []byte {
			var r rawTar
			r.dir("content/").pax("size=1099511627776").header(rawHdr{name: "content/f", typ: tar.TypeReg, mode: 0o644, size: 5}).data(hello)
			return r.end()
		}, manifestOf(fE), "manifest says 5"},
		{"negative size", func(string) []byte {
			var r rawTar
			r.dir("content/").pax("size=-1").header(rawHdr{name: "content/f", typ: tar.TypeReg, mode: 0o644, size: 5}).data(hello)
			return r.end()
		}, manifestOf(fE), "read tar"},
		// Types the manifest does not have.
		{"fifo for a file", tarOf(dirHdr("content/"), tarEntry{hdr: tar.Header{Name: "content/f", Typeflag: tar.TypeFifo, Mode: 0o644, ModTime: mtime}}), manifestOf(fE), "a fifo in the layer, a file in the manifest"},
		{"char device for a file", tarOf(dirHdr("content/"), dev("content/f", tar.TypeChar, 1, 3)), manifestOf(fE), "a chardev in the layer, a file in the manifest"},
		{"block device for a file", tarOf(dirHdr("content/"), dev("content/f", tar.TypeBlock, 8, 0)), manifestOf(fE), "a blockdev in the layer, a file in the manifest"},
		{"char device 0:0 for a whiteout", tarOf(dirHdr("content/"), dev("content/w", tar.TypeChar, 0, 0)), manifestOf(wE), "a chardev in the layer, a whiteout in the manifest"},
		{"other device numbers", tarOf(dirHdr("content/"), dev("content/null", tar.TypeChar, 8, 0)),
			manifestOf(store.Entry{Path: "null", Type: store.EntryChardev, Mode: 0o644, Mtime: epoch, Major: 1, Minor: 3}), "device 8:0, manifest says 1:3"},
		{"old GNU sparse", func(string) []byte {
			var r rawTar
			r.dir("content/").header(rawHdr{name: "content/f", typ: tar.TypeGNUSparse, mode: 0o644, size: 5}).data(hello)
			return r.end()
		}, manifestOf(fE), "unsupported tar type"},
		{"contiguous file", func(string) []byte {
			var r rawTar
			r.dir("content/").header(rawHdr{name: "content/f", typ: tar.TypeCont, mode: 0o644, size: 5}).data(hello)
			return r.end()
		}, manifestOf(fE), "unsupported tar type"},
		{"global PAX header named as an entry", func(string) []byte {
			var r rawTar
			r.dir("content/")
			r.header(rawHdr{name: "content/f", typ: tar.TypeXGlobalHeader, mode: 0o644, size: 12}).data("12 uid=1000\n")
			return r.file("content/f", hello).end()
		}, manifestOf(fE), "unsupported tar type"},
		{"V7 regular file", func(string) []byte {
			var r rawTar
			r.dir("content/").header(rawHdr{name: "content/f", typ: 0, mode: 0o644, size: 5}).data(hello)
			return r.end()
		}, manifestOf(fE), ""},
		// Owners and modes.
		{"setuid", tarOf(dirHdr("content/"), withMode(f, 0o4755)), manifestOf(fE), "mode 04755, manifest says 0644"},
		{"setgid", tarOf(dirHdr("content/"), withMode(f, 0o2644)), manifestOf(fE), "mode 02644, manifest says 0644"},
		{"setgid directory", tarOf(withMode(dirHdr("content/"), 0o2755)), manifestOf(), "mode 02755, manifest says 0755"},
		{"type bits in the mode", tarOf(dirHdr("content/"), withMode(f, 0o100644)), manifestOf(fE), "mode 0100644, manifest says 0644"},
		{"owner", func(string) []byte {
			e := f
			e.hdr.Uid, e.hdr.Gid = 1000, 1000
			return tarOf(dirHdr("content/"), e)("")
		}, manifestOf(fE), "owner 1000:1000, manifest says 0:0"},
		{"PAX uid", func(string) []byte {
			var r rawTar
			r.dir("content/").pax("uid=4294967296").file("content/f", hello)
			return r.end()
		}, manifestOf(fE), "owner 4294967296:0, manifest says 0:0"},
		{"user and group names", func(string) []byte {
			e := f
			e.hdr.Uname, e.hdr.Gname = "nobody", "nogroup"
			return tarOf(dirHdr("content/"), e)("")
		}, manifestOf(fE), ""}, // names are not content: m's ids are written
		// Whiteouts and markers in the wrong place or shape.
		{"opaque marker for a plain directory", tarOf(dirHdr("content/"), dirHdr("content/d/"), whiteoutHdr("content/d/.wh..wh..opq")), manifestOf(dirEntry("d")), "not an opaque directory"},
		{"opaque marker as a directory", tarOf(dirHdr("content/"), dirHdr("content/o/"), dirHdr("content/o/.wh..wh..opq/")), manifestOf(opq), "a whiteout must be an empty regular file"},
		{"opaque marker with data", tarOf(dirHdr("content/"), dirHdr("content/o/"), fileHdr("content/o/.wh..wh..opq", hello)), manifestOf(opq), "a whiteout must be an empty regular file"},
		{"opaque marker of a file", tarOf(dirHdr("content/"), f, whiteoutHdr("content/f/.wh..wh..opq")), manifestOf(fE), "not an opaque directory"},
		{"whiteout as a symlink", func(c string) []byte {
			return tarOf(dirHdr("content/"), linkHdr(tar.TypeSymlink, "content/.wh.w", c))(c)
		}, manifestOf(wE), "a whiteout must be an empty regular file"},
		{"whiteout with data", tarOf(dirHdr("content/"), fileHdr("content/.wh.w", hello)), manifestOf(wE), "a whiteout must be an empty regular file"},
		{"whiteout of a directory", tarOf(dirHdr("content/"), whiteoutHdr("content/.wh.d")), manifestOf(dirEntry("d")), "a whiteout in the layer, a dir in the manifest"},
		{"whiteout in another directory", tarOf(dirHdr("content/"), dirHdr("content/d/"), whiteoutHdr("content/d/.wh.w")), manifestOf(dirEntry("d"), wE), "not in the manifest"},
		{"whiteout as a component", tarOf(dirHdr("content/"), fileHdr("content/.wh.w/f", hello)), manifestOf(wE), "not in the manifest"},
		{"whiteout of nothing", tarOf(dirHdr("content/"), whiteoutHdr("content/.wh.")), manifestOf(), "not a path under content/"},
		{"whiteout of .", tarOf(dirHdr("content/"), whiteoutHdr("content/.wh..")), manifestOf(), "not a path under content/"},
		{"whiteout of ..", tarOf(dirHdr("content/"), whiteoutHdr("content/.wh...")), manifestOf(), "not a path under content/"},
		{"whiteout named as the entry", tarOf(dirHdr("content/"), whiteoutHdr("content/w")), manifestOf(wE), "a file in the layer, a whiteout in the manifest"},
		{"whiteout, for a path also in the manifest as a file", tarOf(dirHdr("content/"), whiteoutHdr("content/.wh.f"), f), manifestOf(fE), "a whiteout in the layer, a file in the manifest"},
	})
}

func TestAttackXattrs(t *testing.T) {
	needRoot(t)
	// user::rwx user:1234:rwx group::r-x mask::rwx other::r-x
	acl := string([]byte{2, 0, 0, 0, 1, 0, 7, 0, 0xff, 0xff, 0xff, 0xff, 2, 0, 7, 0, 0xd2, 4, 0, 0, 4, 0, 5, 0, 0xff, 0xff, 0xff, 0xff, 0x10, 0, 7, 0, 0xff, 0xff, 0xff, 0xff, 0x20, 0, 5, 0, 0xff, 0xff, 0xff, 0xff})
	extra := []string{
		"SCHILY.xattr.security.capability", string(netRawCap),
		"SCHILY.xattr.trusted.overlay.opaque", "y",
		"SCHILY.xattr.user.overlay.opaque", "y",
		"SCHILY.xattr.trusted.overlay.redirect", "/etc",
		"SCHILY.xattr.trusted.overlay.metacopy", "",
		"SCHILY.xattr.user.overlay.redirect", "/etc",
		"SCHILY.xattr.system.posix_acl_access", acl,
		"SCHILY.xattr.security.selinux", "system_u:object_r:shadow_t:s0",
		"SCHILY.xattr.trusted.pwned", "y",
		"SCHILY.xattr.user.note", "x",
		"LIBARCHIVE.xattr.security.capability", "AQAAAgAgAAAAAAAAAAAAAAAAAAA=",
	}
	dirExtra := append(slices.Clone(extra), "SCHILY.xattr.system.posix_acl_default", acl)
	opq := dirEntry("o")
	opq.Xattrs = []store.Xattr{{Name: opaqueXattr, Value: []byte("y")}}
	runAttacks(t, []attack{
		// What the stream adds is never written: each entry gets m's xattrs only.
		{"xattrs not in the manifest", tarOf(withPAX(dirHdr("content/"), dirExtra...), withPAX(dirHdr("content/d/"), dirExtra...),
			withPAX(fileHdr("content/d/f", hello), extra...), withPAX(fileHdr("content/c", hello), extra...)),
			manifestOf(capEntry("c", hello), dirEntry("d"), fileEntry("d/f", hello)), ""},
		{"xattrs on a symlink, a fifo, a whiteout", func(c string) []byte {
			return tarOf(dirHdr("content/"), withPAX(whiteoutHdr("content/.wh.w"), extra...),
				withPAX(tarEntry{hdr: tar.Header{Name: "content/p", Typeflag: tar.TypeFifo, Mode: 0o644, ModTime: mtime}}, extra...),
				withPAX(linkHdr(tar.TypeSymlink, "content/s", c), extra...))(c)
		}, func(c string) *store.Manifest {
			return manifest(store.Entry{Path: "p", Type: store.EntryFifo, Mode: 0o644, Mtime: epoch}, linkEntry(store.EntrySymlink, "s", c),
				store.Entry{Path: "w", Type: store.EntryWhiteout, Mtime: epoch})
		}, ""},
		{"opaque as an xattr, not a marker", tarOf(dirHdr("content/"), withPAX(dirHdr("content/o/"), "SCHILY.xattr.trusted.overlay.opaque", "y")), manifestOf(opq), "without its marker"},
		{"the manifest's capability, other value", tarOf(dirHdr("content/"), withPAX(fileHdr("content/c", hello), "SCHILY.xattr.security.capability", string(netRawCap[:len(netRawCap)-1])+"\x01")),
			manifestOf(capEntry("c", hello)), "xattr security.capability is not the manifest's"},
		{"the manifest's capability, libarchive's key", tarOf(dirHdr("content/"), withPAX(fileHdr("content/c", hello), "LIBARCHIVE.xattr.security.capability", "AQAAAgAgAAAAAAAAAAAAAAAAAAA=")),
			manifestOf(capEntry("c", hello)), "xattr security.capability is not the manifest's"},
	})
}

// sparseTar is a PAX sparse file (GNU format 1.0, or 0.1) "content/f" of
// realsize 10: five zeros (a hole), then "hello"; then a file g, so that the
// end-of-archive check does not catch it by chance of its padding.
func sparseTar(v1 bool) []byte {
	var r rawTar
	r.dir("content/")
	if v1 {
		r.pax("GNU.sparse.major=1", "GNU.sparse.minor=0", "GNU.sparse.name=content/f", "GNU.sparse.realsize=10")
		r.header(rawHdr{name: "content/GNUSparseFile.0/f", typ: tar.TypeReg, mode: 0o644, size: blockSize + 5})
		r.data("1\n5\n5\n")
	} else {
		r.pax("GNU.sparse.major=0", "GNU.sparse.minor=1", "GNU.sparse.name=content/f", "GNU.sparse.size=10", "GNU.sparse.numblocks=1", "GNU.sparse.map=5,5")
		r.header(rawHdr{name: "content/GNUSparseFile.0/f", typ: tar.TypeReg, mode: 0o644, size: 5})
	}
	r.data(hello)
	return r.file("content/g", hello).end()
}

func TestAttackSparse(t *testing.T) {
	needRoot(t)
	m := manifestOf(fileEntry("f", "\x00\x00\x00\x00\x00hello"), fileEntry("g", hello))
	// Go's reader hands a sparse file over as a regular one of its real
	// size, holes read as zeros, its physical size and padding unseen.
	// WriteLayer writes none: the header's size is not its data's.
	runAttacks(t, []attack{
		{"PAX sparse 1.0", func(string) []byte { return sparseTar(true) }, m, "sparse"},
		{"PAX sparse 0.1", func(string) []byte { return sparseTar(false) }, m, "sparse"},
		{"sparse whiteout with hidden data", func(string) []byte {
			var r rawTar
			r.dir("content/").pax("GNU.sparse.major=1", "GNU.sparse.minor=0", "GNU.sparse.name=content/.wh.w", "GNU.sparse.realsize=0")
			r.header(rawHdr{name: "content/GNUSparseFile.0/.wh.w", typ: tar.TypeReg, mode: 0o644, size: 2 * blockSize}).data("0\n").data(strings.Repeat("x", blockSize))
			return r.file("content/z", hello).end()
		}, manifestOf(store.Entry{Path: "w", Type: store.EntryWhiteout, Mtime: epoch}, fileEntry("z", hello)), "sparse"},
	})
}

func TestAttackTruncatedAndTrailing(t *testing.T) {
	needRoot(t)
	full := tarOf(dirHdr("content/"), fileHdr("content/f", hello), fileHdr("content/g", hello))("")
	m := manifestOf(fileEntry("f", hello), fileEntry("g", hello))
	single := &store.Manifest{Entries: []store.Entry{fileEntry(".", hello)}}
	singleTar := tarOf(fileHdr("content", hello))("")
	cut := func(b []byte, n int) func(string) []byte { return func(string) []byte { return b[:n] } }
	plus := func(b []byte, tail []byte) func(string) []byte {
		return func(string) []byte { return append(slices.Clone(b), tail...) }
	}
	second := tarOf(dirHdr("content/"), fileHdr("content/pwned", hello))("")
	var paxCut rawTar
	paxCut.dir("content/").pax("path=content/f", "comment="+strings.Repeat("x", 2000))
	runAttacks(t, []attack{
		{"empty", cut(full, 0), m, "without the end-of-archive marker"},
		{"one block", cut(full, blockSize), m, "without the end-of-archive marker"},
		{"inside a header", cut(full, blockSize+100), m, "read tar"},
		{"inside a PAX header", func(string) []byte { return paxCut.Bytes()[:paxCut.Len()-700] }, m, "read tar"},
		{"one end block", cut(full, len(full)-blockSize), m, "without the end-of-archive marker"},
		{"no end blocks", cut(full, len(full)-2*blockSize), m, "without the end-of-archive marker"},
		{"single file, one end block", func(string) []byte { return singleTar[:len(singleTar)-blockSize] }, func(string) *store.Manifest { return single }, "without the end-of-archive marker"},
		// After the end-of-archive marker: nothing (WriteLayer writes
		// nothing there; the caller reads on to the blob's end).
		{"bytes after the end", plus(full, []byte("PWNED")), m, "after the end-of-archive marker"},
		{"a block after the end", plus(full, bytes.Repeat([]byte{'x'}, blockSize)), m, "after the end-of-archive marker"},
		{"zeros after the end", plus(full, make([]byte, 10240)), m, "after the end-of-archive marker"},
		{"a second archive after the end", plus(full, second), m, "after the end-of-archive marker"},
		{"single file, bytes after the end", plus(singleTar, []byte("PWNED")), func(string) *store.Manifest { return single }, "after the end-of-archive marker"},
		{"a zero block, then entries", func(string) []byte {
			b := slices.Clone(full[:len(full)-2*blockSize])
			b = append(b, make([]byte, blockSize)...)
			return append(b, second...)
		}, m, "read tar"},
	})
}

// zeroReader is an endless stream of zeros.
type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// A valid layer followed by 1 TiB of zeros (a gzip member appended to the
// blob inflates to that from about 1 GiB; here, not compressed, so that the
// test costs nothing): ReadLayer refuses it within its bound, rather than
// leave the rest for extractTree to inflate to its end.
func TestAttackTrailingBomb(t *testing.T) {
	needRoot(t)
	m := manifest(fileEntry("f", hello))
	layer := makeTar(t, dirHdr("content/"), fileHdr("content/f", hello))
	cr := &countingReader{r: io.MultiReader(bytes.NewReader(layer), io.LimitReader(zeroReader{}, 1<<40))}
	dst := filepath.Join(t.TempDir(), "dst")
	err := ReadLayer(context.Background(), cr, dst, m)
	checkRefused(t, err, "after the end-of-archive marker", dst)
	if cr.n > maxBytes(m)+64<<10 {
		t.Fatalf("read %d bytes, bound %d", cr.n, maxBytes(m))
	}

	// The same through gzip, as extractTree reads it: the bomb is a second
	// member; ReadLayer reads the stream to its end, so that extractTree's
	// drain finds nothing.
	var blob bytes.Buffer
	zw := gzip.NewWriter(&blob)
	_, _ = zw.Write(layer)
	must(t, zw.Close())
	zw = gzip.NewWriter(&blob)
	zeros := make([]byte, 1<<20)
	for range 64 {
		_, _ = zw.Write(zeros)
	}
	must(t, zw.Close())
	zr, err := pgzip.NewReader(bytes.NewReader(blob.Bytes()))
	must(t, err)
	defer zr.Close()
	cz := &countingReader{r: zr}
	dst = filepath.Join(t.TempDir(), "dst")
	err = ReadLayer(context.Background(), cz, dst, m)
	checkRefused(t, err, "after the end-of-archive marker", dst)
	if cz.n > maxBytes(m)+64<<10 {
		t.Fatalf("inflated %d bytes, bound %d", cz.n, maxBytes(m))
	}

	// And a valid blob is read to its gzip trailer by ReadLayer itself,
	// then extractTree's drain (a Read after the end) finds nothing.
	blob.Reset()
	zw = gzip.NewWriter(&blob)
	_, _ = zw.Write(layer)
	must(t, zw.Close())
	br := bytes.NewReader(blob.Bytes())
	zr, err = pgzip.NewReader(br)
	must(t, err)
	defer zr.Close()
	must(t, ReadLayer(context.Background(), zr, filepath.Join(t.TempDir(), "dst"), m))
	if br.Len() != 0 {
		t.Fatalf("%d bytes of the blob left unread", br.Len())
	}
	if n, err := io.Copy(io.Discard, struct{ io.Reader }{zr}); n != 0 || err != nil {
		t.Fatalf("drain after ReadLayer: %d bytes, %v", n, err)
	}
}

// Streams built for memory: a huge number of entries, huge and many PAX
// headers. Each is refused having read little and allocated little.
func TestAttackMemory(t *testing.T) {
	needRoot(t)
	m := manifest(fileEntry("f", hello))
	endless := func(gen func(w io.Writer) error) io.Reader {
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(gen(pw)) }()
		return pr
	}
	cases := []struct {
		name string
		gen  func(w io.Writer) error
		want string
	}{
		{"a million entries not in the manifest", func(w io.Writer) error {
			tw := tar.NewWriter(w)
			root := dirHdr("content/").hdr
			if err := tw.WriteHeader(&root); err != nil {
				return err
			}
			for i := range 1000000 {
				if err := tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("content/f%d", i), Typeflag: tar.TypeReg, Mode: 0o644, ModTime: mtime}); err != nil {
					return err
				}
			}
			return tw.Close()
		}, "not in the manifest"},
		{"a million duplicates", func(w io.Writer) error {
			tw := tar.NewWriter(w)
			root := dirHdr("content/").hdr
			if err := tw.WriteHeader(&root); err != nil {
				return err
			}
			for range 1000000 {
				f := fileHdr("content/f", hello)
				if err := tw.WriteHeader(&f.hdr); err != nil {
					return err
				}
				if _, err := io.WriteString(tw, hello); err != nil {
					return err
				}
			}
			return tw.Close()
		}, "duplicate entry"},
		{"a PAX header of 1 TiB", func(w io.Writer) error {
			var r rawTar
			r.dir("content/").header(rawHdr{name: "PaxHeaders/f", typ: tar.TypeXHeader, mode: 0o644, size: 1 << 40})
			r.WriteString("1099511627776 comment=")
			if _, err := w.Write(r.Bytes()); err != nil {
				return err
			}
			_, err := io.Copy(w, io.LimitReader(zeroReader{}, 1<<40))
			return err
		}, "larger than the"},
		{"a GNU long name of 1 TiB", func(w io.Writer) error {
			var r rawTar
			r.dir("content/").header(rawHdr{name: "././@LongLink", typ: tar.TypeGNULongName, mode: 0o644, size: 1 << 40})
			if _, err := w.Write(r.Bytes()); err != nil {
				return err
			}
			_, err := io.Copy(w, io.LimitReader(zeroReader{}, 1<<40))
			return err
		}, "larger than the"},
		{"endless PAX headers", func(w io.Writer) error {
			var r rawTar
			r.dir("content/")
			if _, err := w.Write(r.Bytes()); err != nil {
				return err
			}
			for {
				r.Reset()
				r.pax("comment=" + strings.Repeat("x", 3000))
				if _, err := w.Write(r.Bytes()); err != nil {
					return err
				}
			}
		}, "larger than the"},
		{"a sparse map of 1 TiB", func(w io.Writer) error {
			var r rawTar
			r.dir("content/").pax("GNU.sparse.major=1", "GNU.sparse.minor=0", "GNU.sparse.name=content/f", "GNU.sparse.realsize=5")
			r.header(rawHdr{name: "content/GNUSparseFile.0/f", typ: tar.TypeReg, mode: 0o644, size: 1 << 40})
			r.WriteString("99999999999\n")
			if _, err := w.Write(r.Bytes()); err != nil {
				return err
			}
			_, err := io.Copy(w, io.LimitReader(zeroReader{}, 1<<40))
			return err
		}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dst := filepath.Join(t.TempDir(), "dst")
			r := endless(tc.gen)
			cr := &countingReader{r: r}
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			start := time.Now()
			err := ReadLayer(context.Background(), cr, dst, m)
			elapsed := time.Since(start)
			runtime.ReadMemStats(&after)
			r.(*io.PipeReader).CloseWithError(errors.New("reader gone"))
			checkRefused(t, err, tc.want, dst)
			if cr.n > maxBytes(m)+64<<10 || elapsed > 10*time.Second {
				t.Fatalf("read %d bytes (bound %d) in %v", cr.n, maxBytes(m), elapsed)
			}
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 16<<20 {
				t.Fatalf("allocated %d bytes", alloc)
			}
		})
	}
}

// The destination and its parent, as a hostile neighbour (or a stale
// staging directory) could leave them: nothing is followed.
func TestAttackDestination(t *testing.T) {
	needRoot(t)
	m := manifest(fileEntry("f", hello))
	layer := makeTar(t, dirHdr("content/"), fileHdr("content/f", hello))
	single := &store.Manifest{Entries: []store.Entry{fileEntry(".", hello)}}
	singleLayer := makeTar(t, fileHdr("content", hello))
	for _, tc := range []struct {
		name   string
		target string // dst is a symlink to canary/target
		layer  []byte
		m      *store.Manifest
	}{
		{"directory layer, dst a symlink to a directory", "dir", layer, m},
		{"directory layer, dst a dangling symlink", "new", layer, m},
		{"file layer, dst a symlink to a file", "file", singleLayer, single},
		{"file layer, dst a dangling symlink", "new", singleLayer, single},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base, canary, dst := attackBase(t)
			must(t, os.Symlink(filepath.Join(canary, tc.target), dst))
			before := hostState(t, base)
			err := ReadLayer(context.Background(), bytes.NewReader(tc.layer), dst, tc.m)
			if !errors.Is(err, ErrBadLayer) || !errors.Is(err, os.ErrExist) {
				t.Fatalf("err = %v, want ErrBadLayer and ErrExist", err)
			}
			if got, err := os.Readlink(dst); err != nil || got != filepath.Join(canary, tc.target) {
				t.Fatalf("dst is no longer the symlink it was: %q, %v", got, err)
			}
			if after := hostState(t, base); after != before {
				t.Fatalf("outside dst changed:\nbefore:\n%s\nafter:\n%s", before, after)
			}
		})
	}

	// Canceled half way: dst is removed.
	t.Run("canceled", func(t *testing.T) {
		base, _, dst := attackBase(t)
		before := hostState(t, base)
		ctx, cancel := context.WithCancel(context.Background())
		r := &cancelAfter{r: bytes.NewReader(makeTar(t, dirHdr("content/"), dirHdr("content/d/"), fileHdr("content/d/f", hello), fileHdr("content/g", hello))), n: 3 * blockSize, cancel: cancel}
		err := ReadLayer(ctx, r, dst, manifest(dirEntry("d"), fileEntry("d/f", hello), fileEntry("g", hello)))
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
		checkRefused(t, err, "", dst)
		if after := hostState(t, base); after != before {
			t.Fatalf("outside dst changed:\nbefore:\n%s\nafter:\n%s", before, after)
		}
	})
}

// cancelAfter cancels once n bytes are read.
type cancelAfter struct {
	r      io.Reader
	n      int
	cancel func()
}

func (c *cancelAfter) Read(p []byte) (int, error) {
	k, err := c.r.Read(p)
	c.n -= k
	if c.n <= 0 {
		c.cancel()
	}
	return k, err
}

// While ReadLayer runs, the tree is private: the root is 0700 and no one but
// its owner can look up a name in it, whatever the modes of what is below.
func TestAttackPrivateWhileExtracting(t *testing.T) {
	needRoot(t)
	base, _, dst := attackBase(t)
	must(t, os.Chmod(base, 0o755))
	m := manifest(dirEntry("d"), fileEntry("d/f", hello))
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- ReadLayer(context.Background(), pr, dst, m) }()
	var r rawTar
	r.dir("content/").dir("content/d/").file("content/d/f", hello)
	_, err := pw.Write(r.Bytes())
	must(t, err)
	var st unix.Stat_t
	for deadline := time.Now().Add(5 * time.Second); ; {
		if unix.Lstat(filepath.Join(dst, "d/f"), &st) == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("d/f not extracted")
		}
		time.Sleep(time.Millisecond)
	}
	must(t, unix.Lstat(dst, &st))
	if st.Mode&0o7777 != 0o700 || st.Uid != uint32(os.Geteuid()) {
		t.Errorf("root while extracting: mode %#o, uid %d", st.Mode&0o7777, st.Uid)
	}
	pw.Write(make([]byte, 2*blockSize))
	pw.Close()
	must(t, <-done)
	checkExactly(t, dst, m)
}

// A stream of exactly the bound ends there; one of a byte more fails.
func TestLimitReaderAtTheBound(t *testing.T) {
	for _, tc := range []struct {
		n    int
		fail bool
	}{{100, false}, {101, true}} {
		lr := &limitReader{r: bytes.NewReader(make([]byte, tc.n)), n: 100, max: 100}
		b, err := io.ReadAll(lr)
		if len(b) != 100 || (err != nil) != tc.fail {
			t.Errorf("%d bytes, bound 100: read %d, %v", tc.n, len(b), err)
		}
	}
}
