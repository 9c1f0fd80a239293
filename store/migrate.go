package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"

	"toolshed.dev/shed/internal/atomicfile"
)

// A store made before db/meta.db kept each record as meta/<hash>.json, with
// meta/<hash>.manifest and meta/<hash>.provenance beside it. Open migrates
// such a store once, under an exclusive db/lock, so that every Store reads one
// form only:
//
//  1. move each manifest and provenance into its db/ shard (a rename; a rerun
//     finds it there already), and fsync the shards;
//  2. put every record into the database in one transaction (its commit is the
//     moment the store has switched; before it, meta/ is still the truth);
//  3. remove meta/ and fsync the root.
//
// A crash anywhere leaves meta/ in place, and the next Open does it again:
// each step is idempotent. A record that does not parse is kept, raw, under
// its hash part, so that verify still reports it and gc still keeps its bytes.

// legacyRecord is the JSON form of meta/<hash>.json.
type legacyRecord struct {
	Version int `json:"version"`
	PathInfo
}

func decodeLegacyInfo(b []byte) (*PathInfo, error) {
	var r legacyRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, err
	}
	if r.Version != 1 {
		return nil, fmt.Errorf("metadata version %d, want 1", r.Version)
	}
	if r.Path.IsZero() {
		return nil, errors.New("metadata has no path")
	}
	return &r.PathInfo, nil
}

func (s *Store) migrateLegacyMeta() error {
	legacy := filepath.Join(s.root, dirLegacyMeta)
	if _, err := os.Lstat(legacy); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err := checkPrivateDir(legacy); err != nil {
		return err
	}
	if err := createDB(s.root); err != nil {
		return err
	}
	l, err := lock(context.Background(), filepath.Join(s.root, dirDB, fileDBLock), unix.LOCK_EX)
	if err != nil {
		return err
	}
	defer l.unlock()
	if _, err := os.Lstat(legacy); errors.Is(err, fs.ErrNotExist) {
		return nil // another process migrated it while we waited
	}
	ents, err := os.ReadDir(legacy)
	if err != nil {
		return fmt.Errorf("migrate %s: %w", legacy, err)
	}
	records := map[string][]byte{} // hash part -> encoded record
	shards := map[string]bool{}
	for _, e := range ents {
		name := e.Name()
		hp, ext, _ := strings.Cut(name, ".")
		if len(hp) != HashPartLen || strings.HasPrefix(name, ".") {
			continue // an atomicfile temporary of a dead writer
		}
		shard := filepath.Join(s.root, dirDB, hp[:dbShardLen])
		switch ext {
		case "manifest", "provenance":
			if !shards[shard] {
				if err := atomicfile.MkdirAll(shard, 0o700); err != nil {
					return err
				}
				shards[shard] = true
			}
			if err := os.Rename(filepath.Join(legacy, name), filepath.Join(shard, name)); err != nil {
				return fmt.Errorf("migrate %s: %w", name, err)
			}
		case "json":
			b, err := os.ReadFile(filepath.Join(legacy, name))
			if err != nil {
				return fmt.Errorf("migrate %s: %w", name, err)
			}
			records[hp] = b // raw unless it decodes, below
		}
	}
	for shard := range shards {
		if err := syncDir(shard); err != nil {
			return err
		}
	}
	db, err := bolt.Open(s.dbFile(), 0o600, nil)
	if err != nil {
		return fmt.Errorf("open %s: %w", s.dbFile(), err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		paths := tx.Bucket(bucketPaths)
		for hp, b := range records {
			if info, err := decodeLegacyInfo(b); err == nil && info.Path.HashPart() == hp {
				_, perr := os.Lstat(s.provenanceFile(info.Path))
				b = encodeInfo(info, perr == nil)
			}
			if err := paths.Put([]byte(hp), b); err != nil {
				return err
			}
		}
		return nil
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("migrate %s into %s: %w", legacy, s.dbFile(), err)
	}
	if err := os.RemoveAll(legacy); err != nil {
		return fmt.Errorf("remove %s after migrating it: %w", legacy, err)
	}
	return syncDir(s.root)
}
