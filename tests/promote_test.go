package tests

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"toolshed.dev/shed/internal/ptytest"
)

// TestPromotePager: `shed workshop promote` of a long diff pages it when stdout is a terminal (a real
// pseudo-terminal), through $SHED_PAGER, and never when stdout is a pipe; either way a one-line
// summary of what the proposal changes (packages by kind, access, lines per file) comes right
// before the question, after the diff.
func TestPromotePager(t *testing.T) {
	requireRoot(t)
	root := newRoot(t)
	// A proposal for a new record (version 0 to 1), as `shed bench propose` writes one: long enough
	// that a terminal of 24 rows cannot show it.
	const id = "0123456789abcdef"
	dir := filepath.Join(root, "proposals", id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "proposal.json"), fmt.Sprintf(`{"id":%q,"workshop":"paged","base":0,"bench":"b","created":"2026-01-01T00:00:00Z",`+
		`"widens":["network: pypi.org:443"],"added":["apt jq=1.6-2.1","apt curl=7.88.1-10","pip requests==2.31.0"],"diff_sha256":"x"}`, id))
	var diff strings.Builder
	fmt.Fprintf(&diff, "proposal %s for Workshop paged, version 0, from Bench b\nWIDENS ACCESS: network: pypi.org:443\n", id)
	diff.WriteString("--- a/workshop.toml (version 0)\n+++ b/workshop.toml (proposed)\n@@ -0,0 +1,3 @@\n+name = \"paged\"\n+seed = \"debian/bookworm\"\n+[apt]\n")
	diff.WriteString("--- a/workshop.lock (version 0)\n+++ b/workshop.lock (proposed)\n@@ -1,2 +1,60 @@\n-old one\n-old two\n")
	for i := range 60 {
		fmt.Fprintf(&diff, "+lock line %d\n", i)
	}
	writeFile(t, filepath.Join(dir, "diff"), diff.String())
	const summary = "shed: proposal " + id + ": +2 apt packages, +1 pip package; WIDENS ACCESS: network: pypi.org:443; lines: workshop.toml +3 -0, workshop.lock +60 -2"
	const prompt = "Promote proposal " + id + " as version 1 of paged? Type yes to confirm:"
	// The pager marks every line it shows.
	env := append(os.Environ(), "SHED_SOCKET=none", "SHED_ROOT="+root, `SHED_PAGER=sed "s/^/PAGED| /"`)

	t.Run("terminal", func(t *testing.T) {
		master, slave := ptytest.Open(t, 24, 200)
		cmd := exec.Command(shedBin, "workshop", "promote", id)
		cmd.Env = env
		cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
		out := readAll(master)
		io.WriteString(master, "no\n")
		err := cmd.Run()
		slave.Close()
		screen := strings.ReplaceAll(<-out, "\r", "")
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(screen, "not confirmed") {
			t.Fatalf("promote answered no: %v\n%s", err, screen)
		}
		last := strings.LastIndex(screen, "PAGED| +lock line 59")
		if strings.Count(screen, "PAGED| ") < 60 || last < 0 {
			t.Fatalf("the diff was not paged on a terminal:\n%s", screen)
		}
		s, p := strings.Index(screen, summary), strings.Index(screen, prompt)
		if s < last || p < s || strings.TrimSpace(screen[s+len(summary):p]) != "" {
			t.Errorf("want the paged diff, then the summary, then the prompt right after it (at %d, %d, %d):\n%s", last, s, p, screen)
		}
	})

	t.Run("pipe", func(t *testing.T) {
		master, slave := ptytest.Open(t, 24, 200)
		cmd := exec.Command(shedBin, "workshop", "promote", id)
		cmd.Env = env
		var stdout, stderr bytes.Buffer
		cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, &stdout, &stderr
		io.WriteString(master, "no\n")
		if err := cmd.Run(); err == nil {
			t.Fatalf("promote answered no succeeded:\n%s", stderr.String())
		}
		if strings.Contains(stdout.String(), "PAGED|") || !strings.Contains(stdout.String(), "+lock line 59\n") {
			t.Errorf("a pipe got the pager, or not the diff:\n%s", stdout.String())
		}
		if e := stderr.String(); !strings.HasPrefix(e, summary+"\n"+prompt) {
			t.Errorf("stderr: want the summary, then the prompt:\n%s", e)
		}
	})
}

// readAll reads f until it ends (a pseudo-terminal's master: when its slave is closed), in the
// background, and sends what it read.
func readAll(f *os.File) <-chan string {
	out := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(f)
		out <- string(b)
	}()
	return out
}
