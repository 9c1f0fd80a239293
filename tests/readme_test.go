package tests

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestReadmeExample runs the README's first command, `make example`, on a
// store of its own, and checks what it prints: the example Workshop is
// realized from Debian's mirror (a seed and an apt layer), realized again
// from the cache, and `shed why` explains /usr/bin/jq.
func TestReadmeExample(t *testing.T) {
	parallel(t) // see parallelTests in main_test.go
	if _, err := exec.LookPath("make"); err != nil {
		t.Fatal("make is not installed; `make deps` installs it")
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "    make example ") || !strings.Contains(string(readme), "    make test ") {
		t.Fatal("README no longer leads with `make example` and `make test`: update this test with it")
	}
	root := filepath.Join(t.TempDir(), "root")
	cmd := exec.Command("make", "-s", "example")
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "SHED_ROOT="+root)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make example: %v\n%s", err, out)
	}
	requireRoot(t)
	for _, want := range []string{
		`(?m)^initialized store at ` + regexp.QuoteMeta(root) + `$`,
		`(?m)^` + regexp.QuoteMeta(root) + `/store/[0-9a-z]{32}-debian-bookworm$`,
		`(?m)^` + regexp.QuoteMeta(root) + `/store/[0-9a-z]{32}-apt-curl-jq$`,
		`(?m)^  package:  jq \S+$`,
		`(?m)^  declared: examples/jq/workshop.toml:6: apt.packages: "jq"$`,
	} {
		if !regexp.MustCompile(want).Match(out) {
			t.Errorf("make example output does not match %s:\n%s", want, out)
		}
	}
}
