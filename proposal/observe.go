package proposal

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"toolshed.dev/shed/bench"
	"toolshed.dev/shed/builder"
	"toolshed.dev/shed/debian"
	"toolshed.dev/shed/internal/lines"
	"toolshed.dev/shed/proxy"
	"toolshed.dev/shed/recipe"
	"toolshed.dev/shed/store"
)

// Observed is what a Bench did that a recipe can say: nothing else of it is ever read.
type Observed struct {
	// Apt are the packages installed in the Bench that apt marks as manually installed and that the
	// layers did not have (or had at another version), with the versions installed.
	Apt []debian.Installed
	// Pip are the distributions installed as requested (a REQUESTED marker) that the layers did not have.
	Pip []PipDist
	// Allowed and Refused are the destinations (host or host:port) the Bench's proxy allowed and refused.
	Allowed, Refused []string
	// Grants are the grants the Bench was launched with.
	Grants []bench.Grant
	// Unfinished are the packages that dpkg left half installed or half configured, as "name (state)".
	Unfinished []string
}

// PipDist is an installed Python distribution.
type PipDist struct{ Name, Version string }

// maxRead bounds what is read from a Bench: its files are the agent's to make hostile.
const maxRead = 64 << 20

// maxLogLine bounds a network log line that is read. The proxy writes one line a request, whose head
// the agent writes and net/http bounds (64 KiB and 4 KiB more): its method once and its host twice (in
// the reason), JSON-escaped at up to 6 bytes a byte, make under 0.9 MiB. A longer line is no decision
// the proxy wrote.
const maxLogLine = 1 << 20

// view reads files as a Bench sees them, never following a symlink out of it.
type view struct {
	roots []int // a running Bench: its root; a stopped one: its upper, then its layers top first
	live  bool
}

func openView(s *store.Store, rec *bench.Record) (*view, error) {
	open := func(p string) (int, error) {
		return unix.Open(p, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	}
	v := &view{}
	if rec.Running && rec.Pid > 0 {
		// The Bench's merged root as its init sees it.
		fd, err := open(fmt.Sprintf("/proc/%d/root", rec.Pid))
		if err != nil {
			return nil, fmt.Errorf("bench %s: %w", rec.Name, err)
		}
		v.roots, v.live = []int{fd}, true
		return v, nil
	}
	if !rec.Keep {
		return nil, fmt.Errorf("bench %s is not running and was not kept: there is nothing to propose from", rec.Name)
	}
	dirs := []string{filepath.Join(bench.Dir(s), rec.ID, "upper")}
	for i := len(rec.Layers) - 1; i >= 0; i-- {
		dirs = append(dirs, s.Location(rec.Layers[i]))
	}
	for _, d := range dirs {
		fd, err := open(d)
		if err != nil {
			v.close()
			return nil, err
		}
		v.roots = append(v.roots, fd)
	}
	return v, nil
}

func (v *view) close() {
	for _, fd := range v.roots {
		unix.Close(fd)
	}
}

func (v *view) open(rel string, flags uint64) (*os.File, error) {
	rel = strings.TrimPrefix(rel, "/")
	var first error
	for i, root := range v.roots {
		// O_NONBLOCK: a FIFO the agent put in place of a file must not hang the reader (it is then
		// refused as not a regular file).
		fd, err := unix.Openat2(root, rel, &unix.OpenHow{Flags: flags | unix.O_CLOEXEC | unix.O_NOFOLLOW | unix.O_NONBLOCK,
			Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV})
		if err == nil {
			f := os.NewFile(uintptr(fd), rel)
			// An overlay whiteout in the upper hides the layers' file.
			if st, err := f.Stat(); err == nil && !v.live && i == 0 && st.Mode()&os.ModeCharDevice != 0 {
				f.Close()
				return nil, os.ErrNotExist
			}
			return f, nil
		}
		if first == nil {
			first = err
		}
		if !errors.Is(err, unix.ENOENT) {
			return nil, err
		}
	}
	return nil, first
}

func (v *view) readFile(rel string) ([]byte, error) {
	f, err := v.open(rel, unix.O_RDONLY)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file", rel)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxRead+1))
	if len(b) > maxRead {
		return nil, fmt.Errorf("%s: larger than %d bytes", rel, maxRead)
	}
	return b, err
}

// readDir lists a directory's names across the view (upper and layers merged, without whiteouts).
func (v *view) readDir(rel string) []string {
	seen := map[string]bool{}
	var out []string
	for i, root := range v.roots {
		fd, err := unix.Openat2(root, strings.TrimPrefix(rel, "/"), &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC | unix.O_NOFOLLOW,
			Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV})
		if err != nil {
			continue
		}
		f := os.NewFile(uintptr(fd), rel)
		ents, _ := f.ReadDir(-1)
		f.Close()
		for _, e := range ents {
			if seen[e.Name()] {
				continue
			}
			seen[e.Name()] = true
			if !v.live && i == 0 && e.Type()&os.ModeCharDevice != 0 {
				continue // whiteout
			}
			out = append(out, e.Name())
		}
	}
	slices.Sort(out)
	return out
}

