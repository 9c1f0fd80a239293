package store

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Files stored once. Identical files of different store paths are one inode:
// each is a hard link of an entry of links/, named by the file's link key,
// as `nix-store --optimise` does with /nix/store/.links. A hard link shares
// everything a manifest records of a file (content, mode, owner, mtime,
// xattrs), so the key is the hash of the file's manifest line without its
// name, and linking changes no path's manifest or content hash.
//
// Three rules keep a rescan of every path equal to its manifest:
//   - Within one path, only the first file of each key is linked: two of
//     its files that are one inode would read as a hardlink entry.
//   - A file that already has hardlink entries in its path is left as it
//     is: replacing one name of it would split the group.
//   - A directory whose entries were replaced gets its recorded times back.
//
// Linking happens in staging, before a path is renamed into store/, so a
// path is never changed once valid, except by `shed store optimise`, which
// replaces a valid path's file by an identical one with one rename (a reader
// sees either), after hashing both. An entry of links/ is linked to only
// after its bytes hash to the key's digest: a damaged one is replaced by a
// good file, never linked again.
//
// An entry whose link count is 1 is used by no path: gc removes it. The
// saving is exact, since a linked file is counted once in its path's size:
// each entry saves its size times (links - 2).

// dirLinks holds one hard link of each file stored once: links/<2 hex>/<62 hex>.
const dirLinks = "links"

// linkTmpPrefix names a link being made in links/: a crashed one is debris that gc sweeps.
const linkTmpPrefix = ".tmp-"

// LinkFilesOnce says whether paths registered from now on have their files stored once
// (Config.StoreFilesOnce, on unless set to false).
func (s *Store) LinkFilesOnce() bool {
	return s.config.StoreFilesOnce == nil || *s.config.StoreFilesOnce
}

// linkKey is a file's key in links/: the hash of its manifest line without its name.
func linkKey(e *Entry) Hash {
	c := *e
	c.Path = ""
	return Sum(c.appendLine(nil))
}

func (s *Store) linkFile(key Hash) string {
	h := key.Hex()
	return filepath.Join(s.root, dirLinks, h[:2], h[2:])
}

// linkable reports whether a file entry may be stored once. Empty files have
// no bytes to save and would run into the filesystem's link limit first;
// setuid and setgid files and files with capabilities are kept apart so that
// no privileged binary is reachable under another name than its path's.
func linkable(e *Entry) bool {
	if e.Type != EntryFile || e.Size == 0 || e.Mode&(unix.S_ISUID|unix.S_ISGID) != 0 {
		return false
	}
	for _, x := range e.Xattrs {
		if x.Name == "security.capability" {
			return false
		}
	}
	return true
}

// LinkResult is what linking a tree's files did.
type LinkResult struct {
	Linked int   `json:"linked"` // files replaced by the copy in links/
	Saved  int64 `json:"saved"`  // bytes freed on disk by it
}

