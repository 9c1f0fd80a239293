package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// PathInfo is the registration record of a valid store path: what the store
// knows about it beyond its bytes. It is written once, atomically, after the
// bytes are in place; a path without it is not valid.
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

// metaVersion is bound into every record so that a future format change is
// detected instead of misread.
const metaVersion = 1

type metaRecord struct {
	Version int `json:"version"`
	PathInfo
}

func encodeInfo(info *PathInfo) ([]byte, error) {
	b, err := json.MarshalIndent(metaRecord{metaVersion, *info}, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

func decodeInfo(b []byte) (*PathInfo, error) {
	var r metaRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, err
	}
	if r.Version != metaVersion {
		return nil, fmt.Errorf("metadata version %d, want %d", r.Version, metaVersion)
	}
	if r.Path.IsZero() {
		return nil, errors.New("metadata has no path")
	}
	return &r.PathInfo, nil
}

// readInfo reads p's registration record. It returns ErrNotExist if there is none.
func (s *Store) readInfo(p Path) (*PathInfo, error) {
	b, err := os.ReadFile(s.metaFile(p))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s", ErrNotExist, p)
	} else if err != nil {
		return nil, fmt.Errorf("read metadata of %s: %w", p, err)
	}
	info, err := decodeInfo(b)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: metadata: %v", ErrCorrupt, p, err)
	}
	if info.Path != p {
		return nil, fmt.Errorf("%w: %s: metadata names %s", ErrCorrupt, p, info.Path)
	}
	return info, nil
}

// Info returns the registration of a valid path: its record exists and its
// bytes are on disk. Otherwise it returns an error satisfying errors.Is(err, ErrNotExist).
func (s *Store) Info(p Path) (*PathInfo, error) {
	info, err := s.readInfo(p)
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

// All loads every registration record at once, in parallel: gc, verify and
// ls need the whole graph, and one pass over meta/ is much cheaper than a
// query per path. Records that do not parse are returned in bad.
func (s *Store) All() (infos map[Path]*PathInfo, bad map[string]error, err error) {
	dir := filepath.Join(s.root, dirMeta)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("read %s: %w", dir, err)
	}
	var names []string
	for _, e := range ents {
		if n := e.Name(); strings.HasSuffix(n, ".json") && !strings.HasPrefix(n, ".") {
			names = append(names, n)
		}
	}
	infos = make(map[Path]*PathInfo, len(names))
	bad = map[string]error{}
	var mu sync.Mutex
	work := make(chan string)
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) * 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := range work {
				b, err := os.ReadFile(filepath.Join(dir, n))
				var info *PathInfo
				if err == nil {
					info, err = decodeInfo(b)
				}
				if err == nil && info.Path.HashPart()+".json" != n {
					err = fmt.Errorf("record names %s", info.Path)
				}
				mu.Lock()
				if err != nil {
					bad[n] = err
				} else {
					infos[info.Path] = info
				}
				mu.Unlock()
			}
		}()
	}
	for _, n := range names {
		work <- n
	}
	close(work)
	wg.Wait()
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
// check receives p's record and returns the bytes to keep; it runs under p's lock.
func (s *Store) SetProvenance(ctx context.Context, p Path, check func(info *PathInfo) ([]byte, error)) error {
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
	return writeFileAtomic(s.provenanceFile(p), b, 0o600)
}
