package store

import (
	"errors"
	"fmt"
	"strings"

	"github.com/zeebo/blake3"
)

// DefaultStoreDir is the logical store directory that path hashes are bound to.
// It is the directory of the default root, and it stays the same when a store
// lives elsewhere (--root), because nothing in a layer refers to the physical
// location: two roots on one machine can then share paths through a cache.
const DefaultStoreDir = "/var/lib/toolshed/store"

// MaxNameLen bounds the name part of a store path (as Nix does), so that a
// base name always fits in a file name.
const MaxNameLen = 211

// Path is the base name of a store path: "<hash part>-<name>". It is always
// valid: construct one with ParsePath or MakePath.
type Path struct{ base string }

// ErrBadPath is returned for a string that is not a store path name.
var ErrBadPath = errors.New("not a store path")

// ErrBadName is returned for a name that cannot be the name part of a path.
var ErrBadName = errors.New("bad store name")

// ParsePath validates a base name "<32 base32 chars>-<name>". A full file name
// under a store directory is accepted too, and reduced to its base name.
func ParsePath(s string) (Path, error) {
	base := s
	if i := strings.LastIndexByte(s, '/'); i >= 0 {
		base = s[i+1:]
	}
	if len(base) < HashPartLen+2 || base[HashPartLen] != '-' {
		return Path{}, fmt.Errorf("%w: %q: want <32-char hash>-<name>", ErrBadPath, s)
	}
	if _, err := pathEncoding.DecodeString(base[:HashPartLen]); err != nil || strings.ToLower(base[:HashPartLen]) != base[:HashPartLen] {
		return Path{}, fmt.Errorf("%w: %q: bad hash part", ErrBadPath, s)
	}
	if err := CheckName(base[HashPartLen+1:]); err != nil {
		return Path{}, fmt.Errorf("%w: %q: %v", ErrBadPath, s, err)
	}
	return Path{base}, nil
}

// CheckName reports whether name may be the name part of a store path:
// 1 to 211 characters from [A-Za-z0-9+._?=-], not starting with a dot.
func CheckName(name string) error {
	if name == "" {
		return fmt.Errorf("%w: empty", ErrBadName)
	}
	if len(name) > MaxNameLen {
		return fmt.Errorf("%w: longer than %d characters", ErrBadName, MaxNameLen)
	}
	if name[0] == '.' {
		return fmt.Errorf("%w %q: starts with a dot", ErrBadName, name)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("+-._?=", c) >= 0:
		default:
			return fmt.Errorf("%w %q: character %q not allowed", ErrBadName, name, c)
		}
	}
	return nil
}

// MakePath derives a store path from what identifies it: kind says what the
// fingerprint is ("output", "fixed:sha256", "source", "text"), and the store
// directory and name are mixed in so that equal fingerprints under other names
// or stores never collide. The hash part is the first 160 bits of
// BLAKE3("shed-path-v1" 0 kind 0 fingerprint 0 storeDir 0 name).
func MakePath(kind, fingerprint, storeDir, name string) (Path, error) {
	if err := CheckName(name); err != nil {
		return Path{}, fmt.Errorf("make path %q: %w", name, err)
	}
	h := blake3.New()
	for _, s := range []string{"shed-path-v1", kind, fingerprint, storeDir, name} {
		h.WriteString(s)
		h.Write([]byte{0})
	}
	sum := h.Sum(nil)
	return Path{pathEncoding.EncodeToString(sum[:pathHashBytes]) + "-" + name}, nil
}

// String returns the base name.
func (p Path) String() string { return p.base }

// HashPart returns the 32-character hash part.
func (p Path) HashPart() string { return p.base[:HashPartLen] }

// Name returns the name part.
func (p Path) Name() string { return p.base[HashPartLen+1:] }

// IsZero reports whether p is the zero Path.
func (p Path) IsZero() bool { return p.base == "" }

// MarshalText implements encoding.TextMarshaler.
func (p Path) MarshalText() ([]byte, error) { return []byte(p.base), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (p *Path) UnmarshalText(b []byte) error {
	v, err := ParsePath(string(b))
	if err != nil {
		return err
	}
	*p = v
	return nil
}
