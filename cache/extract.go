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
	"slices"
	"strings"

	"github.com/zeebo/blake3"
	"golang.org/x/sys/unix"

	"toolshed.dev/shed/store"
)

// ReadLayer extracts the tar stream r into dst, which must not exist (it is
// created; its parent exists), and returns only when the tree at dst is
// exactly the one m describes, so that the caller can register it with m
// without reading it again (store.AddOptions.Manifest).
//
// m is trusted (the caller checked it against a signed content hash), the
// stream is not. Every entry is checked against m before anything of it is
// written: its path (the parent must be a directory of m extracted earlier),
// type, mode, owners, mtime, size, link target, device numbers and the
// xattrs m lists (the opaque mark travels as a ".wh..wh..opq" marker). A
// file's bytes are hashed as they are written and must hash to m's digest;
// at most maxBytes(m) bytes are read from r, which must end at the
// end-of-archive marker, or after zeros that pad it to a 10,240-byte record
// (maxPadding; it is read to its end); every entry of m must be
// seen once; sparse files are refused. What is written is m's, not the
// stream's: each entry is created under its own name, exclusively, in the
// directory of its parent, and given m's owner, mode, xattrs and mtime, so
// the tree holds exactly m's entries and nothing else (see extraction for
// why no path is resolved).
//
// The entries of a directory must come together, after it, as WriteLayer
// writes them (a pre-order walk): a directory's owner, mode, xattrs and
// mtime are set when the stream leaves it, and an entry for a directory
// already left is refused. The root stays private (0700, the caller's) until
// the end.
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
	x := &extraction{
		m:      m,
		single: m.Entries[0].Type == store.EntryFile,
		index:  make(map[string]int, len(m.Entries)),
		seen:   make([]bool, len(m.Entries)),
		opaque: make([]bool, len(m.Entries)),
		name:   filepath.Base(dst),
		buf:    make([]byte, 256<<10),
		h:      blake3.New(),
		disk:   diskOpaque(),
	}
	for i := range m.Entries {
		x.index[m.Entries[i].Path] = i
	}
	// The parent of dst is the caller's (a staging directory): the one path
	// resolved here. Everything below it is created relative to descriptors.
	if x.parent, err = unix.Open(filepath.Dir(dst), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
		return err
	}
	defer x.close()
	defer func() {
		if err != nil && x.created {
			x.close()
			if rmErr := os.RemoveAll(dst); rmErr != nil {
				err = errors.Join(err, fmt.Errorf("remove partial layer: %w", rmErr))
			}
		}
	}()
	if !x.single {
		if err := unix.Mkdirat(x.parent, x.name, 0o700); err != nil {
			if errors.Is(err, unix.EEXIST) {
				return fs.ErrExist
			}
			return err
		}
		x.created = true
		fd, err := unix.Openat(x.parent, x.name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		x.stack = append(x.stack, openDir{0, fd})
		if err := dropInherited(fd); err != nil {
			return err
		}
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
		// The entry's data is read (its size is m's); the padding is next.
		end = lr.read() + (blockSize-hdr.Size%blockSize)%blockSize
	}
	if lr.read() != end+2*blockSize {
		return errors.New("stream ends without the end-of-archive marker")
	}
	// And the stream ends there, but for zeros that pad it to a record
	// (maxPadding). Go's reader stops at the marker, and the caller reads on
	// to the end of the blob (the gzip trailer, the digest) unbounded, so
	// that a cache could append anything (a gzip member inflating to
	// terabytes of zeros) after a valid layer; the end is seen here, within
	// the bound.
	if err := checkPadding(lr); err != nil {
		return err
	}
	for i, seen := range x.seen {
		if !seen {
			return fmt.Errorf("entry %q of the manifest is not in the layer", m.Entries[i].Path)
		}
	}
	// Leave every directory, the root last: their metadata is set now.
	for len(x.stack) > 0 {
		if err := x.pop(); err != nil {
			return err
		}
	}
	return nil
}

