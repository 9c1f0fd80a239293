package sandbox

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestEachLineLong: /etc/group may hold a group whose members make a line over 64 KiB. It neither
// ends the reading of the file nor hides its own id (the ids come first on a line).
func TestEachLineLong(t *testing.T) {
	name := filepath.Join(t.TempDir(), "group")
	members := strings.Repeat("someone,", 100_000/8)
	text := "root:x:0:\n# comment\n\nbig:x:1234:" + members + "\nlast:x:4321:\n"
	if err := os.WriteFile(name, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	var ids []string
	if err := eachLine(name, func(line string) error {
		ids = append(ids, strings.Split(line, ":")[2])
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]string{"0", "1234", "4321"}, ids); d != "" {
		t.Errorf("ids (-want +got):\n%s", d)
	}
}
