// Package audit keeps the supervisor's audit log: every privileged action and every Bench event, in an
// append-only file whose entries are chained by hash, so that a changed, removed or reordered entry
// shows.
//
//	<root>/audit/log.jsonl   one entry per line, each line exactly the entry's canonical JSON (as
//	                         encoding/json writes Entry) and a newline: {"seq":N,...,"prev":HASH,"hash":HASH}
//	<root>/audit/head        "SEQ HASH END": the seq and hash of the last entry made durable and the
//	                         byte offset where its line ends, replaced atomically. Entries cut from
//	                         the end show against it. Entries noted after it (written without
//	                         waiting for an fsync, marked "noted") are covered by the next Append,
//	                         or the flusher's commit within FlushDelay; a durable entry after it
//	                         means the head lags (or an Append was killed before its head).
//
// An entry's hash is BLAKE3 of the previous entry's hash and the entry's canonical JSON without its
// hash. The log is a record of what happened, not a defence against root: whoever can write the store
// can rewrite the whole chain and its head. What the chain gives is that a partial edit (one entry
// changed, dropped, moved, or the tail cut) is found by `shed audit verify`.
//
// No caller can blind the log. Every string field is bounded (MaxField bytes of JSON, MaxDetail for
// the detail, escapes counted), so a line is at most MaxLine bytes: a longer value is cut on a UTF-8
// boundary and ends with "…[truncated, N bytes, blake3:HEX]", the length and hash of the whole. The
// appender finds the last entry by structure, not by reading back a window: from the end it
// remembers of its own last write while the file still ends there, else from the entry the head
// names (checked), else (a head of the old "SEQ HASH" form, or none) from the start, it reads line by
// line to the end. A line that is not an entry (a torn write, an edit) is skipped by the appender
// and reported by Verify, which goes on with the next line.
package audit

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/zeebo/blake3"
	"golang.org/x/sys/unix"

	"toolshed.dev/shed/internal/atomicfile"
)

// Entry is one thing that happened.
type Entry struct {
	Seq  int64     `json:"seq"`  // its place in the log, from 1
	Time time.Time `json:"time"` // when
	// Who: the caller's user name and role, as the kernel identified them. Never a secret (an API
	// key is logged as the user it acts for).
	User string `json:"user,omitempty"`
	Role string `json:"role,omitempty"`
	Via  string `json:"via,omitempty"` // how, when not the socket: "e2b key ID" (a key's public id)
	// What: an operation of the API (bench.run, workshop.promote, ...), a Bench event (bench.start,
	// bench.end, net.allowed, net.refused, net.cut, net.dropped), or audit.dropped (refusals counted, not
	// written one by one).
	Event    string `json:"event"`
	Bench    string `json:"bench,omitempty"`    // the Bench's name (never its id: app resolves one)
	Workshop string `json:"workshop,omitempty"` // its Workshop (a record's name, or a recipe file)
	Version  int    `json:"version,omitempty"`  // the record version, when it is one
	// DiffSHA256 is a promotion's confirmed diff.
	DiffSHA256 string `json:"diff_sha256,omitempty"`
	Dest       string `json:"dest,omitempty"`  // a network destination (host:port)
	Error      string `json:"error,omitempty"` // the error code, if it failed
	Detail     string `json:"detail,omitempty"`
	Count      int64  `json:"count,omitempty"` // how many, in an entry that counts (audit.dropped)
	// Intent: written before an operation that must not act unrecorded acts; its outcome is a later
	// entry whose Of is this one's seq. An intent with no outcome: the operation never ended.
	Intent bool  `json:"intent,omitempty"`
	Of     int64 `json:"of,omitempty"`
	// Noted: written by Note, without an fsync. Noted entries may follow the head; durable ones
	// may not.
	Noted bool   `json:"noted,omitempty"`
	Prev  string `json:"prev"` // the previous entry's hash ("" for the first)
	Hash  string `json:"hash"` // this entry's
}

