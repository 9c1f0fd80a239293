package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"

	"toolshed.dev/shed/internal/atomicfile"
)

// DefaultEpoch is the mtime that content added with AddDir and AddText is
// clamped to, as Nix clamps to 1: the same bytes added twice are the same path.
const DefaultEpoch = 1

// BuildFunc writes a path's content at out, which does not exist yet and lies
// in a private staging directory on the store's filesystem.
type BuildFunc func(ctx context.Context, out string) error

// AddOptions describe a path being added.
type AddOptions struct {
	Deriver    Path
	References []Path
	// BuildInputs are what the path was built from but does not need at run
	// time (PathInfo.BuildInputs).
	BuildInputs []Path
	// Epoch clamps every mtime in the path to at most this many seconds since
	// 1970 (SOURCE_DATE_EPOCH of the build). Zero means DefaultEpoch.
	Epoch int64
	CA    string
	// Facts are what the builder knows of how the path was made (its derivation, inputs, fetches),
	// handed to the store's attestor (SetAttestor), which puts them in the path's provenance.
	Facts any
	// Attestation, if set, replaces the store's attestor for this path: a path that arrives from
	// elsewhere brings its own signed provenance, and the caller checks it against info here. It
	// returns the provenance to keep; an error aborts the registration and nothing is registered.
	Attestation func(info *PathInfo) ([]byte, error)
	// Manifest, if set, is the manifest of what build writes, checked by build entry by entry and
	// byte by byte as it wrote them (cache.ReadLayer, against a manifest whose hash was signed):
	// the store registers the output with it instead of clamping and scanning the tree again, a
	// second pass over every byte. The check lives with the writer because only the writer sees
	// each byte once, on its way to disk; the store still refuses an output whose root is not of
	// the manifest's type, and `shed store verify --check-contents` re-hashes what is on disk.
	Manifest *Manifest
}

// sortedPaths returns ps sorted by their string form, without duplicates.
func sortedPaths(ps []Path) []Path {
	ps = slices.Clone(ps)
	slices.SortFunc(ps, func(a, b Path) int { return cmpString(a.String(), b.String()) })
	return slices.Compact(ps)
}

// Realize makes p valid, calling build to produce it if it is not. If another
// process is building p, Realize waits for it and reuses its result, so every
// path is built once however many processes ask for it. p stays a temporary
// root of this Store until it is closed. built reports whether this call built p.
func (s *Store) Realize(ctx context.Context, p Path, opts AddOptions, build BuildFunc) (info *PathInfo, built bool, err error) {
	if err := s.AddTempRoot(ctx, p); err != nil {
		return nil, false, err
	}
	if info, err := s.Info(p); err == nil {
		return info, false, nil
	}
	pl, err := lock(ctx, s.pathLockFile(p), unix.LOCK_EX)
	if err != nil {
		return nil, false, err
	}
	defer pl.unlock()
	if info, err := s.Info(p); err == nil {
		return info, false, nil // built while we waited
	}
	st, err := s.newStage(ctx)
	if err != nil {
		return nil, false, err
	}
	defer st.remove()
	out := filepath.Join(st.dir, "out")
	if err := build(ctx, out); err != nil {
		return nil, false, err
	}
	if _, err := os.Lstat(out); err != nil {
		return nil, false, fmt.Errorf("build %s: produced no output: %w", p, err)
	}
	failpointFor("add-staged", p.Name())
	if m := opts.Manifest; m != nil {
		if err := checkRootType(out, m); err != nil {
			return nil, false, fmt.Errorf("build %s: %w", p, err)
		}
	}
	info, err = s.register(ctx, p, out, opts, opts.Manifest)
	if err != nil {
		return nil, false, err
	}
	return info, true, nil
}

// AddDir copies src (a directory or a file) into the store as a
// content-addressed path named name: its hash part derives from its content,
// so adding the same content again returns the same path and adds nothing.
func (s *Store) AddDir(ctx context.Context, src, name string, refs []Path) (*PathInfo, error) {
	if err := CheckName(name); err != nil {
		return nil, fmt.Errorf("add %s: %w", src, err)
	}
	st, err := s.newStage(ctx)
	if err != nil {
		return nil, err
	}
	defer st.remove()
	out := filepath.Join(st.dir, "out")
	if err := CopyTree(ctx, src, out); err != nil {
		return nil, fmt.Errorf("add %s: %w", src, err)
	}
	failpointFor("add-staged", name)
	if err := ClampTimes(out, DefaultEpoch); err != nil {
		return nil, err
	}
	failpointFor("add-clamped", name)
	m, err := ScanTree(ctx, out)
	if err != nil {
		return nil, err
	}
	p, err := MakePath("source", m.Hash().Hex(), s.StoreDir(), name)
	if err != nil {
		return nil, err
	}
	if err := s.AddTempRoot(ctx, p); err != nil {
		return nil, err
	}
	pl, err := lock(ctx, s.pathLockFile(p), unix.LOCK_EX)
	if err != nil {
		return nil, err
	}
	defer pl.unlock()
	if info, err := s.Info(p); err == nil {
		return info, nil
	}
	return s.register(ctx, p, out, AddOptions{References: refs, CA: "source"}, m)
}

