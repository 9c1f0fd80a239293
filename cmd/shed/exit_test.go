package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestExitCodes pins the documented exit codes (README.md): scripts can only
// test for non-zero, so the exact codes are checked here, in process.
func TestExitCodes(t *testing.T) {
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	bad := filepath.Join(dir, "bad.toml")
	os.WriteFile(bad, []byte("name = \"x\"\nseed = \"debian/bookworm\"\nbogus = 1\n"), 0o644)
	good := filepath.Join(dir, "good.toml")
	os.WriteFile(good, []byte("name = \"x\"\nseed = \"debian/bookworm\"\n"), 0o644)

	shed := func(args ...string) (int, string) {
		var out, errb bytes.Buffer
		code := run(append([]string{"shed", "--root", root}, args...), &out, &errb)
		return code, errb.String()
	}
	if code, _ := shed("init"); code != exitOK {
		t.Fatalf("init: exit %d", code)
	}
	src := filepath.Join(dir, "src")
	os.MkdirAll(src, 0o755)
	os.WriteFile(filepath.Join(src, "f"), []byte("x"), 0o644)
	var outb bytes.Buffer
	run([]string{"shed", "--root", root, "store", "add", src}, &outb, &bytes.Buffer{})
	stored := strings.TrimSpace(outb.String())
	os.WriteFile(filepath.Join(stored, "f"), []byte("y"), 0o644)

	cases := []struct {
		args []string
		want int
	}{
		{[]string{"recipe", "check", good}, exitOK},
		{[]string{"recipe", "check", bad}, exitInvalid},
		{[]string{"instantiate", bad}, exitInvalid},
		{[]string{"recipe", "check", good, "extra"}, exitUsage},
		{[]string{"gc", "--max-freed", "lots"}, exitUsage},
		{[]string{"gc", "--no-such-flag"}, exitUsage},
		{[]string{"store", "info", "not-a-path"}, exitFailure},
		{[]string{"recipe", "check", filepath.Join(dir, "missing.toml")}, exitFailure},
		{[]string{"store", "verify"}, exitOK},
		{[]string{"store", "verify", "--check-contents"}, exitProblems},
	}
	for _, c := range cases {
		code, stderr := shed(c.args...)
		if code != c.want {
			t.Errorf("shed %s: got exit %d, want %d\n%s", strings.Join(c.args, " "), code, c.want, stderr)
		}
		if code != exitOK && !strings.HasPrefix(stderr, "shed: error: ") {
			t.Errorf("shed %s: stderr does not start with \"shed: error: \":\n%s", strings.Join(c.args, " "), stderr)
		}
	}
}

// TestDocsUpToDate: docs/cli.md is generated from the command definitions
// (`make docs`), so the reference never drifts from the code.
func TestDocsUpToDate(t *testing.T) {
	var out bytes.Buffer
	if code := run([]string{"shed", "man", "--markdown"}, &out, os.Stderr); code != 0 {
		t.Fatalf("shed man --markdown: exit %d", code)
	}
	want, err := os.ReadFile(filepath.Join("..", "..", "docs", "cli.md"))
	if err != nil {
		t.Fatal(err)
	}
	if out.String() != string(want) {
		t.Errorf("docs/cli.md is stale: run `make docs` and commit the result")
	}
}
