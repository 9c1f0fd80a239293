package bench

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"toolshed.dev/shed/recipe"
)

// TestGrantMissing: a grant of a path that is not there (or lies under a file) is a MissingError
// (so ErrGrant), naming the path, not a refusal about the recipe's bounds.
func TestGrantMissing(t *testing.T) {
	bound := t.TempDir()
	if err := os.WriteFile(filepath.Join(bound, "file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	r := &recipe.Recipe{File: "workshop.toml", Grants: []recipe.Grant{{Path: bound, Mode: "rw"}}}
	for _, c := range []struct{ path, want string }{
		{filepath.Join(bound, "missing", "sub"), "no such file or directory"},
		{filepath.Join(bound, "file", "sub"), "not a directory"},
	} {
		_, err := resolveGrants(r, []Grant{{Host: c.path, Bench: "/work", Mode: "ro"}}, nil)
		var me *MissingError
		if !errors.As(err, &me) || me.Path != c.path || !errors.Is(err, ErrGrant) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("grant of %s: %v, want a MissingError saying %q", c.path, err, c.want)
		}
	}
}
