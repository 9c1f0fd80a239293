package sandbox

import (
	"os"

	"golang.org/x/sys/unix"
)

// PrivateDir returns the root directory of a new tmpfs that is attached nowhere (a detached mount; mode
// 0700, nosuid, nodev, noexec): what is made in it is reached only through this descriptor
// ("/proc/self/fd/N/NAME") and the binds cloned from its files (Bind.SourceFD), and is freed with the
// last of them. It is for a unix socket that a sandbox reaches through a bind. Bound through
// /proc/self/fd, the socket's address in /proc/net/unix names no host path; and its bind in the
// sandbox's mountinfo, which any user can read, is "/NAME" on a file system named "tmpfs", not a path
// that says whose sandbox it serves or where that sandbox's state is.
func PrivateDir() (*os.File, error) {
	m, err := detachedMount("tmpfs", func(ctx int) error {
		for _, kv := range [][2]string{{"source", "tmpfs"}, {"mode", "0700"}, {"size", "4k"}} {
			if err := unix.FsconfigSetString(ctx, kv[0], kv[1]); err != nil {
				return err
			}
		}
		return nil
	}, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC)
	if err != nil {
		return nil, &SetupError{Op: "make a private directory", Err: err}
	}
	return os.NewFile(uintptr(m), "private tmpfs"), nil
}