// The bounds of an entry, in bytes of JSON (a value's escapes count: "<" is 6 bytes, \u003c).
const (
	MaxField  = 256  // each string field but the detail, its truncation marker included
	MaxDetail = 1024 // the detail
	// MaxLine bounds an entry's whole line, newline included: the fields at their bounds (9 of
	// MaxField, one of MaxDetail) plus the keys, numbers, time and hashes (under 500 bytes).
	MaxLine = 4096
)

// bound cuts every string field of e to its bound.
func (e *Entry) bound() {
	for _, f := range []*string{&e.User, &e.Role, &e.Via, &e.Event, &e.Bench, &e.Workshop, &e.DiffSHA256, &e.Dest, &e.Error} {
		*f = bound(*f, MaxField)
	}
	e.Detail = bound(e.Detail, MaxDetail)
}

// bound returns s if its JSON string is at most max bytes, else the longest prefix of whole runes that
// fits with the marker "…[truncated, N bytes, blake3:HEX]" (the whole value's length and hash). Each
// byte of s that is not UTF-8 is first replaced by U+FFFD, as encoding/json would write it: a value
// with such a byte would not read back as the same string, and its line would be no entry (hidden
// from Entries, a problem to Verify) while the whole value's length and hash still name what was given.
func bound(s string, max int) string {
	v := validUTF8(s)
	if jsonLen(v) <= max {
		return v
	}
	sum := blake3.Sum256([]byte(s))
	marker := fmt.Sprintf("…[truncated, %d bytes, blake3:%x]", len(s), sum) // its JSON is itself
	room, i := max-len(marker), 0
	for i < len(v) {
		r, size := utf8.DecodeRuneInString(v[i:])
		if room -= runeLen(r, size); room < 0 {
			break
		}
		i += size
	}
	return v[:i] + marker
}

// validUTF8 is s with each byte that is not UTF-8 replaced by U+FFFD.
func validUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b.WriteRune(utf8.RuneError)
		} else {
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// jsonLen is the length of s's JSON encoding, quotes aside.
func jsonLen(s string) int {
	n := 0
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		n += runeLen(r, size)
		i += size
	}
	return n
}

// runeLen is the length of r's JSON encoding (size bytes of UTF-8, as utf8.DecodeRuneInString read
// it) as encoding/json writes it.
func runeLen(r rune, size int) int {
	switch {
	case r == '"', r == '\\', r == '\b', r == '\f', r == '\n', r == '\r', r == '\t':
		return 2
	case r == utf8.RuneError && size == 1, r < 0x20, r == '<', r == '>', r == '&', r == '\u2028', r == '\u2029':
		return 6 // \ufffd for a byte that is not UTF-8, \u00XX, \u003c, \u2028
	}
	return size
}

// Log is a store's audit log.
type Log struct {
	dir string
	mu  sync.Mutex // appends within this process; a flock serializes processes
	// last is where this process's last write left the log, while nobody else wrote after it.
	last *tail

	// Group commit: appends that wait for the disk at once share one fsync and one head. syncMu
	// makes one of them the one that syncs; durable is how far the file is known synced.
	syncMu  sync.Mutex
	durable *tail
	commits int // fsyncs made (for tests)
	// failed is the first fsync of the log that failed: after it, what the kernel held unwritten may
	// be gone while later fsyncs succeed (the pages marked clean), so nothing is said durable again
	// by this process: every commit returns it (a supervisor restarted over the log goes on).
	failed error

	// The flusher (FlushWithin): a noted entry is made durable within delay of its write (by this
	// timer, unless an Append comes first), so that noting many costs one fsync per batch.
	flushMu  sync.Mutex
	flushing *time.Timer
	delay    time.Duration
}

// syncFile is f.Sync (a test makes it fail).
var syncFile = (*os.File).Sync

// FlushDelay bounds how long the supervisor's noted entries wait for their fsync: what an OS crash
// or power loss can lose of the entries of a running supervisor.
const FlushDelay = 100 * time.Millisecond

// tail is where a log ends: its last entry, and whether a torn line follows it.
type tail struct {
	seq  int64
	hash string
	// the file (device, inode) and its size when the tail was found or written: valid while they hold
	dev, ino uint64
	size     int64
	// open: the file ends inside a line (a write cut short): the next write ends that line first
	open bool
}