// maxPadding is how many zero bytes may follow the end-of-archive marker. A
// writer pads its archive to a whole record: 10,240 bytes (a blocking factor
// of 20) for GNU tar, bsdtar and Python's tarfile by default, which leaves at
// most 19 zero blocks after the marker's two (when the marker's second block
// starts a record). Any smaller blocking factor pads less; WriteLayer and
// Go's writer pad nothing. A larger one (tar -b 40 and up, for tapes) is
// refused: its record is the writer's choice, and no bound on it would stop a
// zero tail early.
const maxPadding = 10240 - blockSize

// checkPadding reads what follows the end-of-archive marker to the stream's
// end: at most maxPadding zero bytes. It reads at most maxPadding+1 bytes.
func checkPadding(r io.Reader) error {
	tail, err := io.ReadAll(io.LimitReader(r, maxPadding+1))
	if err != nil {
		return fmt.Errorf("read after the end-of-archive marker: %w", err)
	}
	if i := slices.IndexFunc(tail, func(b byte) bool { return b != 0 }); i >= 0 {
		return fmt.Errorf("data after the end-of-archive marker (a non-zero byte %d bytes after it)", i)
	}
	if len(tail) > maxPadding {
		return fmt.Errorf("more than %d zero bytes after the end-of-archive marker (a 10,240-byte record's padding)", maxPadding)
	}
	return nil
}

// extraction is the state of one ReadLayer.
//
// Why it writes what it writes, and nothing else, without umoci's extractor
// (which handles arbitrary images and pays for it: about 30 system calls per
// entry, probes of what is on disk among them): every entry is first checked
// against the trusted manifest, so only names of m are written, each a
// single path component created relative to a descriptor of a directory this
// extraction made (mkdirat, then openat with O_NOFOLLOW|O_DIRECTORY), with a
// call that fails if the name exists (O_CREAT|O_EXCL, mkdirat, symlinkat,
// linkat, mknodat). No path is resolved through anything the stream
// controls: a symlink of the layer is never followed because no name is
// looked up under one (its children are refused: their parent is not a
// directory of m), and a hard link's target is a file of m opened by the
// same walk of directories made here. Owners and modes come from m and are
// set explicitly (fchown before fchmod: chown clears setuid bits), xattrs
// after both (chown clears file capabilities), mtimes last.
type extraction struct {
	m       *store.Manifest
	single  bool
	index   map[string]int // manifest path → index in m.Entries
	seen    []bool         // entry extracted
	opaque  []bool         // opaque marker extracted (directories)
	stack   []openDir      // the directories from the root to the one being filled
	parent  int            // dst's parent directory
	name    string         // dst's name in it
	created bool           // dst was created by this extraction
	buf     []byte
	h       *blake3.Hasher
	disk    string // the opaque mark's name on disk (store.OpaqueXattr)
}

type openDir struct{ i, fd int }

func (x *extraction) close() {
	for _, d := range x.stack {
		unix.Close(d.fd)
	}
	x.stack = nil
	if x.parent >= 0 {
		unix.Close(x.parent)
		x.parent = -1
	}
}

