package upper

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// List is the uppers directly under dir (such as "benches"), by their last part; the parts of
// changes under way (dot names) are not listed. A dir with none yet is empty, not an error.
func (f *FS) List(dir string) ([]string, error) {
	p, err := f.path(dir)
	if err != nil {
		return nil, err
	}
	ents, err := os.ReadDir(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			if _, err := os.Lstat(filepath.Join(p, e.Name(), upperSubdir)); err == nil {
				out = append(out, e.Name())
			}
		}
	}
	return out, nil
}

// OpenMounted is Open for a caller that only tidies up (a sweep): the uppers as they are, but nil
// (and no error) where they are an image not mounted now, which it does not mount (a mount would
// outlive the command that made it; the supervisor mounts them when it starts).
func OpenMounted(storeRoot string) (*FS, error) {
	dir := filepath.Join(storeRoot, dirName)
	if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if _, err := os.Lstat(filepath.Join(storeRoot, imageName)); err == nil {
		if ok, err := isBtrfs(dir); err != nil || !ok {
			return nil, err
		}
	}
	return Open(storeRoot, Options{})
}

// SweepParts removes under dir (such as "benches") the parts of changes a crash cut short (a Create
// or Branch of a name nothing will make again: names are random ids) that are older than age, so as
// not to race one under way. It returns how many.
func (f *FS) SweepParts(dir string, age time.Duration) (int, error) {
	p, err := f.path(dir)
	if err != nil {
		return 0, err
	}
	ents, err := os.ReadDir(p)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	} else if err != nil {
		return 0, err
	}
	n := 0
	var errs []error
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), ".") || !strings.HasSuffix(e.Name(), partSuffix) {
			continue
		}
		if fi, err := e.Info(); err != nil || time.Since(fi.ModTime()) < age {
			continue
		}
		if err := f.removeDir(filepath.Join(p, e.Name())); err != nil {
			errs = append(errs, err)
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}
