package bench

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"toolshed.dev/shed/internal/userns"
	"toolshed.dev/shed/recipe"
	"toolshed.dev/shed/sandbox"
	"toolshed.dev/shed/store"
)

// Grant is a host directory or file mounted into a Bench.
type Grant struct {
	Host  string // host path as asked
	Bench string // path inside the Bench
	Mode  string // "ro" or "rw"
}

// ErrGrant marks a grant that is refused.
var ErrGrant = errors.New("grant refused")

// Refusals that say more (each is also ErrGrant): a symlink on the way, a
// writable grant of a directory that root owns, and a directory whose group
// is not one of its owner's.
var (
	ErrGrantSymlink = fmt.Errorf("%w", ErrGrant)
	ErrGrantRoot    = fmt.Errorf("%w", ErrGrant)
	ErrGrantNotOwn  = fmt.Errorf("%w", ErrGrant) // without root: a rw grant of someone else's
	ErrGrantStore   = fmt.Errorf("%w", ErrGrant) // a directory that holds a store

	ErrGrantGroup = fmt.Errorf("%w", ErrGrant)
)

// MissingError is a grant of a path that does not exist (or under a file): a grant mounts what is
// there, it makes nothing on the host.
type MissingError struct {
	Path string
	Err  error // ENOENT or ENOTDIR
}

func (e *MissingError) Error() string {
	if errors.Is(e.Err, unix.ENOTDIR) {
		return fmt.Sprintf("%v: %s: a component of the path is not a directory", ErrGrant, e.Path)
	}
	return fmt.Sprintf("%v: %s: no such file or directory", ErrGrant, e.Path)
}

func (e *MissingError) Is(target error) bool { return target == ErrGrant }
func (e *MissingError) Unwrap() error        { return e.Err }

// ParseGrant reads --grant HOSTPATH[:BENCHPATH][:ro|rw] (default ro, bench
// path = host path).
func ParseGrant(s string) (Grant, error) {
	parts := strings.Split(s, ":")
	g := Grant{Mode: "ro"}
	if n := len(parts); n > 1 && (parts[n-1] == "ro" || parts[n-1] == "rw") {
		g.Mode = parts[n-1]
		parts = parts[:n-1]
	}
	switch len(parts) {
	case 1:
		g.Host, g.Bench = parts[0], parts[0]
	case 2:
		g.Host, g.Bench = parts[0], parts[1]
	default:
		return g, fmt.Errorf("%w: --grant %q: want HOSTPATH[:BENCHPATH][:ro|rw]", ErrGrant, s)
	}
	for _, p := range []string{g.Host, g.Bench} {
		if !filepath.IsAbs(p) || filepath.Clean(p) != p {
			return g, fmt.Errorf("%w: --grant %q: %q must be an absolute, clean path", ErrGrant, s, p)
		}
	}
	if g.Bench == "/" || underAny(g.Bench, "/proc", "/sys", "/dev") {
		return g, fmt.Errorf("%w: --grant %q: cannot mount over %s", ErrGrant, s, g.Bench)
	}
	return g, nil
}

func underAny(p string, roots ...string) bool {
	for _, r := range roots {
		if p == r || strings.HasPrefix(p, r+"/") {
			return true
		}
	}
	return false
}

// resolved is a grant checked against the recipe and opened.
type resolved struct {
	Grant
	fd  *os.File        // O_PATH descriptor of the host path, opened from / with no symlink
	ids sandbox.BindIDs // how its owners appear in the Bench
}

