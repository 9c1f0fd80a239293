package store

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
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
	// Size is the bytes of regular files the deleted paths had (their records' sizes); MaxFreed
	// counts these.
	Size int64 `json:"size"`
	// Freed is the bytes freed on disk: Size, less what is still stored once for paths that stay
	// (links.go). A dry run cannot tell, and says Size.
	Freed int64 `json:"freed"`
	// Links counts the entries of links/ removed because no path used them any more.
	Links int `json:"links"`
	// Swept counts debris removed: unregistered bytes, dead staging directories, trash.
	Swept int `json:"swept"`
}

// gcBatch is how many records one commit of db/meta.db removes. A batch is a
// prefix of the referrers-first order of what gc deletes, so after each commit
// no valid path refers to a path whose record is gone. Once all are committed
// the files are removed in parallel, in any order, since none of the paths is
// valid any more. One commit per batch bounds the memory of a transaction.
const gcBatch = 16384

// gcWorkers is how many goroutines remove the files of the dead paths. Removal is
// syscall-bound (unlinkat, rmdir, getdents), mostly in different directories
// (each path's own tree, the 1,024 shards of db/), so a few more than the
// cores keep the filesystem busy.
const gcWorkers = 8

// GC deletes every valid path that no root, temporary root or live path needs.
//
// It holds gc.lock exclusively from reading the roots to its last delete, so no
// root can be added in between (see roots.go). Live paths are the closure of the
// roots over references, plus the derivers of live paths (kept so that logs and
// `shed why` can still explain a path), plus their build inputs if the store
// keeps them (Config.KeepBuildInputs). Dead paths are ordered referrers first,
// and unregistered in batches, each one commit of the database, so that a
// collection stopped by MaxFreed or a crash never leaves a valid path whose
// reference is gone; then their files (bytes, manifest, provenance, logs,
// lock) are removed by a pool of workers (removeDead).
//
// gc takes no path lock: a process that holds one (a build, a repair) holds a
// temporary root on the path first, and SetProvenance takes gc.lock, so a path
// whose lock is held is live, and no lock on a dead path can be taken until gc
// is done (AddTempRoot waits for gc.lock).
func (s *Store) GC(ctx context.Context, opts GCOptions) (*GCResult, error) {
	gcl, err := lock(ctx, s.gcLockFile(), unix.LOCK_EX)
	if err != nil {
		return nil, err
	}
	defer gcl.unlock()

	g, err := s.loadGraph(ctx)
	if err != nil {
		return nil, err
	}
	live, temp, err := s.liveSet(g)
	if err != nil {
		return nil, err
	}
	dead := g.deadInOrder(live)

	res := &GCResult{Deleted: []Path{}}
	n := 0
	for _, id := range dead {
		if opts.MaxFreed > 0 && res.Size >= opts.MaxFreed {
			break
		}
		res.Size += g.size[id]
		n++
	}
	dead = dead[:n]
	if opts.DryRun {
		for _, id := range dead {
			res.Deleted = append(res.Deleted, g.paths[id])
		}
		res.Freed = res.Size
		return res, nil
	}
	others, err := s.listByHash(dirLogs, dirLocks)
	if err != nil {
		return res, err
	}
	names, err := readNames(filepath.Join(s.root, dirStore))
	if err != nil {
		return res, err
	}
	res.Size = 0
	for start := 0; start < len(dead); start += gcBatch {
		if err := checkCtx(ctx); err != nil {
			return res, err
		}
		batch := dead[start:min(start+gcBatch, len(dead))]
		err := s.withDB(ctx, true, func(paths *bolt.Bucket) error {
			for _, id := range batch {
				if err := paths.Delete([]byte(g.paths[id].HashPart())); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return res, fmt.Errorf("unregister %d paths: %w", len(batch), err)
		}
		failpoint("gc-unregistered")
		for _, id := range batch {
			res.Deleted = append(res.Deleted, g.paths[id])
			res.Size += g.size[id]
		}
	}
	// Every record of what is deleted is durably gone: the files go in any
	// order, so in that of store/'s listing (its hash order on ext4), in which
	// consecutive unlinks change the same directory blocks; in the graph's
	// order they land on blocks at random, each another block for the journal.
	var freed atomic.Int64
	err = s.removeDead(ctx, g, inListingOrder(g, dead, names), others, &freed)
	res.Freed = freed.Load()
	if err != nil {
		return res, err
	}
	n, err = s.sweep(ctx, g, temp, names)
	res.Swept = n
	if err != nil {
		return res, err
	}
	// Last, so that the links the deleted paths held are gone: an entry only links/ holds is
	// freed now.
	links, linksFreed, err := s.sweepLinks(ctx)
	res.Links = links
	res.Freed += linksFreed
	return res, err
}

// inListingOrder returns dead in the order of names (store/'s listing), then
// those whose bytes were not listed.
func inListingOrder(g *graph, dead []int32, names []string) []int32 {
	todo := make([]bool, len(g.paths))
	for _, id := range dead {
		todo[id] = true
	}
	order := make([]int32, 0, len(dead))
	for _, name := range names {
		if len(name) <= HashPartLen {
			continue
		}
		if id, ok := g.index[name[:HashPartLen]]; ok && todo[id] && g.paths[id].base == name {
			order = append(order, id)
			todo[id] = false
		}
	}
	for _, id := range dead {
		if todo[id] {
			order = append(order, id)
		}
	}
	return order
}

// removeDead removes the files of unregistered paths, in parallel: each path's
// bytes, its manifest, its provenance if its record said it had one, and the
// logs and lock file the listing of logs/ and locks/ found for it. No file is
// probed for: a missing one was removed by hand, and is not an error.
//
// The bytes are removed where they are, not renamed into trash/ first as
// debris is: their record is durably gone, so what a crash leaves of them is
// unregistered debris, which no reader uses (validity is the record first),
// verify lists as debris, and the next gc or add of the path removes. The
// rename cost a third of the time of each deletion here, and every
// cross-directory rename of a filesystem takes one lock.
func (s *Store) removeDead(ctx context.Context, g *graph, batch []int32, others map[string][]string, freed *atomic.Int64) error {
	work := make(chan int32)
	var mu sync.Mutex
	var first error
	var wg sync.WaitGroup
	for range gcWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range work {
				p := g.paths[id]
				err := removeInPlace(s.Location(p), freed)
				files := []string{s.manifestFile(p)}
				if g.prov[id] {
					files = append(files, s.provenanceFile(p))
				}
				files = append(files, others[p.HashPart()]...)
				for _, f := range files {
					if rerr := os.Remove(f); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) && err == nil {
						err = rerr
					}
				}
				failpoint("gc-trashed")
				if err != nil {
					mu.Lock()
					if first == nil {
						first = fmt.Errorf("delete %s: %w", p, err)
					}
					mu.Unlock()
				}
			}
		}()
	}
	for _, id := range batch {
		if ctx.Err() != nil {
			break
		}
		work <- id
	}
	close(work)
	wg.Wait()
	if first != nil {
		return first
	}
	return ctx.Err()
}

