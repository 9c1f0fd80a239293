package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"toolshed.dev/shed/app"
	"toolshed.dev/shed/records"
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
		{[]string{"bench", "run", "--memory", "64", "-f", good, "--", "true"}, exitUsage},
		{[]string{"bench", "run", "--memory", "lots", "-f", good, "--", "true"}, exitUsage},
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

// TestDocsUpToDate: docs/cli.md and docs/man/shed.1 are generated from the
// command definitions (`make docs`), so the reference never drifts from the code.
func TestDocsUpToDate(t *testing.T) {
	for _, c := range []struct{ file, flag string }{{"cli.md", "--markdown"}, {"man/shed.1", ""}} {
		var out bytes.Buffer
		args := []string{"shed", "man"}
		if c.flag != "" {
			args = append(args, c.flag)
		}
		if code := run(args, &out, os.Stderr); code != 0 {
			t.Fatalf("%s: exit %d", strings.Join(args, " "), code)
		}
		want, err := os.ReadFile(filepath.Join("..", "..", "docs", c.file))
		if err != nil {
			t.Fatal(err)
		}
		if out.String() != string(want) {
			t.Errorf("docs/%s is stale: run `make docs` and commit the result", c.file)
		}
	}
}

// TestManPage: the man page is well-formed roff that names every command.
func TestManPage(t *testing.T) {
	var out bytes.Buffer
	if code := run([]string{"shed", "man"}, &out, os.Stderr); code != 0 {
		t.Fatalf("shed man: exit %d", code)
	}
	page := out.String()
	if !strings.HasPrefix(page, ".TH SHED 1 ") {
		t.Errorf("no .TH header: %.40q", page)
	}
	for _, want := range []string{".SS shed bench run\n", ".SS shed realize\n", "\\fB\\-\\-offline\\fR", ".SH EXIT STATUS"} {
		if !strings.Contains(page, want) {
			t.Errorf("the man page lacks %q", want)
		}
	}
	for i, line := range strings.Split(page, "\n") {
		if strings.HasPrefix(line, "'") || (strings.HasPrefix(line, ".") && !strings.HasPrefix(line, ".TH") && !strings.HasPrefix(line, ".S") &&
			!strings.HasPrefix(line, ".PP") && !strings.HasPrefix(line, ".TP") && !strings.HasPrefix(line, ".nf") && !strings.HasPrefix(line, ".fi")) {
			t.Errorf("line %d would be read as a roff request: %q", i+1, line)
		}
	}
}

// TestJSONErrors: with --json (before or after the command), an error is one JSON object on stderr
// with the message, the hint, the API's code and the exit code; without it, the two lines for people.
func TestJSONErrors(t *testing.T) {
	root := filepath.Join(t.TempDir(), "root")
	for _, c := range []struct {
		args       []string
		code, exit string
	}{
		{[]string{"shed", "--json", "bench", "rm"}, "usage", "2"},
		{[]string{"shed", "--root", root, "realize", "--json", "/nonexistent/workshop.toml"}, "not_found", "1"},
	} {
		var out, errb bytes.Buffer
		code := run(c.args, &out, &errb)
		var e struct {
			Error, Hint, Code string
			Exit              int
		}
		if err := json.Unmarshal(errb.Bytes(), &e); err != nil {
			t.Errorf("%v: stderr is not one JSON object: %v\n%s", c.args, err, errb.String())
			continue
		}
		if e.Code != c.code || strconv.Itoa(e.Exit) != c.exit || strconv.Itoa(code) != c.exit || e.Error == "" {
			t.Errorf("%v: %+v (exit %d), want code %s, exit %s", c.args, e, code, c.code, c.exit)
		}
		if out.Len() != 0 {
			t.Errorf("%v: stdout %q, want nothing", c.args, out.String())
		}
	}
}

// TestCompleteNames: the shells complete a record's name where a command takes one, from the store;
// with no store, nothing (and no error).
func TestCompleteNames(t *testing.T) {
	root := filepath.Join(t.TempDir(), "root")
	if code := run([]string{"shed", "--root", root, "init"}, io.Discard, io.Discard); code != exitOK {
		t.Fatalf("init: %d", code)
	}
	f := &records.Files{Recipe: []byte("name = \"jq-tools\"\nseed = \"debian/bookworm\"\n"), Lock: []byte("# lock\n"), Extra: map[string][]byte{}}
	if _, err := records.Open(root).Add(context.Background(), records.Version{Name: "jq-tools", By: "root"}, f, nil); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		root string
		want string
	}{{root, "jq-tools\n"}, {filepath.Join(t.TempDir(), "none"), ""}} {
		// As the scripts ask (the word being completed last), and as urfave/cli's older ones did.
		for _, args := range [][]string{
			{"shed", "__complete", "--root", c.root, "workshop", "show", ""},
			{"shed", "__complete", "--root", c.root, "workshop", "show", "jq"},
			{"shed", "--root", c.root, "workshop", "show", "--generate-bash-completion"},
		} {
			var out, errb bytes.Buffer
			code := run(args, &out, &errb)
			if code != exitOK || out.String() != c.want || errb.Len() != 0 {
				t.Errorf("%q: exit %d, %q, stderr %q; want %q", args, code, out.String(), errb.String(), c.want)
			}
		}
	}
}

// TestRealizeSummary: a realize ends with one line of what it did and how long it took.
func TestRealizeSummary(t *testing.T) {
	for _, c := range []struct {
		r    app.RealizeResult
		want string
	}{
		{app.RealizeResult{Workshop: "jq-tools", Layers: []string{"a", "b"}, Seconds: 0.0123}, "shed: realized jq-tools in 12 ms: its 2 layers were in the store"},
		{app.RealizeResult{Workshop: "jq-tools", Layers: []string{"a", "b"}, Built: []string{"a", "b"}, Fetched: make([]string, 19), FetchedBytes: 4613734, Seconds: 31.24},
			"shed: realized jq-tools in 31.2 s: built 2 paths, fetched 19 files (4.4 MiB)"},
		{app.RealizeResult{Workshop: "py", Layers: []string{"a", "b", "c"}, Substituted: make([]string, 5), SubstitutedBytes: 52323942, Seconds: 4.2},
			"shed: realized py in 4.2 s: substituted 5 paths (49.9 MiB)"},
	} {
		if got := realizeSummary(&c.r); got != c.want {
			t.Errorf("got  %q\nwant %q", got, c.want)
		}
	}
}