// Open returns the audit log of the store at root.
func Open(root string) *Log { return &Log{dir: filepath.Join(root, "audit")} }

// FlushWithin starts the flusher: each noted entry is then synced at most d after it was written
// (0: by the next Append or Flush only, as in a process that ends soon). For a long-lived process,
// which calls Close when it stops.
func (l *Log) FlushWithin(d time.Duration) {
	l.flushMu.Lock()
	defer l.flushMu.Unlock()
	l.delay = d
}

// Close stops the flusher and syncs what it would have: for a process that stops. The log can still
// be appended to (its noted entries wait for the next Append or Flush).
func (l *Log) Close() error {
	l.flushMu.Lock()
	l.delay = 0
	if l.flushing != nil {
		l.flushing.Stop()
		l.flushing = nil
	}
	l.flushMu.Unlock()
	return l.Flush()
}

func (l *Log) file() string { return filepath.Join(l.dir, "log.jsonl") }
func (l *Log) head() string { return filepath.Join(l.dir, "head") }

// hashOf is the entry's hash: BLAKE3 of its canonical JSON with Hash empty (Prev is in it).
func hashOf(e Entry) string {
	e.Hash = ""
	b, _ := json.Marshal(e)
	h := blake3.Sum256(b)
	return hex.EncodeToString(h[:])
}

// Append adds e (its Seq, Time, Prev and Hash are set here, its fields bounded) durably: the entry,
// and a head that names it or an entry after it, are fsynced before Append returns. For what the
// supervisor did for a caller, before it answers. It returns the entry as written. Appends waiting
// at once share their fsyncs (group commit): each still returns only after an fsync that began after
// its entry was written.
func (l *Log) Append(e Entry) (Entry, error) { return l.append(e, true) }

// Note adds e without waiting for the disk, marked noted: for what must not wait for an fsync (a
// running Bench's events, an operation whose own effects are not durable either). It is written
// before Note returns, so the process's crash loses nothing; the OS's crash can lose it until it is
// synced: by the next Append (one fsync covers the file) or Flush, or by the flusher (FlushWithin),
// whichever is first. Each moves the head past it.
func (l *Log) Note(e Entry) error {
	_, err := l.append(e, false)
	if err == nil {
		l.armFlush()
	}
	return err
}

// armFlush starts the flusher, unless it is waiting already (its flush covers this entry too).
func (l *Log) armFlush() {
	l.flushMu.Lock()
	defer l.flushMu.Unlock()
	if l.flushing == nil && l.delay > 0 {
		l.flushing = time.AfterFunc(l.delay, func() {
			l.flushMu.Lock()
			l.flushing = nil
			l.flushMu.Unlock()
			_ = l.Flush() // a failed fsync is every later commit's error (failed), Append's and Flush's
		})
	}
}

