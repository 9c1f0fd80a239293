package cache

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/opencontainers/umoci/oci/layer"
	"golang.org/x/sys/unix"

	"toolshed.dev/shed/store"
)

// LayerRoot is the name under which a path's tree appears in its layer tar:
// a directory path is the entry "content/" followed by "content/<path>" for
// each of its entries, a single-file path is one regular-file entry
// "content". A named root keeps the root an ordinary entry (with "" or "/"
// GenerateInsertLayer names it "." or "/") and gives both kinds of path the
// same shape.
const LayerRoot = "content"

// ErrBadLayer is wrapped by every error of ReadLayer.
var ErrBadLayer = errors.New("bad layer")

// onDisk is umoci's on-disk format of a path: overlay whiteouts (char 0:0)
// and opaque directories travel as OCI ".wh." entries and come back as
// overlayfs's own marks, the opaque mark under the name this process's store
// keeps it (store.OpaqueXattr): user.overlay.opaque in a rootless store,
// whose overlays are mounted with userxattr.
func onDisk() layer.OverlayfsRootfs {
	return layer.OverlayfsRootfs{UserXattr: diskOpaque() != opaqueXattr}
}

// diskOpaque is store.OpaqueXattr, a variable so that tests, which run as
// root, can take the rootless branch without a user namespace.
var diskOpaque = store.OpaqueXattr

const (
	whPrefix     = ".wh."                   // OCI whiteout name prefix
	whOpaque     = ".wh..wh..opq"           // OCI opaque-directory marker
	opaqueXattr  = "trusted.overlay.opaque" // as manifests record it; carried by whOpaque, never as an xattr
	blockSize    = 512
	entryAllowed = 4 << 10 // per entry: header, PAX header, paddings, an opaque marker
)

