package cache

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"path/filepath"
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

// onDisk is umoci's on-disk format of a path for WriteLayer: overlay
// whiteouts (char 0:0) and opaque directories travel as OCI ".wh." entries.
// ReadLayer turns them back into overlayfs's own marks, the opaque mark
// under the name this process's store keeps it (store.OpaqueXattr):
// user.overlay.opaque in a rootless store, whose overlays are mounted with
// userxattr.
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
	return writeTree(ctx, w, src, LayerRoot)
}

// writeTree writes the tree at src to w as a tar stream whose entries are under target.
func writeTree(ctx context.Context, w io.Writer, src, target string) error {
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
	rc := layer.GenerateInsertLayer(src, target, false, &layer.RepackOptions{OnDiskFormat: onDisk()})
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

// maxBytes bounds the tar stream of m: its files' sizes, two end blocks and their padding, and
// per entry a fixed allowance plus its names and xattrs twice over (long
// names and xattrs go in PAX records; an opaque directory's marker repeats
// its name).
func maxBytes(m *store.Manifest) int64 {
	n := int64(2*blockSize + maxPadding + 1) // the marker, its padding, and a byte to see that nothing more follows
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

// limitReader fails, rather than ending, once the stream holds more than max bytes.
type limitReader struct {
	r      io.Reader
	n, max int64
}

func (l *limitReader) read() int64 { return l.max - l.n }

func (l *limitReader) Read(p []byte) (int, error) {
	if l.n <= 0 {
		// At the bound a stream may still end (ReadLayer reads on to see
		// the end): a byte more is the failure, not the asking for it.
		var b [1]byte
		if _, err := io.ReadFull(l.r, b[:]); err != nil {
			return 0, err
		}
		return 0, fmt.Errorf("layer is larger than the %d bytes its manifest allows", l.max)
	}
	if int64(len(p)) > l.n {
		p = p[:l.n]
	}
	k, err := l.r.Read(p)
	l.n -= int64(k)
	return k, err
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
