package why

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"toolshed.dev/shed/store"
)

// TestListHasLong: a line over bufio.Scanner's 64 KiB in a dpkg .list file does not end its reading:
// a file named after it is found.
func TestListHasLong(t *testing.T) {
	layer := t.TempDir()
	list := "var/lib/dpkg/info/jq.list"
	if err := os.MkdirAll(filepath.Join(layer, filepath.Dir(list)), 0o755); err != nil {
		t.Fatal(err)
	}
	text := "/.\n/usr\n/" + strings.Repeat("x", 100_000) + "\n/usr/bin/jq\n"
	if err := os.WriteFile(filepath.Join(layer, list), []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	none := func(string) (store.Entry, int, bool) { return store.Entry{}, 0, false }
	if !listHas(layer, list, map[string]bool{"/usr/bin/jq": true}, none) {
		t.Error("/usr/bin/jq, after a 100 KB line, not found")
	}
}
