package store

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/zeebo/blake3"
	"golang.org/x/sys/unix"

	"toolshed.dev/shed/internal/userns"
)

// A manifest is the canonical text form of a file tree, from which a store
// path's content hash is computed, and which is kept beside the path so that
// verification can name the file that differs. The format:
//
//	shed-manifest v1
//	"." dir 0755 0 0 1700000000
//	"etc/passwd" file 0644 0 0 1700000000 1234 <64 hex digits>
//	"usr/bin/su" file 4755 0 0 1700000000 5678 <64 hex> xattr "security.capability" 0100000200...
//	"usr/lib/x.so.1" symlink 0777 0 0 1700000000 "x.so.1.2"
//	"usr/bin/gunzip" hardlink 0755 0 0 1700000000 "usr/bin/gzip"
//	"dev/null" chardev 0666 0 0 1700000000 1 3
//	"var/old" whiteout 0000 0 0 1700000000
//
// One line per entry, each ending in "\n"; fields separated by one space:
// path, type, mode (4 octal digits), uid, gid, mtime in seconds, the type's
// own fields, then zero or more `xattr <name> <hex value>` ("-" for an empty
// value), sorted by name. Strings are strconv.Quote'd, so that any byte of a
// file name survives and no field can run into the next. Entries are in
// depth-first pre-order with the children of a directory sorted by byte
// order: a directory's line comes right before its contents.
const manifestHeader = "shed-manifest v1\n"

// EntryType is the kind of a manifest entry.
type EntryType string

// The entry types. A whiteout is overlayfs's mark of a deleted file (a
// character device 0:0); it gets its own type because it means absence.
const (
	EntryDir      EntryType = "dir"
	EntryFile     EntryType = "file"
	EntryHardlink EntryType = "hardlink"
	EntrySymlink  EntryType = "symlink"
	EntryChardev  EntryType = "chardev"
	EntryBlockdev EntryType = "blockdev"
	EntryFifo     EntryType = "fifo"
	EntryWhiteout EntryType = "whiteout"
)

// manifestXattrs are the extended attributes that are part of a tree's
// content, sorted. Others (security.selinux, trusted.overlay.origin, ...)
// describe the host or one build, not the content, and are ignored.
var manifestXattrs = []string{
	"security.capability",
	"system.posix_acl_access",
	"system.posix_acl_default",
	opaqueXattr,
}

// The opaque mark of a directory (overlayfs hides what the layers below
// hold there) has two names on disk: trusted.overlay.opaque in a store made
// by root, user.overlay.opaque in a rootless one, whose overlays are mounted
// with userxattr in shed's user namespace, where trusted.* is out of reach.
// Manifests record it as opaqueXattr whichever name it has, so that a recipe
// realized rootless and as root gets the same content hashes.
const (
	opaqueXattr     = "trusted.overlay.opaque"
	userOpaqueXattr = "user.overlay.opaque"
)

// OpaqueXattr returns the name under which this process writes the opaque
// mark, the one its overlays read: user.overlay.opaque in a user namespace
// (userns.Active), else trusted.overlay.opaque. Manifests record the mark as
// trusted.overlay.opaque either way.
func OpaqueXattr() string {
	if rootless() {
		return userOpaqueXattr
	}
	return opaqueXattr
}

// rootless is userns.Active, a variable so that tests, which run as root,
// can take the rootless branch without a user namespace.
var rootless = userns.Active

// Xattr is an extended attribute of an entry.
type Xattr struct {
	Name  string
	Value []byte
}

// Entry is one file of a tree.
type Entry struct {
	Path   string // "." for the root, else slash-separated without "./"
	Type   EntryType
	Mode   uint32 // permission bits incl. setuid/setgid/sticky (07777)
	UID    uint32
	GID    uint32
	Mtime  int64  // seconds; the store clamps nanoseconds to 0
	Size   int64  // file
	Digest Hash   // file
	Target string // symlink target, or the path of a hardlink's first entry
	Major  uint32 // chardev, blockdev
	Minor  uint32 // chardev, blockdev
	Xattrs []Xattr
}

// Manifest lists a tree's entries in canonical order.
type Manifest struct{ Entries []Entry }

// Encode returns the canonical encoding, which Hash hashes.
func (m *Manifest) Encode() []byte {
	b := make([]byte, 0, len(manifestHeader)+len(m.Entries)*128)
	b = append(b, manifestHeader...)
	for i := range m.Entries {
		b = m.Entries[i].appendLine(b)
	}
	return b
}

