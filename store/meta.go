package store

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"
)

// PathInfo is the registration record of a valid store path: what the store
// knows about it beyond its bytes. It is written once, atomically (one commit
// of db/meta.db), after the bytes are in place; a path without it is not valid.
// The JSON form is what the CLI and API show, and what a store before the
// database kept in meta/<hash>.json (see migrate.go).
type PathInfo struct {
	Path Path `json:"path"`
	// Deriver is the .drv that produced the path, if any.
	Deriver Path `json:"deriver,omitzero"`
	// References are the store paths this path needs at run time: for a layer,
	// the layers below it; for a .drv, its input derivations and sources. gc
	// keeps them, and copy ships them. Sorted, no duplicates.
	References []Path `json:"references"`
	// BuildInputs are the store paths the path was built from but does not
	// need to run: a layer's .debs and wheels. gc frees them unless the store
	// keeps build inputs (Config.KeepBuildInputs); copy ships them only when
	// asked. They need not be valid. Sorted, no duplicates.
	BuildInputs []Path `json:"build_inputs,omitempty"`
	// ContentHash is the BLAKE3 of the path's manifest (see ScanTree).
	ContentHash Hash `json:"content_hash"`
	// Size is the number of bytes of regular files in the path.
	Size int64 `json:"size"`
	// Registered is when the path became valid.
	Registered time.Time `json:"registered"`
	// CA says how a content-addressed path's name was derived, e.g.
	// "fixed:sha256:<hex>" for a fetch output or "source" for `shed store add`.
	CA string `json:"ca,omitempty"`
}

// readInfo reads p's registration record. It returns ErrNotExist if there is none.
func (s *Store) readInfo(ctx context.Context, p Path) (*PathInfo, error) {
	var info *PathInfo
	err := s.withDB(ctx, false, func(paths *bolt.Bucket) error {
		v := paths.Get([]byte(p.HashPart()))
		if v == nil {
			return fmt.Errorf("%w: %s", ErrNotExist, p)
		}
		var err error
		if info, _, err = decodeInfo(v); err != nil {
			return fmt.Errorf("%w: %s: record: %v", ErrCorrupt, p, err)
		}
		if info.Path != p {
			return fmt.Errorf("%w: %s: record names %s", ErrCorrupt, p, info.Path)
		}
		return nil
	})
	if err != nil && !errors.Is(err, ErrNotExist) && !errors.Is(err, ErrCorrupt) {
		return nil, fmt.Errorf("read metadata of %s: %w", p, err)
	}
	return info, err
}

// Info returns the registration of a valid path: its record exists and its
// bytes are on disk. Otherwise it returns an error satisfying errors.Is(err, ErrNotExist).
func (s *Store) Info(p Path) (*PathInfo, error) {
	info, err := s.readInfo(context.Background(), p)
	if err != nil {
		return nil, err
	}
	if _, err := os.Lstat(s.Location(p)); err != nil {
		return nil, fmt.Errorf("%w: %s: registered but missing on disk", ErrNotExist, p)
	}
	return info, nil
}

// IsValid reports whether p is a valid path.
func (s *Store) IsValid(p Path) bool {
	_, err := s.Info(p)
	return err == nil
}

// Manifest returns the manifest recorded when p was registered.
func (s *Store) Manifest(p Path) (*Manifest, error) {
	b, err := os.ReadFile(s.manifestFile(p))
	if err != nil {
		return nil, fmt.Errorf("read manifest of %s: %w", p, err)
	}
	m, err := ParseManifest(b)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: manifest: %v", ErrCorrupt, p, err)
	}
	return m, nil
}

