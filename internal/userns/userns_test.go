package userns

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func write(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "subuid")
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestSubIDs(t *testing.T) {
	for _, c := range []struct {
		name, file string
		want       []Extent
		have       uint64 // for a SubIDError
	}{
		{"one range by name", "bob:200000:65536\nalice:100000:65536\n", []Extent{{1, 100000, 65535}}, 0},
		{"by uid", "1001:300000:70000\n", []Extent{{1, 300000, 65535}}, 0},
		{"ranges in file order, cut at 65535", "alice:100000:1000\nbob:1:2\nalice:500000:65536\n",
			[]Extent{{1, 100000, 1000}, {1001, 500000, 64535}}, 0},
		{"comments, blanks and bad lines skipped", "# x\n\nalice:x:5\nalice:100000:65535\n", []Extent{{1, 100000, 65535}}, 0},
		{"too few", "alice:100000:1000\n", nil, 1000},
		{"none", "bob:100000:65536\n", nil, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := subIDs(write(t, c.file), "alice", 1001)
			if c.want == nil {
				var se *SubIDError
				if !errors.As(err, &se) || !errors.Is(err, ErrNoSubIDs) || se.Have != c.have || se.User != "alice" {
					t.Fatalf("got %v, %v; want a SubIDError with %d ids", got, err, c.have)
				}
				return
			}
			if err != nil || !slices.Equal(got, c.want) {
				t.Fatalf("got %v, %v; want %v", got, err, c.want)
			}
		})
	}
	// No file at all is no ids, not a failure to read.
	if _, err := subIDs(filepath.Join(t.TempDir(), "missing"), "alice", 1001); !errors.Is(err, ErrNoSubIDs) {
		t.Fatalf("missing file: %v, want ErrNoSubIDs", err)
	}
}

func TestFreeRange(t *testing.T) {
	a := write(t, "alice:100000:65536\nbob:165536:65536\n")
	b := write(t, "carol:300000:10\n")
	if got := freeRange(a, b); got != 300010 {
		t.Errorf("got %d, want 300010 (after every range)", got)
	}
	if got := freeRange(filepath.Join(t.TempDir(), "missing")); got != 100000 {
		t.Errorf("no files: got %d, want 100000", got)
	}
}

func TestReadMap(t *testing.T) {
	p := write(t, "         0       1001          1\n         1     100000      65535\n")
	m, err := ReadMap(p)
	if err != nil || !slices.Equal(m, []Extent{{0, 1001, 1}, {1, 100000, 65535}}) {
		t.Fatalf("got %v, %v", m, err)
	}
	if _, err := ReadMap(write(t, "0 x 1\n")); err == nil {
		t.Fatal("a malformed map parsed")
	}
	// Active reads this process's own map: the identity on a host, anything else in a container.
	self, err := ReadMap("/proc/self/uid_map")
	if err != nil {
		t.Fatal(err)
	}
	if initial := slices.Equal(self, []Extent{{0, 0, 4294967295}}); Active() == initial {
		t.Errorf("Active() = %v with uid_map %v", Active(), self)
	}
	if Active() {
		return // Owner below is for the initial namespace
	}
	if uid, _ := Owner(); uid != uint32(os.Getuid()) {
		t.Errorf("Owner: %d, want %d", uid, os.Getuid())
	}
}
