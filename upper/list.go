package upper

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
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