// Hash returns the BLAKE3 of the encoding; the header is included, so the
// format version is bound into every content hash.
func (m *Manifest) Hash() Hash { return Sum(m.Encode()) }

// Size returns the sum of the regular files' sizes, hard links counted once.
func (m *Manifest) Size() int64 {
	var n int64
	for i := range m.Entries {
		if m.Entries[i].Type == EntryFile {
			n += m.Entries[i].Size
		}
	}
	return n
}

func (e *Entry) appendLine(b []byte) []byte {
	b = strconv.AppendQuote(b, e.Path)
	b = append(b, ' ')
	b = append(b, e.Type...)
	b = append(b, ' ')
	mode := e.Mode & 07777
	b = append(b, '0'+byte(mode>>9&7), '0'+byte(mode>>6&7), '0'+byte(mode>>3&7), '0'+byte(mode&7), ' ')
	b = strconv.AppendUint(b, uint64(e.UID), 10)
	b = append(b, ' ')
	b = strconv.AppendUint(b, uint64(e.GID), 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, e.Mtime, 10)
	switch e.Type {
	case EntryFile:
		b = append(b, ' ')
		b = strconv.AppendInt(b, e.Size, 10)
		b = append(b, ' ')
		b = hex.AppendEncode(b, e.Digest[:])
	case EntrySymlink, EntryHardlink:
		b = append(b, ' ')
		b = strconv.AppendQuote(b, e.Target)
	case EntryChardev, EntryBlockdev:
		b = append(b, ' ')
		b = strconv.AppendUint(b, uint64(e.Major), 10)
		b = append(b, ' ')
		b = strconv.AppendUint(b, uint64(e.Minor), 10)
	}
	for _, x := range e.Xattrs {
		b = append(b, " xattr "...)
		b = strconv.AppendQuote(b, x.Name)
		b = append(b, ' ')
		if len(x.Value) == 0 {
			b = append(b, '-') // an empty field would read as a doubled separator
		} else {
			b = hex.AppendEncode(b, x.Value)
		}
	}
	return append(b, '\n')
}

// ParseManifest parses an encoding and accepts only what Encode produces for
// a tree ScanTree could have returned: every line must re-encode to itself,
// entries must be in canonical order without duplicates, each entry's parent
// must be a directory before it, and a hardlink must name an earlier file.
func ParseManifest(b []byte) (*Manifest, error) {
	s := string(b)
	if !strings.HasPrefix(s, manifestHeader) {
		return nil, errors.New("parse manifest: bad header, want \"shed-manifest v1\"")
	}
	s = s[len(manifestHeader):]
	if s == "" {
		return nil, errors.New("parse manifest: no entries")
	}
	if !strings.HasSuffix(s, "\n") {
		return nil, errors.New("parse manifest: missing final newline")
	}
	lines := strings.Split(s[:len(s)-1], "\n")
	m := &Manifest{Entries: make([]Entry, 0, len(lines))}
	types := make(map[string]EntryType, len(lines))
	for i, line := range lines {
		lineNo := i + 2
		e, err := parseEntry(line)
		if err != nil {
			return nil, fmt.Errorf("parse manifest: line %d: %w", lineNo, err)
		}
		if string(e.appendLine(nil)) != line+"\n" {
			return nil, fmt.Errorf("parse manifest: line %d: not in canonical form", lineNo)
		}
		if err := checkEntry(&e, i, m.Entries, types); err != nil {
			return nil, fmt.Errorf("parse manifest: line %d: %s: %w", lineNo, strconv.Quote(e.Path), err)
		}
		types[e.Path] = e.Type
		m.Entries = append(m.Entries, e)
	}
	return m, nil
}