// AddText adds a small file (a .drv) as a content-addressed path.
func (s *Store) AddText(ctx context.Context, name string, data []byte, refs []Path) (*PathInfo, error) {
	p, err := MakePath("text", Sum(data).Hex(), s.StoreDir(), name)
	if err != nil {
		return nil, err
	}
	info, _, err := s.Realize(ctx, p, AddOptions{References: refs, CA: "text"}, func(ctx context.Context, out string) error {
		return os.WriteFile(out, data, 0o444)
	})
	return info, err
}

// register moves a staged output into place and records it. The caller holds
// p's lock and has checked that p is not valid. Steps, each durable before the
// next, so a crash anywhere leaves p complete or absent:
//
//  1. clamp mtimes, scan (hash) the tree, store its files once (links.go),
//     fsync it, all still in staging;
//  2. rename it into store/ and fsync store/: the bytes are in place but p is
//     not valid yet (no record), so a crash here leaves debris that the next
//     add of p, or gc, removes;
//  3. write the manifest (and the provenance) atomically, then commit the
//     record to db/meta.db: the commit is the moment p becomes valid.
func (s *Store) register(ctx context.Context, p Path, out string, opts AddOptions, m *Manifest) (*PathInfo, error) {
	refs := sortedPaths(opts.References)
	buildInputs := sortedPaths(opts.BuildInputs)
	for _, r := range refs {
		if r != p && !s.IsValid(r) {
			return nil, fmt.Errorf("register %s: reference %s: %w", p, r, ErrNotExist)
		}
	}
	if m == nil {
		epoch := opts.Epoch
		if epoch == 0 {
			epoch = DefaultEpoch
		}
		if err := ClampTimes(out, epoch); err != nil {
			return nil, err
		}
		failpointFor("add-clamped", p.Name())
		var err error
		if m, err = ScanTree(ctx, out); err != nil {
			return nil, err
		}
	}
	failpointFor("add-scanned", p.Name())
	if s.LinkFilesOnce() {
		// Still in staging: the manifest was made from these bytes just now.
		if _, err := s.linkTree(ctx, out, m, true); err != nil {
			return nil, err
		}
		failpointFor("add-linked", p.Name())
	}
	if err := syncOutput(out); err != nil {
		return nil, err
	}
	failpointFor("add-synced", p.Name())
	// Leftovers of a crashed earlier attempt: bytes without a record.
	if err := s.removeDebris(ctx, p); err != nil {
		return nil, err
	}
	if err := os.Rename(out, s.Location(p)); err != nil {
		return nil, fmt.Errorf("rename output into %s: %w", s.Location(p), err)
	}
	if err := syncDir(filepath.Join(s.root, dirStore)); err != nil {
		return nil, err
	}
	failpointFor("add-renamed", p.Name())
	if err := atomicfile.MkdirAll(s.shardDir(p), 0o700); err != nil {
		return nil, err
	}
	if err := writeFileAtomic(s.manifestFile(p), m.Encode(), 0o600); err != nil {
		return nil, err
	}
	failpointFor("add-manifest-written", p.Name())
	info := &PathInfo{
		Path:        p,
		Deriver:     opts.Deriver,
		References:  refs,
		BuildInputs: buildInputs,
		ContentHash: m.Hash(),
		Size:        m.Size(),
		Registered:  time.Now().UTC().Truncate(time.Second),
		CA:          opts.CA,
	}
	if info.References == nil {
		info.References = []Path{}
	}
	// The provenance is written before the record: a valid path always has it.
	attest := opts.Attestation
	if attest == nil && s.attestor != nil {
		attest = func(info *PathInfo) ([]byte, error) { return s.attestor(info, opts.Facts) }
	}
	hasProv := attest != nil
	if attest != nil {
		prov, err := attest(info)
		if err != nil {
			return nil, fmt.Errorf("register %s: %w", p, err)
		}
		if err := writeFileAtomic(s.provenanceFile(p), prov, 0o600); err != nil {
			return nil, err
		}
		failpointFor("add-provenance-written", p.Name())
	}
	err := s.withDB(ctx, true, func(paths *bolt.Bucket) error {
		return paths.Put([]byte(p.HashPart()), encodeInfo(info, hasProv))
	})
	if err != nil {
		return nil, fmt.Errorf("register %s: %w", p, err)
	}
	failpointFor("add-registered", p.Name())
	return info, nil
}

// checkRootType checks that out, a build's output, is what the root entry of m says: a directory
// or a regular file.
func checkRootType(out string, m *Manifest) error {
	var st unix.Stat_t
	if err := unix.Lstat(out, &st); err != nil {
		return err
	}
	want := uint32(unix.S_IFDIR)
	if len(m.Entries) == 0 || m.Entries[0].Path != "." {
		return errors.New("manifest has no root entry")
	}
	if m.Entries[0].Type == EntryFile {
		want = unix.S_IFREG
	} else if m.Entries[0].Type != EntryDir {
		return fmt.Errorf("manifest's root is a %s", m.Entries[0].Type)
	}
	if st.Mode&unix.S_IFMT != want {
		return fmt.Errorf("output is not the %s its manifest says", m.Entries[0].Type)
	}
	return nil
}

