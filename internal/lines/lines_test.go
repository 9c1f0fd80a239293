package lines

import (
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/google/go-cmp/cmp"
)

type got struct {
	Line string
	Cut  bool
}

func collect(t *testing.T, r io.Reader, max int) ([]got, error) {
	t.Helper()
	var out []got
	err := Each(r, max, func(line []byte, cut bool) error {
		out = append(out, got{string(line), cut})
		return nil
	})
	return out, err
}

func TestEach(t *testing.T) {
	long := strings.Repeat("x", 100<<10)
	for _, tc := range []struct {
		name, in string
		max      int
		want     []got
	}{
		{"empty", "", 8, nil},
		{"lines", "a\nbb\n\nccc", 8, []got{{"a", false}, {"bb", false}, {"", false}, {"ccc", false}}},
		{"crlf", "a\r\nb\r\n", 8, []got{{"a", false}, {"b", false}}},
		{"at the bound", "12345678\n1\n", 8, []got{{"12345678", false}, {"1", false}}},
		{"one over", "123456789\n1\n", 8, []got{{"12345678", true}, {"1", false}}},
		{"one over, no newline", "123456789", 8, []got{{"12345678", true}}},
		{"small bound", "abcdefghij\nk\n", 3, []got{{"abc", true}, {"k", false}}},
		// A line many times the reader's buffer: the lines after it are read.
		{"100 KB line", "a\n" + long + "\nb\nc\n", 64 << 10, []got{{"a", false}, {long[:64<<10], true}, {"b", false}, {"c", false}}},
		{"100 KB last line", "a\n" + long, 64 << 10, []got{{"a", false}, {long[:64<<10], true}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, r := range []io.Reader{strings.NewReader(tc.in), iotest.OneByteReader(strings.NewReader(tc.in))} {
				out, err := collect(t, r, tc.max)
				if err != nil {
					t.Fatal(err)
				}
				if d := cmp.Diff(tc.want, out); d != "" {
					t.Errorf("lines (-want +got):\n%s", d)
				}
			}
		})
	}
}

// TestEachErrors: a read error ends Each with that error, also in a long line's rest; fn's error ends it too.
func TestEachErrors(t *testing.T) {
	boom := errors.New("boom")
	for _, in := range []string{"a\nb", "a\n" + strings.Repeat("x", 100)} {
		r := io.MultiReader(strings.NewReader(in), iotest.ErrReader(boom))
		if _, err := collect(t, r, 16); !errors.Is(err, boom) {
			t.Errorf("%.10q...: got %v, want %v", in, err, boom)
		}
	}
	n := 0
	err := Each(strings.NewReader("a\nb\nc\n"), 8, func([]byte, bool) error {
		n++
		return boom
	})
	if !errors.Is(err, boom) || n != 1 {
		t.Errorf("got %v after %d lines, want %v after 1", err, n, boom)
	}
}
