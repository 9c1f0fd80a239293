// Package secret keeps the credentials that Benches use without holding them: the supervisor's own
// files, outside the store, which a Bench's proxy reads when it injects a value at egress.
//
// A Secret is a name, who may use it, where it may go (the hosts it is bound to and the place in a
// request it fills: a header, basic auth or a query parameter), and the environment variable in
// which a Bench finds its placeholder. The value is kept beside the metadata in <root>/secrets/NAME,
// mode 0600 in a 0700 directory of root's; List and Get never return it, only Value does, and only
// the proxy calls that. Nothing here writes a value anywhere else: not to a record, a lock,
// provenance, the audit log or a log.
//
// The package imports no other package of this project.
package secret

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// MaxValue bounds a secret's value: tokens and passwords, not files.
const MaxValue = 16 << 10

// Secret is a credential's metadata: everything but its value.
type Secret struct {
	Name string `json:"name"`
	// ID is the secret's identifier for the E2B API ("sec_" and 24 hex digits).
	ID string `json:"id"`
	// Owner is the user who may name it for their Benches; "" is operators only.
	Owner string `json:"owner,omitempty"`
	// Env is the variable in which a Bench that names it finds its placeholder.
	Env string `json:"env"`
	// Hosts are the destinations it may go to; none: only where a launch's own rules put it (E2B's
	// network transforms), never by a placeholder.
	Hosts []Host `json:"hosts,omitempty"`
	// Place is where in a request to one of Hosts the placeholder is replaced.
	Place Place `json:"place,omitzero"`
	// Body lets the placeholder be replaced in request bodies to its hosts too (headers only when
	// false, as the operator did not say otherwise).
	Body bool `json:"body,omitempty"`
	// Metadata are the E2B API's free key-value pairs (never a value).
	Metadata map[string]string `json:"metadata,omitempty"`
	Version  int               `json:"version"`
	Created  time.Time         `json:"created"`
	Updated  time.Time         `json:"updated"`
}

// Host is a destination a secret is bound to: a DNS name or an IP literal, and a port (0: 443).
type Host struct {
	Name string `json:"name"`
	Port int    `json:"port,omitempty"`
}

func (h Host) String() string {
	return net.JoinHostPort(h.Name, strconv.Itoa(h.port()))
}

func (h Host) port() int {
	if h.Port == 0 {
		return 443
	}
	return h.Port
}

// Matches reports whether a request to host:port (host canonical: lowercased, an IP literal in its
// canonical form) is to h.
func (h Host) Matches(host string, port int) bool { return h.Name == host && h.port() == port }

// Place is where a placeholder goes in a request: exactly one of its kinds.
type Place struct {
	// Header and Template: the header Header whose value is Template, with "{}" where the
	// placeholder stands ("Authorization", "Bearer {}").
	Header   string `json:"header,omitempty"`
	Template string `json:"template,omitempty"`
	// Basic: the user name or password of basic auth (Authorization: Basic ...).
	Basic bool `json:"basic,omitempty"`
	// Query: the query parameter of that name.
	Query string `json:"query,omitempty"`
}

func (p Place) String() string {
	switch {
	case p.Header != "":
		return p.Header + ": " + p.Template
	case p.Basic:
		return "basic auth"
	case p.Query != "":
		return "query parameter " + p.Query
	}
	return "none"
}

// ParsePlace parses a place as the CLI takes it: "header:NAME: TEMPLATE" ("header:Authorization:
// Bearer {}"), "basic", or "query:PARAM".
func ParsePlace(s string) (Place, error) {
	switch kind, rest, _ := strings.Cut(s, ":"); kind {
	case "basic":
		if rest != "" {
			return Place{}, errors.New(`"basic" takes nothing after it`)
		}
		return Place{Basic: true}, nil
	case "query":
		if rest == "" || strings.ContainsAny(rest, "&=#? ") {
			return Place{}, fmt.Errorf("query parameter %q: a name without & = # ? or spaces", rest)
		}
		return Place{Query: rest}, nil
	case "header":
		name, tmpl, ok := strings.Cut(rest, ":")
		tmpl = strings.TrimSpace(tmpl)
		if !ok || !validHeaderName(name) {
			return Place{}, fmt.Errorf("header place %q: write header:NAME: TEMPLATE, such as \"header:Authorization: Bearer {}\"", s)
		}
		if strings.Count(tmpl, "{}") != 1 || strings.ContainsAny(tmpl, "\r\n\x00") {
			return Place{}, fmt.Errorf("header template %q: it holds \"{}\", where the secret goes, exactly once", tmpl)
		}
		if strings.EqualFold(name, "Host") || strings.HasPrefix(strings.ToLower(name), "proxy-") {
			return Place{}, fmt.Errorf("header %q: not a header a secret goes in", name)
		}
		return Place{Header: canonicalHeader(name), Template: tmpl}, nil
	}
	return Place{}, fmt.Errorf("place %q: one of header:NAME: TEMPLATE, basic, query:PARAM", s)
}

