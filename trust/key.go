package trust

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"

	"toolshed.dev/shed/internal/atomicfile"
)

// A key is written as NAME:BASE64, as Nix writes its signing keys: NAME says whose it is (a host, a CI
// system) and the rest is the ed25519 key. The public form is what other stores list as trusted.

// SecretKey signs provenance.
type SecretKey struct {
	Name string
	key  ed25519.PrivateKey
}

// PublicKey checks signatures.
type PublicKey struct {
	Name string
	Key  ed25519.PublicKey
}

var keyNameRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`) })

// ErrBadKey marks a key that does not parse.
var ErrBadKey = errors.New("bad key")

// GenerateKey makes a new signing key named name.
func GenerateKey(name string) (*SecretKey, error) {
	if !keyNameRE().MatchString(name) {
		return nil, fmt.Errorf("%w: name %q: use letters, digits, '.', '_' and '-'", ErrBadKey, name)
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	return &SecretKey{Name: name, key: priv}, nil
}

// Public returns the key's public half.
func (k *SecretKey) Public() PublicKey {
	return PublicKey{Name: k.Name, Key: k.key.Public().(ed25519.PublicKey)}
}

// String returns NAME:BASE64 of the secret key.
func (k *SecretKey) String() string { return k.Name + ":" + base64.StdEncoding.EncodeToString(k.key) }

// String returns NAME:BASE64, the form a trust list holds.
func (k PublicKey) String() string { return k.Name + ":" + base64.StdEncoding.EncodeToString(k.Key) }

// ID is what a signature names its key by: the public key itself, so that two keys with one name
// are never confused.
func (k PublicKey) ID() string { return k.String() }

func parseKey(s string, size int) (string, []byte, error) {
	name, b64, ok := strings.Cut(strings.TrimSpace(s), ":")
	if !ok || !keyNameRE().MatchString(name) {
		return "", nil, fmt.Errorf("%w: want NAME:BASE64", ErrBadKey)
	}
	raw, err := base64.StdEncoding.DecodeString(b64)
	if err != nil || len(raw) != size {
		return "", nil, fmt.Errorf("%w: %s: want %d bytes of base64", ErrBadKey, name, size)
	}
	return name, raw, nil
}

// ParsePublicKey parses NAME:BASE64.
func ParsePublicKey(s string) (PublicKey, error) {
	name, raw, err := parseKey(s, ed25519.PublicKeySize)
	if err != nil {
		return PublicKey{}, err
	}
	return PublicKey{Name: name, Key: ed25519.PublicKey(raw)}, nil
}

// ParseSecretKey parses NAME:BASE64 of a secret key.
func ParseSecretKey(s string) (*SecretKey, error) {
	name, raw, err := parseKey(s, ed25519.PrivateKeySize)
	if err != nil {
		return nil, err
	}
	return &SecretKey{Name: name, key: ed25519.PrivateKey(raw)}, nil
}

// Keys are a store's own keys, under <root>/trust: signing.sec (mode 0600) is the current one;
// retired/ keeps the public halves of the keys it replaced, which still vouch for what they signed.
type Keys struct {
	dir string
}

// OpenKeys returns the keys of the store at root.
func OpenKeys(root string) *Keys { return &Keys{dir: filepath.Join(root, "trust")} }

// ErrNoKey is returned when the store has no signing key.
var ErrNoKey = errors.New("the store has no signing key")

func (ks *Keys) secretFile() string { return filepath.Join(ks.dir, "signing.sec") }

// Ensure creates the signing key named name if the store has none, and returns the current key.
func (ks *Keys) Ensure(name string) (*SecretKey, bool, error) {
	if k, err := ks.Secret(); err == nil {
		return k, false, nil
	} else if !errors.Is(err, ErrNoKey) {
		return nil, false, err
	}
	k, err := GenerateKey(name)
	if err != nil {
		return nil, false, err
	}
	if err := ks.write(k); err != nil {
		return nil, false, err
	}
	return k, true, nil
}

func (ks *Keys) write(k *SecretKey) error {
	if err := atomicfile.MkdirAll(filepath.Join(ks.dir, "retired"), 0o700); err != nil {
		return err
	}
	return atomicfile.WriteFile(ks.secretFile(), []byte(k.String()+"\n"), 0o600)
}

// Secret returns the current signing key.
func (ks *Keys) Secret() (*SecretKey, error) {
	b, err := os.ReadFile(ks.secretFile())
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w (%s)", ErrNoKey, ks.secretFile())
	} else if err != nil {
		return nil, err
	}
	k, err := ParseSecretKey(string(b))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", ks.secretFile(), err)
	}
	return k, nil
}

// Retired returns the public halves of the keys that rotations replaced.
func (ks *Keys) Retired() ([]PublicKey, error) {
	ents, err := os.ReadDir(filepath.Join(ks.dir, "retired"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	var out []PublicKey
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".pub") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(ks.dir, "retired", e.Name()))
		if err != nil {
			return nil, err
		}
		k, err := ParsePublicKey(string(b))
		if err != nil {
			return nil, fmt.Errorf("retired/%s: %w", e.Name(), err)
		}
		out = append(out, k)
	}
	return out, nil
}

// Rotate replaces the signing key by a new one named name; the old key's public half is kept in
// retired/ (its secret half is destroyed: nothing signs with it again).
func (ks *Keys) Rotate(name string) (old PublicKey, cur *SecretKey, err error) {
	prev, err := ks.Secret()
	if err != nil {
		return PublicKey{}, nil, err
	}
	if cur, err = GenerateKey(name); err != nil {
		return PublicKey{}, nil, err
	}
	old = prev.Public()
	retired := filepath.Join(ks.dir, "retired", fmt.Sprintf("%s-%x.pub", old.Name, old.Key[:6]))
	// The old key's public half is durable before its secret half is replaced: what it signed never
	// stops verifying here.
	if err := atomicfile.MkdirAll(filepath.Dir(retired), 0o700); err != nil {
		return PublicKey{}, nil, err
	}
	if err := atomicfile.WriteFile(retired, []byte(old.String()+"\n"), 0o600); err != nil {
		return PublicKey{}, nil, err
	}
	if err := ks.write(cur); err != nil {
		return PublicKey{}, nil, err
	}
	return old, cur, nil
}