// entry checks hdr against m and only then writes it.
func (x *extraction) entry(hdr *tar.Header, r io.Reader) error {
	name := hdr.Name
	bad := func(format string, args ...any) error {
		return fmt.Errorf("entry %q: %s", name, fmt.Sprintf(format, args...))
	}
	// Go's reader hands a PAX sparse file (GNU.sparse.* records) over as a
	// regular one of its real size, holes read as zeros: its data in the
	// stream is not hdr.Size bytes, which the end-of-archive check counts on,
	// and an entry that must be empty (a whiteout) can carry data unseen.
	// WriteLayer writes none.
	for k := range hdr.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return bad("a sparse file (%s)", k)
		}
	}
	p, kind, _ := parseName(name, hdr.Typeflag == tar.TypeDir)
	if kind == kindInvalid {
		return bad("not a path under %s/", LayerRoot)
	}
	i, ok := x.index[p]
	if !ok {
		return bad("not in the manifest")
	}
	e := &x.m.Entries[i]
	if p != "." && kind != kindOpaque {
		parent := path.Dir(p)
		if j, ok := x.index[parent]; !ok || x.m.Entries[j].Type != store.EntryDir || !x.seen[j] {
			return bad("parent %q is not a directory extracted before it", parent)
		}
	}
	if kind != kindEntry {
		// WriteLayer writes whiteouts and opaque markers as empty regular
		// files that carry nothing else.
		if hdr.Typeflag != tar.TypeReg || hdr.Size != 0 {
			return bad("a whiteout must be an empty regular file")
		}
		if kind == kindOpaque {
			if e.Type != store.EntryDir || !x.seen[i] || !hasXattr(e, opaqueXattr) {
				return bad("opaque marker for %q, which is not an opaque directory extracted before it", p)
			}
			if x.opaque[i] {
				return bad("duplicate entry")
			}
			if _, err := x.dir(i); err != nil { // the marker is inside p, so p must not be left yet
				return bad("%v", err)
			}
			x.opaque[i] = true // the mark itself is set with p's metadata
			return nil
		}
		if e.Type != store.EntryWhiteout {
			return bad("a whiteout in the layer, a %s in the manifest", e.Type)
		}
	} else if err := checkHeader(hdr, e); err != nil {
		return bad("%v", err)
	}
	if x.seen[i] {
		return bad("duplicate entry")
	}
	if err := x.checkXattrs(hdr, e, kind); err != nil {
		return bad("%v", err)
	}
	if e.Type == store.EntryHardlink {
		j, ok := x.index[e.Target]
		if !ok || !x.seen[j] || x.m.Entries[j].Type != store.EntryFile {
			return bad("hard link to %q, which is not a file extracted before it", e.Target)
		}
		if t := &x.m.Entries[j]; e.Mode != t.Mode || e.UID != t.UID || e.GID != t.GID || e.Mtime != t.Mtime || !slices.EqualFunc(e.Xattrs, t.Xattrs, equalXattr) {
			return bad("the manifest gives a hard link other metadata than its file %q", e.Target)
		}
	}
	x.seen[i] = true
	if err := x.write(i, e, r); err != nil {
		return fmt.Errorf("entry %q: %w", name, err) // fs.ErrExist for a single file's dst, as for a tree's
	}
	return nil
}

// checkXattrs checks the xattrs of e that the stream must carry: each one m
// lists, with m's value (the opaque mark as its marker, checked when the
// directory is left). Others in the stream are not content (or are the
// sender's additions) and are never written. Only files and directories
// carry xattrs here (umoci's writer puts none on a whiteout; capabilities,
// ACLs and the opaque mark are on files and directories).
func (x *extraction) checkXattrs(hdr *tar.Header, e *store.Entry, kind int) error {
	if len(e.Xattrs) == 0 {
		return nil
	}
	if kind != kindEntry || (e.Type != store.EntryFile && e.Type != store.EntryDir) {
		return fmt.Errorf("the manifest gives a %s xattrs, which a layer does not carry", e.Type)
	}
	for _, xa := range e.Xattrs {
		if xa.Name == opaqueXattr {
			continue
		}
		if v, ok := hdr.PAXRecords["SCHILY.xattr."+xa.Name]; !ok || v != string(xa.Value) {
			return fmt.Errorf("xattr %s is not the manifest's", xa.Name)
		}
	}
	return nil
}