// linkTree stores the files of the tree at dir, described by m, once:
// each linkable file becomes a hard link of its entry in links/, made from
// it if there is none. trusted says the files were hashed into m just now (a
// staged output); otherwise a file is hashed before it becomes an entry, so
// that a damaged path never spreads its damage. A file that is not what m
// says is left alone: reporting it is verify's job. A directory whose
// entries were replaced gets its recorded times back.
func (s *Store) linkTree(ctx context.Context, dir string, m *Manifest, trusted bool) (LinkResult, error) {
	var res LinkResult
	if len(m.Entries) == 0 || m.Entries[0].Type != EntryDir {
		return res, nil // a single file (a .drv, a .deb) is its own path's only name
	}
	if err := s.linksDir(); err != nil {
		return res, err
	}
	grouped := make(map[string]bool)
	dirs := make(map[string]*Entry)
	for i := range m.Entries {
		e := &m.Entries[i]
		switch e.Type {
		case EntryHardlink:
			grouped[e.Target] = true
		case EntryDir:
			dirs[e.Path] = e
		}
	}
	seen := make(map[Hash]bool)
	fh := fileHashers.Get().(*fileHasher)
	defer fileHashers.Put(fh)
	for i := range m.Entries {
		e := &m.Entries[i]
		if !linkable(e) || grouped[e.Path] {
			continue
		}
		key := linkKey(e)
		if seen[key] {
			continue
		}
		seen[key] = true
		if err := ctx.Err(); err != nil {
			return res, err
		}
		linked, saved, err := s.linkOne(ctx, fh, filepath.Join(dir, e.Path), e, key, trusted)
		if err != nil {
			return res, err
		}
		if linked {
			res.Linked++
			res.Saved += saved
			// At once, not at the end: an optimise stopped here leaves no directory changed.
			d := dirs[path.Dir(e.Path)]
			if d == nil {
				return res, fmt.Errorf("link files of %s: no manifest entry for directory %s", dir, path.Dir(e.Path))
			}
			ts := []unix.Timespec{{Sec: d.Mtime}, {Sec: d.Mtime}}
			if err := unix.UtimesNanoAt(unix.AT_FDCWD, filepath.Join(dir, d.Path), ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return res, fmt.Errorf("link files of %s: restore the times of %s: %w", dir, d.Path, err)
			}
		}
	}
	return res, nil
}

// linkOne makes the file at name (entry e) a link of links/'s entry for key,
// or that entry a link of it. linked says name was replaced; saved is the
// size of what that freed (nothing if name had other links).
func (s *Store) linkOne(ctx context.Context, fh *fileHasher, name string, e *Entry, key Hash, trusted bool) (linked bool, saved int64, err error) {
	var fst unix.Stat_t
	if err := unix.Lstat(name, &fst); err != nil || !sameMeta(&fst, e) {
		return false, 0, nil // not what the manifest says: verify reports it
	}
	entry := s.linkFile(key)
	for attempt := 0; attempt < 3; attempt++ {
		var est unix.Stat_t
		err := unix.Lstat(entry, &est)
		if errors.Is(err, unix.ENOENT) {
			if !trusted && !s.hashes(ctx, fh, name, &fst, e) {
				return false, 0, nil
			}
			err := unix.Link(name, entry)
			if errors.Is(err, unix.ENOENT) {
				if err := os.Mkdir(filepath.Dir(entry), 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
					return false, 0, fmt.Errorf("link files: %w", err)
				}
				err = unix.Link(name, entry)
			}
			switch {
			case errors.Is(err, unix.EEXIST):
				continue // another process made it first: use it
			case err == nil, linkRefused(err):
				return false, 0, nil // name is the entry now (or stays a copy)
			}
			return false, 0, fmt.Errorf("link files: %s: %w", name, err)
		}
		if err != nil {
			return false, 0, fmt.Errorf("link files: %w", err)
		}
		if est.Dev == fst.Dev && est.Ino == fst.Ino {
			return false, 0, nil // stored once already
		}
		if !sameMeta(&est, e) || !s.hashes(ctx, fh, entry, &est, e) {
			// A damaged entry: the file takes its place, so that no path links to it again.
			if !trusted && !s.hashes(ctx, fh, name, &fst, e) {
				return false, 0, nil
			}
			if err := s.replaceWithLink(name, entry); err != nil && !linkRefused(err) && !errors.Is(err, unix.ENOENT) {
				return false, 0, err
			}
			return false, 0, nil
		}
		if !trusted && !s.hashes(ctx, fh, name, &fst, e) {
			// Damaged: replacing it would be a repair, which is asked for, audited and
			// reported; verify names it first.
			return false, 0, nil
		}
		err = s.replaceWithLink(entry, name)
		switch {
		case err == nil:
			if fst.Nlink == 1 {
				saved = fst.Size
			}
			return true, saved, nil
		case errors.Is(err, unix.ENOENT):
			continue // gc removed the entry in between: make it again
		case linkRefused(err):
			return false, 0, nil // stays a copy
		}
		return false, 0, err
	}
	return false, 0, nil
}

