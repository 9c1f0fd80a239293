package tests

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestCompletionRunsNothing drives each shell's real completion (bash with and without
// bash-completion, zsh's completion system, fish's complete -C) on the lines of issue 24, with shed's
// script loaded as `shed completion SHELL` prints it: TAB must run nothing (no Bench, no write to the
// store, no marker file, nothing on stderr) and offer what fits (commands, flags, file names after
// --), whatever the line asks shed to do.
func TestCompletionRunsNothing(t *testing.T) {
	for _, sh := range []string{"bash", "zsh", "fish"} {
		if _, err := exec.LookPath(sh); err != nil {
			t.Fatalf("%s is not installed (.ci/run installs it)", sh)
		}
	}
	if _, err := os.Stat(bashCompletionLib); err != nil {
		t.Fatalf("bash-completion is not installed (.ci/run installs it): %v", err)
	}
	root := filepath.Join(t.TempDir(), "root")
	if out, err := exec.Command(shedBin, "--root", root, "init").CombinedOutput(); err != nil {
		t.Fatalf("init: %v %s", err, out)
	}
	recipe, err := filepath.Abs("../examples/jq/workshop.toml")
	if err != nil {
		t.Fatal(err)
	}
	// The shells complete file names in dir, which has one file and one directory.
	dir := t.TempDir()
	marker := filepath.Join(dir, "MARKER")
	writeFile(t, filepath.Join(dir, "afile.txt"), "x")
	if err := os.Mkdir(filepath.Join(dir, "adir"), 0o755); err != nil {
		t.Fatal(err)
	}
	home := t.TempDir()
	env := append(os.Environ(), "PATH="+filepath.Dir(shedBin)+":"+os.Getenv("PATH"), "HOME="+home,
		"SHED_ROOT="+root, "SHED_SOCKET=none", "XDG_CONFIG_HOME="+home, "XDG_DATA_HOME="+home)
	files := []string{"afile.txt", "adir/"}
	for _, c := range []struct {
		line      string
		want, not []string // candidates that must be offered, and must not
		exactly   bool     // want is all of them
	}{
		{line: "shed ", want: []string{"bench", "realize", "gc", "help"}, not: []string{"__complete"}},
		{line: "shed bench ", want: []string{"run", "exec", "shell", "ls", "rm", "help"}},
		{line: "shed bench r", want: []string{"run", "rm", "resume", "reset"}, exactly: true},
		{line: "shed bench run --gr", want: []string{"--grant"}, exactly: true},
		{line: "shed bench run -f " + recipe + " --keep --name t -- touch " + marker + " ", want: files, not: []string{"--keep", "run"}},
		{line: "shed bench run -f " + recipe + " --offline --keep --name t -- touch " + marker + " ", want: files, not: []string{"--keep"}},
		{line: "shed bench run -f " + recipe + " --keep --name t -- jq -n 1+1 ", want: files},
		{line: "shed bench exec t -- touch " + marker + " ", want: files},
		{line: "shed bench shell -f " + recipe + " --keep --name t ", exactly: true},
		{line: "shed realize ", want: files},
		{line: "shed realize --offline " + recipe + " ", want: files},
		{line: "shed gc ", exactly: true},
		{line: "shed gc --dry", want: []string{"--dry-run"}, exactly: true},
		{line: "shed bench run --grant a:b:r", exactly: true},
		{line: "shed bench run --grant " + dir + ":/srv/project:rw --ke", want: []string{"--keep"}, exactly: true},
		// A colon in a word before the cursor keeps the word whole: the store named is one path.
		{line: "shed --root " + dir + "/a:b bench ", want: []string{"run", "exec"}},
		{line: "shed bench run -f a", want: files, exactly: true},
		{line: "shed bench run --file=a", want: []string{"--file=afile.txt", "--file=adir/"}, exactly: true},
		{line: "shed completion ", want: []string{"bash", "zsh", "fish"}, exactly: true},
		{line: "shed help be", want: []string{"bench"}, exactly: true},
		{line: "shed workshop show ", exactly: true}, // the store has no records
	} {
		for _, sh := range []string{"bash", "bash-completion", "zsh", "fish"} {
			before := storeState(t, root)
			got, stderr := completeLine(t, sh, c.line, dir, env)
			what := fmt.Sprintf("%s: %q", sh, c.line)
			if stderr != "" {
				t.Errorf("%s: printed on stderr:\n%s", what, stderr)
			}
			if after := storeState(t, root); after != before {
				t.Errorf("%s: the store changed: a command ran\nbefore:\n%s\nafter:\n%s", what, before, after)
			}
			if _, err := os.Stat(marker); err == nil {
				t.Errorf("%s: the marker file exists: the command ran", what)
				os.Remove(marker)
			}
			got = normalize(got)
			for _, w := range normalize(c.want) {
				if !slices.Contains(got, w) {
					t.Errorf("%s: offered %q, want %q among them", what, got, w)
				}
			}
			for _, n := range normalize(c.not) {
				if slices.Contains(got, n) {
					t.Errorf("%s: offered %q, which has %q", what, got, n)
				}
			}
			if c.exactly && len(got) != len(c.want) {
				t.Errorf("%s: offered %q, want exactly %q", what, got, c.want)
			}
		}
	}
	r := runResult(t, exec.Command(shedBin, "--root", root, "--json", "bench", "ls"))
	if r.code != 0 || strings.TrimSpace(r.stdout) != "[]" {
		t.Errorf("shed bench ls: exit %d, %s%s; want no Bench", r.code, r.stdout, r.stderr)
	}
}

