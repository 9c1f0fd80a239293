// Package records keeps the canonical Workshop records: every promoted version of each Workshop's
// recipe and lock, added by compare-and-swap.
package records

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"toolshed.dev/shed/internal/atomicfile"
	"toolshed.dev/shed/internal/hint"
	"toolshed.dev/shed/recipe"
)

// Workshops are the canonical Workshop records, written only here (by the supervisor, or by root's CLI
// when there is no supervisor): for each Workshop, every promoted version of its recipe and lock.
//
//	<root>/workshops/<name>/<N>/workshop.toml, workshop.lock, version.json (and the recipe's key files)
//	<root>/workshops/<name>/current     the current version's number
//	<root>/workshops/<name>.lock        flock-held while a version is added: versions are compare-and-swap
type Workshops struct {
	dir string
}

// Open returns the records of the store at root.
func Open(root string) *Workshops { return &Workshops{dir: filepath.Join(root, "workshops")} }

// Version is one version of a Workshop record.
type Version struct {
	Name string    `json:"name"`           // the record
	N    int       `json:"version"`        // the version, from 1
	Time time.Time `json:"time"`           // when it was made
	By   string    `json:"by"`             // who added or promoted it (a user name, from the peer's credentials)
	Base int       `json:"base,omitempty"` // the version it was promoted over
	// Proposal is the proposal this version promoted, if any.
	Proposal string `json:"proposal,omitempty"`
	// Users may realize and launch Benches of this Workshop (names, or @group); operators always may.
	// A promotion keeps the base version's.
	Users []string `json:"users,omitempty"`
}

// Errors of records.
var (
	ErrNoRecord = errors.New("no such Workshop record")
	ErrConflict = errors.New("the record changed")
)

var recordNameRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`) })

// IsName reports whether s could name a record (a recipe's name).
func IsName(s string) bool { return recordNameRE().MatchString(s) }

func (rs *Workshops) nameDir(name string) string { return filepath.Join(rs.dir, name) }

// Dir returns the directory of version n of name, which holds workshop.toml and workshop.lock.
func (rs *Workshops) Dir(name string, n int) string {
	return filepath.Join(rs.nameDir(name), strconv.Itoa(n))
}

// File returns the recipe file of version n.
func (rs *Workshops) File(name string, n int) string {
	return filepath.Join(rs.Dir(name, n), "workshop.toml")
}

// Current returns the current version of name.
func (rs *Workshops) Current(name string) (*Version, error) {
	if !IsName(name) {
		return nil, fmt.Errorf("%w: %q", ErrNoRecord, name)
	}
	b, err := os.ReadFile(filepath.Join(rs.nameDir(name), "current"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s", ErrNoRecord, name)
	} else if err != nil {
		return nil, err
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, fmt.Errorf("record %s: bad current version: %v", name, err)
	}
	return rs.Get(name, n)
}

// Get returns version n of name. The name must be a record's name: it is a directory under the
// records, and "../x" would be one elsewhere (a caller's planted version.json, and its workshop.toml
// a link to any file). The version read must say it is that name and number.
func (rs *Workshops) Get(name string, n int) (*Version, error) {
	if !IsName(name) || n < 1 {
		return nil, fmt.Errorf("%w: %q version %d", ErrNoRecord, name, n)
	}
	b, err := os.ReadFile(filepath.Join(rs.Dir(name, n), "version.json"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s version %d", ErrNoRecord, name, n)
	} else if err != nil {
		return nil, err
	}
	var v Version
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, fmt.Errorf("record %s version %d: %v", name, n, err)
	}
	if v.Name != name || v.N != n {
		return nil, fmt.Errorf("record %s version %d: its version.json says %s version %d", name, n, v.Name, v.N)
	}
	return &v, nil
}

// Names lists the records.
func (rs *Workshops) Names() ([]string, error) {
	ents, err := os.ReadDir(rs.dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() && IsName(e.Name()) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// Log returns every version of name, oldest first.
func (rs *Workshops) Log(name string) ([]*Version, error) {
	cur, err := rs.Current(name)
	if err != nil {
		return nil, err
	}
	var out []*Version
	for n := 1; n <= cur.N; n++ {
		v, err := rs.Get(name, n)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// Files are a version's content: the recipe, its lock, and the files the recipe refers to (keys of
// [[apt.source]]), by path relative to the recipe.
type Files struct {
	Recipe, Lock []byte
	Extra        map[string][]byte
}

// ReadFiles reads a recipe, its lock and its key files for a record.
func ReadFiles(r *recipe.Recipe) (*Files, error) {
	f := &Files{Extra: map[string][]byte{}}
	var err error
	if f.Recipe, err = os.ReadFile(r.File); err != nil {
		return nil, err
	}
	if f.Lock, err = os.ReadFile(recipe.LockFile(r.File)); err != nil {
		return nil, hint.Wrap(err, "run `shed lock "+r.File+"` first: a record holds a lock")
	}
	for _, s := range r.Apt.Sources {
		b, err := os.ReadFile(filepath.Join(r.Dir, s.Key))
		if err != nil {
			return nil, err
		}
		f.Extra[s.Key] = b
	}
	return f, nil
}

// Add adds a version of name with files, if the current version is still base (0: the record must
// not exist yet), and makes it current. Two racing adds on one base: exactly one wins, the other gets
// ErrConflict. check, if set, runs under the record's lock before anything is written (it is how a
// promotion makes its confirmation single-use).
func (rs *Workshops) Add(ctx context.Context, v Version, f *Files, check func() error) (*Version, error) {
	if !IsName(v.Name) {
		return nil, fmt.Errorf("record name %q: lowercase letters, digits, '.', '_' and '-'", v.Name)
	}
	if err := atomicfile.MkdirAll(rs.nameDir(v.Name), 0o700); err != nil {
		return nil, err
	}
	lk, err := os.OpenFile(rs.nameDir(v.Name)+".lock", os.O_CREATE|os.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, err
	}
	defer lk.Close()
	if err := unix.Flock(int(lk.Fd()), unix.LOCK_EX); err != nil {
		return nil, err
	}
	cur := 0
	if c, err := rs.Current(v.Name); err == nil {
		cur = c.N
	} else if !errors.Is(err, ErrNoRecord) {
		return nil, err
	}
	if cur != v.Base {
		if v.Base == 0 {
			return nil, fmt.Errorf("%w: %s exists (version %d); changes to it are promoted from proposals", ErrConflict, v.Name, cur)
		}
		return nil, fmt.Errorf("%w: %s is at version %d, not %d", ErrConflict, v.Name, cur, v.Base)
	}
	if check != nil {
		if err := check(); err != nil {
			return nil, err
		}
	}
	v.N, v.Time = cur+1, time.Now().UTC().Truncate(time.Second)
	meta, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("record %s: %w", v.Name, err)
	}
	files := map[string][]byte{"workshop.toml": f.Recipe, "workshop.lock": f.Lock, "version.json": append(meta, '\n')}
	for rel, b := range f.Extra {
		if !filepath.IsLocal(rel) || slices.Contains([]string{"workshop.toml", "workshop.lock", "version.json"}, rel) {
			return nil, fmt.Errorf("record %s: file %q is not a plain relative path", v.Name, rel)
		}
		files[rel] = b
	}
	// The version is made whole in a temporary directory, each file durable, then renamed into place
	// (and the rename made durable) before current names it: a crash leaves the old version current.
	tmp, err := os.MkdirTemp(rs.nameDir(v.Name), ".new-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	for rel, b := range files {
		p := filepath.Join(tmp, rel)
		if err := atomicfile.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			return nil, err
		}
		if err := atomicfile.WriteFile(p, b, 0o644); err != nil {
			return nil, err
		}
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return nil, err
	}
	dst := rs.Dir(v.Name, v.N)
	// A version directory past current is what a crash between this rename and current's write left:
	// nothing ever named it, so it is replaced.
	if err := os.RemoveAll(dst); err != nil {
		return nil, fmt.Errorf("record %s: remove the debris of an earlier add: %w", v.Name, err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		return nil, err
	}
	if err := atomicfile.SyncDir(rs.nameDir(v.Name)); err != nil {
		return nil, err
	}
	if err := atomicfile.WriteFile(filepath.Join(rs.nameDir(v.Name), "current"), []byte(strconv.Itoa(v.N)+"\n"), 0o644); err != nil {
		return nil, err
	}
	return &v, nil
}

// Allow sets who (besides operators) may realize and launch name: users by name, groups as @group.
// It changes the current version's record, under the record's lock.
func (rs *Workshops) Allow(name string, users []string) (*Version, error) {
	if !IsName(name) {
		return nil, fmt.Errorf("%w: %q", ErrNoRecord, name)
	}
	lk, err := os.OpenFile(rs.nameDir(name)+".lock", os.O_CREATE|os.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("%w: %s", ErrNoRecord, name)
	}
	defer lk.Close()
	if err := unix.Flock(int(lk.Fd()), unix.LOCK_EX); err != nil {
		return nil, err
	}
	v, err := rs.Current(name)
	if err != nil {
		return nil, err
	}
	v.Users = users
	meta, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("record %s: %w", name, err)
	}
	if err := atomicfile.WriteFile(filepath.Join(rs.Dir(name, v.N), "version.json"), append(meta, '\n'), 0o644); err != nil {
		return nil, err
	}
	return v, nil
}

// VersionOf says which record version a recipe file is, if it is one.
func (rs *Workshops) VersionOf(file string) (string, int, bool) {
	rel, err := filepath.Rel(rs.dir, file)
	if err != nil {
		return "", 0, false
	}
	parts := strings.Split(rel, string(filepath.Separator))
	if len(parts) != 3 || parts[2] != "workshop.toml" {
		return "", 0, false
	}
	var n int
	if _, err := fmt.Sscan(parts[1], &n); err != nil {
		return "", 0, false
	}
	return parts[0], n, true
}
