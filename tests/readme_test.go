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
// store of its own, and checks what it prints: the example recipe checks and
// compiles to a seed and an apt layer.
func TestReadmeExample(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Fatal("make is not installed; .ci/run installs it")
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
	for _, want := range []string{
		`(?m)^initialized store at ` + regexp.QuoteMeta(root) + `$`,
		`(?m)^ok: examples/jq/workshop.toml: jq-tools, seed debian/bookworm, 2 apt packages, 0 pip packages, 1 grant$`,
		`(?m)^seed +\S+/store/[0-9a-z]{32}-debian-bookworm\.drv +-> \S+-debian-bookworm$`,
		`(?m)^layer +\S+/store/[0-9a-z]{32}-apt-curl-jq\.drv +-> \S+-apt-curl-jq$`,
	} {
		if !regexp.MustCompile(want).Match(out) {
			t.Errorf("make example output does not match %s:\n%s", want, out)
		}
	}
}