// write creates entry i (checked) in its parent directory.
func (x *extraction) write(i int, e *store.Entry, r io.Reader) error {
	if i == 0 {
		if x.single {
			return x.file(x.parent, x.name, e, r)
		}
		return nil // the root exists; its metadata is set when it is left, last
	}
	dirfd, err := x.dir(x.index[path.Dir(e.Path)])
	if err != nil {
		return err
	}
	base := path.Base(e.Path)
	switch e.Type {
	case store.EntryDir:
		if err := unix.Mkdirat(dirfd, base, 0o700); err != nil {
			return fmt.Errorf("mkdirat: %w", err)
		}
		fd, err := unix.Openat(dirfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open directory: %w", err)
		}
		x.stack = append(x.stack, openDir{i, fd})
		return nil
	case store.EntryFile:
		return x.file(dirfd, base, e, r)
	case store.EntryHardlink:
		j := x.index[e.Target]
		tdir, done, err := x.lookupDir(x.index[path.Dir(e.Target)])
		if err != nil {
			return err
		}
		defer done()
		if err := unix.Linkat(tdir, path.Base(x.m.Entries[j].Path), dirfd, base, 0); err != nil {
			return fmt.Errorf("linkat: %w", err)
		}
		return nil
	case store.EntrySymlink:
		if e.Mode != 0o777 {
			return fmt.Errorf("mode %#o: a symlink's is 0777", e.Mode)
		}
		if err := unix.Symlinkat(e.Target, dirfd, base); err != nil {
			return fmt.Errorf("symlinkat: %w", err)
		}
		if err := unix.Fchownat(dirfd, base, int(e.UID), int(e.GID), unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("chown: %w", err)
		}
		return setMtime(dirfd, base, e.Mtime, unix.AT_SYMLINK_NOFOLLOW)
	}
	var mode uint32
	dev := 0
	switch e.Type {
	case store.EntryChardev:
		mode, dev = unix.S_IFCHR, int(unix.Mkdev(e.Major, e.Minor))
	case store.EntryBlockdev:
		mode, dev = unix.S_IFBLK, int(unix.Mkdev(e.Major, e.Minor))
	case store.EntryFifo:
		mode = unix.S_IFIFO
	case store.EntryWhiteout: // overlayfs's: a character device 0:0
		mode = unix.S_IFCHR
	default:
		return fmt.Errorf("unknown entry type %s", e.Type)
	}
	if err := unix.Mknodat(dirfd, base, mode|0o600, dev); err != nil {
		return fmt.Errorf("mknodat: %w", err)
	}
	// The name was made by mknodat just now in a directory only this
	// extraction writes to: it is not a symlink for fchmodat to follow.
	if err := unix.Fchownat(dirfd, base, int(e.UID), int(e.GID), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("chown: %w", err)
	}
	if err := unix.Fchmodat(dirfd, base, e.Mode, 0); err != nil {
		return fmt.Errorf("chmod: %w", err)
	}
	return setMtime(dirfd, base, e.Mtime, unix.AT_SYMLINK_NOFOLLOW)
}

// file writes a regular file's bytes, hashing them on their way, and gives
// it m's metadata once they hash to m's digest.
func (x *extraction) file(dirfd int, base string, e *store.Entry, r io.Reader) error {
	fd, err := unix.Openat(dirfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		if x.single && errors.Is(err, unix.EEXIST) {
			return fs.ErrExist
		}
		return fmt.Errorf("create: %w", err)
	}
	if x.single {
		x.created = true
	}
	defer unix.Close(fd)
	if x.single {
		if err := dropInherited(fd); err != nil {
			return err
		}
	}
	x.h.Reset()
	var n int64
	for {
		k, rerr := r.Read(x.buf)
		if k > 0 {
			x.h.Write(x.buf[:k])
			if err := writeAll(fd, x.buf[:k]); err != nil {
				return fmt.Errorf("write: %w", err)
			}
			n += int64(k)
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return fmt.Errorf("read: %w", rerr)
		}
	}
	var d store.Hash
	x.h.Sum(d[:0])
	if n != e.Size || d != e.Digest {
		return errors.New("content differs from its manifest")
	}
	return x.setMetadata(fd, e)
}