// resolveGrants checks each requested grant against the recipe's [[grant]]
// bounds: its host path must be a bound or lie under one, and rw needs an rw
// bound. It narrows, never widens. The host path is opened from / with
// openat2(RESOLVE_NO_SYMLINKS|RESOLVE_NO_MAGICLINKS): no component of it, the
// bound's own included, may be a symlink, so the directory opened lies beneath
// the bound's path, whatever is swapped there meanwhile. The Bench mounts that
// descriptor: a path swapped after the check cannot redirect the mount.
//
// A Bench acts as the granted directory's owner in it (sandbox.IDsOwner: its
// uid and gid are the Bench's root). So the directory's group must be one of
// its owner's groups, or the Bench would have that group's access there (read
// its files, leave setgid files of it) that the owner has not; and a writable
// grant of a directory that root owns is refused: the Bench could leave
// setuid-root files there, on the host. A directory of root's, read-only,
// shows with host ids (sandbox.IDsHost): as to any user, not to root.
func resolveGrants(r *recipe.Recipe, asked []Grant, stores []string) ([]resolved, error) {
	var out []resolved
	closeAll := func() {
		for _, g := range out {
			g.fd.Close()
		}
	}
	for _, g := range asked {
		var bound *recipe.Grant
		for i := range r.Grants {
			b := &r.Grants[i]
			if g.Host == b.Path || strings.HasPrefix(g.Host, b.Path+"/") {
				if bound == nil || len(b.Path) > len(bound.Path) {
					bound = b
				}
			}
		}
		if bound == nil {
			closeAll()
			return nil, fmt.Errorf("%w: %s is not within any [[grant]] of %s (%s)", ErrGrant, g.Host, r.File, boundsOf(r))
		}
		if g.Mode == "rw" && bound.Mode != "rw" {
			closeAll()
			return nil, fmt.Errorf("%w: %s rw: the recipe's bound %s is %s only", ErrGrant, g.Host, bound.Path, bound.Mode)
		}
		fd, err := openNoSymlinks(g.Host)
		if err != nil {
			closeAll()
			if errors.Is(err, unix.ELOOP) {
				return nil, fmt.Errorf("%w: %s: a component of the path is a symlink", ErrGrantSymlink, g.Host)
			}
			if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
				return nil, &MissingError{Path: g.Host, Err: err}
			}
			return nil, fmt.Errorf("%w: %s: %v", ErrGrant, g.Host, err)
		}
		var st unix.Stat_t
		if err := unix.Fstat(int(fd.Fd()), &st); err != nil {
			fd.Close()
			closeAll()
			return nil, fmt.Errorf("%w: %s: %v", ErrGrant, g.Host, err)
		}
		// The recipe checked the path as written; this is the directory itself, found by inode
		// (through a symlink in an ancestor, a bind mount): one that holds a store is refused.
		if store := holdsStore(&st, stores); store != "" {
			fd.Close()
			closeAll()
			return nil, fmt.Errorf("%w: %s holds shed's store %s: a Bench must not reach it", ErrGrantStore, g.Host, store)
		}
		if userns.Active() {
			// Without root, uid 0 here is the user: a Bench can be given only their own files as its
			// root's (the kernel idmaps no mount for a user), and sees any other as it is.
			ids := sandbox.IDsHost
			if st.Uid == 0 {
				ids = sandbox.IDsOwner
			} else if g.Mode == "rw" {
				fd.Close()
				closeAll()
				return nil, fmt.Errorf("%w: %s rw: it is not yours, and shed without root can give a Bench only your own files to write", ErrGrantNotOwn, g.Host)
			}
			out = append(out, resolved{Grant: g, fd: fd, ids: ids})
			continue
		}
		if g.Mode == "rw" && st.Uid == 0 {
			fd.Close()
			closeAll()
			return nil, fmt.Errorf("%w: %s rw: it is root's, and a Bench is its grant's owner there: it could leave setuid-root files on the host", ErrGrantRoot, g.Host)
		}
		ids := sandbox.IDsOwner
		if st.Uid == 0 {
			// Root's (and so read-only): the Bench sees it as any user of the host would, not as
			// root, who reads every file of it.
			ids = sandbox.IDsHost
		} else if err := ownersGroup(st.Uid, st.Gid); err != nil {
			fd.Close()
			closeAll()
			return nil, fmt.Errorf("%w: %s: %v", ErrGrantGroup, g.Host, err)
		}
		out = append(out, resolved{Grant: g, fd: fd, ids: ids})
	}
	return out, nil
}

func boundsOf(r *recipe.Recipe) string {
	if len(r.Grants) == 0 {
		return "it grants nothing"
	}
	var b []string
	for _, g := range r.Grants {
		b = append(b, g.Path+" "+g.Mode)
	}
	return "its bounds: " + strings.Join(b, ", ")
}

// ownersGroup checks that gid is one of the groups of the user uid (primary or
// supplementary, as /etc/passwd and /etc/group say).
func ownersGroup(uid, gid uint32) error {
	u, err := user.LookupId(strconv.FormatUint(uint64(uid), 10))
	if err != nil {
		return fmt.Errorf("its owner, uid %d, has no account on this host, so which groups it may act as is unknown", uid)
	}
	groups, err := u.GroupIds()
	if err != nil {
		return fmt.Errorf("the groups of its owner %s: %v", u.Username, err)
	}
	if !slices.Contains(groups, strconv.FormatUint(uint64(gid), 10)) {
		return fmt.Errorf("its group, gid %d, is not one of its owner %s's groups: a Bench acting as the owner would have that group's access", gid, u.Username)
	}
	return nil
}

// openNoSymlinks opens the absolute, clean path p from / without following a
// symlink in any component, returning an O_PATH descriptor.
func openNoSymlinks(p string) (*os.File, error) {
	root, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(root)
	rel := strings.TrimPrefix(p, "/")
	if rel == "" {
		rel = "."
	}
	fd, err := unix.Openat2(root, rel, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), p), nil
}

// holdsStore returns the first of stores that is the directory dir (its stat) or below it, by device
// and inode along each store's real path; "" if none.
func holdsStore(dir *unix.Stat_t, stores []string) string {
	for _, store := range stores {
		p, err := filepath.EvalSymlinks(store)
		if err != nil {
			continue // not there: nothing to reach
		}
		for {
			var st unix.Stat_t
			if unix.Stat(p, &st) == nil && st.Dev == dir.Dev && st.Ino == dir.Ino {
				return store
			}
			if p == "/" {
				break
			}
			p = filepath.Dir(p)
		}
	}
	return ""
}

// storesOf are the stores a Bench of s must not be granted: s, and without root the user's default
// store (whichever s is), since every store of the user's is the Bench root's to read.
func storesOf(s *store.Store) []string {
	stores := []string{s.Root()}
	if r := store.UserRoot(); userns.Active() && r != "" {
		stores = append(stores, r)
	}
	return stores
}