// All loads every registration record at once, in one read of the database:
// gc, verify and ls need the whole graph. Records that do not decode are
// returned in bad, keyed by their hash part.
func (s *Store) All() (infos map[Path]*PathInfo, bad map[string]error, err error) {
	bad = map[string]error{}
	err = s.withDB(context.Background(), false, func(paths *bolt.Bucket) error {
		infos = map[Path]*PathInfo{}
		return paths.ForEach(func(k, v []byte) error {
			info, _, err := decodeInfo(v)
			if err == nil && info.Path.HashPart() != string(k) {
				err = fmt.Errorf("record names %s", info.Path)
			}
			if err != nil {
				bad[string(k)] = err
			} else {
				infos[info.Path] = info
			}
			return nil
		})
	})
	if err != nil {
		return nil, nil, err
	}
	return infos, bad, nil
}

// Paths returns the valid paths sorted by name then hash, for listings.
func SortedPaths(infos map[Path]*PathInfo) []Path {
	ps := make([]Path, 0, len(infos))
	for p := range infos {
		ps = append(ps, p)
	}
	slices.SortFunc(ps, func(a, b Path) int {
		if c := strings.Compare(a.Name(), b.Name()); c != 0 {
			return c
		}
		return strings.Compare(a.String(), b.String())
	})
	return ps
}

// Provenance returns the signed provenance kept beside p, or ErrNoProvenance.
func (s *Store) Provenance(p Path) ([]byte, error) {
	b, err := os.ReadFile(s.provenanceFile(p))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%s: %w", p, ErrNoProvenance)
	}
	return b, err
}

// ErrNoProvenance marks a path without provenance: registered before the store signed its paths, or
// by a Store with no attestor.
var ErrNoProvenance = errors.New("no provenance")

// SetProvenance replaces the provenance of the valid path p (say, signed again after a key rotation).
// check receives p's record and returns the bytes to keep; it runs under p's lock, and under a shared
// gc.lock, so that gc cannot delete p in between (gc takes no path locks).
func (s *Store) SetProvenance(ctx context.Context, p Path, check func(info *PathInfo) ([]byte, error)) error {
	gcl, err := lock(ctx, s.gcLockFile(), unix.LOCK_SH)
	if err != nil {
		return err
	}
	defer gcl.unlock()
	pl, err := lock(ctx, s.pathLockFile(p), unix.LOCK_EX)
	if err != nil {
		return err
	}
	defer pl.unlock()
	info, err := s.Info(p)
	if err != nil {
		return err
	}
	b, err := check(info)
	if err != nil {
		return err
	}
	// The record's flag first, so that gc, which removes only the files the
	// record says exist, never leaves this one behind.
	err = s.withDB(ctx, true, func(paths *bolt.Bucket) error {
		v := paths.Get([]byte(p.HashPart()))
		if v == nil {
			return fmt.Errorf("%w: %s", ErrNotExist, p)
		}
		if len(v) > 1 && v[1]&flagProvenance != 0 {
			return nil
		}
		return paths.Put([]byte(p.HashPart()), encodeInfo(info, true))
	})
	if err != nil {
		return err
	}
	return writeFileAtomic(s.provenanceFile(p), b, 0o600)
}

// ValidPaths says which of ps are valid, as IsValid does for each, in one read of the database:
// a cache-hit realize asks it of every .drv and output of a Workshop at once.
func (s *Store) ValidPaths(ctx context.Context, ps []Path) ([]bool, error) {
	valid := make([]bool, len(ps))
	err := s.withDB(ctx, false, func(paths *bolt.Bucket) error {
		for i, p := range ps {
			v := paths.Get([]byte(p.HashPart()))
			if v == nil {
				continue
			}
			// A record that does not decode, or names another path, makes p invalid, as for Info.
			info, _, err := decodeInfo(v)
			valid[i] = err == nil && info.Path == p
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read metadata: %w", err)
	}
	// The bytes after the records, as Info checks them: a path is valid only with both.
	for i, p := range ps {
		if valid[i] {
			_, err := os.Lstat(s.Location(p))
			valid[i] = err == nil
		}
	}
	return valid, nil
}

// DBOpens says how many times this Store has opened its database: each operation opens it for as
// long as it runs (db.go). Tests and benchmarks count them.
func (s *Store) DBOpens() int64 { return s.dbOpens.Load() }