// Flush makes durable every entry this process wrote (noted ones), and moves the head past them: for
// the flusher, and Close. Without such entries it costs nothing.
func (l *Log) Flush() error {
	l.mu.Lock()
	w := l.last
	l.mu.Unlock()
	if w == nil {
		return nil
	}
	l.syncMu.Lock()
	d := l.durable
	l.syncMu.Unlock()
	if d != nil && d.dev == w.dev && d.ino == w.ino && d.size >= w.size {
		return nil
	}
	f, err := os.OpenFile(l.file(), os.O_RDWR|os.O_APPEND|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	if st.Dev != w.dev || st.Ino != w.ino {
		return nil // the file this process wrote is no longer the log
	}
	return l.commit(f, *w)
}

func (l *Log) append(e Entry, durable bool) (Entry, error) {
	f, written, err := l.write(e, durable)
	if err != nil {
		return e, err
	}
	defer f.Close()
	if !durable {
		return written.e, nil
	}
	return written.e, l.commit(f, written.at)
}

// written is an entry as written, and where its line ends.
type written struct {
	e  Entry
	at tail
}

// write appends e's line (under the process's lock and the file's) and returns the file, still
// open, and the entry as written.
func (l *Log) write(e Entry, durable bool) (*os.File, written, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := atomicfile.MkdirAll(l.dir, 0o700); err != nil {
		return nil, written{}, fmt.Errorf("audit: %w", err)
	}
	f, err := os.OpenFile(l.file(), os.O_CREATE|os.O_RDWR|os.O_APPEND|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, written{}, fmt.Errorf("audit: %w", err)
	}
	e, err = l.writeLocked(f, e, durable)
	_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
	if err != nil {
		f.Close()
		return nil, written{}, err
	}
	return f, written{e: e, at: *l.last}, nil
}

func (l *Log) writeLocked(f *os.File, e Entry, durable bool) (Entry, error) {
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		return e, fmt.Errorf("audit: %w", err)
	}
	t, err := l.tail(f)
	if err != nil {
		return e, err
	}
	e.bound()
	e.Seq, e.Prev, e.Noted = t.seq+1, t.hash, !durable
	if e.Time.IsZero() {
		e.Time = time.Now().UTC()
	}
	e.Hash = hashOf(e)
	b, err := json.Marshal(e)
	if err != nil {
		return e, fmt.Errorf("audit: %w", err)
	}
	line := make([]byte, 0, len(b)+2)
	if t.open {
		line = append(line, '\n') // the torn line ends here: Verify reports it, appends go on
	}
	line = append(append(line, b...), '\n')
	l.last = nil // until the write is known whole
	if _, err := f.Write(line); err != nil {
		return e, fmt.Errorf("audit: append: %w", err)
	}
	l.last = &tail{seq: e.Seq, hash: e.Hash, dev: t.dev, ino: t.ino, size: t.size + int64(len(line))}
	return e, nil
}

// commit returns once the log is fsynced past w (an entry this process wrote to f) and the head
// names w or an entry after it. Of the appends waiting at once, one syncs for all: it finds, under
// both locks, where the log ends now (entries other appends, of this process or another, wrote
// since), fsyncs without them (writers go on meanwhile: what they add is not named), and writes the
// head for that end under the file's lock, unless the head names it or a later one already (another
// process's commit): a head never goes back.
func (l *Log) commit(f *os.File, w tail) error {
	l.syncMu.Lock()
	defer l.syncMu.Unlock()
	if d := l.durable; d != nil && d.dev == w.dev && d.ino == w.ino && d.size >= w.size {
		return nil // an fsync that began after w was written covered it
	}
	if l.failed != nil {
		return l.failed
	}
	t, err := l.end(f)
	if err != nil {
		return err
	}
	if err := syncFile(f); err != nil {
		l.failed = fmt.Errorf("audit: fsync: %w (an earlier fsync of the log failed: what it held may not be on disk)", err)
		return fmt.Errorf("audit: fsync: %w", err)
	}
	l.commits++
	// The head names the last entry and where its line ends: the file's end, unless a torn line
	// (a writer that crashed) follows it; then w, whose end is known.
	named := t
	if t.open || t.dev != w.dev || t.ino != w.ino {
		named = w
	}
	if err := l.forward(f, named); err != nil {
		return err
	}
	if !t.open {
		l.durable = &tail{dev: t.dev, ino: t.ino, size: t.size}
	} else {
		l.durable = &tail{dev: w.dev, ino: w.ino, size: w.size}
	}
	return nil
}

// end is where the log in f ends now, found under both locks.
func (l *Log) end(f *os.File) (tail, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		return tail{}, fmt.Errorf("audit: %w", err)
	}
	defer unix.Flock(int(f.Fd()), unix.LOCK_UN)
	return l.tail(f)
}

// forward writes the head for named (synced), unless it names named or a later entry already: under
// the file's lock, which every head's writer holds.
func (l *Log) forward(f *os.File, named tail) error {
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	defer unix.Flock(int(f.Fd()), unix.LOCK_UN)
	if h, err := l.readHead(); err != nil || h.seq < named.seq {
		line := fmt.Sprintf("%d %s %d\n", named.seq, named.hash, named.size)
		if err := atomicfile.WriteFile(l.head(), []byte(line), 0o600); err != nil {
			return fmt.Errorf("audit: %w", err)
		}
	}
	return nil
}

