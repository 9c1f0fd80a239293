package recipe

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Defaults used when a recipe does not set them.
const (
	DefaultMirror = "http://deb.debian.org/debian"
	DefaultIndex  = "https://pypi.org/simple"
)

// defaultForbidden are never granted, whatever Options says: the store and
// shed's state must stay out of reach of a Bench. Unexported so that no caller
// can shrink the list.
var defaultForbidden = []string{"/var/lib/toolshed", "/run/toolshed"}

// maxSize bounds a recipe file. A recipe lists names and is meant to be read as
// a diff; the bound keeps a hostile file from costing memory or time.
const maxSize = 1 << 20

// Recipe is a validated workshop.toml.
type Recipe struct {
	File    string // the file name as given to Parse/Load
	Dir     string // absolute directory of the file ("" if unknown)
	Name    string
	Seed    Seed
	Apt     Apt
	Pip     Pip
	Network Network
	Grants  []Grant
	// User is the account commands run as by default: "" (root, when the recipe names none), "root",
	// or one of Accounts. Like a network profile, it shapes Benches, not what is built.
	User string
	// Accounts are the accounts the recipe declares ([[account]]), beside root.
	Accounts []Account
	// Workdir is the directory a Bench's commands start in ("": the user's home); the Bench makes it
	// if its layers lack it. Env are the variables they get ([env]), sorted by name. Both shape
	// Benches, not what is built.
	Workdir string
	Env     []EnvVar

	// lines holds the line of each string the file set, by the field's name as errors give it
	// ("seed", "apt.packages[1]"): what realize finds wrong later is reported at its line.
	lines map[string]int
}

// ErrorAt is an error about the recipe's field named field ("seed", "apt.packages[1]",
// "pip.packages[0]"...), at the line that set it: for what only a mirror or an index can tell
// (a suite, a package or a version that does not exist), found after the recipe parsed.
func (r *Recipe) ErrorAt(field, msg, hint string) *Error {
	return &Error{File: r.File, Line: r.lines[field], Field: field, Msg: msg, Hint: hint}
}

// Seed is the base root filesystem a recipe starts from.
type Seed struct {
	Raw      string // as written
	Kind     string // "debian" or "oci" (an image: in a layout directory, or in a registry)
	Suite    string // debian
	Snapshot string // debian, "" if none
	Dir      string // oci from a layout directory, as written
	AbsDir   string // oci from a layout directory, resolved against Recipe.Dir when relative ("" if that is unknown)
	Tag      string // oci: the tag ("latest" when a layout's seed names none; "" for a registry's by digest)
	// Ref is an image in a registry, "HOST[:PORT]/REPO" (an oci:// seed); Dir is then "".
	Ref string
	// Digest is the manifest digest an oci:// seed names ("sha256:..."), "" when it names a tag.
	Digest string
}

// IsRegistry reports whether the seed is an image in a registry (oci://), not in a layout directory.
func (s Seed) IsRegistry() bool { return s.Kind == "oci" && s.Ref != "" }

// Apt is the [apt] table.
type Apt struct {
	Mirror   string
	Packages []AptPackage
	Sources  []AptSource
}

// AptPackage is a Debian package name, optionally pinned to a version.
type AptPackage struct{ Name, Version string } // Version "" if unpinned

// String returns "name" or "name=version", as apt-get takes it.
func (p AptPackage) String() string {
	if p.Version == "" {
		return p.Name
	}
	return p.Name + "=" + p.Version
}

// AptSource is an extra signed apt repository ([[apt.source]]).
type AptSource struct {
	URL        string
	Suite      string
	Components []string
	Key        string // as written, relative to the recipe dir
}

// Pip is the [pip] table.
type Pip struct {
	Index    string
	Packages []PipPackage
}

// PipPackage is a pip distribution name, optionally pinned with ==.
type PipPackage struct{ Name, Version string } // Version "" if unpinned

// String returns "name" or "name==version", as pip takes it.
func (p PipPackage) String() string {
	if p.Version == "" {
		return p.Name
	}
	return p.Name + "==" + p.Version
}

