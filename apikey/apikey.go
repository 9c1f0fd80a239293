// Package apikey keeps the supervisor's API keys: the secrets an agent harness presents (the E2B
// API's X-API-Key) to act as a local user, with that user's roles and limits. A key is shown once,
// when it is made; the store keeps only its SHA-256, so that reading the store (a backup, a copy, a
// bug that prints a file) reveals no key. A key is 160 random bits, so a plain hash is enough: there
// is nothing to guess that a slow hash would protect.
package apikey

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"toolshed.dev/shed/internal/atomicfile"
)

// Prefix starts every key, as E2B's keys start: the SDK takes it, and a leaked key is recognizable
// to secret scanners.
const Prefix = "e2b_"

// Key is what the store keeps of one API key: never the key itself.
type Key struct {
	ID      string    `json:"id"`      // a public name for it (the first 12 hex digits of its hash)
	User    string    `json:"user"`    // the local user it acts as
	Created time.Time `json:"created"` // when it was made
	SHA256  string    `json:"sha256"`  // the key's SHA-256, hex
}

// ErrUnknown is returned for a key that is not the store's.
var ErrUnknown = errors.New("unknown API key")

// Keys are the API keys of one store, in dir (root only: 0700, the file 0600).
type Keys struct{ dir string }

// Open returns the keys of the store at root.
func Open(root string) *Keys { return &Keys{dir: filepath.Join(root, "api-keys")} }

func (k *Keys) file() string { return filepath.Join(k.dir, "keys.json") }

// lock holds the keys' lock (for a change: read, modify, write) until the returned func is called.
func (k *Keys) lock() (func(), error) {
	if err := os.MkdirAll(k.dir, 0o700); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(k.dir, "lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil
}

// List returns the keys, oldest first.
func (k *Keys) List() ([]Key, error) {
	b, err := os.ReadFile(k.file())
	if errors.Is(err, os.ErrNotExist) {
		return []Key{}, nil
	}
	if err != nil {
		return nil, err
	}
	var keys []Key
	if err := json.Unmarshal(b, &keys); err != nil {
		return nil, fmt.Errorf("%s: %w", k.file(), err)
	}
	return keys, nil
}

func (k *Keys) write(keys []Key) error {
	b, err := json.MarshalIndent(keys, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(k.file(), append(b, '\n'), 0o600)
}

func hash(secret string) string {
	h := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(h[:])
}

// Create makes a key for user and returns it (the only time it is seen) and its record.
func (k *Keys) Create(user string) (string, Key, error) {
	var raw [20]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", Key{}, err
	}
	secret := Prefix + hex.EncodeToString(raw[:])
	h := hash(secret)
	key := Key{ID: h[:12], User: user, Created: time.Now().UTC().Truncate(time.Second), SHA256: h}
	unlock, err := k.lock()
	if err != nil {
		return "", Key{}, err
	}
	defer unlock()
	keys, err := k.List()
	if err != nil {
		return "", Key{}, err
	}
	if err := k.write(append(keys, key)); err != nil {
		return "", Key{}, err
	}
	return secret, key, nil
}

// Remove deletes the key id (or every key of a user, given "user:NAME") and returns what it removed.
func (k *Keys) Remove(id string) ([]Key, error) {
	unlock, err := k.lock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	keys, err := k.List()
	if err != nil {
		return nil, err
	}
	user, byUser := strings.CutPrefix(id, "user:")
	var gone []Key
	keys = slices.DeleteFunc(keys, func(key Key) bool {
		if key.ID == id || (byUser && key.User == user) {
			gone = append(gone, key)
			return true
		}
		return false
	})
	if len(gone) == 0 {
		return nil, fmt.Errorf("no API key %s", id)
	}
	return gone, k.write(keys)
}

// Lookup returns the key secret is, or ErrUnknown. Every stored hash is compared, in constant time.
func (k *Keys) Lookup(secret string) (*Key, error) {
	if !strings.HasPrefix(secret, Prefix) {
		return nil, ErrUnknown
	}
	keys, err := k.List()
	if err != nil {
		return nil, err
	}
	h := []byte(hash(secret))
	var found *Key
	for i := range keys {
		if subtle.ConstantTimeCompare(h, []byte(keys[i].SHA256)) == 1 {
			found = &keys[i]
		}
	}
	if found == nil {
		return nil, ErrUnknown
	}
	return found, nil
}
