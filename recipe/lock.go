package recipe

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/pelletier/go-toml/v2"

	"toolshed.dev/shed/internal/atomicfile"
	"toolshed.dev/shed/store"
)

// LockVersion is the format version of workshop.lock.
const LockVersion = 1

// Lock is workshop.lock: the recipe's names resolved to exact versions and
// content hashes, written by `shed lock` and committed beside the recipe.
// Realizing from a lock is reproducible; it never resolves anything again.
type Lock struct {
	Version int `toml:"version"`
	// Inputs fingerprints what the recipe declares that resolution depends on
	// (seed, mirror, sources and their keys, packages): a lock whose Inputs
	// differ from the recipe's no longer matches it and is re-resolved.
	Inputs string        `toml:"inputs"`
	Seed   LockedSeed    `toml:"seed"`
	Apt    []LockedDeb   `toml:"apt,omitempty"`
	Pip    []LockedWheel `toml:"pip,omitempty"`
	// Accounts are the recipe's accounts, every default filled in: which accounts the Workshop's
	// layers hold (resolving reads none of them, so they are not in Inputs).
	Accounts []LockedAccount `toml:"account,omitempty"`
}

// LockedSeed pins the seed.
type LockedSeed struct {
	Spec   string `toml:"spec"`
	Mirror string `toml:"mirror,omitempty"`
	// ReleaseDate is the Date: of the suite's signed InRelease at lock time.
	ReleaseDate string `toml:"release_date,omitempty"`
	// Epoch is SOURCE_DATE_EPOCH for every build of this Workshop: the
	// InRelease date, which no package file is newer than, so clamping
	// mtimes to it never makes a .pyc stale.
	Epoch int64 `toml:"epoch"`
	// Digest is an OCI seed's manifest digest.
	Digest string `toml:"digest,omitempty"`
	// Image is what an image in a registry (an oci:// seed) resolved to: the manifest's parts, each
	// fetched by its digest, so that realizing it reads no manifest and no tag again.
	Image *LockedImage `toml:"image,omitempty"`
}

// LockedImage is a registry image's manifest as the lock pins it.
type LockedImage struct {
	// Platform is the manifest's platform when the reference named an index ("linux/amd64"), else "".
	Platform string `toml:"platform,omitempty"`
	// Manifest is the manifest itself (its digest is the seed's Digest), fetched by digest too: the
	// seed is built from what the manifest lists, so a lock cannot name other config or layers.
	Manifest LockedBlob   `toml:"manifest"`
	Config   LockedBlob   `toml:"config"`
	Layers   []LockedBlob `toml:"layer"`
}

// LockedBlob is one blob of an image: its digest (sha256 only: blobs are fixed-output fetches),
// size and media type.
type LockedBlob struct {
	Digest    string `toml:"digest"`
	Size      int64  `toml:"size"`
	MediaType string `toml:"media_type"`
}

// SHA256 is the blob digest's hex, "" if the digest is not a sha256 one.
func (b LockedBlob) SHA256() string {
	h, ok := strings.CutPrefix(b.Digest, "sha256:")
	if !ok || len(h) != 64 || strings.Trim(h, "0123456789abcdef") != "" {
		return ""
	}
	return h
}

// LockedDeb is one Debian package of the resolved closure.
type LockedDeb struct {
	Name    string `toml:"name"`
	Version string `toml:"version"`
	Arch    string `toml:"arch"`
	URL     string `toml:"url"`
	SHA256  string `toml:"sha256"`
	Size    int64  `toml:"size"`
	// Declared is true for packages the recipe names; false for the
	// dependencies apt pulled in for them.
	Declared bool `toml:"declared"`
}

// String returns "name=version".
func (d LockedDeb) String() string { return d.Name + "=" + d.Version }

// LockedWheel is one Python distribution of the resolved closure: a wheel
// (shed installs wheels only, docs/recipe.md says why).
type LockedWheel struct {
	Name    string `toml:"name"` // PEP 503 normalized
	Version string `toml:"version"`
	URL     string `toml:"url"`
	SHA256  string `toml:"sha256"`
	// Declared is true for packages the recipe names; false for the
	// dependencies pip's resolver pulled in for them.
	Declared bool `toml:"declared"`
}