// checkEntry checks e, the i-th entry, against those before it.
func checkEntry(e *Entry, i int, prev []Entry, types map[string]EntryType) error {
	if i == 0 {
		if e.Path != "." {
			return errors.New("first entry is not the root \".\"")
		}
		if e.Type != EntryDir && e.Type != EntryFile {
			return fmt.Errorf("root is a %s, want dir or file", e.Type)
		}
	} else {
		if err := checkManifestPath(e.Path); err != nil {
			return err
		}
		if c := comparePaths(prev[i-1].Path, e.Path); c == 0 {
			return errors.New("duplicate entry")
		} else if c > 0 {
			return fmt.Errorf("out of order after %s", strconv.Quote(prev[i-1].Path))
		}
		parent := "."
		if j := strings.LastIndexByte(e.Path, '/'); j >= 0 {
			parent = e.Path[:j]
		}
		if types[parent] != EntryDir {
			return errors.New("parent is not a directory listed before it")
		}
	}
	switch e.Type {
	case EntryDir, EntryFile, EntryChardev, EntryBlockdev, EntryFifo, EntryWhiteout:
	case EntrySymlink:
		if e.Target == "" || strings.IndexByte(e.Target, 0) >= 0 {
			return errors.New("bad symlink target")
		}
	case EntryHardlink:
		if types[e.Target] != EntryFile {
			return fmt.Errorf("hardlink to %s, which is not a file listed before it", strconv.Quote(e.Target))
		}
	default:
		return fmt.Errorf("unknown type %q", e.Type)
	}
	if e.Type == EntryFile && e.Size < 0 {
		return errors.New("negative size")
	}
	for j, x := range e.Xattrs {
		if _, ok := slices.BinarySearch(manifestXattrs, x.Name); !ok {
			return fmt.Errorf("xattr %s is not recorded in manifests", strconv.Quote(x.Name))
		}
		if j > 0 && e.Xattrs[j-1].Name >= x.Name {
			return errors.New("xattrs not sorted")
		}
	}
	return nil
}

// checkManifestPath checks a non-root entry path: clean, relative, and made
// of names a directory can hold.
func checkManifestPath(p string) error {
	if p == "" || strings.IndexByte(p, 0) >= 0 {
		return errors.New("bad path")
	}
	for name := range strings.SplitSeq(p, "/") {
		if name == "" || name == "." || name == ".." {
			return errors.New("bad path")
		}
	}
	return nil
}

// comparePaths orders paths as a depth-first walk with sorted children
// visits them: component by component, a parent before its children. It is
// a byte comparison in which '/' sorts before every byte a name can hold
// (names hold no NUL), so "a/b" < "a-b".
func comparePaths(a, b string) int {
	for i := 0; i < len(a) && i < len(b); i++ {
		x, y := a[i], b[i]
		if x == y {
			continue
		}
		if x == '/' {
			x = 0
		}
		if y == '/' {
			y = 0
		}
		if x < y {
			return -1
		}
		return 1
	}
	return len(a) - len(b)
}

// manifestFields reads the space-separated fields of one line.
type manifestFields struct {
	s   string
	err error
}

func (f *manifestFields) word() string {
	if f.err != nil {
		return ""
	}
	if f.s == "" {
		f.err = errors.New("missing field")
		return ""
	}
	w := f.s
	if i := strings.IndexByte(f.s, ' '); i >= 0 {
		w, f.s = f.s[:i], f.s[i+1:]
	} else {
		f.s = ""
	}
	return w
}

func (f *manifestFields) quoted() string {
	if f.err != nil {
		return ""
	}
	q, err := strconv.QuotedPrefix(f.s)
	if err != nil {
		f.err = errors.New("bad quoted string")
		return ""
	}
	s, err := strconv.Unquote(q)
	if err != nil {
		f.err = errors.New("bad quoted string")
		return ""
	}
	f.s = strings.TrimPrefix(f.s[len(q):], " ")
	return s
}

func (f *manifestFields) uint32() uint32 {
	w := f.word()
	if f.err != nil {
		return 0
	}
	v, err := strconv.ParseUint(w, 10, 32)
	if err != nil {
		f.err = fmt.Errorf("bad number %q", w)
	}
	return uint32(v)
}

func (f *manifestFields) int64() int64 {
	w := f.word()
	if f.err != nil {
		return 0
	}
	v, err := strconv.ParseInt(w, 10, 64)
	if err != nil {
		f.err = fmt.Errorf("bad number %q", w)
	}
	return v
}

func (f *manifestFields) hex() []byte {
	w := f.word()
	if f.err != nil || w == "-" {
		return []byte{}
	}
	v, err := hex.DecodeString(w)
	if err != nil {
		f.err = fmt.Errorf("bad hex %q", w)
	}
	return v
}

