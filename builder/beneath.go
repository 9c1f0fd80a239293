package builder

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"

	"golang.org/x/sys/unix"
)

// Store paths and build outputs are files a build made, so a maintainer script chose them: reading
// one from the host must not follow a symlink it planted (var/lib/dpkg/status -> /etc/shadow) out of
// the tree. These read beneath a root with no symlink at all, as openat2 resolves it.

// maxBeneath bounds a file read from a layer (Debian's largest Packages index is about 50 MB).
const maxBeneath = 256 << 20

var errNotRegular = errors.New("not a regular file")

func openAt(root, rel string, flags int) (*os.File, error) {
	rfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(rfd)
	fd, err := unix.Openat2(rfd, rel, &unix.OpenHow{
		Flags:   uint64(flags | unix.O_NOFOLLOW | unix.O_CLOEXEC),
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	})
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: root + "/" + rel, Err: err}
	}
	return os.NewFile(uintptr(fd), root+"/"+rel), nil
}

// ReadBeneath reads the regular file rel under root, following no symlink on the way. A missing
// file is an error satisfying errors.Is(err, fs.ErrNotExist).
func ReadBeneath(root, rel string) ([]byte, error) {
	f, err := openAt(root, rel, unix.O_RDONLY|unix.O_NONBLOCK)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("read %s: %w", f.Name(), errNotRegular)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxBeneath+1))
	if err == nil && len(b) > maxBeneath {
		err = fmt.Errorf("read %s: larger than %d bytes", f.Name(), maxBeneath)
	}
	return b, err
}

// ReadTop reads rel from the topmost of layers (bottom first) that has it, as an overlay of them
// shows it, following no symlink. If none has it, the error satisfies errors.Is(err, fs.ErrNotExist).
func ReadTop(layers []string, rel string) ([]byte, error) {
	for i := len(layers) - 1; i >= 0; i-- {
		b, err := ReadBeneath(layers[i], rel)
		if !errors.Is(err, fs.ErrNotExist) {
			return b, err
		}
	}
	return nil, &os.PathError{Op: "read", Path: rel, Err: fs.ErrNotExist}
}

// ReadDirBeneath lists the directory rel under root (sorted), following no symlink on the way.
func ReadDirBeneath(root, rel string) ([]string, error) {
	f, err := openAt(root, rel, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	slices.Sort(names)
	return names, err
}