// String returns "name==version".
func (w LockedWheel) String() string { return w.Name + "==" + w.Version }

// File returns the wheel's file name, the last element of its URL's path.
func (w LockedWheel) File() string {
	u, err := url.Parse(w.URL)
	if err != nil {
		return ""
	}
	return path.Base(u.Path)
}

// LockFile returns the lock's file name for a recipe file: workshop.lock
// beside workshop.toml (x.toml → x.lock).
func LockFile(recipeFile string) string {
	return strings.TrimSuffix(recipeFile, filepath.Ext(recipeFile)) + ".lock"
}

// Fingerprint returns the Inputs a lock of r must carry to match it. Only what
// resolution reads counts: the name, network and grants do not.
func Fingerprint(r *Recipe) (string, error) {
	var b bytes.Buffer
	line := func(k string, vs ...string) {
		b.WriteString(k)
		for _, v := range vs {
			fmt.Fprintf(&b, " %q", v)
		}
		b.WriteByte('\n')
	}
	line("shed-lock-inputs v1")
	line("seed", r.Seed.Raw)
	line("mirror", r.Apt.Mirror)
	for _, s := range r.Apt.Sources {
		key, err := os.ReadFile(filepath.Join(r.Dir, s.Key))
		if err != nil {
			return "", fmt.Errorf("read key of source %s: %w", s.URL, err)
		}
		line("source", s.URL, s.Suite, strings.Join(s.Components, " "), store.Sum(key).Hex())
	}
	var apt []string
	for _, p := range r.Apt.Packages {
		apt = append(apt, p.String())
	}
	slices.Sort(apt)
	line("apt", apt...)
	var pip []string
	for _, p := range r.Pip.Packages {
		pip = append(pip, NormalizePipName(p.Name)+versionSuffix("==", p.Version))
	}
	slices.Sort(pip)
	line("pip-index", r.Pip.Index)
	line("pip", pip...)
	return store.Sum(b.Bytes()).String(), nil
}

// ErrNoLock is returned by LoadLock when there is no lock file.
var ErrNoLock = errors.New("no lock file")

// LoadLock reads a lock file strictly.
func LoadLock(file string) (*Lock, error) {
	data, err := ReadLock(file)
	if err != nil {
		return nil, err
	}
	return ParseLock(file, data)
}

// ReadLock reads a lock file's bytes for ParseLock; ErrNoLock if there is none.
func ReadLock(file string) ([]byte, error) {
	data, err := os.ReadFile(file)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s", ErrNoLock, file)
	} else if err != nil {
		return nil, fmt.Errorf("read lock: %w", err)
	}
	return data, nil
}

// ParseLock parses a lock file's bytes strictly; file names it in errors.
func ParseLock(file string, data []byte) (*Lock, error) {
	var l Lock
	dec := toml.NewDecoder(bytes.NewReader(data)).DisallowUnknownFields()
	if err := dec.Decode(&l); err != nil {
		return nil, &Error{File: file, Msg: fmt.Sprintf("invalid lock: %v", err),
			Hint: "a lock is written by `shed lock`: delete it and run `shed lock` again"}
	}
	if l.Version != LockVersion {
		return nil, &Error{File: file, Field: "version", Msg: fmt.Sprintf("lock version %d, want %d", l.Version, LockVersion),
			Hint: "run `shed lock --update` to rewrite it"}
	}
	if err := l.Validate(); err != nil {
		return nil, &Error{File: file, Msg: err.Error(),
			Hint: "a lock is written by `shed lock`: do not edit it; run `shed lock --update` to re-resolve"}
	}
	return &l, nil
}

