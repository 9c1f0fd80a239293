package store

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"

	"toolshed.dev/shed/internal/atomicfile"
)

// The registration records live in one bbolt database, db/meta.db, keyed by
// hash part (docs/architecture.md, "Metadata"). A path is valid exactly when
// its record is in the database (committed, so fsynced) and its bytes are in
// store/. gc deletes thousands of records in one transaction, so every record
// of what it deletes is durably gone, at once, before any byte is.
//
// bbolt lets one process at a time open the file for writing, and its own
// flock wait polls every 50 ms; so each operation opens the database for as
// long as it needs it, under db/lock (shared to read, exclusive to write,
// taken with our lock's short backoff), and closes it again: a Store held open
// by a Bench for hours must not keep builders from registering.
const (
	dirDB      = "db"      // meta.db, lock, and <2 chars>/<hash>.manifest|.provenance
	fileDB     = "meta.db" // the registration records
	fileDBLock = "lock"
	// dbShardLen is how many characters of the hash part name the directory
	// of a path's manifest and provenance: 1,024 directories, so that no
	// directory holds more than a few thousand entries at a million paths
	// and gc's parallel unlinks do not queue on one directory's lock.
	dbShardLen = 2
)

var (
	bucketPaths = []byte("paths")
	bucketMeta  = []byte("meta")
	keyFormat   = []byte("format")
)

// dbFormat is the version of the database's layout and record encoding,
// checked on every open so that a future change is detected, not misread.
const dbFormat = 1

func (s *Store) dbFile() string { return filepath.Join(s.root, dirDB, fileDB) }

// withDB runs fn on the open database, read-only unless write. A write commits
// (fsyncs) when fn returns nil and rolls back otherwise.
func (s *Store) withDB(ctx context.Context, write bool, fn func(paths *bolt.Bucket) error) error {
	s.dbOpens.Add(1)
	how := unix.LOCK_SH
	if write {
		how = unix.LOCK_EX
		s.dbMu.Lock()
		defer s.dbMu.Unlock()
	} else {
		s.dbMu.RLock()
		defer s.dbMu.RUnlock()
	}
	l, err := lock(ctx, filepath.Join(s.root, dirDB, fileDBLock), how)
	if err != nil {
		return err
	}
	defer l.unlock()
	// Under db/lock bbolt's own flock is never contended, so no Timeout.
	db, err := bolt.Open(s.dbFile(), 0o600, &bolt.Options{ReadOnly: !write})
	if err != nil {
		return fmt.Errorf("open %s: %w", s.dbFile(), err)
	}
	defer db.Close()
	run := func(tx *bolt.Tx) error {
		if v := tx.Bucket(bucketMeta).Get(keyFormat); len(v) != 1 || v[0] != dbFormat {
			return fmt.Errorf("%s: database format %v, want %d", s.dbFile(), v, dbFormat)
		}
		return fn(tx.Bucket(bucketPaths))
	}
	if write {
		return db.Update(run)
	}
	return db.View(run)
}

// createDB makes db/ and an empty database in it, if there is none.
func createDB(root string) error {
	dir := filepath.Join(root, dirDB)
	if err := atomicfile.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	name := filepath.Join(dir, fileDB)
	// Not skipped when the file exists: a crash in bolt.Open's creation, or
	// before the buckets were committed, leaves a file without them.
	l, err := lock(context.Background(), filepath.Join(dir, fileDBLock), unix.LOCK_EX)
	if err != nil {
		return err
	}
	defer l.unlock()
	db, err := bolt.Open(name, 0o600, nil)
	if err != nil {
		return fmt.Errorf("create %s: %w", name, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		if _, err := tx.CreateBucketIfNotExists(bucketPaths); err != nil {
			return err
		}
		m, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return err
		}
		return m.Put(keyFormat, []byte{dbFormat})
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("create %s: %w", name, err)
	}
	return syncDir(dir)
}

// shardDir is the directory of p's manifest and provenance.
func (s *Store) shardDir(p Path) string {
	return filepath.Join(s.root, dirDB, p.HashPart()[:dbShardLen])
}