func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range []byte(s) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// canonicalHeader is net/http's canonical form of a header name, without importing net/http.
func canonicalHeader(s string) string {
	b := []byte(strings.ToLower(s))
	up := true
	for i, c := range b {
		if up && 'a' <= c && c <= 'z' {
			b[i] = c - 'a' + 'A'
		}
		up = c == '-'
	}
	return string(b)
}

// ParseHost parses "NAME[:PORT]" or "[V6]:PORT" into a Host in canonical form.
func ParseHost(s string) (Host, error) {
	name, port := s, 0
	if h, p, err := net.SplitHostPort(s); err == nil {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return Host{}, fmt.Errorf("host %q: port %q is not 1-65535", s, p)
		}
		name, port = h, n
	}
	if a, err := netip.ParseAddr(strings.Trim(name, "[]")); err == nil && a.Zone() == "" {
		return Host{Name: a.Unmap().String(), Port: port}, nil
	}
	name = strings.ToLower(name)
	if !hostRE().MatchString(name) {
		return Host{}, fmt.Errorf("host %q: a DNS name or an IP address, with :PORT if not 443", s)
	}
	return Host{Name: name, Port: port}, nil
}

// Compiled at first use, not at every shed process's start: most never check a secret.
var (
	hostRE = sync.OnceValue(func() *regexp.Regexp {
		return regexp.MustCompile(`^([a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?\.)*[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?$`)
	})
	nameRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,62}$`) })
	envRE  = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`) })
)

// CheckName checks a secret's name: lowercase letters, digits, '-', '_' and '.', at most 63.
func CheckName(name string) error {
	if !nameRE().MatchString(name) || strings.HasPrefix(name, "sec_") {
		return fmt.Errorf("secret name %q: lowercase letters, digits, '-', '_' and '.', starting with a letter or digit, at most 63, not starting sec_", name)
	}
	return nil
}

// EnvOf is the default variable of a secret's placeholder: its name in capitals, '-' and '.' as '_'.
func EnvOf(name string) string {
	return strings.NewReplacer("-", "_", ".", "_").Replace(strings.ToUpper(name))
}

// ErrNotFound is returned for a secret that is not there, ErrExist by Add for one that is.
var (
	ErrNotFound = errors.New("no such secret")
	ErrExist    = errors.New("already exists")
)

// Store is the directory of secrets.
type Store struct{ dir string }

// Open returns the store of secrets under root (<root>/secrets, made on the first Add).
func Open(root string) *Store { return &Store{dir: filepath.Join(root, "secrets")} }

// Dir is the store's directory.
func (s *Store) Dir() string { return s.dir }

// file is what one file holds.
type file struct {
	Secret
	Value []byte `json:"value"`
}

// Add stores sec with value; an existing secret of that name is replaced only if replace, keeping
// its id and creation time and counting a new version.
func (s *Store) Add(sec Secret, value []byte, replace bool) (Secret, error) {
	if err := check(&sec, value); err != nil {
		return Secret{}, err
	}
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return Secret{}, err
	}
	if err := os.Chmod(s.dir, 0o700); err != nil {
		return Secret{}, err
	}
	now := time.Now().UTC().Truncate(time.Second)
	sec.Created, sec.Updated, sec.Version = now, now, 1
	if old, _, err := s.read(sec.Name); err == nil {
		if !replace {
			return Secret{}, fmt.Errorf("secret %s: %w", sec.Name, ErrExist)
		}
		sec.ID, sec.Created, sec.Version = old.ID, old.Created, old.Version+1
	} else if !errors.Is(err, ErrNotFound) {
		return Secret{}, err
	}
	if sec.ID == "" {
		b := make([]byte, 12)
		rand.Read(b)
		sec.ID = "sec_" + hex.EncodeToString(b)
	}
	return sec, s.write(sec, value)
}

