package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestCompleteRunsNothing: shed asked for completions, by `shed __complete` or by the flag of an
// older script (urfave/cli's, which ran the command when the line had a "--"), prints candidates and
// runs nothing: no store is made, no file touched, nothing on stderr.
func TestCompleteRunsNothing(t *testing.T) {
	t.Setenv("SHED_SOCKET", "none")
	dir := t.TempDir()
	root, marker := filepath.Join(dir, "root"), filepath.Join(dir, "MARKER")
	for _, args := range [][]string{
		{"shed", "--root", root, "bench", "run", "-f", "workshop.toml", "--keep", "--", "touch", marker, "--generate-bash-completion"},
		{"shed", "--root", root, "bench", "exec", "b", "--", "touch", marker, "--generate-bash-completion"},
		{"shed", "--root", root, "init", "--generate-bash-completion"},
		{"shed", "--root", root, "gc", "--generate-bash-completion"},
		{"shed", "__complete", "--root", root, "bench", "run", "--", "touch", marker, ""},
		{"shed", "__complete", "--root", root, "init", ""},
		{"shed", "__complete", "--root", root, "gc", "--"},
		{"shed", "__complete", "--root", root, "bench", "exec", ""}, // lists the Benches, of no store
		{"shed", "__complete", "--root", root, "workshop", "show", ""},
	} {
		var out, errb bytes.Buffer
		if code := run(args, &out, &errb); code != exitOK || errb.Len() != 0 {
			t.Errorf("%q: exit %d, stderr %q", args, code, errb.String())
		}
		for _, p := range []string{root, marker} {
			if _, err := os.Stat(p); err == nil {
				t.Errorf("%q made %s: it ran", args, p)
			}
			os.RemoveAll(p)
		}
	}
}

// TestCompleteCandidates: what `shed __complete` offers for a line: commands, flags, a flag's
// value's kind, file names after "--".
func TestCompleteCandidates(t *testing.T) {
	for _, c := range []struct {
		words []string
		want  string
	}{
		{[]string{""}, "init recipe instantiate lock realize log why bench snapshot diff store key workshop daemon snapshotter k8s mcp audit agent secret copy export import root gc completion man help"},
		{[]string{"bench", "r"}, "run rm resume reset"},
		{[]string{"bench", "fork", "-"}, "--count --lifetime --root --json --verbose --help -h"},
		{[]string{"bench", "create", "--snapshot", ""}, ""},
		{[]string{"bench", "create", "-f", ""}, ":files"},
		{[]string{"snapshot", ""}, "create ls rm help"},
		{[]string{"bench", "run", "--gr"}, "--grant"},
		{[]string{"bench", "run", "-"}, "--grant --net --secret --offline --keep --name --user -u --tty -t --file -f --memory --pids --metrics --verify --substituter --root --json --verbose --help -h"},
		{[]string{"bench", "run", "-f", ""}, ":files"},
		{[]string{"bench", "run", "--file=w"}, ":files"},
		{[]string{"bench", "run", "--root", ""}, ":dirs"},
		{[]string{"bench", "run", "--name", ""}, ""},
		{[]string{"bench", "run", "--grant", "a:b:r"}, ""},
		{[]string{"bench", "run", "--grant", "/a:/b:rw", "--ke"}, "--keep"},
		{[]string{"bench", "run", "--", "touch", ""}, ":files"},
		{[]string{"bench", "run", "--", "jq", "-"}, ":files"},
		{[]string{"bench", "shell", ""}, ""},
		{[]string{"realize", ""}, ":files"},
		{[]string{"gc", ""}, ""},
		{[]string{"completion", ""}, "bash zsh fish"},
		{[]string{"help", "b"}, "bench"},
		{[]string{"help", "bench", ""}, "run shell ls propose exec logs network rm create pause resume fork reset"},
		{[]string{"--root", "/x:y", "store", "v"}, "verify"},
		{[]string{"nope", ""}, ""},
		{[]string{"--"}, "--root --json --verbose --help --version"},
	} {
		var out bytes.Buffer
		complete(newApp(io.Discard, io.Discard), c.words, &out)
		if got := strings.Join(strings.Fields(out.String()), " "); got != c.want {
			t.Errorf("%q: got %q, want %q", c.words, got, c.want)
		}
	}
	if !slices.Contains(strings.Fields(bashCompletion), "__complete") {
		t.Error("the bash script does not ask shed __complete")
	}
}

// TestCompleteNotInUserns: TAB and help do not enter a user namespace (a user without subordinate
// ids would see its error on the prompt); a command on the store does.
func TestCompleteNotInUserns(t *testing.T) {
	t.Setenv("SHED_SOCKET", "none")
	for _, c := range []struct {
		args []string
		want bool
	}{
		{[]string{"shed", "bench", "ls"}, true},
		{[]string{"shed", "__complete", "bench", "exec", ""}, false},
		{[]string{"shed", "bench", "run", "--", "touch", "x", "--generate-bash-completion"}, false},
		{[]string{"shed", "bench", "help", "run"}, false},
		{[]string{"shed", "help", "bench", "run"}, false},
	} {
		if got := worksOnStore(c.args); got != c.want {
			t.Errorf("worksOnStore(%q) = %v, want %v", c.args, got, c.want)
		}
	}
}
