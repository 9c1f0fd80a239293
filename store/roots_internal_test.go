package store

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReadRootLinesLong: a line of a temporary roots file over bufio.Scanner's 64 KiB does not end its
// reading: the roots after it are held.
func TestReadRootLinesLong(t *testing.T) {
	var ps []Path
	for _, n := range []string{"a", "b"} {
		p, err := ParsePath(strings.Repeat("0", HashPartLen) + "-" + n)
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	name := filepath.Join(t.TempDir(), "roots")
	text := ps[0].String() + "\n" + strings.Repeat("x", 100_000) + "\n" + ps[1].String() + "\n"
	if err := os.WriteFile(name, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	got := map[Path]bool{}
	if err := readRootLines(name, got); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || !got[ps[0]] || !got[ps[1]] {
		t.Errorf("got roots %v, want %v", got, ps)
	}
}
