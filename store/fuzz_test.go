package store_test

import (
	"bytes"
	"testing"

	"toolshed.dev/shed/store"
)

// FuzzParseManifest checks that the parser never panics and accepts only
// canonical encodings: whatever it parses encodes back to the same bytes.
func FuzzParseManifest(f *testing.F) {
	f.Add([]byte(validManifest))
	f.Add([]byte("shed-manifest v1\n\".\" file 0644 0 0 0 0 " + store.Sum(nil).Hex() + "\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := store.ParseManifest(b)
		if err != nil {
			return
		}
		if enc := m.Encode(); !bytes.Equal(enc, b) {
			t.Fatalf("Encode(Parse(b)) != b\nb:   %q\nenc: %q", b, enc)
		}
		if d := store.DiffManifests(m, m); len(d) != 0 {
			t.Fatalf("a manifest differs from itself: %q", d)
		}
		if m.Size() < 0 {
			t.Fatalf("negative size %d", m.Size())
		}
	})
}
