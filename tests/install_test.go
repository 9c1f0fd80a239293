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
		t.Fatal("make is not installed (`make deps` installs it)")
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
		"usr/bin/shed", "usr/libexec/shed/shed-cli", "usr/libexec/shed/shed-serve", "usr/libexec/shed/shed-init", "usr/share/man/man1/shed.1", "usr/share/bash-completion/completions/shed",
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
	// The servers and k8s run in shed-serve, which shed-cli finds beside it: reading the recipe is
	// shed-serve's (shed-cli would say where it looked for shed-serve).
	k := exec.Command(filepath.Join(dest, "usr/bin/shed"), "--root", filepath.Join(dest, "store"), "k8s", "manifests", "--image", "registry.example/w:1", filepath.Join(dest, "none.toml"))
	k.Env = append(os.Environ(), "SHED_SOCKET=none")
	if out, err := k.CombinedOutput(); !strings.Contains(string(out), "shed: error: read recipe: open "+filepath.Join(dest, "none.toml")) {
		t.Errorf("installed shed k8s manifests: %v\n%s\nwant shed-serve's error", err, out)
	}
	if b, _ := os.ReadFile(filepath.Join(dest, "usr/share/bash-completion/completions/shed")); !strings.Contains(string(b), "__complete") {
		t.Error("the bash completion is not shed's")
	}
}

// TestMakeUninstall: `make uninstall` removes what `make install` put, and the directories install
// made, so that the tree is as it was; directories that were there before stay, even empty ones.
func TestMakeUninstall(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Fatal("make is not installed (`make deps` installs it)")
	}
	dest := t.TempDir()
	// What was there before: PREFIX/bin with a file of another package's, and an empty man1.
	for _, d := range []string{"usr/bin", "usr/share/man/man1"} {
		if err := os.MkdirAll(filepath.Join(dest, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, filepath.Join(dest, "usr/bin/other"), "not shed's\n")
	before := treeOf(t, dest)
	for _, target := range []string{"install", "install", "uninstall"} { // installing twice forgets nothing
		if out, err := exec.Command("make", "-C", "..", target, "DESTDIR="+dest, "PREFIX=/usr").CombinedOutput(); err != nil {
			t.Fatalf("make %s: %v\n%s", target, err, out)
		}
	}
	if after := treeOf(t, dest); after != before {
		t.Errorf("after make install and make uninstall the tree is\n%s\nwant, as before,\n%s", after, before)
	}
}

// treeOf lists every file and directory under dir, one a line.
func treeOf(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		b.WriteString(rel + "\n")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestMakeDeps: `make deps` installs what the build and the tests use, from the one list CI uses
// (scripts/deps.sh, which .ci/run runs), and the README's first screen says to run it before make test.
func TestMakeDeps(t *testing.T) {
	requireRoot(t)
	out, err := exec.Command("make", "-C", "..", "-s", "deps").CombinedOutput()
	if err != nil {
		t.Fatalf("make deps: %v\n%s", err, out)
	}
	ci, err := os.ReadFile("../.ci/run")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(ci), "\nscripts/deps.sh\n") || strings.Contains(string(ci), "apt-get install") {
		t.Errorf(".ci/run does not install its packages through scripts/deps.sh alone:\n%s", ci)
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	first, _, _ := strings.Cut(string(readme), "```console")
	for _, want := range []string{"make deps", "](#install)"} {
		if !strings.Contains(first, want) {
			t.Errorf("the README's first screen does not say %q:\n%s", want, first)
		}
	}
}
