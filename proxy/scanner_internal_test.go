package proxy

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// TestScanner: every occurrence is handed to act, also when split across reads (one byte at a time);
// of two patterns at one place the longer wins, and a shorter one inside a longer match still coming
// is not acted on first; an error stops the stream before the pattern's first byte.
func TestScanner(t *testing.T) {
	mask := func(pats ...string) func(int) ([]byte, error) {
		return func(i int) ([]byte, error) { return bytes.Repeat([]byte("*"), len(pats[i])), nil }
	}
	for _, c := range []struct {
		in   string
		pats []string
		want string
	}{
		{"xxtok123yy", []string{"tok", "tok123"}, "xx******yy"},
		{"xxabcdefyy", []string{"cd", "abcdef"}, "xx******yy"},
		{"cdab cd", []string{"cd", "abcdef"}, "**ab **"},
		{"aaaa", []string{"aa"}, "****"},
		{"no match here", []string{"zz"}, "no match here"},
		{"tail tok", []string{"tok"}, "tail ***"},
		{"empty pattern", []string{""}, "empty pattern"},
	} {
		var pats [][]byte
		for _, p := range c.pats {
			pats = append(pats, []byte(p))
		}
		for _, one := range []bool{false, true} {
			var src io.Reader = strings.NewReader(c.in)
			if one {
				src = iotest.OneByteReader(src)
			}
			s := &scanner{src: io.NopCloser(src), pats: pats, act: mask(c.pats...)}
			got, err := io.ReadAll(s)
			if err != nil || string(got) != c.want {
				t.Errorf("%q %q (one byte at a time: %v): %q %v, want %q", c.in, c.pats, one, got, err, c.want)
			}
		}
	}
	stop := errors.New("stop")
	s := &scanner{src: io.NopCloser(iotest.OneByteReader(strings.NewReader("before-PLACEHOLDER-after"))), pats: [][]byte{[]byte("PLACEHOLDER")},
		act: func(int) ([]byte, error) { return nil, stop }}
	got, err := io.ReadAll(s)
	if !errors.Is(err, stop) || string(got) != "before-" {
		t.Errorf("a refusal: %q %v, want %q and the error", got, err, "before-")
	}
}
