package main

import (
	"bytes"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
)

// eachLeaf calls fn for every command that runs (no subcommands), with its words ("bench", "run").
func eachLeaf(a *cli.App, fn func(path []string, c *cli.Command)) {
	var walk func([]string, []*cli.Command)
	walk = func(prefix []string, cmds []*cli.Command) {
		for _, c := range cmds {
			if c.Hidden || c.Name == "help" {
				continue
			}
			p := append(append([]string(nil), prefix...), c.Name)
			if len(c.Subcommands) > 0 {
				walk(p, c.Subcommands)
				continue
			}
			fn(p, c)
		}
	}
	walk(nil, a.Commands)
}

// runShed is shed with args on a store that is not there (nothing a usage error stops may touch one).
func runShed(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	t.Setenv("SHED_SOCKET", "none")
	root := filepath.Join(t.TempDir(), "none")
	var out, errb bytes.Buffer
	code := run(append([]string{"shed", "--root", root}, args...), &out, &errb)
	if _, err := os.Stat(root); err == nil {
		t.Errorf("shed %q made the store %s", args, root)
	}
	return code, out.String(), errb.String()
}

// TestFlagErrorsNameTheCommand: every command's flag errors (a flag it does not have, a flag's
// value left out, a value of the wrong type) and an argument to one that takes none exit 2 and name the command as it is typed, the flag as
// it is spelled, and the command's help.
func TestFlagErrorsNameTheCommand(t *testing.T) {
	eachLeaf(newApp(io.Discard, io.Discard), func(path []string, c *cli.Command) {
		full := "shed " + strings.Join(path, " ")
		type try struct {
			args []string
			want string
		}
		tries := []try{
			{[]string{"--no-such-flag"}, full + " has no flag --no-such-flag"},
			{[]string{"-no-such-flag"}, full + " has no flag -no-such-flag"},
		}
		if strings.TrimSpace(c.ArgsUsage) == "" {
			tries = append(tries, try{[]string{"extra"}, full + ` takes no arguments (got "extra")`})
		}
		for _, f := range c.Flags {
			name := f.Names()[0]
			switch f.(type) {
			case *cli.BoolFlag:
				tries = append(tries, try{[]string{"--" + name + "=maybe"}, full + " " + dashed(name) + ` "maybe": want true or false`})
			case *cli.Int64Flag, *cli.IntFlag, *cli.DurationFlag, *cli.UintFlag:
				tries = append(tries, try{[]string{"--" + name, "xx"}, full + " " + dashed(name) + ` "xx": want`})
				tries = append(tries, try{[]string{"--" + name}, full + " " + dashed(name) + " needs a value"})
			default:
				if takesValue(f) {
					tries = append(tries, try{[]string{"--" + name}, full + " " + dashed(name) + " needs a value"})
				}
			}
		}
		for _, tr := range tries {
			code, _, stderr := runShed(t, append(append([]string(nil), path...), tr.args...)...)
			if code != exitUsage || !strings.Contains(stderr, "shed: error: "+tr.want) || !strings.Contains(stderr, "`"+full+" --help`") {
				t.Errorf("shed %s %s: exit %d\n%s\nwant exit 2, %q and a hint of `%s --help`", strings.Join(path, " "), strings.Join(tr.args, " "), code, stderr, tr.want, full)
			}
		}
	})
}

// TestUsageHints: the cases of issue 24, and the same class: what is close is suggested, help
// shows what it is asked for, a flag after the arguments and a required flag left out are usage
// errors that say so.
func TestUsageHints(t *testing.T) {
	for _, c := range []struct {
		args []string
		code int
		want []string // on stderr, or stdout for help
	}{
		{[]string{"bench", "run", "--mem", "1G", "--", "true"}, exitUsage, []string{"shed bench run has no flag --mem", "did you mean --memory? see `shed bench run --help`"}},
		{[]string{"bench", "run", "-mem", "1G", "--", "true"}, exitUsage, []string{"shed bench run has no flag -mem", "did you mean --memory?"}},
		{[]string{"gc", "--dry"}, exitUsage, []string{"did you mean --dry-run?", "`shed gc --help`"}},
		{[]string{"workshop", "promote", "--no-relaize"}, exitUsage, []string{"shed workshop promote has no flag --no-relaize", "did you mean --no-realize?"}},
		{[]string{"--jsn", "bench", "ls"}, exitUsage, []string{"shed has no flag --jsn", "did you mean --json?", "`shed --help`"}},
		{[]string{"bench", "rn"}, exitUsage, []string{`shed bench has no command "rn"`, "did you mean `shed bench run`?", "`shed help bench` lists its commands"}},
		{[]string{"key", "ls"}, exitUsage, []string{`shed key has no command "ls"`, "`shed help key` lists its commands"}},
		{[]string{"agent", "key", "crate"}, exitUsage, []string{"did you mean `shed agent key create`?"}},
		{[]string{"relaize"}, exitUsage, []string{`unknown command "relaize"`, "did you mean `shed realize`?"}},
		{[]string{"help", "bench", "rn"}, exitUsage, []string{"did you mean `shed bench run`?"}},
		{[]string{"realize", "x.toml", "--offline"}, exitUsage, []string{"shed realize: the flag --offline comes after an argument (x.toml)", "`shed realize --offline x.toml`"}},
		{[]string{"store", "verify", "/a", "/b", "--repair"}, exitUsage, []string{"`shed store verify --repair /a /b`"}},
		{[]string{"realize", "x.toml", "--substituter", "oci-layout:/c", "--offline"}, exitUsage, []string{"`shed realize --substituter oci-layout:/c --offline x.toml`"}},
		{[]string{"store", "verify", "/x", "--bogus"}, exitUsage, []string{"shed store verify has no flag --bogus"}},
		{[]string{"bench", "logs"}, exitUsage, []string{"bench logs wants BENCH", "shed: hint: see `shed bench logs --help`"}},
		{[]string{"workshop", "show"}, exitUsage, []string{"shed: hint: see `shed workshop show --help`"}},
		{[]string{"audit", "x"}, exitUsage, []string{"shed: hint: see `shed audit --help`"}},
		{[]string{"copy"}, exitUsage, []string{"shed copy wants --to CACHE", "`shed copy --help`"}},
		{[]string{"copy", "x"}, exitUsage, []string{"shed copy wants --to CACHE"}},
		{[]string{"export", "x"}, exitUsage, []string{"shed export wants --oci DIR"}},
	} {
		code, stdout, stderr := runShed(t, c.args...)
		for _, w := range c.want {
			if code != c.code || !strings.Contains(stderr, w) {
				t.Errorf("shed %q: exit %d, stdout %q\n%s\nwant exit %d and %q", c.args, code, stdout, stderr, c.code, w)
			}
		}
	}
}