// syncOutput makes a staged output durable before it is renamed into place: a single file with
// one fsync (a .drv, a .deb: syncfs would also wait for every other dirty byte of the file
// system, a substitution's trees among them), a tree with SyncTree's one syncfs.
func syncOutput(out string) error {
	fd, err := unix.Open(out, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("sync %s: %w", out, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("sync %s: %w", out, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return SyncTree(out)
	}
	if err := unix.Fsync(fd); err != nil {
		return fmt.Errorf("sync %s: %w", out, err)
	}
	return nil
}

// errRegistered is removeDebris's refusal: the path has a record after all.
var errRegistered = errors.New("it is registered")

// removeDebris deletes p's bytes, manifest and provenance when p has no record.
// The caller holds p's lock.
func (s *Store) removeDebris(ctx context.Context, p Path) error {
	if _, err := s.readInfo(ctx, p); err == nil || errors.Is(err, ErrCorrupt) {
		return fmt.Errorf("remove debris of %s: %w", p, errRegistered)
	} else if !errors.Is(err, ErrNotExist) {
		return err
	}
	if err := s.trash(s.Location(p)); err != nil {
		return err
	}
	for _, f := range []string{s.manifestFile(p), s.provenanceFile(p)} {
		if err := os.Remove(f); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove stale record of %s: %w", p, err)
		}
	}
	return nil
}

// trash deletes name by first renaming it into trash/ (atomic: the store never
// shows a half-deleted path), then removing it from there. A crash during the
// removal leaves only trash, which the next gc empties. A file (a .drv, a
// .deb) is unlinked where it is: that is atomic already.
func (s *Store) trash(name string) error {
	fi, err := os.Lstat(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return fmt.Errorf("remove %s: %w", name, err)
	}
	if !fi.IsDir() {
		if err := os.Remove(name); err != nil {
			return fmt.Errorf("remove %s: %w", name, err)
		}
		return nil
	}
	dst := filepath.Join(s.root, dirTrash, filepath.Base(name)+"-"+randomSuffix())
	if err := os.Rename(name, dst); err != nil {
		return fmt.Errorf("move %s to trash: %w", name, err)
	}
	if err := removeTree(dst, nil); err != nil {
		// Whatever removeTree did not expect (a directory it may not
		// write, say) is os.RemoveAll's to judge.
		if err := os.RemoveAll(dst); err != nil {
			return fmt.Errorf("remove %s: %w", dst, err)
		}
	}
	return nil
}

// removeTree removes the directory dir and everything in it, by the types its
// entries have in the directory listing: unlike os.RemoveAll, it makes no
// attempt that fails (unlink of a directory, rmdir of a full one) on the way.
//
// If freed is not nil, the size of each regular file whose last link goes is
// added to it (a file stored once with other paths frees nothing).
func removeTree(dir string, freed *atomic.Int64) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), dir)
	ents, err := f.ReadDir(-1)
	if err != nil {
		f.Close()
		return err
	}
	for _, e := range ents {
		if e.IsDir() {
			err = removeTree(filepath.Join(dir, e.Name()), freed)
			if err != nil {
				f.Close()
				return err
			}
			continue
		}
		if freed != nil && e.Type().IsRegular() {
			var st unix.Stat_t
			if unix.Fstatat(fd, e.Name(), &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Nlink == 1 {
				freed.Add(st.Size)
			}
		}
		err = unix.Unlinkat(fd, e.Name(), 0)
		if err != nil {
			f.Close()
			return err
		}
	}
	f.Close()
	return unix.Rmdir(dir)
}

// stage is a private staging directory under tmp/, flock-ed while in use so
// that a sweep can tell it from the leftovers of a dead process.
type stage struct {
	dir string
	f   *os.File
}

func (s *Store) newStage(ctx context.Context) (*stage, error) {
	// Created under a shared gc.lock: gc sweeps unlocked staging directories
	// under an exclusive one, so it never sees ours between mkdir and flock.
	gcl, err := lock(ctx, s.gcLockFile(), unix.LOCK_SH)
	if err != nil {
		return nil, err
	}
	defer gcl.unlock()
	dir := filepath.Join(s.root, dirTmp, "stage-"+randomSuffix())
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create staging directory: %w", err)
	}
	f, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("open staging directory: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock staging directory: %w", err)
	}
	return &stage{dir, f}, nil
}

func (st *stage) remove() {
	os.RemoveAll(st.dir)
	st.f.Close()
}

func randomSuffix() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Stage returns a private staging directory on the store's filesystem, for
// work that is not an add (a lock resolution, a --check rebuild). gc leaves it
// alone until release is called, which removes it.
func (s *Store) Stage(ctx context.Context) (dir string, release func(), err error) {
	st, err := s.newStage(ctx)
	if err != nil {
		return "", nil, err
	}
	return st.dir, st.remove, nil
}
