package tests

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestMissingCommand: a command that is not in the Bench exits 127, as a shell's does, with a hint
// that says how to get it; so does a Bench's own exit 127, and any other code is the command's.
func TestMissingCommand(t *testing.T) {
	requireRoot(t)
	root := sharedRoot(t)
	file := writeFile(t, filepath.Join(t.TempDir(), "workshop.toml"), fmt.Sprintf("name = \"nocmd-%d\"\nseed = \"debian/bookworm\"\n", os.Getpid()))
	for _, c := range []struct {
		argv []string
		exit int
		hint bool
	}{
		{[]string{"no-such-command"}, 127, true},
		{[]string{"/usr/bin/no-such-command"}, 127, true},
		{[]string{"sh", "-c", "no-such-command"}, 127, false}, // the shell's own 127
		{[]string{"sh", "-c", "exit 3"}, 3, false},
	} {
		r := shed(t, root, nil, append([]string{"bench", "run", "-f", file, "--net", "none", "--"}, c.argv...)...)
		if r.code != c.exit {
			t.Errorf("%v: exit %d, want %d\n%s", c.argv, r.code, c.exit, r.stderr)
		}
		if got := strings.Contains(r.stderr, "shed: hint: the Workshop does not have it"); got != c.hint {
			t.Errorf("%v: hint %v, want %v:\n%s", c.argv, got, c.hint, r.stderr)
		}
	}
}
