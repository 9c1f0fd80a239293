// Package atomicfile replaces files so that a crash (SIGKILL, power loss) leaves either the old
// content or the new one, whole, and the new one durable once the call returns. It is the one way
// shed writes state that other code trusts: records, proposals, keys, replay state, config, Benches.
//
// It is ours rather than google/renameio's because renameio does not fsync the directory, so a
// rename it reports done can be lost with the power; the whole of it is the few lines below.
package atomicfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// WriteFile writes data to path with mode perm, replacing whatever was there: a temporary file of a
// unique name in path's directory is written, set to perm (exactly: the umask does not apply),
// fsynced, closed and renamed over path, then the directory is fsynced. Concurrent writers of one path
// all succeed, and the file is one of their writes, whole. On an error nothing is left behind but the
// old file, and the error is an *os.PathError for path (Op "write") whose Err names the step that
// failed: "write /r/config.toml: fsync: input/output error".
func WriteFile(path string, data []byte, perm os.FileMode) error {
	return write(path, data, perm, true)
}

// Replace is WriteFile without its fsyncs: a reader sees the old content or the new, whole, but after
// a crash the file may be either. It is for state that a crash makes moot, such as the record of a
// running process, which the crash ended too.
func Replace(path string, data []byte, perm os.FileMode) error {
	return write(path, data, perm, false)
}

func write(path string, data []byte, perm os.FileMode, durable bool) (err error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return writeError(path, "create temporary file", err)
	}
	tmp := f.Name()
	closed := false
	step := ""
	defer func() {
		if err != nil {
			if !closed {
				f.Close()
			}
			os.Remove(tmp)
			err = writeError(path, step, err)
		}
	}()
	step = "write"
	if _, err = f.Write(data); err != nil {
		return err
	}
	step = "chmod"
	if err = f.Chmod(perm); err != nil {
		return err
	}
	step = "fsync"
	if durable {
		if err = f.Sync(); err != nil {
			return err
		}
	}
	step, closed = "close", true
	if err = f.Close(); err != nil {
		return err
	}
	step = "rename"
	if err = os.Rename(tmp, path); err != nil {
		return err
	}
	if !durable {
		return nil
	}
	step = "fsync directory"
	return syncDir(dir)
}

// writeError is the error of a WriteFile of path that failed at step. The os errors name the
// temporary file, which is gone: only their cause is kept.
func writeError(path, step string, err error) error {
	var pe *os.PathError
	var le *os.LinkError
	if errors.As(err, &pe) {
		err = pe.Err
	} else if errors.As(err, &le) {
		err = le.Err
	}
	return &os.PathError{Op: "write", Path: path, Err: fmt.Errorf("%s: %w", step, err)}
}

// SyncDir makes dir's entries (files created, renamed or removed in it) durable: for callers that
// rename a directory into place, and after the creation of a directory. Its error is an
// *os.PathError for dir (Op "fsync").
func SyncDir(dir string) error {
	if err := syncDir(dir); err != nil {
		return &os.PathError{Op: "fsync", Path: dir, Err: err}
	}
	return nil
}

func syncDir(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open: %w", err)
	}
	if err := unix.Fsync(fd); err != nil {
		unix.Close(fd)
		return err
	}
	if err := unix.Close(fd); err != nil {
		return fmt.Errorf("close: %w", err)
	}
	return nil
}

// MkdirAll is os.MkdirAll whose creations are durable: the parent of every directory it creates is
// fsynced, so what is then written inside cannot outlive, after a power loss, the directory it is in.
func MkdirAll(dir string, perm os.FileMode) error {
	var created []string // missing now, innermost first
	for d := filepath.Clean(dir); ; {
		if _, err := os.Stat(d); err == nil {
			break
		} else if !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("create directory %s: %w", dir, err)
		}
		created = append(created, d)
		parent := filepath.Dir(d)
		if parent == d {
			break
		}
		d = parent
	}
	if len(created) == 0 {
		return nil
	}
	if err := os.MkdirAll(dir, perm); err != nil {
		return fmt.Errorf("create directory %s: %w", dir, err)
	}
	for _, d := range created {
		if err := SyncDir(filepath.Dir(d)); err != nil {
			return err
		}
	}
	return nil
}
