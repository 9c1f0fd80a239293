package store

import (
	"encoding/base32"
	"encoding/hex"
	"fmt"

	"github.com/zeebo/blake3"
)

// HashSize is the size of a full BLAKE3 digest as the store uses it.
const HashSize = 32

// Hash is a BLAKE3-256 digest. It identifies bytes; it says nothing about
// whether they are safe to use (see docs/trust.md).
type Hash [HashSize]byte

// Sum returns the BLAKE3-256 digest of b.
func Sum(b []byte) Hash { return Hash(blake3.Sum256(b)) }

// ParseHash parses the form String returns: "blake3:" followed by 64 hex digits.
func ParseHash(s string) (Hash, error) {
	var h Hash
	const prefix = "blake3:"
	if len(s) != len(prefix)+2*HashSize || s[:len(prefix)] != prefix {
		return h, fmt.Errorf("parse hash %q: want blake3:<64 hex digits>", s)
	}
	if _, err := hex.Decode(h[:], []byte(s[len(prefix):])); err != nil {
		return h, fmt.Errorf("parse hash %q: %w", s, err)
	}
	return h, nil
}

// String returns "blake3:<hex>".
func (h Hash) String() string { return "blake3:" + hex.EncodeToString(h[:]) }

// Hex returns the digest in lowercase hex without a prefix.
func (h Hash) Hex() string { return hex.EncodeToString(h[:]) }

// IsZero reports whether h is the zero value.
func (h Hash) IsZero() bool { return h == Hash{} }

// MarshalText implements encoding.TextMarshaler.
func (h Hash) MarshalText() ([]byte, error) { return []byte(h.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (h *Hash) UnmarshalText(b []byte) error {
	v, err := ParseHash(string(b))
	if err != nil {
		return err
	}
	*h = v
	return nil
}

// pathHashBytes is how much of a digest names a store path: 160 bits, as Nix
// truncates SHA-256, which keeps names short and collisions out of reach.
const pathHashBytes = 20

// pathEncoding is Nix's base32 alphabet (no e, o, u, t), so that a hash part
// never spells a word; 20 bytes encode to exactly 32 characters.
var pathEncoding = base32.NewEncoding("0123456789abcdfghijklmnpqrsvwxyz").WithPadding(base32.NoPadding)

// HashPartLen is the length of the hash part of a store path's base name.
const HashPartLen = 32