// Observe reads what the Bench rec did: its dpkg and apt state, its Python distributions, its proxy's
// decisions and its grants. It reads the Bench's files as data, through openat2 confined to the Bench.
func Observe(s *store.Store, rec *bench.Record) (*Observed, error) {
	v, err := openView(s, rec)
	if err != nil {
		return nil, err
	}
	defer v.close()
	obs := &Observed{Grants: rec.Grants}

	// What the layers had, to tell what the Bench added.
	var lowers []string
	for _, l := range rec.Layers {
		lowers = append(lowers, s.Location(l))
	}
	base, err := builder.StatusOf(lowers)
	if err != nil {
		return nil, fmt.Errorf("the Bench's layers: %w", err)
	}
	b, err := v.readFile("/var/lib/dpkg/status")
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		// Not absent but unreadable (a FIFO or a link the agent put there, a huge file): say so.
		return nil, fmt.Errorf("the Bench's dpkg status: %w", err)
	}
	if err == nil {
		now, err := debian.ParseStatus(b)
		if err != nil {
			return nil, fmt.Errorf("the Bench's dpkg status: %w", err)
		}
		if obs.Unfinished, err = debian.Unfinished(b); err != nil {
			return nil, fmt.Errorf("the Bench's dpkg status: %w", err)
		}
		auto := autoInstalled(v)
		for name, p := range now {
			if old, ok := base[name]; (ok && old.Version == p.Version) || auto[name] {
				continue
			}
			obs.Apt = append(obs.Apt, p)
		}
		slices.SortFunc(obs.Apt, func(a, b debian.Installed) int { return strings.Compare(a.Package, b.Package) })
	}

	for _, lib := range []string{"/usr/local/lib", "/usr/lib"} {
		for _, py := range v.readDir(lib) {
			if !strings.HasPrefix(py, "python3") {
				continue
			}
			for _, pk := range []string{"dist-packages", "site-packages"} {
				dir := lib + "/" + py + "/" + pk
				for _, di := range v.readDir(dir) {
					base, ok := strings.CutSuffix(di, ".dist-info")
					if !ok {
						continue
					}
					if _, err := v.readFile(dir + "/" + di + "/REQUESTED"); err != nil {
						continue
					}
					if i := strings.LastIndexByte(base, '-'); i > 0 {
						d := PipDist{recipe.NormalizePipName(base[:i]), base[i+1:]}
						if !inLayers(lowers, dir+"/"+di) && !slices.Contains(obs.Pip, d) {
							obs.Pip = append(obs.Pip, d)
						}
					}
				}
			}
		}
	}
	slices.SortFunc(obs.Pip, func(a, b PipDist) int { return strings.Compare(a.Name, b.Name) })

	if f, err := os.Open(filepath.Join(bench.Dir(s), rec.ID, "network.log")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("the Bench's network log: %w", err)
	} else if err == nil {
		// The agent writes what the proxy logs (the method and host it asks for), so lines can be
		// long: one over the bound is skipped and the lines after it are read.
		err := lines.Each(io.LimitReader(f, maxRead), maxLogLine, func(line []byte, cut bool) error {
			var d proxy.Decision
			if cut || json.Unmarshal(line, &d) != nil || d.Host == "" {
				return nil
			}
			dest := d.Host
			if d.Port != 0 && d.Port != 80 && d.Port != 443 {
				dest = fmt.Sprintf("%s:%d", d.Host, d.Port)
			}
			list := &obs.Refused
			if d.Allowed {
				list = &obs.Allowed
			}
			if !slices.Contains(*list, dest) {
				*list = append(*list, dest)
			}
			return nil
		})
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("the Bench's network log: %w", err)
		}
		slices.Sort(obs.Allowed)
		slices.Sort(obs.Refused)
	}
	return obs, nil
}

// autoInstalled reads apt's extended_states: the packages apt installed as dependencies.
func autoInstalled(v *view) map[string]bool {
	auto := map[string]bool{}
	b, err := v.readFile("/var/lib/apt/extended_states")
	if err != nil {
		return auto
	}
	for _, para := range bytes.Split(b, []byte("\n\n")) {
		var name string
		isAuto := false
		for _, line := range strings.Split(string(para), "\n") {
			if n, ok := strings.CutPrefix(line, "Package: "); ok {
				name = strings.TrimSpace(n)
			}
			if strings.TrimSpace(line) == "Auto-Installed: 1" {
				isAuto = true
			}
		}
		if name != "" && isAuto {
			auto[name] = true
		}
	}
	return auto
}

func inLayers(lowers []string, rel string) bool {
	for _, l := range lowers {
		if _, err := os.Lstat(filepath.Join(l, rel)); err == nil {
			return true
		}
	}
	return false
}