// removeInPlace removes a store path's bytes: a file, or a tree by removeTree,
// adding to freed the bytes of the files whose last link went.
func removeInPlace(loc string, freed *atomic.Int64) error {
	var st unix.Stat_t
	err := unix.Lstat(loc, &st)
	if errors.Is(err, unix.ENOENT) {
		return nil
	} else if err != nil {
		return &os.PathError{Op: "lstat", Path: loc, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		if err := os.Remove(loc); err != nil {
			return err
		}
		if st.Mode&unix.S_IFMT == unix.S_IFREG && st.Nlink == 1 {
			freed.Add(st.Size)
		}
		return nil
	}
	if err := removeTree(loc, freed); err != nil {
		return os.RemoveAll(loc) // what removeTree did not expect is os.RemoveAll's to judge
	}
	return nil
}

// listByHash lists the files of the given store directories (logs/, locks/)
// that belong to a path, by the path's hash part: "<hash>.log.check" and
// "<hash>.lock" are listed under "<hash>", with their directory.
func (s *Store) listByHash(dirs ...string) (map[string][]string, error) {
	m := map[string][]string{}
	for _, d := range dirs {
		dir := filepath.Join(s.root, d)
		f, err := os.Open(dir)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", dir, err)
		}
		names, err := f.Readdirnames(-1)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", dir, err)
		}
		for _, n := range names {
			if len(n) > HashPartLen && n[HashPartLen] == '.' {
				m[n[:HashPartLen]] = append(m[n[:HashPartLen]], filepath.Join(dir, n))
			}
		}
	}
	return m, nil
}