// Record encoding: compact and binary, because gc decodes every record on
// each run (JSON took 7-9 s for 100,000 records here). Strings are
// uvarint-length-prefixed, lists uvarint-count-prefixed.
//
//	format byte (1) | flags byte | path | deriver ("" if none)
//	| references | build inputs | content hash (32 bytes) | size varint
//	| registered: unix seconds varint, nanoseconds uvarint | ca
const (
	recordFormat   = 1
	flagProvenance = 1 << 0 // a provenance file was (or is about to be) written beside the record
)

// encodeInfo encodes info's record; hasProv sets flagProvenance.
func encodeInfo(info *PathInfo, hasProv bool) []byte {
	n := 2 + 32 + 3*binary.MaxVarintLen64 + len(info.Path.base) + len(info.Deriver.base) + len(info.CA) + 5*binary.MaxVarintLen64
	for _, r := range info.References {
		n += len(r.base) + 2
	}
	for _, r := range info.BuildInputs {
		n += len(r.base) + 2
	}
	b := make([]byte, 0, n)
	var flags byte
	if hasProv {
		flags |= flagProvenance
	}
	b = append(b, recordFormat, flags)
	str := func(s string) {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	str(info.Path.base)
	str(info.Deriver.base)
	for _, l := range [][]Path{info.References, info.BuildInputs} {
		b = binary.AppendUvarint(b, uint64(len(l)))
		for _, r := range l {
			str(r.base)
		}
	}
	b = append(b, info.ContentHash[:]...)
	b = binary.AppendVarint(b, info.Size)
	b = binary.AppendVarint(b, info.Registered.Unix())
	b = binary.AppendUvarint(b, uint64(info.Registered.Nanosecond()))
	str(info.CA)
	return b
}

// recordReader decodes a record; the first error sticks.
type recordReader struct {
	b   []byte
	err error
}

func (r *recordReader) fail(what string) {
	if r.err == nil {
		r.err = fmt.Errorf("record cut short or damaged at %s", what)
	}
	r.b = nil
}

func (r *recordReader) uvarint(what string) uint64 {
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail(what)
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *recordReader) varint(what string) int64 {
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.fail(what)
		return 0
	}
	r.b = r.b[n:]
	return v
}

// bytes returns the next string's bytes, aliasing the record.
func (r *recordReader) bytes(what string) []byte {
	n := r.uvarint(what)
	if n > uint64(len(r.b)) {
		r.fail(what)
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

// path decodes a path, validated unless it is empty and may be.
func (r *recordReader) path(what string, mayBeEmpty bool) Path {
	b := r.bytes(what)
	if r.err != nil || (len(b) == 0 && mayBeEmpty) {
		return Path{}
	}
	p, err := ParsePath(string(b))
	if err != nil && r.err == nil {
		r.err = fmt.Errorf("%s: %w", what, err)
	}
	return p
}

func (r *recordReader) paths(what string) []Path {
	n := r.uvarint(what)
	if n > uint64(len(r.b)) {
		r.fail(what)
		return nil
	}
	ps := make([]Path, 0, n)
	for range n {
		ps = append(ps, r.path(what, false))
	}
	return ps
}

// decodeInfo decodes a record fully, checking every path in it.
func decodeInfo(b []byte) (info *PathInfo, hasProv bool, err error) {
	if len(b) < 2 {
		return nil, false, errors.New("record cut short")
	}
	if b[0] != recordFormat {
		return nil, false, fmt.Errorf("record format %d, want %d", b[0], recordFormat)
	}
	hasProv = b[1]&flagProvenance != 0
	r := &recordReader{b: b[2:]}
	info = &PathInfo{}
	info.Path = r.path("path", false)
	info.Deriver = r.path("deriver", true)
	info.References = r.paths("references")
	if bi := r.paths("build inputs"); len(bi) > 0 {
		info.BuildInputs = bi
	}
	if len(r.b) < len(info.ContentHash) {
		r.fail("content hash")
	} else {
		copy(info.ContentHash[:], r.b)
		r.b = r.b[len(info.ContentHash):]
	}
	info.Size = r.varint("size")
	sec := r.varint("registered")
	nsec := r.uvarint("registered")
	info.Registered = time.Unix(sec, int64(nsec)).UTC()
	info.CA = string(r.bytes("ca"))
	if r.err == nil && len(r.b) != 0 {
		r.err = errors.New("trailing bytes after the record")
	}
	if r.err != nil {
		return nil, false, r.err
	}
	return info, hasProv, nil
}