// parseEntry parses one line; the caller checks that it is canonical.
func parseEntry(line string) (Entry, error) {
	f := &manifestFields{s: line}
	var e Entry
	e.Path = f.quoted()
	e.Type = EntryType(f.word())
	if mode := f.word(); f.err == nil {
		v, err := strconv.ParseUint(mode, 8, 32)
		if err != nil || v > 07777 {
			return e, fmt.Errorf("bad mode %q", mode)
		}
		e.Mode = uint32(v)
	}
	e.UID = f.uint32()
	e.GID = f.uint32()
	e.Mtime = f.int64()
	switch e.Type {
	case EntryFile:
		e.Size = f.int64()
		if d := f.hex(); f.err == nil && len(d) != HashSize {
			return e, errors.New("bad digest")
		} else {
			copy(e.Digest[:], d)
		}
	case EntrySymlink, EntryHardlink:
		e.Target = f.quoted()
	case EntryChardev, EntryBlockdev:
		e.Major = f.uint32()
		e.Minor = f.uint32()
	}
	for f.err == nil && f.s != "" {
		if f.word() != "xattr" {
			return e, errors.New("unexpected field")
		}
		e.Xattrs = append(e.Xattrs, Xattr{Name: f.quoted(), Value: f.hex()})
	}
	return e, f.err
}

// DiffManifests lists the differences between a and b for people, one line
// per difference, "path: what", in manifest order.
func DiffManifests(a, b *Manifest) []string {
	var out []string
	for _, d := range Differences(a, b) {
		out = append(out, d.String())
	}
	return out
}

// Difference is one way in which an entry differs between two manifests.
type Difference struct {
	Path string // as displayed: quoted only when it needs escaping
	What string // "only in first", "only in second", "content differs (size 1 → 2)", ...
}

func (d Difference) String() string { return d.Path + ": " + d.What }

// Differences is DiffManifests with the path and the difference kept apart.
func Differences(a, b *Manifest) []Difference {
	index := func(m *Manifest) map[string]*Entry {
		x := make(map[string]*Entry, len(m.Entries))
		for i := range m.Entries {
			x[m.Entries[i].Path] = &m.Entries[i]
		}
		return x
	}
	am, bm := index(a), index(b)
	paths := make([]string, 0, len(am))
	for p := range am {
		paths = append(paths, p)
	}
	for p := range bm {
		if am[p] == nil {
			paths = append(paths, p)
		}
	}
	slices.SortFunc(paths, comparePaths)
	var out []Difference
	for _, p := range paths {
		x, y := am[p], bm[p]
		name := displayPath(p)
		switch {
		case y == nil:
			out = append(out, Difference{name, "only in first"})
		case x == nil:
			out = append(out, Difference{name, "only in second"})
		default:
			for _, d := range diffEntry(x, y) {
				out = append(out, Difference{name, d})
			}
		}
	}
	return out
}

func diffEntry(a, b *Entry) []string {
	var d []string
	add := func(format string, args ...any) { d = append(d, fmt.Sprintf(format, args...)) }
	if a.Type != b.Type {
		add("type %s → %s", a.Type, b.Type)
	} else {
		switch a.Type {
		case EntryFile:
			if a.Size != b.Size {
				add("content differs (size %d → %d)", a.Size, b.Size)
			} else if a.Digest != b.Digest {
				add("content differs")
			}
		case EntrySymlink:
			if a.Target != b.Target {
				add("target %s → %s", strconv.Quote(a.Target), strconv.Quote(b.Target))
			}
		case EntryHardlink:
			if a.Target != b.Target {
				add("hard link to %s → %s", strconv.Quote(a.Target), strconv.Quote(b.Target))
			}
		case EntryChardev, EntryBlockdev:
			if a.Major != b.Major || a.Minor != b.Minor {
				add("device %d:%d → %d:%d", a.Major, a.Minor, b.Major, b.Minor)
			}
		}
	}
	if a.Mode != b.Mode {
		add("mode %04o → %04o", a.Mode, b.Mode)
	}
	if a.UID != b.UID {
		add("uid %d → %d", a.UID, b.UID)
	}
	if a.GID != b.GID {
		add("gid %d → %d", a.GID, b.GID)
	}
	if a.Mtime != b.Mtime {
		add("mtime %d → %d", a.Mtime, b.Mtime)
	}
	xa, xb := a.Xattrs, b.Xattrs
	for len(xa) > 0 || len(xb) > 0 {
		switch {
		case len(xb) == 0 || len(xa) > 0 && xa[0].Name < xb[0].Name:
			add("xattr %s only in first", xa[0].Name)
			xa = xa[1:]
		case len(xa) == 0 || xb[0].Name < xa[0].Name:
			add("xattr %s only in second", xb[0].Name)
			xb = xb[1:]
		default:
			if !bytes.Equal(xa[0].Value, xb[0].Value) {
				add("xattr %s differs", xa[0].Name)
			}
			xa, xb = xa[1:], xb[1:]
		}
	}
	return d
}