// graph is the reference graph gc works on: every record, decoded only as far
// as gc needs, its paths numbered in the database's (hash) order so that edges
// are int32s. It costs about 150 bytes a path.
type graph struct {
	paths   []Path
	size    []int64
	prov    []bool           // the record says a provenance file exists
	deriver []int32          // -1: none, or not registered
	refOff  []uint32         // the references of i are refs[refOff[i]:refOff[i+1]]
	refs    []int32          // registered references only
	biOff   []uint32         // likewise for build inputs
	bis     []int32          //
	index   map[string]int32 // hash part -> id
	bad     map[string]bool  // hash parts of records that do not decode: their bytes are kept
	temp    map[string]bool  // hash parts of temporary roots (set by liveSet)
}

func (g *graph) id(p Path) (int32, bool) {
	id, ok := g.index[p.HashPart()]
	return id, ok && g.paths[id] == p
}

// loadGraph reads every record in one read transaction: a first pass numbers
// the paths, a second decodes their edges into those numbers.
func (s *Store) loadGraph(ctx context.Context) (*graph, error) {
	g := &graph{bad: map[string]bool{}}
	err := s.withDB(ctx, false, func(paths *bolt.Bucket) error {
		g.index = map[string]int32{}
		c := paths.Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			r := &recordReader{}
			if len(v) >= 2 && v[0] == recordFormat {
				r.b = v[2:]
			} else {
				r.fail("format")
			}
			pb := r.bytes("path")
			if r.err != nil || len(pb) <= HashPartLen || string(pb[:HashPartLen]) != string(k) {
				g.bad[string(k)] = true
				continue
			}
			p := Path{string(pb)}
			g.index[p.HashPart()] = int32(len(g.paths))
			g.paths = append(g.paths, p)
			g.prov = append(g.prov, v[1]&flagProvenance != 0)
		}
		g.size = make([]int64, len(g.paths))
		g.deriver = make([]int32, len(g.paths))
		g.refOff = make([]uint32, 1, len(g.paths)+1)
		g.biOff = make([]uint32, 1, len(g.paths)+1)
		g.refs = make([]int32, 0, 2*len(g.paths))
		lookup := func(b []byte) int32 {
			if len(b) > HashPartLen {
				if id, ok := g.index[string(b[:HashPartLen])]; ok && g.paths[id].base == string(b) {
					return id
				}
			}
			return -1
		}
		id := -1
		for k, v := c.First(); k != nil; k, v = c.Next() {
			if g.bad[string(k)] {
				continue
			}
			id++
			r := &recordReader{b: v[2:]}
			r.bytes("path")
			g.deriver[id] = -1
			if d := r.bytes("deriver"); len(d) > 0 {
				g.deriver[id] = lookup(d)
			}
			for _, l := range []*[]int32{&g.refs, &g.bis} {
				n := r.uvarint("count")
				if n > uint64(len(r.b)) {
					r.fail("count") // damaged: verify names it
					n = 0
				}
				for range n {
					if e := lookup(r.bytes("edge")); e >= 0 {
						*l = append(*l, e)
					}
				}
			}
			// refOff and biOff end where refs and bis end now; the
			// references were appended before the build inputs.
			g.refOff = append(g.refOff, uint32(len(g.refs)))
			g.biOff = append(g.biOff, uint32(len(g.bis)))
			if len(r.b) >= len(Hash{}) {
				r.b = r.b[len(Hash{}):]
			}
			g.size[id] = r.varint("size")
			if r.err != nil {
				// A record cut short decodes as far as it goes; verify names it.
				r.err = nil
			}
			if id%4096 == 0 && ctx.Err() != nil {
				return ctx.Err()
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return g, nil
}

func (g *graph) refsOf(id int32) []int32 { return g.refs[g.refOff[id]:g.refOff[id+1]] }
func (g *graph) bisOf(id int32) []int32  { return g.bis[g.biOff[id]:g.biOff[id+1]] }

// liveSet computes what must be kept, and the temporary roots of live processes. Caller holds
// gc.lock exclusively.
func (s *Store) liveSet(g *graph) (live []bool, temp map[Path]bool, err error) {
	temp, err = s.liveTempRoots()
	if err != nil {
		return nil, nil, err
	}
	named, err := s.Roots()
	if err != nil {
		return nil, nil, err
	}
	live = make([]bool, len(g.paths))
	var stack []int32
	push := func(id int32) {
		if id >= 0 && !live[id] {
			live[id] = true
			stack = append(stack, id)
		}
	}
	g.temp = make(map[string]bool, len(temp))
	for p := range temp {
		g.temp[p.HashPart()] = true
		if id, ok := g.id(p); ok {
			push(id) // else a temporary root of a path not built yet
		}
	}
	for _, r := range named {
		if id, ok := g.id(r.Path); ok {
			push(id)
		}
	}
	for len(stack) > 0 {
		id := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		for _, r := range g.refsOf(id) {
			push(r)
		}
		if s.config.KeepBuildInputs {
			for _, r := range g.bisOf(id) {
				push(r)
			}
		}
		push(g.deriver[id])
	}
	return live, temp, nil
}

// deadInOrder returns the paths not in live, each before everything it
// references (a reverse topological order, by Kahn's algorithm: a path comes
// once every dead path that refers to it has), ties broken by hash for stable
// output. Paths on a reference cycle (which registration cannot make) come last.
func (g *graph) deadInOrder(live []bool) []int32 {
	referrers := make([]int32, len(g.paths)) // dead referrers not yet ordered
	for id := range g.paths {
		if live[id] {
			continue
		}
		for _, r := range g.refsOf(int32(id)) {
			if r != int32(id) && !live[r] {
				referrers[r]++
			}
		}
	}
	order := make([]int32, 0, len(g.paths))
	for id := range g.paths {
		if !live[id] && referrers[id] == 0 {
			order = append(order, int32(id))
		}
	}
	for i := 0; i < len(order); i++ {
		id := order[i]
		for _, r := range g.refsOf(id) {
			if r != id && !live[r] {
				if referrers[r]--; referrers[r] == 0 {
					order = append(order, r)
				}
			}
		}
	}
	for id := range g.paths {
		if !live[id] && referrers[id] > 0 {
			order = append(order, int32(id))
		}
	}
	return order
}

// sweep removes debris: bytes in store/ with no record (a crash between rename
// and registration, or during gc), manifests and provenance with no record,
// staging directories of dead processes, trash, stale lock files, and
// temporary files of dead writers. What is registered is what the graph held,
// plus what live processes (their temporary roots) may have registered since.
// Caller holds gc.lock exclusively.
func (s *Store) sweep(ctx context.Context, g *graph, temp map[Path]bool, storeNames []string) (int, error) {
	n := 0
	// Registered when the graph was read (so kept, or deleted with its files
	// by this gc), kept although it does not decode, or held by a live
	// process, which may have registered it since.
	known := func(hp string) bool {
		_, ok := g.index[hp]
		return ok || g.bad[hp] || g.temp[hp]
	}
	// storeNames was listed after the graph was read: what is not known in it
	// is debris, or a path being added now (whose lock is held).
	for _, name := range storeNames {
		if len(name) > HashPartLen && known(name[:HashPartLen]) {
			continue
		}
		p, err := ParsePath(name)
		if err != nil {
			continue // not ours to judge; verify reports it
		}
		pl, err := tryLock(s.pathLockFile(p), unix.LOCK_EX)
		if err != nil {
			continue // being built right now
		}
		err = s.removeDebris(ctx, p)
		if errors.Is(err, errRegistered) {
			pl.unlock()
			continue
		}
		pl.unlockAndRemove()
		if err != nil {
			return n, err
		}
		n++
	}
	dbDir := filepath.Join(s.root, dirDB)
	ents, err := os.ReadDir(dbDir)
	if err != nil {
		return n, fmt.Errorf("read %s: %w", dbDir, err)
	}
	for _, e := range ents {
		if !e.IsDir() || len(e.Name()) != dbShardLen {
			continue
		}
		shard := filepath.Join(dbDir, e.Name())
		names, err := readNames(shard)
		if err != nil {
			return n, err
		}
		for _, name := range names {
			switch {
			case strings.HasPrefix(name, "."): // atomicfile temporary of a dead writer
				// A live writer's temporary is renamed away within milliseconds;
				// only remove those old enough to be a dead writer's.
				if fi, err := os.Lstat(filepath.Join(shard, name)); err == nil && time.Since(fi.ModTime()) > time.Minute {
					os.Remove(filepath.Join(shard, name))
					n++
				}
			case len(name) > HashPartLen && !known(name[:HashPartLen]):
				os.Remove(filepath.Join(shard, name))
				n++
			}
		}
	}
	locks, err := s.listByHash(dirLocks)
	if err != nil {
		return n, err
	}
	for hp, files := range locks {
		if known(hp) {
			continue // registered (a dead one's lock went with it), or in use
		}
		// A failed or interrupted build's lock; it may be taken again right
		// now by a build that has just added its temporary root.
		for _, f := range files {
			if l, err := tryLock(f, unix.LOCK_EX); err == nil {
				l.unlockAndRemove()
				n++
			}
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

func readNames(dir string) ([]string, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", dir, err)
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", dir, err)
	}
	return names, nil
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
