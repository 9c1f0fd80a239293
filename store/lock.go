package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"toolshed.dev/shed/internal/atomicfile"
)

// ErrLocked is returned by a non-blocking lock attempt on a held lock.
var ErrLocked = errors.New("locked")

// lockFile is an flock(2) on a file that stays linked while held. flock locks
// are released by the kernel when the holder dies, so a SIGKILLed shed never
// leaves a stale lock behind.
type lockFile struct{ f *os.File }

// lock opens (creating) name and takes an flock of kind how (unix.LOCK_SH or
// unix.LOCK_EX), waiting until it is free or ctx is done. Lock files may be
// deleted by gc while nobody holds them, so after locking we check that the
// file we hold is still the one at name, and retry if not (as Nix does).
func lock(ctx context.Context, name string, how int) (*lockFile, error) {
	delay := time.Millisecond
	for {
		l, err := tryLock(name, how)
		if err == nil {
			return l, nil
		}
		if !errors.Is(err, ErrLocked) {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for lock %s: %w", name, ctx.Err())
		case <-time.After(delay):
		}
		// Back off to at most 50 ms: builds take seconds, waiting a little
		// longer than needed costs nothing, spinning costs a core.
		if delay < 50*time.Millisecond {
			delay *= 2
		}
	}
}

// tryLock is lock without waiting: it returns ErrLocked if another holder has it.
func tryLock(name string, how int) (*lockFile, error) {
	for {
		f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return nil, fmt.Errorf("open lock %s: %w", name, err)
		}
		if err := unix.Flock(int(f.Fd()), how|unix.LOCK_NB); err != nil {
			f.Close()
			if errors.Is(err, unix.EWOULDBLOCK) {
				return nil, ErrLocked
			}
			return nil, fmt.Errorf("flock %s: %w", name, err)
		}
		if sameFile(f, name) {
			return &lockFile{f}, nil
		}
		f.Close() // deleted under us: lock the new file instead
	}
}

func sameFile(f *os.File, name string) bool {
	var a, b unix.Stat_t
	if unix.Fstat(int(f.Fd()), &a) != nil || unix.Stat(name, &b) != nil {
		return false
	}
	return a.Dev == b.Dev && a.Ino == b.Ino
}

func (l *lockFile) unlock() error {
	if l == nil || l.f == nil {
		return nil
	}
	err := l.f.Close() // closing the only descriptor releases the flock
	l.f = nil
	return err
}

// unlockAndRemove deletes the lock file while still holding the lock, so that
// a waiter that opened the old file notices (sameFile) and retries.
func (l *lockFile) unlockAndRemove() error {
	if l == nil || l.f == nil {
		return nil
	}
	err := os.Remove(l.f.Name())
	if cerr := l.unlock(); err == nil {
		err = cerr
	}
	return err
}

func (s *Store) gcLockFile() string { return filepath.Join(s.root, dirLocks, fileGCLock) }

func (s *Store) pathLockFile(p Path) string {
	return filepath.Join(s.root, dirLocks, p.HashPart()+".lock")
}

// writeFileAtomic writes data to name so that a crash leaves either the old file or the new one,
// durable once it returns (a temporary file, fsync, rename, fsync of the directory).
func writeFileAtomic(name string, data []byte, perm os.FileMode) error {
	return atomicfile.WriteFile(name, data, perm)
}

// syncDir makes the entries of a directory (creations, renames, deletions) durable.
func syncDir(dir string) error { return atomicfile.SyncDir(dir) }
