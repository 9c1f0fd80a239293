package tests

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestMakeInstall: `make install` with DESTDIR and PREFIX puts shed, its man page and the three
// shells' completions where each looks, and the installed shed names its version and commit.
func TestMakeInstall(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Fatal("make is not installed (.ci/run installs it)")
	}
	if _, err := exec.Command("git", "-C", "..", "rev-parse", "HEAD").Output(); err != nil {
		t.Skip("not a git checkout: the commit is not known (a release tarball sets COMMIT)")
	}
	dest := t.TempDir()
	out, err := exec.Command("make", "-C", "..", "install", "DESTDIR="+dest, "PREFIX=/usr").CombinedOutput()
	if err != nil {
		t.Fatalf("make install: %v\n%s", err, out)
	}
	for _, f := range []string{
		"usr/bin/shed", "usr/share/man/man1/shed.1", "usr/share/bash-completion/completions/shed",
		"usr/share/zsh/site-functions/_shed", "usr/share/fish/vendor_completions.d/shed.fish",
	} {
		fi, err := os.Stat(filepath.Join(dest, f))
		if err != nil || fi.Size() == 0 {
			t.Errorf("%s: %v (size %v)", f, err, fi)
		}
	}
	head, _ := exec.Command("git", "-C", "..", "rev-parse", "--short=12", "HEAD").Output()
	v, err := exec.Command(filepath.Join(dest, "usr/bin/shed"), "--version").Output()
	if err != nil || !strings.Contains(string(v), "(commit "+strings.TrimSpace(string(head))) {
		t.Errorf("installed shed --version: %q, %v; want commit %s", v, err, head)
	}
	if b, _ := os.ReadFile(filepath.Join(dest, "usr/share/bash-completion/completions/shed")); !strings.Contains(string(b), "__complete") {
		t.Error("the bash completion is not shed's")
	}
}
