package bench

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"toolshed.dev/shed/recipe"
)

// Grant is a host directory or file mounted into a Bench.
type Grant struct {
	Host  string // host path as asked
	Bench string // path inside the Bench
	Mode  string // "ro" or "rw"
}

// ErrGrant marks a grant that is refused.
var ErrGrant = errors.New("grant refused")

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
	fd *os.File // O_PATH descriptor of the host path, opened beneath its bound
}

// resolveGrants checks each requested grant against the recipe's [[grant]]
// bounds: its host path must be a bound or lie under one, and rw needs an rw
// bound. It narrows, never widens. The path below the bound is opened with
// openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS) from the bound's descriptor,
// and the Bench mounts that descriptor: a symlink out of the bound is refused,
// and a path swapped after the check cannot redirect the mount.
func resolveGrants(r *recipe.Recipe, asked []Grant) ([]resolved, error) {
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
		fd, err := openBeneath(bound.Path, strings.TrimPrefix(strings.TrimPrefix(g.Host, bound.Path), "/"))
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("%w: %s: %v", ErrGrant, g.Host, err)
		}
		out = append(out, resolved{g, fd})
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

// openBeneath opens bound (as the recipe names it) and then rel beneath it
// without following any symlink, returning an O_PATH descriptor.
func openBeneath(bound, rel string) (*os.File, error) {
	bfd, err := unix.Open(bound, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open bound %s: %w", bound, err)
	}
	if rel == "" {
		return os.NewFile(uintptr(bfd), bound), nil
	}
	defer unix.Close(bfd)
	fd, err := unix.Openat2(bfd, rel, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EXDEV) {
			return nil, fmt.Errorf("%s crosses a symlink or leaves %s", rel, bound)
		}
		return nil, err
	}
	return os.NewFile(uintptr(fd), filepath.Join(bound, rel)), nil
}