// Validate holds a lock to the grammars of the recipe: a lock is reviewed like
// a recipe and must not smuggle in what a recipe cannot say.
func (l *Lock) Validate() error {
	seen := map[string]bool{}
	for i, d := range l.Apt {
		if _, err := ParseAptPackage(d.Name + "=" + d.Version); err != nil {
			return fmt.Errorf("apt[%d]: %v", i, err)
		}
		if seen[d.Name] {
			return fmt.Errorf("apt[%d]: %s is listed twice", i, d.Name)
		}
		seen[d.Name] = true
		if e := checkURL(d.URL); e != nil {
			return fmt.Errorf("apt[%d].url: %s", i, e.Msg)
		}
		if len(d.SHA256) != 64 || strings.Trim(d.SHA256, "0123456789abcdef") != "" {
			return fmt.Errorf("apt[%d].sha256: want 64 lowercase hex digits", i)
		}
		if d.Size <= 0 {
			return fmt.Errorf("apt[%d].size: want a positive size", i)
		}
		if d.Arch == "" || strings.Trim(d.Arch, "abcdefghijklmnopqrstuvwxyz0123456789-") != "" {
			return fmt.Errorf("apt[%d].arch: bad architecture %q", i, d.Arch)
		}
	}
	seen = map[string]bool{}
	for i, w := range l.Pip {
		p, err := ParsePipPackage(w.Name + "==" + w.Version)
		if err != nil {
			return fmt.Errorf("pip[%d]: %v", i, err)
		}
		if p.Version == "" || NormalizePipName(w.Name) != w.Name {
			return fmt.Errorf("pip[%d]: want a normalized name and a version", i)
		}
		if seen[w.Name] {
			return fmt.Errorf("pip[%d]: %s is listed twice", i, w.Name)
		}
		seen[w.Name] = true
		if e := checkURL(w.URL); e != nil {
			return fmt.Errorf("pip[%d].url: %s", i, e.Msg)
		}
		if f := w.File(); !strings.HasSuffix(f, ".whl") || !safeFileName(f) {
			return fmt.Errorf("pip[%d].url: %q is not a wheel file", i, f)
		}
		if len(w.SHA256) != 64 || strings.Trim(w.SHA256, "0123456789abcdef") != "" {
			return fmt.Errorf("pip[%d].sha256: want 64 lowercase hex digits", i)
		}
	}
	if im := l.Seed.Image; im != nil {
		if (LockedBlob{Digest: l.Seed.Digest}).SHA256() == "" {
			return fmt.Errorf("seed.digest: want an image's sha256 manifest digest")
		}
		if im.Platform != "" && strings.Trim(im.Platform, "abcdefghijklmnopqrstuvwxyz0123456789/") != "" {
			return fmt.Errorf("seed.image.platform: bad platform %q", im.Platform)
		}
		if im.Manifest.Digest != l.Seed.Digest {
			return fmt.Errorf("seed.image.manifest.digest %q is not seed.digest %q", im.Manifest.Digest, l.Seed.Digest)
		}
		for i, b := range append([]LockedBlob{im.Manifest, im.Config}, im.Layers...) {
			what := "seed.image.manifest"
			switch {
			case i == 1:
				what = "seed.image.config"
			case i > 1:
				what = fmt.Sprintf("seed.image.layer[%d]", i-2)
			}
			if b.SHA256() == "" {
				return fmt.Errorf("%s.digest: want sha256: and 64 lowercase hex digits", what)
			}
			if b.Size <= 0 {
				return fmt.Errorf("%s.size: want a positive size", what)
			}
			if b.MediaType == "" || strings.Trim(b.MediaType, "abcdefghijklmnopqrstuvwxyz0123456789.+-/") != "" {
				return fmt.Errorf("%s.media_type: bad media type %q", what, b.MediaType)
			}
		}
		if len(im.Layers) == 0 {
			return fmt.Errorf("seed.image: an image with no layers")
		}
	}
	seen = map[string]bool{}
	for i, a := range l.Accounts {
		if e := checkAccountName(a.Name); e != nil {
			return fmt.Errorf("account[%d]: %s", i, e.Msg)
		}
		if seen[a.Name] {
			return fmt.Errorf("account[%d]: %s is listed twice", i, a.Name)
		}
		seen[a.Name] = true
		if a.UID < FirstUID || a.UID > LastUID || a.GID != a.UID {
			return fmt.Errorf("account[%d]: uid %d, gid %d: want one id from %d to %d", i, a.UID, a.GID, FirstUID, LastUID)
		}
		if e := checkAccountPath(a.Home, "home", "/home/"+a.Name); e != nil {
			return fmt.Errorf("account[%d]: %s", i, e.Msg)
		}
		if e := checkAccountPath(a.Shell, "shell", DefaultShell); e != nil {
			return fmt.Errorf("account[%d]: %s", i, e.Msg)
		}
	}
	return nil
}