// displayPath shows a path as is unless it holds bytes that need escaping
// (a newline would split the line).
func displayPath(p string) string {
	if q := strconv.Quote(p); q[1:len(q)-1] != p {
		return q
	}
	return p
}

// errTreeChanged reports that a file was replaced or modified while it was
// read: the result would describe no tree that ever existed.
var errTreeChanged = errors.New("changed during the walk")

type inodeKey struct{ dev, ino uint64 }

// hashJob is one regular file that the walker hands to a hash worker. The
// walker keeps a pointer and the worker fills digest and err; the entry is
// only touched after the scan's pending jobs are done.
type hashJob struct {
	scan   *scanner
	entry  int
	path   string
	key    inodeKey
	size   int64
	digest Hash
	err    error
}

// hashBufSize is a hash worker's read size. Reads of 64 KiB to 1 MiB hash at
// the same rate here, and mmap of large files is slower (its page faults
// cost more than the copy: docs/benchmarks.md); 256 KiB fits in a core's L2.
const hashBufSize = 256 << 10

// inlineMax is the size up to which a walker that has its own fileHasher
// (Store.Verify's, which run one per core) hashes a file itself: one read,
// no hand-off between goroutines.
const inlineMax = 64 << 10

// fileHasher is what a goroutine needs to hash files, kept for as long as the
// goroutine hashes: its read buffer and BLAKE3 state. fileHashers keeps them
// between scans, so that a scan does not allocate (and zero) its buffers.
type fileHasher struct {
	buf []byte
	h   *blake3.Hasher
}

var fileHashers = sync.Pool{New: func() any {
	return &fileHasher{buf: make([]byte, hashBufSize), h: blake3.New()}
}}

// hashPool is a set of hash workers that any number of scans share: one per
// core for a whole Store.Verify, instead of workers and buffers per path.
type hashPool struct {
	jobs chan *hashJob
	wg   sync.WaitGroup
}

// newHashPool starts n workers, which hash until close; ctx cancels the
// hash in progress.
func newHashPool(ctx context.Context, n int) *hashPool {
	p := &hashPool{jobs: make(chan *hashJob, 256)}
	for range n {
		p.wg.Go(func() {
			fh := fileHashers.Get().(*fileHasher)
			defer fileHashers.Put(fh)
			for j := range p.jobs {
				j.run(ctx, fh)
			}
		})
	}
	return p
}

// close stops the workers once every job handed to them is done.
func (p *hashPool) close() {
	close(p.jobs)
	p.wg.Wait()
}

func (j *hashJob) run(ctx context.Context, fh *fileHasher) {
	defer j.scan.pending.Done()
	if j.scan.failed.Load() {
		return // another file of the scan failed: the scan fails with it
	}
	d, err := fh.hashFile(ctx, j.path, j.key, j.size, &j.scan.failed)
	switch {
	case err == errHashFailed: // stopped by another file's failure
	case err != nil:
		j.err = err
		j.scan.failed.Store(true)
	default:
		j.digest = d
	}
}

// errHashFailed stops a walk when a file it handed to a worker failed to
// hash; the scan returns that file's error.
var errHashFailed = errors.New("a file failed to hash")

// ScanTree walks root (a directory or a single regular file; a symlink as
// root is refused) without following symlinks, and returns its manifest.
// File contents are hashed by runtime.GOMAXPROCS workers while the walk goes
// on, so that hashing runs at disk speed.
func ScanTree(ctx context.Context, root string) (*Manifest, error) {
	pool := newHashPool(ctx, runtime.GOMAXPROCS(0))
	defer pool.close()
	return scanTree(ctx, root, nil, pool, nil)
}

