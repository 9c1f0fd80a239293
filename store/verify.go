package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Problem is one thing wrong with one store path.
type Problem struct {
	Path Path   `json:"path"`
	File string `json:"file,omitempty"` // inside the path, when known
	What string `json:"what"`
	// Damaged says the path's bytes on disk are not the registered ones (changed, missing, or
	// unreadable) while its record is sound: what a repair puts back (Store.Repair).
	Damaged bool `json:"damaged,omitempty"`
}

func (p Problem) String() string {
	if p.File != "" {
		return fmt.Sprintf("%s: %s: %s", p.Path, p.File, p.What)
	}
	return fmt.Sprintf("%s: %s", p.Path, p.What)
}

// VerifyOptions control a verification.
type VerifyOptions struct {
	// CheckContents re-hashes every file and compares with the recorded manifest.
	CheckContents bool
	// Paths limits the check to these paths; empty means every path.
	Paths []Path
	// CheckProvenance, if set, checks each path's provenance (nil if it has none) against its record:
	// the trust policy's signature check. An error is reported as a problem of the path.
	CheckProvenance func(info *PathInfo, provenance []byte) error
}

// VerifyResult lists what was checked and what is wrong.
type VerifyResult struct {
	Checked  int       `json:"checked"`  // paths checked
	Size     int64     `json:"size"`     // the checked paths' registered size, in bytes
	Bytes    int64     `json:"bytes"`    // bytes re-hashed
	Problems []Problem `json:"problems"` // what is wrong: path, file, what
	// Debris lists unregistered bytes in store/: the remains of an interrupted
	// add. They are not store paths (no reader ever sees them), so they are not
	// problems; the next add of the same path or `shed gc` removes them.
	Debris []string `json:"debris"`
}

// Verify checks that registered paths are present, that their references are
// valid, that records and manifests parse, and with CheckContents that every
// file still hashes to what was recorded, naming each file that does not.
// Bytes in store/ without a record (an interrupted add) are reported as
// incomplete unless a build holds their lock. Verify changes nothing.
func (s *Store) Verify(ctx context.Context, opts VerifyOptions) (*VerifyResult, error) {
	infos, bad, err := s.All()
	if err != nil {
		return nil, err
	}
	res := &VerifyResult{Problems: []Problem{}, Debris: []string{}}
	var mu sync.Mutex
	report := func(p Problem) {
		mu.Lock()
		res.Problems = append(res.Problems, p)
		mu.Unlock()
	}
	var todo []Path
	if len(opts.Paths) > 0 {
		for _, p := range opts.Paths {
			if _, ok := infos[p]; !ok {
				report(Problem{Path: p, What: "not registered"})
				continue
			}
			todo = append(todo, p)
		}
	} else {
		todo = SortedPaths(infos)
		for name, err := range bad {
			report(Problem{What: fmt.Sprintf("unreadable record %s: %v", name, err)})
		}
		res.Debris = s.findDebris(infos, report)
	}

	// Paths are checked in parallel, one walker per core. The walkers share
	// one pool of hash workers, one per core, to which they hand files larger
	// than inlineMax and hash smaller ones themselves: no goroutines, buffers
	// or hand-offs per path, and a big file or path still keeps every core busy.
	var pool *hashPool
	if opts.CheckContents {
		pool = newHashPool(ctx, runtime.GOMAXPROCS(0))
		defer pool.close()
	}
	// The walkers take the next path by an atomic counter: no hand-off, so no
	// wake-up, per path.
	var next atomic.Int64
	var wg sync.WaitGroup
	for range max(2, runtime.GOMAXPROCS(0)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var fh *fileHasher
			if pool != nil {
				fh = fileHashers.Get().(*fileHasher)
				defer fileHashers.Put(fh)
			}
			for ctx.Err() == nil {
				i := next.Add(1) - 1
				if i >= int64(len(todo)) {
					return
				}
				p := todo[i]
				n := s.verifyOne(ctx, infos, infos[p], pool, fh, report)
				if opts.CheckProvenance != nil {
					prov, err := s.Provenance(p)
					if err != nil && !errors.Is(err, ErrNoProvenance) {
						report(Problem{Path: p, What: err.Error()})
					} else if err := opts.CheckProvenance(infos[p], prov); err != nil {
						report(Problem{Path: p, What: "provenance: " + err.Error()})
					}
				}
				mu.Lock()
				res.Checked++
				res.Size += infos[p].Size
				res.Bytes += n
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return res, err
	}
	sort.SliceStable(res.Problems, func(i, j int) bool {
		a, b := res.Problems[i], res.Problems[j]
		if a.Path != b.Path {
			return a.Path.String() < b.Path.String()
		}
		return a.File < b.File
	})
	return res, nil
}

// verifyOne checks one path; with pool (--check-contents), it scans the path
// with pool's workers and fh, the walker's own.
func (s *Store) verifyOne(ctx context.Context, infos map[Path]*PathInfo, info *PathInfo, pool *hashPool, fh *fileHasher, report func(Problem)) int64 {
	p := info.Path
	var st unix.Stat_t // the scan's lstat of the root too
	if err := unix.Lstat(s.Location(p), &st); err != nil {
		report(Problem{Path: p, What: "registered but missing on disk", Damaged: true})
		return 0
	}
	for _, r := range info.References {
		if _, ok := infos[r]; !ok && r != p {
			report(Problem{Path: p, What: fmt.Sprintf("reference %s is not valid", r)})
		}
	}
	want, err := s.Manifest(p)
	if err != nil {
		report(Problem{Path: p, What: err.Error()})
		return 0
	}
	if want.Hash() != info.ContentHash {
		report(Problem{Path: p, What: "recorded manifest does not match the recorded content hash"})
	}
	if pool == nil {
		return 0
	}
	got, err := scanTree(ctx, s.Location(p), &st, pool, fh)
	if err != nil {
		if ctx.Err() == nil {
			report(Problem{Path: p, What: fmt.Sprintf("cannot scan: %v", err), Damaged: true})
		}
		return 0
	}
	if got.Hash() != info.ContentHash {
		diffs := Differences(want, got)
		if len(diffs) == 0 {
			report(Problem{Path: p, What: "content hash differs", Damaged: true})
		}
		for _, d := range diffs {
			switch d.What {
			case "only in first":
				d.What = "missing (recorded, not on disk)"
			case "only in second":
				d.What = "unexpected (on disk, not recorded)"
			}
			report(Problem{Path: p, File: d.Path, What: d.What, Damaged: true})
		}
	}
	return got.Size()
}

// findDebris reports bytes in store/ that have no record and that nobody is
// building: the remains of an interrupted add, swept by the next gc.
func (s *Store) findDebris(infos map[Path]*PathInfo, report func(Problem)) []string {
	debris := []string{}
	ents, err := os.ReadDir(filepath.Join(s.root, dirStore))
	if err != nil {
		report(Problem{What: fmt.Sprintf("cannot read store directory: %v", err)})
		return debris
	}
	for _, e := range ents {
		p, err := ParsePath(e.Name())
		if err != nil {
			report(Problem{What: fmt.Sprintf("stray file store/%s: not a store path", e.Name())})
			continue
		}
		if _, ok := infos[p]; ok {
			continue
		}
		l, err := tryLock(s.pathLockFile(p), unix.LOCK_EX)
		if errors.Is(err, ErrLocked) {
			continue
		}
		if err == nil {
			l.unlock()
		}
		if _, err := s.readInfo(context.Background(), p); errors.Is(err, ErrNotExist) {
			debris = append(debris, p.String())
		}
	}
	return debris
}
