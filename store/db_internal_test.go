package store

import (
	"testing"
	"time"
)

// FuzzDecodeRecord: a damaged record is refused or decoded, never a panic or
// a hang, and what decodes encodes to a record that decodes the same.
func FuzzDecodeRecord(f *testing.F) {
	a, _ := MakePath("output", "a", DefaultStoreDir, "a")
	b, _ := MakePath("output", "b", DefaultStoreDir, "b.drv")
	f.Add(encodeInfo(&PathInfo{Path: a, References: []Path{}}, false))
	f.Add(encodeInfo(&PathInfo{Path: a, Deriver: b, References: []Path{a, b}, BuildInputs: []Path{b}, Size: 7,
		Registered: time.Unix(1700000000, 5).UTC(), CA: "text"}, true))
	f.Fuzz(func(t *testing.T, data []byte) {
		info, prov, err := decodeInfo(data)
		if err != nil {
			return
		}
		enc := encodeInfo(info, prov)
		again, againProv, err := decodeInfo(enc)
		if err != nil {
			t.Fatalf("decoded %+v, whose encoding %x does not decode: %v", info, enc, err)
		}
		if got := encodeInfo(again, againProv); string(got) != string(enc) {
			t.Errorf("decoded %+v, then %+v", info, again)
		}
	})
}
