package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// A temporary root keeps a path alive for as long as the process that holds it
// runs: a realize in progress, a running Bench. Each process appends the paths
// it holds to its own file under temproots/, which it keeps flock-ed; gc reads
// the files of live holders and deletes those nobody holds.
//
// The protocol cannot race a deletion: a holder appends under a shared gc.lock,
// and gc holds gc.lock exclusively from reading the roots until its last delete.
// So a root is either seen by gc, or added after gc is done; in the second case
// the caller checks validity after adding the root and rebuilds what is gone.

// AddTempRoot keeps p alive until this Store is closed or the process exits.
// p need not be valid yet: builders root their output before building it.
func (s *Store) AddTempRoot(ctx context.Context, p Path) error {
	return s.AddTempRoots(ctx, []Path{p})
}

// AddTempRoots is AddTempRoot for several paths, under one gc lock.
func (s *Store) AddTempRoots(ctx context.Context, ps []Path) error {
	s.tempMu.Lock()
	defer s.tempMu.Unlock()
	if err := s.openTempRootsLocked(ctx); err != nil {
		return err
	}
	gcl, err := lock(ctx, s.gcLockFile(), unix.LOCK_SH)
	if err != nil {
		return err
	}
	defer gcl.unlock()
	var b bytes.Buffer
	for _, p := range ps {
		b.WriteString(p.String())
		b.WriteByte('\n')
	}
	// One write per call; O_APPEND keeps concurrent goroutines' lines whole.
	if _, err := s.tempRoots.Write(b.Bytes()); err != nil {
		return fmt.Errorf("add temporary root: %w", err)
	}
	return nil
}

func (s *Store) openTempRootsLocked(ctx context.Context) error {
	if s.tempRoots != nil {
		return nil
	}
	for {
		// One file per Store, not per process: two Stores in one process must
		// not share (or truncate) each other's roots. The pid in the name is
		// for people; liveness is the flock.
		name := filepath.Join(s.root, dirTempRoots, strconv.Itoa(os.Getpid())+"-"+randomSuffix())
		f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL|os.O_APPEND|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return fmt.Errorf("create temporary roots file: %w", err)
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			return fmt.Errorf("lock %s: %w", name, err)
		}
		// gc may have found the file unlocked between our open and flock,
		// judged its owner dead and deleted it: then start again.
		if sameFile(f, name) {
			s.tempRoots = f
			return nil
		}
		f.Close()
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

// liveTempRoots returns the paths held by live processes and deletes the files
// of dead ones. The caller holds gc.lock exclusively.
func (s *Store) liveTempRoots() (map[Path]bool, error) {
	dir := filepath.Join(s.root, dirTempRoots)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", dir, err)
	}
	roots := map[Path]bool{}
	for _, e := range ents {
		name := filepath.Join(dir, e.Name())
		if own := s.tempRootsName(); own == name {
			// Our own file: probing it through another descriptor would
			// fail (flock conflicts between descriptions), but reading is simpler.
			if err := readRootLines(name, roots); err != nil {
				return nil, err
			}
			continue
		}
		l, err := tryLock(name, unix.LOCK_EX)
		if errors.Is(err, ErrLocked) {
			if err := readRootLines(name, roots); err != nil {
				return nil, err
			}
			continue
		}
		if err != nil {
			return nil, err
		}
		// Nobody holds it: its process is gone.
		if err := l.unlockAndRemove(); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("remove stale temporary roots %s: %w", name, err)
		}
	}
	return roots, nil
}

// heldByOthers reports whether a live process other than this Store holds p as a temporary root:
// a Bench over it, a build using it. Unlike liveTempRoots it takes no gc.lock and deletes nothing.
func (s *Store) heldByOthers(p Path) (bool, error) {
	dir := filepath.Join(s.root, dirTempRoots)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return false, fmt.Errorf("read %s: %w", dir, err)
	}
	own := s.tempRootsName()
	for _, e := range ents {
		name := filepath.Join(dir, e.Name())
		if name == own {
			continue
		}
		l, err := tryLock(name, unix.LOCK_EX)
		if err == nil {
			l.unlock() // its process is gone
			continue
		}
		if !errors.Is(err, ErrLocked) {
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			return false, err
		}
		held := map[Path]bool{}
		if err := readRootLines(name, held); err != nil {
			return false, err
		}
		if held[p] {
			return true, nil
		}
	}
	return false, nil
}