// tail finds the log's last entry, by structure: it reads whole lines forward from a known entry's
// end (its own last write's while the file ends there, else the head's), to the end of the file.
// Lines that are not entries are skipped (Verify reports them). A last line without its newline is a
// write a crash cut short: it is kept, as evidence and as Verify's to report, and the next write
// ends it; the log stays appendable, chained on from the last whole entry (or from the torn line,
// if it is a whole entry that lacks only its newline).
func (l *Log) tail(f *os.File) (tail, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return tail{}, fmt.Errorf("audit: %w", err)
	}
	t := tail{dev: st.Dev, ino: st.Ino, size: st.Size}
	if k := l.last; k != nil && k.dev == t.dev && k.ino == t.ino && k.size == t.size {
		return *k, nil
	}
	start := int64(0)
	// A head that does not read, or whose entry is not where it says, is not followed: the log is
	// read from its start (and Verify reports the head).
	if h, err := l.readHead(); err == nil && h.end > 0 && h.end <= t.size && entryEndsAt(f, h) {
		start, t.seq, t.hash = h.end, h.seq, h.hash
	}
	// Noted entries move no head, so a process that did not write the last entry reads from the end
	// first: the last line that is an entry is the tail, as the forward read would find it, without
	// reading every entry noted since the last fsync (a supervisor notes one per Bench event).
	if found, err := lastEntry(f, start, &t); err != nil || found {
		return t, err
	}
	return scanTail(f, start, t)
}

// scanTail reads forward from start (the end of a known entry, or 0) to t.size: the last line that
// is an entry is the tail.
func scanTail(f *os.File, start int64, t tail) (tail, error) {
	err := lines(io.NewSectionReader(f, start, t.size-start), start, func(_ int, _ int64, line []byte, _ int64, ended bool) {
		if e, err := parse(line); err == nil {
			t.seq, t.hash = e.Seq, e.Hash
		}
		t.open = !ended
	})
	if err != nil {
		return tail{}, fmt.Errorf("audit: read the log: %w", err)
	}
	return t, nil
}

// tailWindow is how much of the log's end lastEntry reads: many entries (a line is at most MaxLine).
const tailWindow = 16 * MaxLine

// lastEntry finds the tail in the last tailWindow bytes after start: the last line there that is an
// entry, or the torn line after it if that one is. It says whether it found one; if not (no line
// there is an entry, or the window holds no whole line), only scanTail can say.
func lastEntry(f *os.File, start int64, t *tail) (bool, error) {
	if t.size <= start {
		return false, nil
	}
	lo := max(start, t.size-tailWindow)
	buf := make([]byte, t.size-lo)
	if _, err := f.ReadAt(buf, lo); err != nil {
		return false, fmt.Errorf("audit: read the log: %w", err)
	}
	open := buf[len(buf)-1] != '\n'
	if !open {
		buf = buf[:len(buf)-1]
	}
	for {
		i := bytes.LastIndexByte(buf, '\n')
		if i < 0 && lo > start {
			return false, nil // the window's first line may begin before it
		}
		// The torn line, if any, comes first; after it, whole lines. Either kind, if it is an
		// entry, is the tail (as in scanTail, where the last line that parses wins).
		if e, err := parse(buf[i+1:]); err == nil {
			t.seq, t.hash, t.open = e.Seq, e.Hash, open
			return true, nil
		}
		if i < 0 {
			return false, nil
		}
		buf = buf[:i]
	}
}

// entryEndsAt says whether h's entry is the line that ends at h.end.
func entryEndsAt(f *os.File, h head) bool {
	lo := max(0, h.end-MaxLine-1)
	buf := make([]byte, h.end-lo)
	if _, err := f.ReadAt(buf, lo); err != nil || buf[len(buf)-1] != '\n' {
		return false
	}
	buf = buf[:len(buf)-1]
	i := bytes.LastIndexByte(buf, '\n')
	if i < 0 && lo > 0 {
		return false
	}
	e, err := parse(buf[i+1:])
	return err == nil && e.Seq == h.seq && e.Hash == h.hash
}

