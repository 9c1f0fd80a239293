package builder

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"toolshed.dev/shed/derivation"
	"toolshed.dev/shed/internal/hint"
)

// TestAccountsLayerRefusals: a Workshop the accounts layer cannot make its accounts in (here a
// busybox root, with no useradd) fails its build with one error that says why and a hint, and no
// output; an argument that is not an account is refused before anything runs.
func TestAccountsLayerRefusals(t *testing.T) {
	needRootT(t)
	bb, err := exec.LookPath("busybox")
	if err != nil {
		t.Skip("no busybox")
	}
	lower := t.TempDir()
	for _, d := range []string{"bin", "proc", "dev", "tmp", "run", "etc", "sys", "root"} {
		if err := os.MkdirAll(filepath.Join(lower, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(lower, "bin", "busybox"), data, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, applet := range []string{"sh", "mkdir", "dirname", "cut"} {
		if err := os.Symlink("busybox", filepath.Join(lower, "bin", applet)); err != nil {
			t.Fatal(err)
		}
	}
	d := &derivation.Derivation{Name: "accounts-user", Args: []string{"user:1000:/home/user:/bin/bash:sudo"}}
	build := func(d *derivation.Derivation) (string, error) {
		stage := t.TempDir()
		var log strings.Builder
		err := (&Builder{}).buildAccountsLayer(context.Background(), d, []string{lower}, stage, filepath.Join(stage, "out"), &log)
		if _, statErr := os.Stat(filepath.Join(stage, "out")); statErr == nil {
			t.Errorf("%s: a failed build left its output", d.Args)
		}
		return log.String(), err
	}
	log, err := build(d)
	if !errors.Is(err, ErrBuildFailed) || !strings.Contains(err.Error(), "no useradd in the Workshop") || !strings.Contains(hint.Of(err), "passwd (shadow) package") {
		t.Errorf("no useradd: %v (hint %q)\n%s", err, hint.Of(err), log)
	}
	bad := &derivation.Derivation{Name: "accounts-x", Args: []string{"user:1000:/home/user"}}
	if _, err := build(bad); err == nil || !strings.Contains(err.Error(), "not name:uid:home:shell:sudo") {
		t.Errorf("a bad argument: %v", err)
	}
}
