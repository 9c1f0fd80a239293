package main

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/urfave/cli/v2"
)

// Usage errors name the command as it is typed (`shed bench run --help`, where urfave said "shed run"),
// a flag as it is spelled (--memory: Go's flag package says -memory), and, for a flag or a command
// that is not there, the one that is close ("did you mean --memory?").

// setupUsage makes every command's usage errors shed's: flag errors (OnUsageError), a required flag
// left out and a flag after the arguments (checked before the Action, see checkArgs).
func setupUsage(a *cli.App) {
	var walk func([]*cli.Command)
	walk = func(cmds []*cli.Command) {
		for _, c := range cmds {
			c.OnUsageError = onUsageError
			if action := c.Action; action != nil {
				c.Action = func(ctx *cli.Context) error { return namedHint(ctx, action(ctx)) }
			}
			// (A group's Before runs before its subcommand's: it would see the subcommand as an argument.)
			if len(c.Subcommands) == 0 && c.Action != nil {
				var required []cli.Flag
				for _, f := range c.Flags {
					// urfave's own check prints the help on stdout and exits 1, and reads an argument
					// as a help topic: shed checks it, as a usage error.
					if sf, ok := f.(*cli.StringFlag); ok && sf.Required {
						sf.Required = false
						required = append(required, f)
					}
				}
				before := c.Before
				c.Before = func(ctx *cli.Context) error {
					if err := checkArgs(ctx, required); err != nil {
						return err
					}
					if before != nil {
						return before(ctx)
					}
					return nil
				}
			}
			walk(c.Subcommands)
		}
	}
	walk(a.Commands)
}

// namedHint gives a usage error of c's Action (usageError's "see `shed help`") the command's own
// help: `shed bench logs` without BENCH points at `shed bench logs --help`.
func namedHint(c *cli.Context, err error) error {
	var ee *exitError
	if errors.As(err, &ee) && ee.code == exitUsage && ee.hint == usageError("").(*exitError).hint {
		ee.hint = "see `" + commandPath(c) + " --help`"
	}
	return err
}

// commandPath is the command c runs, as typed: "shed bench run" ("shed" for the top level).
func commandPath(c *cli.Context) string {
	var names []string
	for _, l := range c.Lineage() {
		if l.Command != nil && l.Command.Name != "" {
			names = append(names, l.Command.Name)
		}
	}
	// The top level's command is named after the app ("shed"); urfave gives the top level's flags
	// a context of their own, whose Command may also be the app's.
	names = slices.Compact(names)
	if len(names) == 0 || names[len(names)-1] != c.App.Name {
		names = append(names, c.App.Name)
	}
	slices.Reverse(names)
	return strings.Join(names, " ")
}

// typed is flag name as the command line has it (-mem or --mem), else as dashed writes it.
func typed(c *cli.Context, name string) string {
	if l := c.Lineage(); len(l) > 1 {
		for _, a := range l[1].Args().Slice() {
			if a == "--" {
				break
			}
			if n, _, _ := strings.Cut(a, "="); n == "-"+name || n == "--"+name {
				return n
			}
		}
	}
	return dashed(name)
}

// dashed is a flag's name as it is typed: --memory, -f.
func dashed(name string) string {
	if len(name) == 1 {
		return "-" + name
	}
	return "--" + name
}

var (
	undefinedFlag = regexp.MustCompile(`^flag provided but not defined: -+(.*)$`)
	needsValue    = regexp.MustCompile(`^flag needs an argument: -+(.*)$`)
	badValue      = regexp.MustCompile(`^invalid (?:boolean )?value ("(?:[^"\\]|\\.)*") for (?:flag )?-+([^:]+): (.*)$`)
)

