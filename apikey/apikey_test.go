package apikey

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestKeys: a key made is found, acts as its user, is stored only as a hash, and is gone once removed.
func TestKeys(t *testing.T) {
	root := t.TempDir()
	k := Open(root)
	secret, key, err := k.Create("alice")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(secret, Prefix) || len(secret) != len(Prefix)+40 {
		t.Fatalf("key %q: want %s and 40 hex digits", secret, Prefix)
	}
	other, _, err := k.Create("bob")
	if err != nil {
		t.Fatal(err)
	}
	got, err := k.Lookup(secret)
	if err != nil || got.User != "alice" || got.ID != key.ID {
		t.Fatalf("Lookup: %+v, %v", got, err)
	}
	for _, wrong := range []string{"", Prefix, secret[:len(secret)-1], secret + "0", strings.ToUpper(secret), key.SHA256, key.ID} {
		if _, err := k.Lookup(wrong); err != ErrUnknown {
			t.Errorf("Lookup(%q) = %v, want ErrUnknown", wrong, err)
		}
	}
	b, err := os.ReadFile(filepath.Join(root, "api-keys", "keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), secret) || strings.Contains(string(b), other) || strings.Contains(string(b), secret[len(Prefix):]) {
		t.Fatalf("the keys file holds a key:\n%s", b)
	}
	if fi, err := os.Stat(filepath.Join(root, "api-keys", "keys.json")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("keys.json: %v, %v", fi.Mode(), err)
	}
	if _, err := k.Remove(key.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := k.Lookup(secret); err != ErrUnknown {
		t.Fatalf("a removed key still works: %v", err)
	}
	if _, err := k.Lookup(other); err != nil {
		t.Fatalf("removing alice's key removed bob's: %v", err)
	}
	if _, err := k.Remove(key.ID); err == nil {
		t.Fatal("removing a removed key succeeded")
	}
	if gone, err := k.Remove("user:bob"); err != nil || len(gone) != 1 {
		t.Fatalf("Remove(user:bob) = %v, %v", gone, err)
	}
	if keys, err := k.List(); err != nil || len(keys) != 0 {
		t.Fatalf("List = %v, %v", keys, err)
	}
}