// TestHelpOfEveryCommand: `shed help A B`, `shed A help B` and `shed A B --help` show A B's help,
// and a group's lists its commands, for every command.
func TestHelpOfEveryCommand(t *testing.T) {
	a := newApp(io.Discard, io.Discard)
	var walk func([]string, []*cli.Command)
	walk = func(prefix []string, cmds []*cli.Command) {
		for _, c := range cmds {
			if c.Hidden || c.Name == "help" {
				continue
			}
			path := append(append([]string(nil), prefix...), c.Name)
			full := "shed " + strings.Join(path, " ")
			forms := [][]string{append([]string{"help"}, path...), append(append([]string(nil), path...), "--help")}
			if len(prefix) > 0 {
				forms = append(forms, append(append(append([]string(nil), prefix...), "help"), c.Name))
			}
			for _, args := range forms {
				code, stdout, stderr := runShed(t, args...)
				if code != exitOK || !strings.Contains(stdout, "   "+full+" - "+c.Usage) {
					t.Errorf("shed %s: exit %d, %s%s\nwant the help of %s", strings.Join(args, " "), code, stdout, stderr, full)
				}
				for _, sc := range c.Subcommands {
					if !sc.Hidden && !regexp.MustCompile(`(?m)^   `+regexp.QuoteMeta(sc.Name)+`\b`).MatchString(stdout) {
						t.Errorf("shed %s: does not list %s %s:\n%s", strings.Join(args, " "), full, sc.Name, stdout)
					}
				}
			}
			walk(path, c.Subcommands)
		}
	}
	walk(nil, a.Commands)
}

// TestHintsNameRealCommands: every `shed ...` that shed's sources write in backquotes (its hints,
// usages, help texts, notices) names a command that exists, and the flags after it are its own.
func TestHintsNameRealCommands(t *testing.T) {
	a := newApp(io.Discard, io.Discard)
	mention := regexp.MustCompile("`shed( [^`]*)`")
	n := 0
	err := filepath.WalkDir("../..", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "tests" || d.Name() == "vendor" || strings.HasPrefix(d.Name(), ".")) && p != "../.." {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, m := range mention.FindAllStringSubmatch(string(b), -1) {
			n++
			if msg := checkMention(a, strings.Fields(m[1])); msg != "" {
				t.Errorf("%s: `shed%s`: %s", p, m[1], msg)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 50 {
		t.Errorf("found %d mentions of shed commands: the walk missed the sources", n)
	}
}

// checkMention says what is wrong with a command line a text names ("" if nothing): its command
// words must name a command, and its flags (up to the first argument) be that command's or global.
func checkMention(a *cli.App, words []string) string {
	cmds, flags := a.Commands, append([]cli.Flag(nil), a.Flags...)
	var cmd *cli.Command
	for _, w := range words {
		switch {
		case w == "--" || !regexp.MustCompile(`^-{0,2}[a-z][a-z0-9-]*$`).MatchString(w):
			return "" // an argument (NAME, %s, a quote): the rest is not checked
		case strings.HasPrefix(w, "-"):
			name := strings.TrimLeft(w, "-")
			if name == "help" || name == "h" || (cmd == nil && (name == "version" || name == "v")) {
				continue
			}
			if findFlag(flags, name) == nil && findFlag(a.Flags, name) == nil {
				return "no flag " + w
			}
		case w == "help" && len(cmds) > 0:
			continue
		case len(cmds) > 0:
			c := findCommand(cmds, w)
			if c == nil {
				return "no command " + w
			}
			cmd, cmds, flags = c, c.Subcommands, c.Flags
		default:
			return "" // the command's argument
		}
	}
	return ""
}
