package store

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// GCOptions control a collection.
type GCOptions struct {
	DryRun bool
	// MaxFreed stops the collection once this many bytes are freed; 0 means no limit.
	MaxFreed int64
}

// GCResult says what a collection removed (or would remove, in a dry run).
type GCResult struct {
	Deleted []Path `json:"deleted"` // the paths deleted (or, in a dry run, that would be)
	Freed   int64  `json:"freed"`   // bytes freed
	// Swept counts debris removed: unregistered bytes, dead staging directories, trash.
	Swept int `json:"swept"`
}

// gcBatch is how many paths are unregistered between two fsyncs of meta/: a
// record must be durably gone before its bytes are, or a crash could leave a
// record without bytes; one fsync per batch keeps gc of 10,000 paths fast.
const gcBatch = 512

// GC deletes every valid path that no root, temporary root or live path needs.
//
// It holds gc.lock exclusively from reading the roots to its last delete, so no
// root can be added in between (see roots.go). Live paths are the closure of the
// roots over references, plus the derivers of live paths (kept so that logs and
// `shed why` can still explain a path), plus their build inputs if the store
// keeps them (Config.KeepBuildInputs). Dead paths are deleted referrers first,
// so that a collection stopped by MaxFreed or a crash never leaves a valid path
// whose reference is gone. Each deletion unregisters first, then moves the bytes
// to trash, then removes them.
func (s *Store) GC(ctx context.Context, opts GCOptions) (*GCResult, error) {
	gcl, err := lock(ctx, s.gcLockFile(), unix.LOCK_EX)
	if err != nil {
		return nil, err
	}
	defer gcl.unlock()

	infos, _, err := s.All()
	if err != nil {
		return nil, err
	}
	live, temp, err := s.liveSet(infos)
	if err != nil {
		return nil, err
	}
	dead := deadInOrder(infos, live)

	res := &GCResult{Deleted: []Path{}}
	var batch []Path
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		if err := syncDir(filepath.Join(s.root, dirMeta)); err != nil {
			return err
		}
		failpoint("gc-unregistered")
		for _, p := range batch {
			if err := s.trash(s.Location(p)); err != nil {
				return err
			}
			failpoint("gc-trashed")
		}
		batch = batch[:0]
		return nil
	}
	for _, p := range dead {
		if err := checkCtx(ctx); err != nil {
			return res, err
		}
		if opts.MaxFreed > 0 && res.Freed >= opts.MaxFreed {
			break
		}
		res.Deleted = append(res.Deleted, p)
		res.Freed += infos[p].Size
		if opts.DryRun {
			continue
		}
		// Only a path nobody is building can be deleted; a builder holding
		// the lock also holds a temporary root, so this is a second guard.
		pl, err := tryLock(s.pathLockFile(p), unix.LOCK_EX)
		if errors.Is(err, ErrLocked) {
			res.Deleted = res.Deleted[:len(res.Deleted)-1]
			res.Freed -= infos[p].Size
			continue
		} else if err != nil {
			return res, err
		}
		if err := os.Remove(s.metaFile(p)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			pl.unlock()
			return res, fmt.Errorf("unregister %s: %w", p, err)
		}
		os.Remove(s.manifestFile(p))
		os.Remove(s.provenanceFile(p))
		for _, suffix := range []string{"", ".check", ".repair"} { // the build's log, and those of a --check and a repair
			os.Remove(s.LogFile(p) + suffix)
		}
		pl.unlockAndRemove()
		batch = append(batch, p)
		if len(batch) == gcBatch {
			if err := flush(); err != nil {
				return res, err
			}
		}
	}
	if err := flush(); err != nil {
		return res, err
	}
	if !opts.DryRun {
		n, err := s.sweep(infos, live, temp)
		res.Swept = n
		if err != nil {
			return res, err
		}
	}
	return res, nil
}

// liveSet computes what must be kept, and the temporary roots of live processes. Caller holds
// gc.lock exclusively.
func (s *Store) liveSet(infos map[Path]*PathInfo) (live, temp map[Path]bool, err error) {
	temp, err = s.liveTempRoots()
	if err != nil {
		return nil, nil, err
	}
	named, err := s.Roots()
	if err != nil {
		return nil, nil, err
	}
	live = map[Path]bool{}
	var stack []Path
	push := func(p Path) {
		if !live[p] {
			live[p] = true
			stack = append(stack, p)
		}
	}
	for p := range temp {
		push(p)
	}
	for _, r := range named {
		push(r.Path)
	}
	for len(stack) > 0 {
		p := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		info, ok := infos[p]
		if !ok {
			continue // a temporary root of a path not built yet
		}
		for _, r := range info.References {
			push(r)
		}
		if s.config.KeepBuildInputs {
			for _, r := range info.BuildInputs {
				push(r)
			}
		}
		if !info.Deriver.IsZero() {
			push(info.Deriver)
		}
	}
	return live, temp, nil
}