// onUsageError is every command's OnUsageError: the flag as typed, the command's full name, and a
// flag that is close to an unknown one.
func onUsageError(c *cli.Context, err error, _ bool) error {
	path := commandPath(c)
	help := "see `" + path + " --help`"
	flags := visibleFlags(c)
	msg := err.Error()
	if m := undefinedFlag.FindStringSubmatch(msg); m != nil {
		name := m[1]
		err = fmt.Errorf("%s has no flag %s", path, typed(c, name))
		if s := suggest(name, flagNames(flags)); s != "" {
			return withHint(exitUsage, err, "did you mean "+dashed(s)+"? "+help)
		}
		return withHint(exitUsage, err, help)
	}
	if m := needsValue.FindStringSubmatch(msg); m != nil {
		err = fmt.Errorf("%s %s needs a value", path, dashed(m[1]))
		if p := flagPlaceholder(flags, m[1]); p != "" {
			err = fmt.Errorf("%s %s needs a value: %s", path, dashed(m[1]), p)
		}
		return withHint(exitUsage, err, help)
	}
	if m := badValue.FindStringSubmatch(msg); m != nil {
		what := m[3]
		if p := flagPlaceholder(flags, m[2]); p != "" {
			what = "want " + p
		} else if strings.HasPrefix(msg, "invalid boolean") {
			what = "want true or false"
		}
		return withHint(exitUsage, fmt.Errorf("%s %s %s: %s", path, dashed(m[2]), m[1], what), help)
	}
	return withHint(exitUsage, fmt.Errorf("%s: %w", path, err), help)
}

// visibleFlags are the flags of c's command, and the global ones.
func visibleFlags(c *cli.Context) []cli.Flag {
	var flags []cli.Flag
	if c.Command != nil {
		flags = append(flags, c.Command.Flags...)
	}
	return append(flags, c.App.Flags...)
}

func flagNames(flags []cli.Flag) []string {
	var names []string
	for _, f := range flags {
		if !hidden(f) {
			names = append(names, f.Names()...)
		}
	}
	return names
}

// flagPlaceholder is what a flag's value is (its usage's `SIZE`, `DURATION`...).
func flagPlaceholder(flags []cli.Flag, name string) string {
	for _, f := range flags {
		if slices.Contains(f.Names(), name) {
			return placeholder(f)
		}
	}
	return ""
}

// unknownCommandError is a command name that is not one of cmds's (c's command's subcommands).
func unknownCommandError(c *cli.Context, name string) error {
	path := commandPath(c)
	var names []string
	cmds := c.App.Commands
	if c.Command != nil && len(c.Command.Subcommands) > 0 {
		cmds = c.Command.Subcommands
	}
	for _, sc := range cmds {
		if !sc.Hidden {
			names = append(names, sc.Names()...)
		}
	}
	list := "`shed help` lists the commands"
	if path != c.App.Name {
		list = "`shed help " + strings.TrimPrefix(path, c.App.Name+" ") + "` lists its commands"
	}
	err := fmt.Errorf("%s has no command %q", path, name)
	if path == c.App.Name {
		err = fmt.Errorf("unknown command %q", name)
	}
	if s := suggest(name, names); s != "" {
		return withHint(exitUsage, err, "did you mean `"+path+" "+s+"`? "+list)
	}
	return withHint(exitUsage, err, list)
}

// suggest is the one of names that typed is close to: the only one it begins, else the nearest
// within an edit or two (a third of its length), else "".
func suggest(typed string, names []string) string {
	if typed == "" {
		return ""
	}
	var prefixed []string
	for _, n := range names {
		if len(n) > 1 && strings.HasPrefix(n, typed) {
			prefixed = append(prefixed, n)
		}
	}
	if len(slices.Compact(prefixed)) == 1 {
		return prefixed[0]
	}
	best, bestD := "", max(1, min(2, len(typed)/3))+1
	for _, n := range names {
		if len(n) < 2 {
			continue
		}
		if d := levenshtein(typed, n); d < bestD {
			best, bestD = n, d
		}
	}
	return best
}

