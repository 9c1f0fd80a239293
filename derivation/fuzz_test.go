package derivation_test

import (
	"bytes"
	"testing"

	"toolshed.dev/shed/derivation"
	"toolshed.dev/shed/store"
)

// FuzzDecode: Decode never panics, and what it accepts is canonical: it
// encodes back to exactly the input.
func FuzzDecode(f *testing.F) {
	for _, d := range examples(f) {
		f.Add(d.Encode())
	}
	f.Add([]byte(derivation.Version + "\nname \"x\"\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := derivation.Decode(b, store.DefaultStoreDir)
		if err != nil {
			return
		}
		if !bytes.Equal(d.Encode(), b) {
			t.Fatalf("accepted non-canonical input:\n%q\nre-encodes as\n%q", b, d.Encode())
		}
		if err := d.Validate(); err != nil {
			t.Fatalf("accepted invalid derivation: %v", err)
		}
	})
}