// maxRead bounds the lines read whole: entries written before fields were bounded could be up to a
// request's size (1 MiB) escaped. A longer line is no entry.
const maxRead = 16 << 20

// lines calls fn with each line of r, which starts at offset off of the log: its number (from 1), its
// offset, its bytes without the newline (nil if it is longer than maxRead; fn must not keep them),
// its length with the newline, and whether a newline ends it (only the last line may not).
func lines(r io.Reader, off int64, fn func(n int, off int64, line []byte, size int64, ended bool)) error {
	br := bufio.NewReaderSize(r, 64<<10)
	var buf []byte
	var size int64
	long := false
	for n := 1; ; {
		chunk, err := br.ReadSlice('\n')
		size += int64(len(chunk))
		if !long && size > maxRead {
			long, buf = true, nil
		} else if !long {
			buf = append(buf, chunk...)
		}
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case err == nil:
			if !long {
				buf = buf[:len(buf)-1]
			}
			fn(n, off, buf, size, true)
		case errors.Is(err, io.EOF):
			if size > 0 {
				fn(n, off, buf, size, false)
			}
			return nil
		default:
			return err
		}
		n, off, buf, size, long = n+1, off+size, buf[:0], 0, false
	}
}

// errText is a line with more than an entry on it.
var errText = errors.New("text after the entry")