func (s *Store) tempRootsName() string {
	s.tempMu.Lock()
	defer s.tempMu.Unlock()
	if s.tempRoots == nil {
		return ""
	}
	return s.tempRoots.Name()
}

func readRootLines(name string, into map[Path]bool) error {
	b, err := os.ReadFile(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return fmt.Errorf("read temporary roots %s: %w", name, err)
	}
	// Every line, however long: a line that ended the reading (bufio.Scanner stops at 64 KiB) would
	// hide the live roots after it from gc.
	for line := range bytes.Lines(b) {
		// A line cut short by a crash mid-write does not parse; ignoring it is
		// safe because its writer is dead.
		if p, err := ParsePath(strings.TrimSuffix(string(line), "\n")); err == nil {
			into[p] = true
		}
	}
	return nil
}

// Root is a named gc root.
type Root struct {
	Name string `json:"name"`
	Path Path   `json:"path"`
}

var rootNameRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`) })

// CheckRootName validates a root name.
func CheckRootName(name string) error {
	if !rootNameRE().MatchString(name) {
		return fmt.Errorf("bad root name %q: use letters, digits, '.', '_' and '-', starting with a letter or digit", name)
	}
	return nil
}

// AddRoot makes name a root for p, replacing an existing root of that name.
// p must be valid.
func (s *Store) AddRoot(ctx context.Context, name string, p Path) error {
	if err := CheckRootName(name); err != nil {
		return err
	}
	gcl, err := lock(ctx, s.gcLockFile(), unix.LOCK_SH)
	if err != nil {
		return err
	}
	defer gcl.unlock()
	// Checked under the gc lock: gc cannot delete p between check and write.
	if !s.IsValid(p) {
		return fmt.Errorf("add root %s: %w: %s", name, ErrNotExist, p)
	}
	return writeFileAtomic(filepath.Join(s.root, dirRoots, name), []byte(p.String()+"\n"), 0o600)
}

// RemoveRoot removes a named root.
func (s *Store) RemoveRoot(name string) error {
	if err := CheckRootName(name); err != nil {
		return err
	}
	err := os.Remove(filepath.Join(s.root, dirRoots, name))
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove root %s: %w", name, ErrRootNotExist)
	} else if err != nil {
		return fmt.Errorf("remove root %s: %w", name, err)
	}
	return syncDir(filepath.Join(s.root, dirRoots))
}

// Roots lists the named roots, sorted by name. A root file that does not name
// a path (damaged by hand) is reported as an error rather than ignored, since
// ignoring it would let gc delete what it protected.
func (s *Store) Roots() ([]Root, error) {
	dir := filepath.Join(s.root, dirRoots)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", dir, err)
	}
	var roots []Root
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") { // atomicfile temporary files
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("read root %s: %w", e.Name(), err)
		}
		p, err := ParsePath(strings.TrimSpace(string(b)))
		if err != nil {
			return nil, fmt.Errorf("root %s: %w", e.Name(), err)
		}
		roots = append(roots, Root{Name: e.Name(), Path: p})
	}
	return roots, nil
}

// RootPath returns the path the named root holds, or ErrRootNotExist: a realize reads its
// Workshop's root only, not every root's file.
func (s *Store) RootPath(name string) (Path, error) {
	if err := CheckRootName(name); err != nil {
		return Path{}, err
	}
	b, err := os.ReadFile(filepath.Join(s.root, dirRoots, name))
	if errors.Is(err, fs.ErrNotExist) {
		return Path{}, fmt.Errorf("root %s: %w", name, ErrRootNotExist)
	} else if err != nil {
		return Path{}, fmt.Errorf("read root %s: %w", name, err)
	}
	p, err := ParsePath(strings.TrimSpace(string(b)))
	if err != nil {
		return Path{}, fmt.Errorf("root %s: %w", name, err)
	}
	return p, nil
}