// Update replaces the value (and metadata, if not nil) of the secret named or identified by ref.
func (s *Store) Update(ref string, value []byte, metadata map[string]string) (Secret, error) {
	sec, _, err := s.Value(ref)
	if err != nil {
		return Secret{}, err
	}
	if metadata != nil {
		sec.Metadata = metadata
	}
	if err := check(&sec, value); err != nil {
		return Secret{}, err
	}
	sec.Version++
	sec.Updated = time.Now().UTC().Truncate(time.Second)
	return sec, s.write(sec, value)
}

func check(sec *Secret, value []byte) error {
	if err := CheckName(sec.Name); err != nil {
		return err
	}
	if len(value) == 0 || len(value) > MaxValue {
		return fmt.Errorf("secret %s: the value is %d bytes: 1 to %d", sec.Name, len(value), MaxValue)
	}
	if slices.ContainsFunc(value, func(c byte) bool { return c < 0x20 || c == 0x7f }) {
		// It goes into headers and URLs: a line break there would be request smuggling.
		return fmt.Errorf("secret %s: the value holds a control character (a line break?)", sec.Name)
	}
	if sec.Env == "" {
		sec.Env = EnvOf(sec.Name)
	}
	if !envRE().MatchString(sec.Env) {
		return fmt.Errorf("secret %s: variable %q: letters, digits and '_', not starting with a digit", sec.Name, sec.Env)
	}
	if len(sec.Hosts) > 0 && sec.Place == (Place{}) {
		return fmt.Errorf("secret %s: bound to hosts but to no place in a request", sec.Name)
	}
	return nil
}

func (s *Store) write(sec Secret, value []byte) error {
	b, err := json.Marshal(file{sec, value})
	if err != nil {
		return err
	}
	// Written whole and renamed: a reader (a Bench's proxy) sees the old value or the new one.
	tmp, err := os.CreateTemp(s.dir, ".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err = tmp.Write(b); err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.Rename(tmp.Name(), filepath.Join(s.dir, sec.Name))
}

func (s *Store) read(name string) (Secret, []byte, error) {
	if CheckName(name) != nil {
		return Secret{}, nil, fmt.Errorf("secret %q: %w", name, ErrNotFound)
	}
	b, err := os.ReadFile(filepath.Join(s.dir, name))
	if errors.Is(err, os.ErrNotExist) {
		return Secret{}, nil, fmt.Errorf("secret %s: %w", name, ErrNotFound)
	}
	if err != nil {
		return Secret{}, nil, err
	}
	var f file
	if err := json.Unmarshal(b, &f); err != nil {
		return Secret{}, nil, fmt.Errorf("secret %s: %s is damaged: %v", name, filepath.Join(s.dir, name), err)
	}
	return f.Secret, f.Value, nil
}

// Get returns the metadata of the secret named or identified (E2B's secretID) by ref.
func (s *Store) Get(ref string) (Secret, error) {
	sec, _, err := s.Value(ref)
	return sec, err
}

// Value returns the secret named or identified by ref, with its value: for the proxy alone.
func (s *Store) Value(ref string) (Secret, []byte, error) {
	if !strings.HasPrefix(ref, "sec_") {
		return s.read(strings.ToLower(ref))
	}
	all, err := s.List()
	if err != nil {
		return Secret{}, nil, err
	}
	for _, sec := range all {
		if sec.ID == ref {
			return s.read(sec.Name)
		}
	}
	return Secret{}, nil, fmt.Errorf("secret %s: %w", ref, ErrNotFound)
}

// List returns every secret's metadata, by name.
func (s *Store) List() ([]Secret, error) {
	ents, err := os.ReadDir(s.dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Secret
	for _, e := range ents {
		if CheckName(e.Name()) != nil {
			continue // a temporary file
		}
		sec, _, err := s.read(e.Name())
		if errors.Is(err, ErrNotFound) {
			continue // removed since the listing
		}
		if err != nil {
			return nil, err
		}
		out = append(out, sec)
	}
	return out, nil
}

// Remove revokes the secret named or identified by ref: the next request of a Bench that uses it
// is refused.
func (s *Store) Remove(ref string) (Secret, error) {
	sec, err := s.Get(ref)
	if err != nil {
		return Secret{}, err
	}
	if err := os.Remove(filepath.Join(s.dir, sec.Name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return Secret{}, err
	}
	return sec, nil
}

// Placeholder returns a new random placeholder: what a Bench holds in a secret's place, worthless
// anywhere but at that Bench's proxy.
func Placeholder() string {
	b := make([]byte, 16)
	rand.Read(b)
	return "shed-secret-" + hex.EncodeToString(b)
}