// normalize makes the shells' candidates alike: bash's are what follows the last '=' or ':' of the
// word (what it replaces) and have no '/' after a directory, which zsh's and fish's have.
func normalize(cands []string) []string {
	var out []string
	for _, c := range cands {
		if i := strings.LastIndexAny(c, "=:"); i >= 0 {
			c = c[i+1:]
		}
		out = append(out, strings.TrimSuffix(c, "/"))
	}
	return out
}

const bashCompletionLib = "/usr/share/bash-completion/bash_completion"

// completeLine is what shell sh offers as completions at the end of line (the candidates, without
// fish's descriptions), and what it printed on stderr, in dir with env. sh is bash (shed's script
// alone), bash-completion (with bash-completion loaded, as Debian's interactive bash has it), zsh or
// fish.
func completeLine(t *testing.T, sh, line, dir string, env []string) ([]string, string) {
	t.Helper()
	var cmd *exec.Cmd
	switch sh {
	case "bash", "bash-completion":
		// As bash fills them in: words split at blanks and at COMP_WORDBREAKS characters.
		words := bashWords(line)
		var q []string
		for _, w := range words {
			q = append(q, shellQuote(w))
		}
		lib := ""
		if sh == "bash-completion" {
			lib = "source " + bashCompletionLib
		}
		script := lib + `
source <(shed completion bash)
COMP_LINE=$1 COMP_POINT=${#1} COMP_WORDS=(` + strings.Join(q, " ") + `) COMP_CWORD=` + fmt.Sprint(len(words)-1) + `
fn=$(complete -p shed | sed -n 's/.* -F \([^ ]*\) .*/\1/p')
"$fn" shed "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
printf '%s\n' "${COMPREPLY[@]}"`
		cmd = exec.Command("bash", "--norc", "--noprofile", "-c", script, "bash", line)
	case "zsh":
		fpath := t.TempDir()
		script, err := exec.Command(shedBin, "completion", "zsh").Output()
		if err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(fpath, "_shed"), string(script))
		cmd = exec.Command("zsh", "-f", "-c", zshCapture, "zsh", fpath, line)
	case "fish":
		cmd = exec.Command("fish", "--no-config", "-c", "shed completion fish | source; complete -C $argv[1]", line)
	}
	cmd.Dir, cmd.Env = dir, env
	// A completion that runs the command may run long (a realize): the test ends it, and all it
	// started, after a while.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-ctx.Done():
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		err = <-done
		t.Errorf("%s: completing %q took more than 30 s: did it run the command?", sh, line)
	}
	if err != nil {
		t.Errorf("%s: completing %q: %v\n%s", sh, line, err, stderr.String())
	}
	var got []string
	for _, l := range strings.Split(stdout.String(), "\n") {
		l, _, _ = strings.Cut(strings.TrimRight(l, "\r"), "\t")
		if l != "" {
			got = append(got, l)
		}
	}
	return got, stderr.String()
}

// bashWords splits line as bash does for COMP_WORDS (quotes aside): at blanks, and each run of
// COMP_WORDBREAKS characters (=, :, ...) is a word of its own; a line that ends in a blank ends in
// an empty word, the one being completed.
func bashWords(line string) []string {
	var words []string
	for _, f := range strings.Fields(line) {
		start := 0
		for i := 1; i <= len(f); i++ {
			if i == len(f) || isBreak(f[i]) != isBreak(f[i-1]) {
				words = append(words, f[start:i])
				start = i
			}
		}
	}
	if line == "" || strings.HasSuffix(line, " ") {
		words = append(words, "")
	}
	return words
}

func isBreak(b byte) bool { return strings.IndexByte("><=;|&(:", b) >= 0 }

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// zshCapture types a line and TAB into an interactive zsh (a pseudo-terminal, zsh/zpty) with the
// completion system and shed's _shed in fpath, and prints the candidates its compadd calls add: the
// technique of zsh-capture-completion. Enter is unbound, so the line itself never runs.
const zshCapture = `
zmodload zsh/zpty
zpty z zsh -f -i
zpty -w z "fpath=($1 \$fpath); PROMPT=; autoload -U compinit; compinit -u -D"
zpty -w z "bindkey '^I' complete-word; __b() { print; print COMP''BEGIN }; __e() { print; print COMP''END; exit }; compprefuncs=(__b); comppostfuncs=(__e)"
zpty -w z 'compadd() { if [[ ${@[1,(i)(-|--)]} == *-(O|A|D)\ * ]]; then builtin compadd "$@"; return; fi; local -a __hits; builtin compadd -A __hits "$@"; local h; for h in $__hits; do print -r -- "$IPREFIX$h"; done; }'
zpty -w z "bindkey '^M' undefined; bindkey '^J' undefined; print rea''dy"
while zpty -r z line; do [[ $line == ready* ]] && break; done
zpty -w -n z "$2"$'\t'
on=0
while zpty -r z line; do
  line=${line%%$'\r'*}
  line=${line%%$'\n'*}
  [[ $line == *COMPEND* ]] && break
  (( on )) && print -r -- "$line"
  [[ $line == *COMPBEGIN* ]] && on=1
done
zpty -d z
`

// storeState lists every file of the store with its size and time: a command that ran leaves a
// difference (a Bench's directory, a log, an audit entry, a realized path).
func storeState(t *testing.T, root string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil // removed while the walk went on (by a command that ran)
		}
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s %d %d\n", p, fi.Size(), fi.ModTime().UnixNano())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}