// WriteLayer writes the store path at src (a directory or one regular file)
// to w as an uncompressed tar stream. The stream is deterministic: umoci
// walks in lexical order, clears user and group names and leaves out atimes
// and ctimes, so the same tree gives the same bytes. It must run where the
// store's marks are readable: as root for trusted.overlay.opaque, in shed's
// user namespace for a rootless store's user.overlay.opaque. Either way an
// opaque directory is sent as a ".wh..wh..opq" marker, so the layer of a
// path is the same from either store.
//
// What umoci cannot carry makes WriteLayer fail (a name starting with
// ".wh."), or ReadLayer refuse the layer: empty xattr values (dropped), a
// whiteout inside an opaque directory (not recreated), hard-linked
// non-regular files (sent as hard links; manifests list them apart).
// WriteLayer also fails on an overlayfs xattr that would reach the tar as an
// xattr: umoci sends those of the other namespace as they are, and unescapes
// one of its own (user.overlay.overlay.opaque, what a build's setfattr of the
// mark becomes) to the mark's name. A store's tree holds neither: capture
// strips them, and copies and pulls write only what manifests record.
//
// On an early return (ctx, or w failing) umoci's generator goroutine stops
// at its next write; it only reads src.
func WriteLayer(ctx context.Context, w io.Writer, src string) error {
	// umoci's CleanPath turns a relative "../x" into "x".
	src, err := filepath.Abs(src)
	if err != nil {
		return fmt.Errorf("write layer %s: %w", src, err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(src, &st); err != nil {
		return fmt.Errorf("write layer %s: %w", src, err)
	}
	if t := st.Mode & unix.S_IFMT; t != unix.S_IFDIR && t != unix.S_IFREG {
		return fmt.Errorf("write layer %s: not a directory or regular file", src)
	}
	rc := layer.GenerateInsertLayer(src, LayerRoot, false, &layer.RepackOptions{OnDiskFormat: onDisk()})
	defer rc.Close() // on an early return, makes the generator's writes fail so it stops
	// Every byte goes to w as umoci wrote it, and is read as tar on its way.
	stream := io.TeeReader(rc, ctxWriter{ctx, w})
	tr := tar.NewReader(stream)
	for {
		hdr, err := tr.Next() // reads the previous entry's data through stream
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("write layer %s: %w", src, err)
		}
		for key := range hdr.PAXRecords {
			name, ok := strings.CutPrefix(key, "SCHILY.xattr.")
			if ok && (strings.HasPrefix(name, "trusted.overlay.") || strings.HasPrefix(name, "user.overlay.")) {
				return fmt.Errorf("write layer %s: %s has the overlayfs xattr %s, which a layer does not carry", src, hdr.Name, name)
			}
		}
	}
	// The end-of-archive blocks, and whatever umoci writes after them.
	if _, err := io.Copy(io.Discard, stream); err != nil {
		return fmt.Errorf("write layer %s: %w", src, err)
	}
	return nil
}

type ctxWriter struct {
	ctx context.Context
	w   io.Writer
}

func (c ctxWriter) Write(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.w.Write(p)
}

// ReadLayer extracts the tar stream r into dst, which must not exist (it is
// created; its parent exists), and returns only when the tree at dst is
// exactly the one m describes.
//
// m is trusted (the caller checked it against a signed content hash), the
// stream is not: every entry is checked against m before umoci's extractor
// writes it (path, type, mode, owners, mtime, size, link target; the parent
// must be a directory of m extracted earlier), at most maxBytes(m) bytes are
// read from r, every entry of m must be seen, and finally the tree at dst
// must scan to m's hash. Directory and whiteout metadata is then set from m:
// adding children changes directories' mtimes, and OCI whiteouts carry none.
//
// On any error dst is removed (unless it existed before). Errors wrap
// ErrBadLayer.
func ReadLayer(ctx context.Context, r io.Reader, dst string, m *store.Manifest) (err error) {
	defer func() {
		if err != nil {
			err = fmt.Errorf("%w: read layer into %s: %w", ErrBadLayer, dst, err)
		}
	}()
	if m == nil || len(m.Entries) == 0 || m.Entries[0].Path != "." {
		return errors.New("manifest has no root entry")
	}
	if dst, err = filepath.Abs(dst); err != nil {
		return err
	}
	single := m.Entries[0].Type == store.EntryFile

	// root is where umoci extracts. A directory path goes straight into dst;
	// a single file is extracted into a private directory beside dst (umoci
	// needs a directory root) and renamed to dst. On failure, only what this
	// call created at dst is removed, never something that was there before.
	root, created := dst, false
	defer func() {
		if err != nil && created {
			if rmErr := os.RemoveAll(dst); rmErr != nil {
				err = errors.Join(err, fmt.Errorf("remove partial layer: %w", rmErr))
			}
		}
	}()
	if single {
		if _, err := os.Lstat(dst); err == nil {
			return fs.ErrExist
		} else if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if root, err = os.MkdirTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".layer-"); err != nil {
			return err
		}
		defer os.RemoveAll(root)
	} else {
		if err := os.Mkdir(dst, 0o700); err != nil {
			return err
		}
		created = true
	}

	x := &extraction{
		m:      m,
		root:   root,
		single: single,
		index:  make(map[string]int, len(m.Entries)),
		seen:   make([]bool, len(m.Entries)),
		opaque: make([]bool, len(m.Entries)),
		te:     layer.NewTarExtractor(&layer.UnpackOptions{OnDiskFormat: onDisk()}),
	}
	for i := range m.Entries {
		x.index[m.Entries[i].Path] = i
	}
	limit := maxBytes(m)
	lr := &limitReader{r: r, n: limit, max: limit}
	tr := tar.NewReader(lr)
	// end is where the last entry's data and padding end. Go's reader takes
	// a stream cut there, or inside the two zero blocks that must follow,
	// for a complete archive; we do not.
	var end int64
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("read tar: %w", err)
		}
		if err := x.entry(hdr, tr); err != nil {
			return err
		}
		// umoci has read the entry's data (its size is m's); the padding is next.
		end = lr.read() + (blockSize-hdr.Size%blockSize)%blockSize
	}
	if lr.read() != end+2*blockSize {
		return errors.New("stream ends without the end-of-archive marker")
	}
	for i, seen := range x.seen {
		if !seen {
			return fmt.Errorf("entry %q of the manifest is not in the layer", m.Entries[i].Path)
		}
	}

	if single {
		if err := unix.Renameat2(unix.AT_FDCWD, filepath.Join(root, LayerRoot), unix.AT_FDCWD, dst, unix.RENAME_NOREPLACE); err != nil {
			return fmt.Errorf("rename into place: %w", err)
		}
		created = true
	} else if err := restoreMetadata(dst, m); err != nil {
		return err
	}

	got, err := store.ScanTree(ctx, dst)
	if err != nil {
		return err
	}
	if got.Hash() != m.Hash() {
		diffs := store.DiffManifests(m, got)
		if len(diffs) > 5 {
			diffs = append(diffs[:5], fmt.Sprintf("(%d more)", len(diffs)-5))
		}
		return fmt.Errorf("extracted tree differs from its manifest (the first): %s", strings.Join(diffs, "; "))
	}
	return nil
}

