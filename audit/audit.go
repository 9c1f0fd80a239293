// Package audit keeps the supervisor's audit log: every privileged action and every Bench event, in an
// append-only file whose entries are chained by hash, so that a changed, removed or reordered entry
// shows.
//
//	<root>/audit/log.jsonl   one entry per line: {"seq":N,...,"prev":HASH,"hash":HASH}
//	<root>/audit/head        the seq and hash of the last entry made durable, replaced atomically:
//	                         entries cut from the end show against it (entries noted after it, a
//	                         running Bench's events written without an fsync, are covered by the next)
//
// An entry's hash is BLAKE3 of the previous entry's hash and the entry's canonical JSON without its
// hash. The log is a record of what happened, not a defence against root: whoever can write the store
// can rewrite the whole chain and its head. What the chain gives is that a partial edit (one entry
// changed, dropped, moved, or the tail cut) is found by `shed audit verify`.
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
	"strconv"
	"strings"
	"sync"
	"time"

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
	// What: an operation of the API (bench.run, workshop.promote, ...) or a Bench event (bench.start,
	// bench.end, net.allowed, net.refused).
	Event    string `json:"event"`
	Bench    string `json:"bench,omitempty"`    // the Bench's name
	Workshop string `json:"workshop,omitempty"` // its Workshop (a record's name, or a recipe file)
	Version  int    `json:"version,omitempty"`  // the record version, when it is one
	// DiffSHA256 is a promotion's confirmed diff.
	DiffSHA256 string `json:"diff_sha256,omitempty"`
	Dest       string `json:"dest,omitempty"`  // a network destination (host:port)
	Error      string `json:"error,omitempty"` // the error code, if it failed
	Detail     string `json:"detail,omitempty"`
	Prev       string `json:"prev"` // the previous entry's hash ("" for the first)
	Hash       string `json:"hash"` // this entry's
}

// Log is a store's audit log.
type Log struct {
	dir string
	mu  sync.Mutex // appends within this process; a flock serializes processes
}

// Open returns the audit log of the store at root.
func Open(root string) *Log { return &Log{dir: filepath.Join(root, "audit")} }

func (l *Log) file() string { return filepath.Join(l.dir, "log.jsonl") }
func (l *Log) head() string { return filepath.Join(l.dir, "head") }

// hashOf is the entry's hash: BLAKE3 of its canonical JSON with Hash empty (Prev is in it).
func hashOf(e Entry) string {
	e.Hash = ""
	b, _ := json.Marshal(e)
	h := blake3.Sum256(b)
	return hex.EncodeToString(h[:])
}

// Append adds e (its Seq, Time, Prev and Hash are set here), durably: the entry, and the head, are
// fsynced before Append returns. For what the supervisor did for a caller, before it answers.
func (l *Log) Append(e Entry) error { return l.append(e, true) }

// Note adds e without waiting for the disk: for the events of a running Bench (its start and end,
// each network destination), which must not slow it down. The next Append makes them durable with
// its own (one fsync covers the file), and moves the head past them.
func (l *Log) Note(e Entry) error { return l.append(e, false) }

func (l *Log) append(e Entry, durable bool) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := atomicfile.MkdirAll(l.dir, 0o700); err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	f, err := os.OpenFile(l.file(), os.O_CREATE|os.O_RDWR|os.O_APPEND|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	seq, prev, err := l.tail(f)
	if err != nil {
		return err
	}
	e.Seq, e.Prev = seq+1, prev
	if e.Time.IsZero() {
		e.Time = time.Now().UTC()
	}
	e.Hash = hashOf(e)
	b, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	if _, err := f.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("audit: append: %w", err)
	}
	if !durable {
		return nil
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("audit: fsync: %w", err)
	}
	return atomicfile.WriteFile(l.head(), []byte(strconv.FormatInt(e.Seq, 10)+" "+e.Hash+"\n"), 0o600)
}