// scanTree is ScanTree with root's lstat (st, or nil to lstat it here) and
// the hash workers given: pool, which may be shared with other scans, and,
// if fh is not nil, the walker's own fileHasher, with which it hashes files
// of up to inlineMax bytes itself.
func scanTree(ctx context.Context, root string, st *unix.Stat_t, pool *hashPool, fh *fileHasher) (*Manifest, error) {
	if st == nil {
		st = new(unix.Stat_t)
		if err := unix.Lstat(root, st); err != nil {
			return nil, fmt.Errorf("scan %s: %w", root, err)
		}
	}
	if t := st.Mode & unix.S_IFMT; t != unix.S_IFDIR && t != unix.S_IFREG {
		return nil, fmt.Errorf("scan %s: not a directory or regular file", root)
	}
	s := &scanner{pool: pool, fh: fh}
	walkErr := s.walk(ctx, ".", root, st)
	s.pending.Wait()
	// A worker's failure stops the walk; report the cause, not the stop,
	// and a real error before a cancellation.
	if walkErr != nil && walkErr != errHashFailed && !errors.Is(walkErr, context.Canceled) {
		return nil, walkErr
	}
	for _, j := range s.hashed {
		if j.err != nil && !errors.Is(j.err, context.Canceled) {
			return nil, j.err
		}
	}
	if walkErr != nil && walkErr != errHashFailed {
		return nil, walkErr
	}
	for _, j := range s.hashed {
		if j.err != nil {
			return nil, j.err
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("scan %s: %w", root, err)
	}
	for _, j := range s.hashed {
		s.m.Entries[j.entry].Digest = j.digest
	}
	return &s.m, nil
}

type scanner struct {
	m       Manifest
	pool    *hashPool
	fh      *fileHasher // nil: every file goes to the pool
	hashed  []*hashJob
	pending sync.WaitGroup      // jobs handed to the pool and not done
	failed  atomic.Bool         // a job failed: stop walking and hashing
	links   map[inodeKey]string // first path of each multiply linked file
}

func (s *scanner) walk(ctx context.Context, rel, full string, st *unix.Stat_t) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("scan %s: %w", full, err)
	}
	if s.failed.Load() {
		return errHashFailed
	}
	xattrs, err := readManifestXattrs(full)
	if err != nil {
		return fmt.Errorf("scan %s: %w", full, err)
	}
	e := Entry{Path: rel, Mode: st.Mode & 07777, UID: st.Uid, GID: st.Gid, Mtime: st.Mtim.Sec, Xattrs: xattrs}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		key := inodeKey{st.Dev, st.Ino}
		if first, ok := s.links[key]; ok {
			e.Type, e.Target = EntryHardlink, first
			break
		}
		if st.Nlink > 1 {
			if s.links == nil {
				s.links = make(map[inodeKey]string)
			}
			s.links[key] = rel
		}
		e.Type, e.Size = EntryFile, st.Size
		if s.fh != nil && st.Size <= inlineMax {
			if e.Digest, err = s.fh.hashFile(ctx, full, key, st.Size, nil); err != nil {
				return err
			}
			break
		}
		j := &hashJob{scan: s, entry: len(s.m.Entries), path: full, key: key, size: st.Size}
		s.hashed = append(s.hashed, j)
		s.pending.Add(1)
		select {
		case s.pool.jobs <- j:
		case <-ctx.Done():
			s.pending.Done()
			j.err = fmt.Errorf("scan %s: %w", full, ctx.Err())
			return j.err
		}
	case unix.S_IFDIR:
		e.Type = EntryDir
		s.m.Entries = append(s.m.Entries, e)
		names, err := readDirNames(full, st)
		if err != nil {
			return fmt.Errorf("scan %s: %w", full, err)
		}
		for _, name := range names {
			childFull, childRel := full+"/"+name, name
			if rel != "." {
				childRel = rel + "/" + name
			}
			var cst unix.Stat_t
			if err := unix.Lstat(childFull, &cst); err != nil {
				return fmt.Errorf("scan %s: %w", childFull, err)
			}
			if err := s.walk(ctx, childRel, childFull, &cst); err != nil {
				return err
			}
		}
		return nil
	case unix.S_IFLNK:
		target, err := os.Readlink(full)
		if err != nil {
			return fmt.Errorf("scan %s: %w", full, err)
		}
		e.Type, e.Target = EntrySymlink, target
	case unix.S_IFCHR:
		if st.Rdev == 0 {
			e.Type = EntryWhiteout
		} else {
			e.Type, e.Major, e.Minor = EntryChardev, unix.Major(st.Rdev), unix.Minor(st.Rdev)
		}
	case unix.S_IFBLK:
		e.Type, e.Major, e.Minor = EntryBlockdev, unix.Major(st.Rdev), unix.Minor(st.Rdev)
	case unix.S_IFIFO:
		e.Type = EntryFifo
	case unix.S_IFSOCK:
		return fmt.Errorf("scan %s: a socket is not store content", full)
	default:
		return fmt.Errorf("scan %s: unknown file type %#o", full, st.Mode&unix.S_IFMT)
	}
	s.m.Entries = append(s.m.Entries, e)
	return nil
}