// maxBytes bounds the tar stream of m: its files' sizes, two end blocks, and
// per entry a fixed allowance plus its names and xattrs twice over (long
// names and xattrs go in PAX records; an opaque directory's marker repeats
// its name).
func maxBytes(m *store.Manifest) int64 {
	n := int64(2 * blockSize)
	for i := range m.Entries {
		e := &m.Entries[i]
		n += entryAllowed + 2*int64(len(LayerRoot)+len(e.Path)+len(e.Target))
		for _, x := range e.Xattrs {
			n += 2 * int64(64+len(x.Name)+len(x.Value))
		}
		if e.Type == store.EntryFile {
			n += e.Size
		}
	}
	return n
}

// limitReader fails, rather than ending, once more than max bytes are asked for.
type limitReader struct {
	r      io.Reader
	n, max int64
}

func (l *limitReader) read() int64 { return l.max - l.n }

func (l *limitReader) Read(p []byte) (int, error) {
	if l.n <= 0 {
		return 0, fmt.Errorf("layer is larger than the %d bytes its manifest allows", l.max)
	}
	if int64(len(p)) > l.n {
		p = p[:l.n]
	}
	k, err := l.r.Read(p)
	l.n -= int64(k)
	return k, err
}

// extraction is the state of one ReadLayer.
type extraction struct {
	m      *store.Manifest
	root   string
	single bool
	index  map[string]int // manifest path → index in m.Entries
	seen   []bool         // entry extracted
	opaque []bool         // opaque marker extracted (directories)
	te     *layer.TarExtractor
}