// levenshtein is the edit distance of a and b, where swapping two neighbours (--yse) is one edit.
func levenshtein(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

// checkArgs refuses, before a command's Action runs, arguments to a command that takes none, a
// required flag left out and a flag after the arguments: urfave/cli reads flags only before the first argument, so `shed realize FILE
// --offline` would take --offline for a second FILE. A command that runs a command line (CMD) is
// left alone: what follows its arguments is the Bench's.
func checkArgs(c *cli.Context, required []cli.Flag) error {
	path := commandPath(c)
	args := c.Args().Slice()
	if strings.TrimSpace(c.Command.ArgsUsage) == "" && len(args) > 0 {
		// A command that takes no arguments ignored them: `shed bench shell x` launched a shell.
		if args[0] == "--help" || args[0] == "-h" {
			return showHelp(c)
		}
		return withHint(exitUsage, fmt.Errorf("%s takes no arguments (got %q)", path, args[0]), "see `"+path+" --help`")
	}
	if !strings.Contains(c.Command.ArgsUsage, "CMD") {
		for i, a := range args {
			if a == "--" {
				break
			}
			if i == 0 || len(a) < 2 || !strings.HasPrefix(a, "-") {
				continue
			}
			name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
			if name == "help" || name == "h" {
				return showHelp(c)
			}
			if !slices.Contains(flagNames(visibleFlags(c)), name) {
				return onUsageError(c, fmt.Errorf("flag provided but not defined: -%s", name), true)
			}
			return withHint(exitUsage, fmt.Errorf("%s: the flag %s comes after an argument (%s)", path, dashed(name), args[0]),
				"flags go before the arguments: `"+path+" "+strings.Join(flagsFirst(visibleFlags(c), args), " ")+"`")
		}
	}
	for _, f := range required {
		if !c.IsSet(f.Names()[0]) {
			p := placeholder(f)
			return withHint(exitUsage, fmt.Errorf("%s wants %s %s", path, dashed(f.Names()[0]), p), "see `"+path+" --help`")
		}
	}
	return nil
}

// flagsFirst is args with the flags (and their values) before the arguments, as urfave/cli reads them.
func flagsFirst(flags []cli.Flag, args []string) []string {
	var fl, pos []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			pos = append(pos, args[i:]...)
			break
		}
		if len(a) < 2 || !strings.HasPrefix(a, "-") {
			pos = append(pos, a)
			continue
		}
		fl = append(fl, a)
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if f := findFlag(flags, name); f != nil && takesValue(f) && !hasValue && i+1 < len(args) {
			fl = append(fl, args[i+1])
			i++
		}
	}
	return append(fl, pos...)
}

// errHelpShown ends a command whose help was printed instead: exit 0, nothing more to say.
var errHelpShown = &exitError{code: exitOK, err: errSilent}

func showHelp(c *cli.Context) error {
	cli.HelpPrinter(c.App.Writer, cli.CommandHelpTemplate, c.Command)
	return errHelpShown
}

// helpArgs rewrites `shed [GROUP...] help [COMMAND...]` to `shed [GROUP...] COMMAND... --help`:
// urfave/cli's help command shows a group's help without its commands, and the group's for a
// command of it (`shed help bench run` showed bench's).
func helpArgs(a *cli.App, args []string) []string {
	cmds := a.Commands
	var path []string
	i := 1
	for ; i < len(args); i++ {
		w := args[i]
		if w == "--" {
			return args
		}
		if strings.HasPrefix(w, "-") {
			if len(path) == 0 && (w == "--root" || w == "-root") {
				i++ // its value
			}
			continue
		}
		if w == "help" || w == "h" {
			break
		}
		c := findCommand(cmds, w)
		if c == nil || len(c.Subcommands) == 0 {
			return args
		}
		path = append(path, w)
		cmds = c.Subcommands
	}
	if i >= len(args) {
		return args
	}
	out := slices.Clone(args[:i])
	for _, w := range args[i+1:] {
		if strings.HasPrefix(w, "-") {
			continue
		}
		out = append(out, w)
		c := findCommand(cmds, w)
		if c == nil {
			return out // unknown: its error, with a suggestion
		}
		if cmds = c.Subcommands; len(cmds) == 0 {
			break
		}
	}
	return append(out, "--help")
}