// safeFileName: a wheel's file name becomes a store name and a file name in
// the build sandbox, so it keeps to the characters wheel names use.
func safeFileName(f string) bool {
	return f != "" && f[0] != '.' && strings.Trim(f, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._+-") == ""
}

// Encode returns the lock as TOML, in a stable, diff-friendly order:
// packages sorted by name, one table each.
func (l *Lock) Encode() ([]byte, error) {
	c := *l
	c.Apt = slices.Clone(l.Apt)
	slices.SortFunc(c.Apt, func(a, b LockedDeb) int { return strings.Compare(a.Name, b.Name) })
	c.Pip = slices.Clone(l.Pip)
	slices.SortFunc(c.Pip, func(a, b LockedWheel) int { return strings.Compare(a.Name, b.Name) })
	var b bytes.Buffer
	b.WriteString("# workshop.lock: written by `shed lock` from the recipe beside it. Commit it; do not edit it.\n")
	b.WriteString("# `shed lock --update [PKG...]` re-resolves.\n")
	enc := toml.NewEncoder(&b).SetIndentTables(false)
	if err := enc.Encode(c); err != nil {
		return nil, fmt.Errorf("encode lock: %w", err)
	}
	return b.Bytes(), nil
}

// WriteLock writes l to file (mode 0644) atomically and durably: concurrent writers of one file all
// succeed, and a crash leaves the old lock or the new one, whole.
func WriteLock(file string, l *Lock) error {
	b, err := l.Encode()
	if err != nil {
		return fmt.Errorf("write lock %s: %w", file, err)
	}
	if err := atomicfile.WriteFile(file, b, 0o644); err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) && pe.Path == file {
			err = pe.Err // the step and its cause: the file is named once
		}
		return fmt.Errorf("write lock %s: %w", file, err)
	}
	return nil
}

// Matches reports whether l was resolved from what r declares now.
func (l *Lock) Matches(r *Recipe) (bool, error) {
	inputs, accounts, err := l.Compare(r)
	return inputs && accounts, err
}

// AccountsDiffer reports whether l was resolved from what r declares but for its accounts: the lock
// then needs its accounts written again, and nothing resolved again.
func (l *Lock) AccountsDiffer(r *Recipe) (bool, error) {
	inputs, accounts, err := l.Compare(r)
	return inputs && !accounts, err
}

// Compare is Matches and AccountsDiffer at once, for one Fingerprint: whether l was resolved from
// what r declares (inputs), and whether it records r's accounts.
func (l *Lock) Compare(r *Recipe) (inputs, accounts bool, err error) {
	fp, err := Fingerprint(r)
	if err != nil {
		return false, false, err
	}
	return l.Inputs == fp, slices.Equal(l.Accounts, LockAccounts(r)), nil
}

// DiffLocks describes how two locks differ at the level of packages, one line
// per change: "+ name version", "- name version", "~ name old → new"; pip
// packages are named "pip:name".
func DiffLocks(a, b *Lock) []string {
	versions := func(l *Lock) map[string]string {
		m := map[string]string{}
		for _, d := range l.Apt {
			m[d.Name] = d.Version
		}
		for _, w := range l.Pip {
			m["pip:"+w.Name] = w.Version
		}
		return m
	}
	am, bm := versions(a), versions(b)
	var names []string
	for n := range am {
		names = append(names, n)
	}
	for n := range bm {
		if _, ok := am[n]; !ok {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	var out []string
	for _, n := range names {
		x, inA := am[n]
		y, inB := bm[n]
		switch {
		case !inB:
			out = append(out, fmt.Sprintf("- %s %s", n, x))
		case !inA:
			out = append(out, fmt.Sprintf("+ %s %s", n, y))
		case x != y:
			out = append(out, fmt.Sprintf("~ %s %s → %s", n, x, y))
		}
	}
	return out
}