// entry checks hdr against m and only then hands it to umoci, renamed
// relative to the extraction root.
func (x *extraction) entry(hdr *tar.Header, r io.Reader) error {
	name := hdr.Name
	bad := func(format string, args ...any) error {
		return fmt.Errorf("entry %q: %s", name, fmt.Sprintf(format, args...))
	}
	p, kind, rel := parseName(name, hdr.Typeflag == tar.TypeDir)
	if kind == kindInvalid {
		return bad("not a path under %s/", LayerRoot)
	}
	i, ok := x.index[p]
	if !ok {
		return bad("not in the manifest")
	}
	e := &x.m.Entries[i]
	if p != "." {
		parent := path.Dir(p)
		if j, ok := x.index[parent]; !ok || x.m.Entries[j].Type != store.EntryDir || !x.seen[j] {
			return bad("parent %q is not a directory extracted before it", parent)
		}
	}

	if kind != kindEntry {
		// umoci writes whiteouts and opaque markers as empty regular files
		// that carry nothing else.
		if hdr.Typeflag != tar.TypeReg || hdr.Size != 0 {
			return bad("a whiteout must be an empty regular file")
		}
		if kind == kindWhiteout {
			if e.Type != store.EntryWhiteout {
				return bad("a whiteout in the layer, a %s in the manifest", e.Type)
			}
			if x.seen[i] {
				return bad("duplicate entry")
			}
			x.seen[i] = true
		} else {
			if e.Type != store.EntryDir || !x.seen[i] || !hasXattr(e, opaqueXattr) {
				return bad("opaque marker for %q, which is not an opaque directory extracted before it", p)
			}
			if x.opaque[i] {
				return bad("duplicate entry")
			}
			x.opaque[i] = true
		}
		hdr.Name = rel
		if err := x.te.UnpackEntry(x.root, hdr, r); err != nil {
			return fmt.Errorf("entry %q: %w", name, err)
		}
		return nil
	}

	if x.seen[i] {
		return bad("duplicate entry")
	}
	if err := checkHeader(hdr, e); err != nil {
		return bad("%v", err)
	}
	if e.Type == store.EntryHardlink {
		if j, ok := x.index[e.Target]; !ok || !x.seen[j] || x.m.Entries[j].Type != store.EntryFile {
			return bad("hard link to %q, which is not a file extracted before it", e.Target)
		}
		hdr.Linkname = e.Target
	}
	x.seen[i] = true

	hdr.Name = rel
	if x.single {
		hdr.Name = LayerRoot
	} else if p == "." {
		// Keep the root private until restoreMetadata gives it m's owner and
		// mode, so no other user can reach into the tree while it is written.
		hdr.Mode, hdr.Uid, hdr.Gid = 0o700, os.Geteuid(), os.Getegid()
	}
	// Keep only the xattrs m records for this entry: others are not content
	// (or are the sender's additions), and the opaque mark travels as a marker.
	xattrs := map[string]string{}
	for _, xa := range e.Xattrs {
		//lint:ignore SA1019 umoci reads and writes xattrs through Header.Xattrs
		if v, ok := hdr.Xattrs[xa.Name]; ok && xa.Name != opaqueXattr {
			xattrs[xa.Name] = v
		}
	}
	//lint:ignore SA1019 as above
	hdr.Xattrs = xattrs
	hdr.PAXRecords = nil
	if err := x.te.UnpackEntry(x.root, hdr, r); err != nil {
		return fmt.Errorf("entry %q: %w", name, err)
	}
	return nil
}

// The kinds of tar entry names.
const (
	kindInvalid  = iota
	kindEntry    // the manifest entry itself
	kindWhiteout // ".wh.<name>": the whiteout p
	kindOpaque   // ".wh..wh..opq": the opaque mark of directory p
)

// parseName maps a tar entry name to the manifest path p it is about, its
// kind, and its name relative to the extraction root. Only the names umoci
// writes under LayerRoot are accepted: no "..", ".", empty or absolute
// components, and a trailing slash only on a directory.
func parseName(name string, isDir bool) (p string, kind int, rel string) {
	if isDir {
		name = strings.TrimSuffix(name, "/")
	}
	if name == LayerRoot {
		return ".", kindEntry, "."
	}
	rel, ok := strings.CutPrefix(name, LayerRoot+"/")
	if !ok || !validPath(rel) {
		return "", kindInvalid, ""
	}
	dir, base := path.Split(rel)
	switch {
	case base == whOpaque:
		if dir == "" {
			return ".", kindOpaque, rel
		}
		return strings.TrimSuffix(dir, "/"), kindOpaque, rel
	case strings.HasPrefix(base, whPrefix):
		base = strings.TrimPrefix(base, whPrefix)
		if !validPath(base) {
			return "", kindInvalid, ""
		}
		return dir + base, kindWhiteout, rel
	}
	return rel, kindEntry, rel
}

// validPath reports whether p is a clean relative path of names.
func validPath(p string) bool {
	if p == "" || strings.IndexByte(p, 0) >= 0 {
		return false
	}
	for name := range strings.SplitSeq(p, "/") {
		if name == "" || name == "." || name == ".." {
			return false
		}
	}
	return true
}

var tarTypes = map[byte]store.EntryType{
	tar.TypeDir:     store.EntryDir,
	tar.TypeReg:     store.EntryFile,
	tar.TypeLink:    store.EntryHardlink,
	tar.TypeSymlink: store.EntrySymlink,
	tar.TypeChar:    store.EntryChardev,
	tar.TypeBlock:   store.EntryBlockdev,
	tar.TypeFifo:    store.EntryFifo,
}

