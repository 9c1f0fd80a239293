package bench

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// A file's metadata (the E2B API's) is envd's: extended attributes in the user.e2b. namespace, kept
// with the file (a rename keeps them, a new file has none). They are read and written from the
// supervisor, through the root of the Bench's init with openat2 RESOLVE_IN_ROOT, never following the
// file's own symlink: the Bench's view, never a host path.

// MetadataPrefix is the namespace of a file's metadata among its extended attributes.
const MetadataPrefix = "user.e2b."

// Bounds on one file's metadata: a key (an attribute name is at most 255 bytes), and all its values
// (most filesystems keep a file's attributes in one block).
const (
	MaxMetadataKey   = 255 - len(MetadataPrefix)
	MaxMetadataBytes = 3 << 10
)

// benchRoot opens the root of a running Bench as its init sees it.
func benchRoot(rec *Record) (int, error) {
	if !rec.Running || rec.Pid <= 0 {
		return -1, fmt.Errorf("bench %s is not running", rec.Name)
	}
	fd, err := unix.Open(fmt.Sprintf("/proc/%d/root", rec.Pid), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("bench %s: its root: %w", rec.Name, err)
	}
	return fd, nil
}

// openIn opens p (absolute, as the Bench names it) under root, the file itself if it is a symlink.
func openIn(root int, p string) (int, error) {
	return unix.Openat2(root, inRoot(p), &unix.OpenHow{Flags: unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS})
}

// inRoot is an absolute path of a Bench relative to its root ("." for the root itself: openat2
// takes no empty path).
func inRoot(p string) string {
	if rel := strings.TrimLeft(p, "/"); rel != "" {
		return rel
	}
	return "."
}

// Metadata returns the metadata of each of paths of the running Bench rec (nil for a file with none,
// or that cannot be read).
func Metadata(rec *Record, paths []string) ([]map[string]string, error) {
	root, err := benchRoot(rec)
	if err != nil {
		return nil, err
	}
	defer unix.Close(root)
	out := make([]map[string]string, len(paths))
	for i, p := range paths {
		fd, err := openIn(root, p)
		if err != nil {
			continue
		}
		out[i] = readMetadata(fd)
		unix.Close(fd)
	}
	return out, nil
}

// fdPath names the file of an O_PATH descriptor for the *xattr calls, which take no such descriptor.
func fdPath(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

func metadataNames(fd int) []string {
	buf := make([]byte, 64<<10)
	n, err := unix.Listxattr(fdPath(fd), buf)
	if err != nil {
		return nil
	}
	var names []string
	for _, name := range strings.Split(string(buf[:n]), "\x00") {
		if strings.HasPrefix(name, MetadataPrefix) && len(name) > len(MetadataPrefix) {
			names = append(names, name)
		}
	}
	return names
}

func readMetadata(fd int) map[string]string {
	var md map[string]string
	buf := make([]byte, MaxMetadataBytes)
	for _, name := range metadataNames(fd) {
		n, err := unix.Getxattr(fdPath(fd), name, buf)
		if err != nil {
			continue
		}
		if md == nil {
			md = map[string]string{}
		}
		md[strings.TrimPrefix(name, MetadataPrefix)] = string(buf[:n])
	}
	return md
}

// SetMetadata makes md the metadata of each of paths (regular files of the running Bench rec): what
// they had is removed, as a file written anew has none.
func SetMetadata(rec *Record, paths []string, md map[string]string) error {
	root, err := benchRoot(rec)
	if err != nil {
		return err
	}
	defer unix.Close(root)
	for _, p := range paths {
		fd, err := openIn(root, p)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		err = setMetadata(fd, md)
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
	}
	return nil
}

func setMetadata(fd int, md map[string]string) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return errors.New("not a regular file")
	}
	for _, name := range metadataNames(fd) {
		if _, keep := md[strings.TrimPrefix(name, MetadataPrefix)]; keep {
			continue
		}
		if err := unix.Removexattr(fdPath(fd), name); err != nil && !errors.Is(err, unix.ENODATA) {
			return fmt.Errorf("remove metadata %s: %w", strings.TrimPrefix(name, MetadataPrefix), err)
		}
	}
	for k, v := range md {
		if err := unix.Setxattr(fdPath(fd), MetadataPrefix+k, []byte(v), 0); err != nil {
			if errors.Is(err, unix.ENOTSUP) {
				return fmt.Errorf("metadata: its filesystem keeps no user extended attributes: %w", err)
			}
			if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.E2BIG) {
				return fmt.Errorf("metadata %s: no room among the file's extended attributes: %w", k, err)
			}
			return fmt.Errorf("metadata %s: %w", k, err)
		}
	}
	return nil
}