func writeAll(fd int, b []byte) error {
	for len(b) > 0 {
		n, err := unix.Write(fd, b)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// setMetadata gives the file or directory open at fd e's owner, mode, xattrs
// and mtime, in that order.
func (x *extraction) setMetadata(fd int, e *store.Entry) error {
	if err := unix.Fchown(fd, int(e.UID), int(e.GID)); err != nil {
		return fmt.Errorf("chown: %w", err)
	}
	if err := unix.Fchmod(fd, e.Mode); err != nil {
		return fmt.Errorf("chmod: %w", err)
	}
	if len(e.Xattrs) > 0 {
		for _, xa := range e.Xattrs {
			name := xa.Name
			if name == opaqueXattr {
				name = x.disk
			}
			if err := unix.Fsetxattr(fd, name, xa.Value, 0); err != nil {
				return fmt.Errorf("set xattr %s: %w", name, err)
			}
		}
		// An ACL sets mode bits of its own: what is on disk must still be m's.
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			return err
		}
		if st.Mode&07777 != e.Mode || st.Uid != e.UID || st.Gid != e.GID {
			return fmt.Errorf("mode %#o and owner %d:%d after its xattrs are set, manifest says %#o, %d:%d", st.Mode&07777, st.Uid, st.Gid, e.Mode, e.UID, e.GID)
		}
	}
	return setMtime(fd, "", e.Mtime, unix.AT_EMPTY_PATH)
}

func setMtime(dirfd int, name string, mtime int64, flags int) error {
	ts := []unix.Timespec{{Sec: mtime}, {Sec: mtime}}
	if err := unix.UtimesNanoAt(dirfd, name, ts, flags); err != nil {
		return fmt.Errorf("set mtime: %w", err)
	}
	return nil
}

// dropInherited removes the ACLs a new root may have inherited from a
// default ACL of the caller's directory: below it, no default ACL exists
// until a directory is left, when nothing more is created in it.
func dropInherited(fd int) error {
	buf := make([]byte, 1024)
	n, err := unix.Flistxattr(fd, buf)
	if errors.Is(err, unix.ERANGE) {
		if n, err = unix.Flistxattr(fd, nil); err == nil {
			buf = make([]byte, n+64)
			n, err = unix.Flistxattr(fd, buf)
		}
	}
	if errors.Is(err, unix.ENOTSUP) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list xattrs: %w", err)
	}
	for name := range strings.SplitSeq(string(buf[:n]), "\x00") {
		if name == "system.posix_acl_access" || name == "system.posix_acl_default" {
			if err := unix.Fremovexattr(fd, name); err != nil {
				return fmt.Errorf("remove inherited %s: %w", name, err)
			}
		}
	}
	return nil
}

func equalXattr(a, b store.Xattr) bool { return a.Name == b.Name && string(a.Value) == string(b.Value) }

// dir returns a descriptor of directory j, leaving the directories entered
// after it. j must be on the stack: one left is complete.
func (x *extraction) dir(j int) (int, error) {
	for k := len(x.stack) - 1; k >= 0; k-- {
		if x.stack[k].i != j {
			continue
		}
		for len(x.stack) > k+1 {
			if err := x.pop(); err != nil {
				return -1, err
			}
		}
		return x.stack[k].fd, nil
	}
	return -1, fmt.Errorf("directory %q was complete before this entry (a directory's entries must come together, after it)", x.m.Entries[j].Path)
}

// pop leaves the innermost directory: it gets m's metadata, its opaque mark
// included, which its marker must have announced.
func (x *extraction) pop() error {
	d := x.stack[len(x.stack)-1]
	x.stack = x.stack[:len(x.stack)-1]
	defer unix.Close(d.fd)
	e := &x.m.Entries[d.i]
	if hasXattr(e, opaqueXattr) && !x.opaque[d.i] {
		return fmt.Errorf("entry %q: an opaque directory in the manifest, without its marker in the layer", e.Path)
	}
	if err := x.setMetadata(d.fd, e); err != nil {
		return fmt.Errorf("entry %q: %w", e.Path, err)
	}
	return nil
}

// lookupDir returns a descriptor of directory j, whether or not it was left,
// without leaving any: from the innermost directory on the stack that holds
// it, down through directories made here, one name at a time.
func (x *extraction) lookupDir(j int) (fd int, done func(), err error) {
	p := x.m.Entries[j].Path
	for k := len(x.stack) - 1; k >= 0; k-- {
		q := x.m.Entries[x.stack[k].i].Path
		var rest string
		switch {
		case q == p:
			return x.stack[k].fd, func() {}, nil
		case q == ".":
			rest = p
		case strings.HasPrefix(p, q+"/"):
			rest = p[len(q)+1:]
		default:
			continue
		}
		fd = x.stack[k].fd
		opened := -1
		for name := range strings.SplitSeq(rest, "/") {
			next, err := unix.Openat(fd, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if opened >= 0 {
				unix.Close(opened)
			}
			if err != nil {
				return -1, nil, fmt.Errorf("open directory %q: %w", p, err)
			}
			fd, opened = next, next
		}
		return fd, func() { unix.Close(opened) }, nil
	}
	return -1, nil, fmt.Errorf("directory %q is not under the root", p)
}
