package ptytest

import (
	"slices"
	"testing"
)

func TestScreen(t *testing.T) {
	for _, c := range []struct {
		out  string
		want []string
	}{
		{"a\r\nb\r\n", []string{"a", "b"}},
		{"abc\rX\r\n", []string{"Xbc"}},
		{"one\r\n⠋ sp\r\n\x1b[1A\x1b[J⠙ sp\r\n\x1b[1A\x1b[Jtwo\r\n", []string{"one", "two"}},
		{"\x1b[31mred\x1b[0m\r\n", []string{"red"}},
		{"abcdefgh\r\n", []string{"abcde", "fgh"}}, // wraps at 5 columns
		{"abcde\r\nf\r\n", []string{"abcde", "f"}}, // a full line does not wrap by itself
		{"keep\r\ngone\x1b[2G\x1b[K\r\n", []string{"keep", "g"}},
	} {
		if got := Screen([]byte(c.out), 5); !slices.Equal(got, c.want) {
			t.Errorf("Screen(%q) = %q, want %q", c.out, got, c.want)
		}
	}
}