// linkRefused says that the file system will not make this link (the entry has all the links it
// allows, another file system, an immutable file): the file stays a copy, which is no error.
func linkRefused(err error) bool {
	return errors.Is(err, unix.EMLINK) || errors.Is(err, unix.EXDEV) || errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES)
}

// replaceWithLink replaces dst by a hard link of src, atomically: the link is
// made under a temporary name in links/ and renamed over dst.
func (s *Store) replaceWithLink(src, dst string) error {
	tmp := filepath.Join(s.root, dirLinks, linkTmpPrefix+randomSuffix())
	if err := unix.Link(src, tmp); err != nil {
		return fmt.Errorf("link files: %s: %w", src, err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("link files: %w", err)
	}
	return nil
}

// sameMeta reports whether st is a regular file with what e records of it.
func sameMeta(st *unix.Stat_t, e *Entry) bool {
	return st.Mode&unix.S_IFMT == unix.S_IFREG && st.Mode&07777 == e.Mode && st.Uid == e.UID &&
		st.Gid == e.GID && st.Mtim.Sec == e.Mtime && st.Size == e.Size
}

// hashes reports whether the file at name (lstat st) has e's digest and xattrs.
func (s *Store) hashes(ctx context.Context, fh *fileHasher, name string, st *unix.Stat_t, e *Entry) bool {
	d, err := fh.hashFile(ctx, name, inodeKey{st.Dev, st.Ino}, st.Size, nil)
	if err != nil || d != e.Digest {
		return false
	}
	xs, err := readManifestXattrs(name)
	if err != nil || len(xs) != len(e.Xattrs) {
		return false
	}
	for i := range xs {
		if xs[i].Name != e.Xattrs[i].Name || string(xs[i].Value) != string(e.Xattrs[i].Value) {
			return false
		}
	}
	return true
}

// linksDir makes links/ if this store predates it, and checks that it is private.
func (s *Store) linksDir() error {
	d := filepath.Join(s.root, dirLinks)
	if err := os.Mkdir(d, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("create %s: %w", d, err)
	}
	return checkPrivateDir(d)
}

// OptimiseResult is what Optimise did.
type OptimiseResult struct {
	Paths int `json:"paths"` // directory paths looked at
	LinkResult
}

// Optimise stores the files of the store's valid paths once (those registered
// before files were stored once, or while the store said not to). Each path
// is held (a temporary root and its lock) while its files are replaced, so
// neither gc nor a repair runs over it. Its files are hashed before they
// become an entry of links/. progress, if not nil, is called after each path.
func (s *Store) Optimise(ctx context.Context, progress func(done, total int)) (*OptimiseResult, error) {
	infos, _, err := s.All()
	if err != nil {
		return nil, err
	}
	res := &OptimiseResult{}
	done := 0
	for p := range infos {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		lr, ok, err := s.optimisePath(ctx, p)
		if err != nil {
			return res, err
		}
		if ok {
			res.Paths++
			res.Linked += lr.Linked
			res.Saved += lr.Saved
		}
		done++
		if progress != nil {
			progress(done, len(infos))
		}
	}
	return res, nil
}

func (s *Store) optimisePath(ctx context.Context, p Path) (LinkResult, bool, error) {
	if err := s.AddTempRoot(ctx, p); err != nil {
		return LinkResult{}, false, err
	}
	pl, err := lock(ctx, s.pathLockFile(p), unix.LOCK_EX)
	if err != nil {
		return LinkResult{}, false, err
	}
	defer pl.unlock()
	if !s.IsValid(p) {
		return LinkResult{}, false, nil // collected since it was listed
	}
	m, err := s.Manifest(p)
	if err != nil {
		return LinkResult{}, false, nil // verify reports an unreadable manifest
	}
	if len(m.Entries) == 0 || m.Entries[0].Type != EntryDir {
		return LinkResult{}, false, nil
	}
	lr, err := s.linkTree(ctx, s.Location(p), m, false)
	if err != nil {
		return lr, true, fmt.Errorf("optimise %s: %w", p, err)
	}
	if lr.Linked > 0 {
		// The renames and times durable before the next path: a crash leaves this one whole.
		if err := SyncTree(s.Location(p)); err != nil {
			return lr, true, err
		}
	}
	return lr, true, nil
}

// LinkStats is what storing files once saves.
type LinkStats struct {
	Files  int   `json:"files"`  // files in links/ that paths use
	Bytes  int64 `json:"bytes"`  // their size, stored once
	Saved  int64 `json:"saved"`  // bytes that copies of them would take
	Unused int   `json:"unused"` // entries no path uses any more, which gc removes
}

// Links counts the entries of links/ and what they save.
func (s *Store) Links(ctx context.Context) (*LinkStats, error) {
	st := &LinkStats{}
	err := s.walkLinks(ctx, func(name string, est *unix.Stat_t) error {
		if est.Nlink <= 1 {
			st.Unused++
			return nil
		}
		st.Files++
		st.Bytes += est.Size
		st.Saved += est.Size * int64(est.Nlink-2)
		return nil
	})
	return st, err
}

// walkLinks calls fn for each entry of links/ (not the temporaries).
func (s *Store) walkLinks(ctx context.Context, fn func(name string, st *unix.Stat_t) error) error {
	d := filepath.Join(s.root, dirLinks)
	shards, err := readNames(d)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	for _, sh := range shards {
		if len(sh) != 2 {
			continue
		}
		names, err := readNames(filepath.Join(d, sh))
		if err != nil {
			return err
		}
		for _, n := range names {
			if err := ctx.Err(); err != nil {
				return err
			}
			name := filepath.Join(d, sh, n)
			var st unix.Stat_t
			if err := unix.Lstat(name, &st); err != nil {
				continue
			}
			if err := fn(name, &st); err != nil {
				return err
			}
		}
	}
	return nil
}

// sweepLinks removes the entries of links/ that no path uses, and temporaries
// of crashed links, and returns how many and their bytes. A link made from
// an entry right after its count was read keeps its inode: the entry is
// only made again by the next path that has the file.
func (s *Store) sweepLinks(ctx context.Context) (n int, freed int64, err error) {
	d := filepath.Join(s.root, dirLinks)
	if names, err := readNames(d); err == nil {
		for _, name := range names {
			if strings.HasPrefix(name, linkTmpPrefix) {
				// A link shares its file's mtime; its ctime is when it was made.
				var st unix.Stat_t
				if unix.Lstat(filepath.Join(d, name), &st) == nil && time.Since(time.Unix(st.Ctim.Unix())) > time.Minute {
					if os.Remove(filepath.Join(d, name)) == nil {
						n++
					}
				}
			}
		}
	}
	err = s.walkLinks(ctx, func(name string, st *unix.Stat_t) error {
		if st.Nlink == 1 && os.Remove(name) == nil {
			n++
			freed += st.Size
		}
		return nil
	})
	return n, freed, err
}

// SharedBytes is the bytes of p's files that are stored once with other paths: linked into
// links/ and used by another path too.
func (s *Store) SharedBytes(p Path) (int64, error) {
	m, err := s.Manifest(p)
	if err != nil {
		return 0, err
	}
	if len(m.Entries) == 0 || m.Entries[0].Type != EntryDir {
		return 0, nil
	}
	grouped := make(map[string]bool)
	for i := range m.Entries {
		if m.Entries[i].Type == EntryHardlink {
			grouped[m.Entries[i].Target] = true
		}
	}
	loc := s.Location(p)
	var n int64
	for i := range m.Entries {
		e := &m.Entries[i]
		if e.Type != EntryFile || grouped[e.Path] {
			continue
		}
		var st unix.Stat_t
		// A link of links/ and of another path besides this one (files linked within their own
		// path are never stored once).
		if unix.Lstat(filepath.Join(loc, e.Path), &st) == nil && st.Nlink > 2 && linkable(e) {
			n += e.Size
		}
	}
	return n, nil
}