// Network is the [network] table.
type Network struct {
	Profile string // "none" or "debian"
	Allow   []Host
	// Secrets are the names of the supervisor's secrets a Bench may use through its proxy, never
	// their values: it holds placeholders (docs/secrets.md).
	Secrets []string
}

// Host is a network destination a Bench may reach.
type Host struct {
	Name string // DNS name or IP literal (no brackets)
	Port int    // 0 if none
}

// String returns "name", "name:port" or "[v6]:port", a form ParseHost accepts.
func (h Host) String() string {
	if h.Port == 0 {
		return h.Name
	}
	p := strconv.Itoa(h.Port)
	if strings.Contains(h.Name, ":") {
		return "[" + h.Name + "]:" + p
	}
	return h.Name + ":" + p
}

// Grant is a host path bind-mounted into a Bench.
type Grant struct {
	Path string
	Mode string // "ro" or "rw"
}

// Options tune Parse and Load.
type Options struct {
	// ForbiddenPaths are refused as grants, with their ancestors and subtrees,
	// in addition to the defaults (/var/lib/toolshed, /run/toolshed).
	ForbiddenPaths []string
}

// ErrInvalid is matched (errors.Is) by every *Error.
var ErrInvalid = errors.New("invalid recipe")

// Error is a recipe error. Error() formats as "FILE:LINE: FIELD: MSG", leaving
// out what is unknown. Hint is a separate sentence telling the user what to do;
// the CLI prints it as "shed: hint: ...".
type Error struct {
	File  string
	Line  int
	Field string
	Msg   string
	Hint  string
}

func (e *Error) Error() string {
	var parts []string
	switch {
	case e.File != "" && e.Line > 0:
		parts = append(parts, e.File+":"+strconv.Itoa(e.Line))
	case e.File != "":
		parts = append(parts, e.File)
	case e.Line > 0:
		parts = append(parts, "line "+strconv.Itoa(e.Line))
	}
	if e.Field != "" {
		parts = append(parts, e.Field)
	}
	parts = append(parts, e.Msg)
	return strings.Join(parts, ": ")
}

// Is makes errors.Is(err, ErrInvalid) true for every *Error.
func (e *Error) Is(target error) bool { return target == ErrInvalid }

// Parse validates data as the recipe file named file. The name is used in
// errors and, made absolute, as Recipe.Dir (which relative seed directories and
// keys are resolved against). Parse reads nothing from the file system.
func Parse(file string, data []byte, opts Options) (*Recipe, error) {
	if len(data) > maxSize {
		return nil, &Error{File: file,
			Msg:  fmt.Sprintf("file is larger than %d bytes", maxSize),
			Hint: "a recipe lists names and settings only: keep it small enough to read as a diff"}
	}
	doc, perr := decode(data)
	if perr != nil {
		perr.File = file
		return nil, perr
	}
	c := &checker{doc: doc, forbidden: opts.ForbiddenPaths}
	r := c.recipe()
	if e := c.first(); e != nil {
		e.File = file
		return nil, e
	}
	r.File, r.lines = file, c.lines
	if file != "" {
		if abs, err := filepath.Abs(filepath.Dir(file)); err == nil {
			r.Dir = abs
		}
	}
	if r.Seed.Kind == "oci" && r.Seed.Dir != "" {
		switch {
		case filepath.IsAbs(r.Seed.Dir):
			r.Seed.AbsDir = filepath.Clean(r.Seed.Dir)
		case r.Dir != "":
			r.Seed.AbsDir = filepath.Join(r.Dir, r.Seed.Dir)
		}
	}
	return r, nil
}

// Load reads and parses file.
func Load(file string, opts Options) (*Recipe, error) {
	data, err := Read(file)
	if err != nil {
		return nil, err
	}
	return Parse(file, data, opts)
}

// Read reads a recipe file's bytes for Parse, up to one byte past the limit (so that Parse sees,
// and reports, a file that is too large).
func Read(file string) ([]byte, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, fmt.Errorf("read recipe: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxSize+1))
	if err != nil {
		return nil, fmt.Errorf("read recipe: %w", err)
	}
	return data, nil
}