// deadInOrder returns the valid paths not in live, each before everything it
// references (a reverse topological order), ties broken by name for stable output.
func deadInOrder(infos map[Path]*PathInfo, live map[Path]bool) []Path {
	var order []Path
	state := map[Path]int{} // 1 visiting, 2 done
	var visit func(Path)
	visit = func(p Path) {
		if state[p] != 0 {
			return
		}
		state[p] = 1
		for _, r := range infos[p].References {
			if _, ok := infos[r]; ok && !live[r] && r != p {
				visit(r)
			}
		}
		state[p] = 2
		order = append(order, p) // after its references
	}
	for _, p := range SortedPaths(infos) {
		if !live[p] {
			visit(p)
		}
	}
	// Referrers first: reverse the post-order.
	for i, j := 0, len(order)-1; i < j; i, j = i+1, j-1 {
		order[i], order[j] = order[j], order[i]
	}
	return order
}

// sweep removes debris: bytes in store/ with no record (a crash between rename
// and registration), manifests with no record, staging directories of dead
// processes, trash, and temporary files of dead writers. Caller holds gc.lock exclusively.
func (s *Store) sweep(infos map[Path]*PathInfo, live, temp map[Path]bool) (int, error) {
	n := 0
	storeDir := filepath.Join(s.root, dirStore)
	ents, err := os.ReadDir(storeDir)
	if err != nil {
		return n, fmt.Errorf("read %s: %w", storeDir, err)
	}
	for _, e := range ents {
		p, err := ParsePath(e.Name())
		if err != nil {
			continue // not ours to judge; verify reports it
		}
		if _, ok := infos[p]; ok || live[p] {
			continue
		}
		pl, err := tryLock(s.pathLockFile(p), unix.LOCK_EX)
		if err != nil {
			continue // being built right now
		}
		if _, err := os.Lstat(s.metaFile(p)); err == nil {
			pl.unlock() // registered since we loaded the records
			continue
		}
		err = s.removeDebris(p)
		pl.unlockAndRemove()
		if err != nil {
			return n, err
		}
		n++
	}
	metaDir := filepath.Join(s.root, dirMeta)
	if ents, err = os.ReadDir(metaDir); err != nil {
		return n, fmt.Errorf("read %s: %w", metaDir, err)
	}
	for _, e := range ents {
		name := e.Name()
		switch {
		case strings.HasPrefix(name, "."): // atomicfile temporary of a dead writer
			// A live writer's temporary is renamed away within milliseconds;
			// only remove those old enough to be a dead writer's.
			if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > time.Minute {
				os.Remove(filepath.Join(metaDir, name))
				n++
			}
		case strings.HasSuffix(name, ".manifest"), strings.HasSuffix(name, ".provenance"):
			hp := strings.TrimSuffix(strings.TrimSuffix(name, ".manifest"), ".provenance")
			if _, err := os.Lstat(filepath.Join(metaDir, hp+".json")); err == nil {
				continue
			}
			l, err := tryLock(filepath.Join(s.root, dirLocks, hp+".lock"), unix.LOCK_EX)
			if err != nil {
				continue // being registered right now
			}
			if _, err := os.Lstat(filepath.Join(metaDir, hp+".json")); errors.Is(err, fs.ErrNotExist) {
				os.Remove(filepath.Join(metaDir, name))
				n++
			}
			l.unlockAndRemove()
		}
	}
	tmpDir := filepath.Join(s.root, dirTmp)
	if ents, err = os.ReadDir(tmpDir); err != nil {
		return n, fmt.Errorf("read %s: %w", tmpDir, err)
	}
	for _, e := range ents {
		name := filepath.Join(tmpDir, e.Name())
		if p, ok := retiredPath(e.Name()); ok && temp[p] {
			continue // a repair replaced it; a process that held the path may still have it mounted
		}
		if stageInUse(name) {
			continue
		}
		if err := os.RemoveAll(name); err != nil {
			return n, fmt.Errorf("remove stale staging %s: %w", name, err)
		}
		n++
	}
	trashDir := filepath.Join(s.root, dirTrash)
	if ents, err = os.ReadDir(trashDir); err != nil {
		return n, fmt.Errorf("read %s: %w", trashDir, err)
	}
	for _, e := range ents {
		// Another process may be removing its own trash right now; whoever
		// finishes first wins and the other's error is of no interest.
		if os.RemoveAll(filepath.Join(trashDir, e.Name())) == nil {
			n++
		}
	}
	return n, nil
}

// stageInUse reports whether a live process holds the staging directory's flock.
func stageInUse(dir string) bool {
	f, err := os.Open(dir)
	if err != nil {
		return false
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return errors.Is(err, unix.EWOULDBLOCK)
	}
	return false
}