// checkHeader compares what hdr claims with the manifest entry e.
func checkHeader(hdr *tar.Header, e *store.Entry) error {
	t, ok := tarTypes[hdr.Typeflag]
	if !ok {
		return fmt.Errorf("unsupported tar type %q", hdr.Typeflag)
	}
	if t != e.Type {
		return fmt.Errorf("a %s in the layer, a %s in the manifest", t, e.Type)
	}
	var size int64
	if t == store.EntryFile {
		size = e.Size
	}
	switch {
	case hdr.Mode != int64(e.Mode):
		return fmt.Errorf("mode %#o, manifest says %#o", hdr.Mode, e.Mode)
	case hdr.Uid != int(e.UID) || hdr.Gid != int(e.GID):
		return fmt.Errorf("owner %d:%d, manifest says %d:%d", hdr.Uid, hdr.Gid, e.UID, e.GID)
	case hdr.ModTime.Unix() != e.Mtime:
		return fmt.Errorf("mtime %d, manifest says %d", hdr.ModTime.Unix(), e.Mtime)
	case hdr.Size != size:
		return fmt.Errorf("size %d, manifest says %d", hdr.Size, size)
	case t == store.EntrySymlink && hdr.Linkname != e.Target:
		return fmt.Errorf("symlink to %q, manifest says %q", hdr.Linkname, e.Target)
	case t == store.EntryHardlink && hdr.Linkname != LayerRoot+"/"+e.Target:
		return fmt.Errorf("hard link to %q, manifest says %q", hdr.Linkname, LayerRoot+"/"+e.Target)
	case (t == store.EntryChardev || t == store.EntryBlockdev) &&
		(hdr.Devmajor != int64(e.Major) || hdr.Devminor != int64(e.Minor)):
		return fmt.Errorf("device %d:%d, manifest says %d:%d", hdr.Devmajor, hdr.Devminor, e.Major, e.Minor)
	}
	return nil
}

func hasXattr(e *store.Entry, name string) bool {
	for _, x := range e.Xattrs {
		if x.Name == name {
			return true
		}
	}
	return false
}

// restoreMetadata gives m's directories and whiteouts under dst the owner,
// mode and mtime m lists, children first so the root opens up last. Each is
// opened beneath dst without following any symlink, and changed through
// that descriptor.
func restoreMetadata(dst string, m *store.Manifest) error {
	dfd, err := unix.Open(dst, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("restore metadata: %w", err)
	}
	defer unix.Close(dfd)
	for i := len(m.Entries) - 1; i >= 0; i-- {
		e := &m.Entries[i]
		if e.Type != store.EntryDir && e.Type != store.EntryWhiteout {
			continue
		}
		if err := setMetadata(dfd, e); err != nil {
			return fmt.Errorf("restore metadata of %q: %w", e.Path, err)
		}
	}
	return nil
}

func setMetadata(dfd int, e *store.Entry) error {
	fd, err := unix.Openat2(dfd, e.Path, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	want := uint32(unix.S_IFDIR)
	if e.Type == store.EntryWhiteout {
		want = unix.S_IFCHR
	}
	if st.Mode&unix.S_IFMT != want || (want == unix.S_IFCHR && st.Rdev != 0) {
		return fmt.Errorf("is not a %s", e.Type)
	}
	// Owner before mode: chown clears setuid and setgid bits.
	if err := unix.Fchownat(fd, "", int(e.UID), int(e.GID), unix.AT_EMPTY_PATH); err != nil {
		return err
	}
	// fchmodat2 (Linux 6.6) takes an O_PATH descriptor; before it, go
	// through its /proc/self/fd link, as glibc does.
	err = unix.Fchmodat(fd, "", e.Mode, unix.AT_EMPTY_PATH)
	if errors.Is(err, unix.EOPNOTSUPP) {
		err = unix.Chmod("/proc/self/fd/"+strconv.Itoa(fd), e.Mode)
	}
	if err != nil {
		return err
	}
	ts := []unix.Timespec{{Sec: e.Mtime}, {Sec: e.Mtime}}
	return unix.UtimesNanoAt(fd, "", ts, unix.AT_EMPTY_PATH)
}