// hashFile hashes the file at path, refusing it if it is no longer the
// inode the walk saw (key) or its size changed. It stops early if ctx is
// done or stop (if not nil) is set. The file is read with raw system calls
// into fh's buffer: an os.File would cost an allocation, a finalizer and an
// epoll registration attempt per file, which a store of small files feels.
func (fh *fileHasher) hashFile(ctx context.Context, path string, key inodeKey, size int64, stop *atomic.Bool) (Hash, error) {
	if testHookHashFile != nil {
		testHookHashFile(path)
	}
	fd, err := openNoFollowFD(path, key)
	if err != nil {
		return Hash{}, fmt.Errorf("scan %s: %w", path, err)
	}
	defer unix.Close(fd)
	h := fh.h
	h.Reset()
	var n int64
	for {
		if err := ctx.Err(); err != nil {
			return Hash{}, fmt.Errorf("scan %s: %w", path, err)
		}
		if stop != nil && stop.Load() {
			return Hash{}, errHashFailed
		}
		k, err := unix.Read(fd, fh.buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return Hash{}, fmt.Errorf("scan %s: read: %w", path, err)
		}
		if k == 0 {
			break
		}
		h.Write(fh.buf[:k])
		n += int64(k)
	}
	if n != size {
		return Hash{}, fmt.Errorf("scan %s: size %d, then read %d bytes: %w", path, size, n, errTreeChanged)
	}
	var d Hash
	h.Sum(d[:0])
	return d, nil
}

// testHookHashFile, if set by a test, runs before each file is hashed.
var testHookHashFile func(path string)

// openNoFollowFD is openNoFollow as a bare descriptor, closed by the caller.
func openNoFollowFD(path string, key inodeKey) (int, error) {
	flags := unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_CLOEXEC
	fd, err := openRetry(path, flags|unix.O_NOATIME)
	if err == unix.EPERM {
		fd, err = openRetry(path, flags)
	}
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: path, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, &os.PathError{Op: "fstat", Path: path, Err: err}
	}
	if st.Dev != key.dev || st.Ino != key.ino {
		unix.Close(fd)
		return -1, fmt.Errorf("replaced by another file: %w", errTreeChanged)
	}
	return fd, nil
}

func openRetry(path string, flags int) (int, error) {
	for {
		fd, err := unix.Open(path, flags, 0)
		if err != unix.EINTR {
			return fd, err
		}
	}
}

// openNoFollow opens path for reading without following a symlink in its
// last component and checks that it is the inode the walk saw (key).
// O_NOATIME keeps reads from touching atimes; only the owner or root may
// ask for it, so others fall back.
func openNoFollow(path string, key inodeKey) (*os.File, error) {
	flags := os.O_RDONLY | syscall.O_NOFOLLOW
	f, err := os.OpenFile(path, flags|syscall.O_NOATIME, 0)
	if errors.Is(err, syscall.EPERM) {
		f, err = os.OpenFile(path, flags, 0)
	}
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || st.Dev != key.dev || st.Ino != key.ino {
		f.Close()
		return nil, fmt.Errorf("replaced by another file: %w", errTreeChanged)
	}
	return f, nil
}

// readDirNames returns the names in directory path, sorted by byte order,
// after checking that path is still the directory st describes. It reads with
// raw system calls: an os.File costs an allocation and three system calls
// more per directory (poller registration, non-blocking mode).
func readDirNames(path string, st *unix.Stat_t) ([]string, error) {
	fd, err := openRetry(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_DIRECTORY|unix.O_CLOEXEC)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	var fst unix.Stat_t
	if err := unix.Fstat(fd, &fst); err != nil {
		return nil, &os.PathError{Op: "fstat", Path: path, Err: err}
	}
	if fst.Dev != st.Dev || fst.Ino != st.Ino {
		return nil, fmt.Errorf("replaced by another directory: %w", errTreeChanged)
	}
	var buf [8192]byte
	var names []string
	for {
		n, err := unix.Getdents(fd, buf[:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, &os.PathError{Op: "readdirent", Path: path, Err: err}
		}
		if n <= 0 {
			break
		}
		// ParseDirent leaves out "." and "..".
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
	}
	for _, name := range names {
		// The kernel never returns these; a path built from one could
		// leave the tree.
		if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") {
			return nil, fmt.Errorf("directory holds an impossible name %q", name)
		}
	}
	slices.Sort(names)
	return names, nil
}