// tail is the log's last entry's seq and hash, read from its end (the head may be behind it by the
// entries noted since the last Append).
func (l *Log) tail(f *os.File) (int64, string, error) {
	fi, err := f.Stat()
	if err != nil {
		return 0, "", fmt.Errorf("audit: %w", err)
	}
	if fi.Size() == 0 {
		return 0, "", nil
	}
	// An entry is one line of at most a few KiB: read back far enough for the last whole one.
	const back = 64 << 10
	off := max(0, fi.Size()-back)
	buf := make([]byte, fi.Size()-off)
	if _, err := f.ReadAt(buf, off); err != nil && err != io.EOF {
		return 0, "", fmt.Errorf("audit: %w", err)
	}
	buf = bytes.TrimRight(buf, "\n")
	line := buf[bytes.LastIndexByte(buf, '\n')+1:]
	var e Entry
	if err := json.Unmarshal(line, &e); err != nil {
		return 0, "", fmt.Errorf("audit: the last entry does not parse (run `shed audit verify`): %v", err)
	}
	return e.Seq, e.Hash, nil
}

// last is the head: the last entry's seq and hash (0 and "" for an empty log).
func (l *Log) last() (int64, string, error) {
	b, err := os.ReadFile(l.head())
	if errors.Is(err, os.ErrNotExist) {
		return 0, "", nil
	} else if err != nil {
		return 0, "", fmt.Errorf("audit: %w", err)
	}
	seqs, hash, ok := strings.Cut(strings.TrimSpace(string(b)), " ")
	seq, err := strconv.ParseInt(seqs, 10, 64)
	if !ok || err != nil {
		return 0, "", fmt.Errorf("audit: %s: not SEQ HASH", l.head())
	}
	return seq, hash, nil
}

// Filter selects entries: by user, by Bench (empty: any).
type Filter struct {
	User, Bench string
}

// Entries returns the log's entries that match f, oldest first.
func (l *Log) Entries(f Filter) ([]Entry, error) {
	out := []Entry{}
	err := l.each(func(e Entry, _ []byte) error {
		if (f.User == "" || e.User == f.User) && (f.Bench == "" || e.Bench == f.Bench) {
			out = append(out, e)
		}
		return nil
	})
	return out, err
}

func (l *Log) each(fn func(Entry, []byte) error) error {
	f, err := os.Open(l.file())
	if errors.Is(err, os.ErrNotExist) {
		return nil
	} else if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	defer f.Close()
	r := bufio.NewReaderSize(f, 64<<10)
	for n := 1; ; n++ {
		line, err := r.ReadBytes('\n')
		if len(line) > 0 {
			var e Entry
			dec := json.NewDecoder(bytes.NewReader(line))
			dec.DisallowUnknownFields()
			if derr := dec.Decode(&e); derr != nil {
				return fmt.Errorf("audit: line %d: %v", n, derr)
			}
			if ferr := fn(e, line); ferr != nil {
				return ferr
			}
		}
		if err == io.EOF {
			return nil
		} else if err != nil {
			return fmt.Errorf("audit: %w", err)
		}
	}
}

// Problem is what verification found wrong, at an entry.
type Problem struct {
	Line int    `json:"line"`
	What string `json:"what"`
}

// Verify checks the chain: each entry's seq follows the one before, its prev is that entry's hash, its
// hash is its own, and the last is the head. It returns the number of entries and what is wrong.
func (l *Log) Verify() (int, []Problem, error) {
	var problems []Problem
	var seq int64
	prev, n := "", 0
	hseq, hhash, err := l.last()
	if err != nil {
		return 0, nil, err
	}
	headSeen := hseq == 0
	err = l.each(func(e Entry, _ []byte) error {
		n++
		if e.Seq == hseq {
			headSeen = true
			if e.Hash != hhash {
				problems = append(problems, Problem{n, "the head names another hash for this entry: it changed"})
			}
		}
		switch {
		case e.Seq != seq+1:
			problems = append(problems, Problem{n, fmt.Sprintf("seq %d follows %d: an entry before it was removed or moved", e.Seq, seq)})
		case e.Prev != prev:
			problems = append(problems, Problem{n, "its prev is not the hash of the entry before it: that entry changed, or this one moved"})
		}
		if hashOf(e) != e.Hash {
			problems = append(problems, Problem{n, "its hash is not its own: it was changed"})
		}
		seq, prev = e.Seq, e.Hash
		return nil
	})
	if err != nil {
		return n, problems, err
	}
	if !headSeen || hseq > seq {
		problems = append(problems, Problem{n, fmt.Sprintf("the head says the log reaches %d, it ends at %d: entries were cut from the end (or the head changed)", hseq, seq)})
	}
	return n, problems, nil
}