// parse reads a line (without its newline) as an entry: it must be exactly the entry's canonical
// JSON, as Append writes it. Anything else on the line, or another encoding of the same entry, is not
// an entry.
func parse(line []byte) (Entry, error) {
	var e Entry
	if line == nil {
		return e, fmt.Errorf("longer than %d bytes", maxRead)
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil {
		return e, fmt.Errorf("it does not parse: %v", err)
	}
	if len(bytes.TrimSpace(line[dec.InputOffset():])) > 0 {
		return e, errText
	}
	if b, err := json.Marshal(e); err != nil || !bytes.Equal(b, line) {
		return e, errors.New("not in its canonical encoding (spaces, order or escapes changed)")
	}
	if e.Seq < 1 {
		return e, errors.New("no seq")
	}
	return e, nil
}

// head is what the head file says: the last durable entry's seq and hash, and where its line ends (0:
// not said, a head written before it was).
type head struct {
	seq  int64
	hash string
	end  int64
}

// readHead reads the head (zero for none).
func (l *Log) readHead() (head, error) {
	b, err := os.ReadFile(l.head())
	if errors.Is(err, os.ErrNotExist) {
		return head{}, nil
	} else if err != nil {
		return head{}, fmt.Errorf("audit: %w", err)
	}
	f := strings.Fields(string(b))
	var h head
	var errs [2]error
	if len(f) == 2 || len(f) == 3 {
		h.seq, errs[0] = strconv.ParseInt(f[0], 10, 64)
		h.hash = f[1]
		if len(f) == 3 {
			h.end, errs[1] = strconv.ParseInt(f[2], 10, 64)
		}
	}
	if (len(f) != 2 && len(f) != 3) || errs[0] != nil || errs[1] != nil || h.seq < 0 || h.end < 0 {
		return head{}, fmt.Errorf("audit: %s: not SEQ HASH END", l.head())
	}
	return h, nil
}

// Filter selects entries: by user, by Bench (empty: any).
type Filter struct {
	User, Bench string
	// BenchAliases are the Bench's other names (its id): entries written before every entry carried
	// the Bench's name named it by whichever the request did.
	BenchAliases []string
}

// matchBench says whether an entry of Bench b is one f selects.
func (f Filter) matchBench(b string) bool {
	if f.Bench == "" || b == f.Bench {
		return true
	}
	for _, a := range f.BenchAliases {
		if a != "" && b == a {
			return true
		}
	}
	return false
}

// Entries returns the log's entries that match f, oldest first. Lines that are not entries are left
// out (Verify reports them).
func (l *Log) Entries(f Filter) ([]Entry, error) {
	out := []Entry{}
	err := l.each(func(n int, off int64, line []byte, size int64, ended bool) {
		if e, err := parse(line); err == nil && (f.User == "" || e.User == f.User) && f.matchBench(e.Bench) {
			out = append(out, e)
		}
	})
	return out, err
}

// each calls fn with each line of the log (see lines).
func (l *Log) each(fn func(n int, off int64, line []byte, size int64, ended bool)) error {
	f, err := os.Open(l.file())
	if errors.Is(err, os.ErrNotExist) {
		return nil
	} else if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	defer f.Close()
	if err := lines(f, 0, fn); err != nil {
		return fmt.Errorf("audit: read the log: %w", err)
	}
	return nil
}

// Problem is what verification found wrong, at a line of the log (0: the head).
type Problem struct {
	Line int    `json:"line"`
	What string `json:"what"`
}

// Verify checks the log line by line: each is exactly an entry's canonical JSON; each entry's seq
// follows the one before, its prev is that entry's hash, its hash is its own; the head's entry is
// there, where the head says, and no durable entry follows it. It returns the number of entries and
// what is wrong; a line that is not an entry is a problem, and the check goes on with the next.
func (l *Log) Verify() (int, []Problem, error) {
	var problems []Problem
	add := func(line int, format string, args ...any) {
		problems = append(problems, Problem{line, fmt.Sprintf(format, args...)})
	}
	h, err := l.readHead()
	if err != nil {
		add(0, "%v: the head was changed or damaged; entries cut from the end cannot be found", err)
		h = head{}
	}
	var seq int64
	prev, n, last := "", 0, 0
	headSeen, lags := h.seq == 0, false
	var lagSeq int64
	lagAt := -1
	err = l.each(func(line int, off int64, b []byte, size int64, ended bool) {
		last = line
		e, err := parse(b)
		if !ended {
			add(line, "the last line has no end: a write was cut short (a crash); the next append ends it")
		}
		if err != nil {
			add(line, "not an entry (%v): a write cut short, or an edit", err)
			return
		}
		n++
		if e.Seq == h.seq {
			headSeen = true
			if e.Hash != h.hash {
				add(line, "the head names another hash for this entry: it changed")
			} else if h.end > 0 && h.end != off+size {
				add(line, "the head says this entry ends at byte %d, it ends at %d: the log before it changed", h.end, off+size)
			}
		}
		if e.Seq > h.seq && !e.Noted && !lags {
			lags, lagSeq, lagAt = true, e.Seq, len(problems)
			add(line, "the head lags: this entry was made durable after the head's entry (seq %d), yet the head does not name it: the head was put back, or the writer stopped between the two", h.seq)
		}
		switch {
		case e.Seq != seq+1:
			add(line, "seq %d follows %d: an entry before it was removed or moved", e.Seq, seq)
		case e.Prev != prev:
			add(line, "its prev is not the hash of the entry before it: that entry changed, or this one moved")
		}
		if hashOf(e) != e.Hash {
			add(line, "its hash is not its own: it was changed")
		}
		seq, prev = e.Seq, e.Hash
	})
	if err != nil {
		return n, problems, err
	}
	if !headSeen || h.seq > seq {
		add(last, "the head says the log reaches %d, it ends at %d: entries were cut from the end (or the head changed)", h.seq, seq)
	}
	if lags && inFlight(l, lagSeq) {
		problems = slices.Delete(problems, lagAt, lagAt+1)
	}
	return n, problems, nil
}

// inFlight reports whether a durable entry the head did not name during the scan was an Append of a
// live writer between its write and its head (the fsync runs outside the file's lock, so a reader
// can see that moment): the head names it, or a later entry, within lagGrace. A writer that stopped
// there (killed, or the head put back) never moves the head, and the lag stays a problem.
func inFlight(l *Log, seq int64) bool {
	for deadline := time.Now().Add(lagGrace); ; time.Sleep(20 * time.Millisecond) {
		if h, err := l.readHead(); err == nil && h.seq >= seq {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

// lagGrace is how long Verify waits for a live writer's head: many fsyncs, even on a loaded disk.
var lagGrace = 3 * time.Second