// readManifestXattrs returns those of path's xattrs that manifests record,
// sorted by name, without following a symlink.
func readManifestXattrs(path string) ([]Xattr, error) {
	var small [256]byte
	buf := small[:]
	for {
		n, err := unix.Llistxattr(path, buf)
		if errors.Is(err, unix.ENOTSUP) {
			return nil, nil
		}
		if errors.Is(err, unix.ERANGE) {
			if n, err = unix.Llistxattr(path, nil); err != nil {
				return nil, fmt.Errorf("list xattrs: %w", err)
			}
			buf = make([]byte, n+64)
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("list xattrs: %w", err)
		}
		buf = buf[:n]
		break
	}
	if len(buf) == 0 {
		return nil, nil
	}
	var xs []Xattr
	for _, name := range manifestXattrs {
		onDisk := name
		if name == opaqueXattr {
			onDisk = opaqueOnDisk(buf)
		}
		if onDisk == "" || !hasXattrName(buf, onDisk) {
			continue
		}
		v, err := lgetxattr(path, onDisk)
		if errors.Is(err, unix.ENODATA) {
			continue // removed since the listing
		}
		if err != nil {
			return nil, fmt.Errorf("get xattr %s: %w", onDisk, err)
		}
		xs = append(xs, Xattr{Name: name, Value: v})
	}
	return xs, nil
}

// opaqueOnDisk returns the name the opaque mark has in list (as listxattr(2)
// returns it), or "". A directory with both (only root sees trusted.*, and
// only a tree made by hand has both) is recorded with the value of
// OpaqueXattr, the name this process's overlays obey.
func opaqueOnDisk(list []byte) string {
	own, other := OpaqueXattr(), opaqueXattr
	if own == opaqueXattr {
		other = userOpaqueXattr
	}
	switch {
	case hasXattrName(list, own):
		return own
	case hasXattrName(list, other):
		return other
	}
	return ""
}

// hasXattrName reports whether list, as listxattr(2) returns it (names each
// followed by NUL), holds name.
func hasXattrName(list []byte, name string) bool {
	for len(list) > 0 {
		i := bytes.IndexByte(list, 0)
		if i < 0 {
			return string(list) == name
		}
		if string(list[:i]) == name {
			return true
		}
		list = list[i+1:]
	}
	return false
}

func lgetxattr(path, name string) ([]byte, error) {
	for {
		n, err := unix.Lgetxattr(path, name, nil)
		if err != nil {
			return nil, err
		}
		v := make([]byte, n)
		m, err := unix.Lgetxattr(path, name, v)
		if errors.Is(err, unix.ERANGE) {
			continue // grew between the calls
		}
		if err != nil {
			return nil, err
		}
		return v[:m], nil
	}
}

// ClampTimes sets the atime and mtime of every entry under root, root
// included and without following symlinks, to min(mtime, epoch) with zero
// nanoseconds, so that a tree's timestamps do not depend on when it was made.
// Children are set before their parent: reading a directory may touch its
// atime.
func ClampTimes(root string, epoch int64) error {
	var st unix.Stat_t
	if err := unix.Lstat(root, &st); err != nil {
		return fmt.Errorf("clamp times %s: %w", root, err)
	}
	return clampTimes(root, &st, epoch)
}

func clampTimes(path string, st *unix.Stat_t, epoch int64) error {
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		names, err := readDirNames(path, st)
		if err != nil {
			return fmt.Errorf("clamp times %s: %w", path, err)
		}
		for _, name := range names {
			child := path + "/" + name
			var cst unix.Stat_t
			if err := unix.Lstat(child, &cst); err != nil {
				return fmt.Errorf("clamp times %s: %w", child, err)
			}
			if err := clampTimes(child, &cst, epoch); err != nil {
				return err
			}
		}
	}
	t := min(st.Mtim.Sec, epoch)
	ts := []unix.Timespec{{Sec: t}, {Sec: t}}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, path, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("clamp times %s: %w", path, err)
	}
	return nil
}

// SyncTree makes everything under root durable: one syncfs(2) of the
// filesystem holding root, cheaper than an fsync per file, then an fsync of
// root itself.
func SyncTree(root string) error {
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("sync %s: %w", root, err)
	}
	defer unix.Close(fd)
	if err := unix.Syncfs(fd); err != nil {
		return fmt.Errorf("sync %s: syncfs: %w", root, err)
	}
	if err := unix.Fsync(fd); err != nil {
		return fmt.Errorf("sync %s: %w", root, err)
	}
	return nil
}
