package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"

	"github.com/urfave/cli/v2"
)

// completeCommand is the hidden entry point of the shells' completion scripts:
// `shed __complete WORD... CURRENT` prints the candidates for CURRENT, the word being completed,
// after the words before it, one a line; a last line ":files" or ":dirs" asks the shell for file
// or directory names instead. It walks the command definitions and never runs a command's Action
// (or Before, After): TAB must never launch a Bench or touch a store, whatever the line says.
const completeCommand = "__complete"

// legacyCompleteFlag is what the completion scripts of older shed versions (urfave/cli's) append to
// the line. shed answers it as __complete and runs nothing: such a script may still be installed.
const legacyCompleteFlag = "--generate-bash-completion"

// completionArgs says whether args (os.Args) ask for completion, and if so the words to complete:
// the words typed after "shed" and, last, the word being completed.
func completionArgs(args []string) ([]string, bool) {
	if len(args) >= 2 && args[1] == completeCommand {
		return args[2:], true
	}
	if n := len(args); n >= 2 && args[n-1] == legacyCompleteFlag {
		// urfave's scripts pass the word being completed only when it starts with "-".
		words := slices.Clone(args[1 : n-1])
		if k := len(words); k == 0 || !strings.HasPrefix(words[k-1], "-") {
			words = append(words, "")
		}
		return words, true
	}
	return nil, false
}

// complete prints the candidates for words (see completeCommand) on w. Nothing it does writes to a
// store or starts a process; only a command's name completer (a BENCH, a record's NAME) reads the
// store or asks the supervisor, within a second.
func complete(a *cli.App, words []string, w io.Writer) {
	if len(words) == 0 {
		words = []string{""}
	}
	cur := words[len(words)-1]
	before := words[:len(words)-1]

	var (
		cmds      = a.Commands
		flags     = slices.Clone(a.Flags)
		cmd       *cli.Command
		npos      int      // positional arguments after the command's name
		valueOf   cli.Flag // the flag whose value cur is
		afterDash bool     // cur is after "--": the Bench's command line, or file names
		helpOf    bool     // after "help": command names only
		global    []string // the global flags typed, for a completer that asks the store
	)
	globals := a.Flags
	for i := 0; i < len(before); i++ {
		word := before[i]
		if word == "--" {
			afterDash = true
			break
		}
		if len(word) > 1 && strings.HasPrefix(word, "-") && !helpOf {
			name, _, hasValue := strings.Cut(strings.TrimLeft(word, "-"), "=")
			isGlobal := findFlag(globals, name) != nil
			f := findFlag(flags, name)
			if f == nil {
				f = findFlag(globals, name)
			}
			if isGlobal {
				global = append(global, word)
			}
			if f != nil && takesValue(f) && !hasValue {
				if i+1 == len(before) {
					valueOf = f
				} else {
					if isGlobal {
						global = append(global, before[i+1])
					}
					i++
				}
			}
			continue
		}
		if npos == 0 && len(cmds) > 0 {
			if word == "help" || word == "h" {
				helpOf = true
				continue
			}
			sub := findCommand(cmds, word)
			if sub == nil {
				return // an unknown command: nothing is sure
			}
			cmd, cmds, flags = sub, sub.Subcommands, slices.Clone(sub.Flags)
			continue
		}
		npos++
	}

	var out []string
	directive := ""
	switch {
	case afterDash:
		directive = ":files"
	case valueOf != nil:
		directive = valueKind(valueOf, cur)
	case strings.HasPrefix(cur, "-") && !helpOf:
		if name, _, ok := strings.Cut(cur, "="); ok { // --file=ex
			f := findFlag(append(slices.Clone(flags), globals...), strings.TrimLeft(name, "-"))
			if f != nil && takesValue(f) {
				directive = valueKind(f, cur[len(name)+1:])
			}
			break
		}
		all := append(slices.Clone(flags), globals...)
		all = append(all, cli.HelpFlag)
		if cmd == nil {
			all = append(all, cli.VersionFlag)
		}
		seen := map[string]bool{}
		for _, f := range all {
			if hidden(f) {
				continue
			}
			for _, n := range f.Names() {
				s := "--" + n
				if len(n) == 1 {
					s = "-" + n
				}
				if !seen[s] && strings.HasPrefix(s, cur) {
					seen[s] = true
					out = append(out, s)
				}
			}
		}
	case npos == 0 && len(cmds) > 0:
		for _, c := range cmds {
			if !c.Hidden && strings.HasPrefix(c.Name, cur) {
				out = append(out, c.Name)
			}
		}
		if !helpOf && strings.HasPrefix("help", cur) {
			out = append(out, "help")
		}
	case helpOf:
	case cmd != nil && npos == 0 && cmd.BashComplete != nil:
		for _, n := range completeNamesOf(a, cmd, global) {
			if strings.HasPrefix(n, cur) {
				out = append(out, n)
			}
		}
	case cmd != nil:
		directive = argsKind(cmd.ArgsUsage, cur)
		if directive == "" {
			for _, word := range choices(cmd.ArgsUsage) {
				if strings.HasPrefix(word, cur) {
					out = append(out, word)
				}
			}
		}
	}
	for _, s := range out {
		fmt.Fprintln(w, s)
	}
	if directive != "" {
		fmt.Fprintln(w, directive)
	}
}

// completeNamesOf runs cmd's name completer (completeBenches, completeRecords) on a context of the
// global flags typed, and returns what it printed. Its errors go nowhere: TAB prints no error.
func completeNamesOf(a *cli.App, cmd *cli.Command, global []string) []string {
	var buf bytes.Buffer
	a.Writer, a.ErrWriter = &buf, io.Discard
	set := flag.NewFlagSet("shed", flag.ContinueOnError)
	set.SetOutput(io.Discard)
	for _, f := range a.Flags {
		if err := f.Apply(set); err != nil {
			return nil
		}
	}
	if set.Parse(global) != nil {
		return nil
	}
	c := cli.NewContext(a, set, nil)
	c.Command = cmd
	cmd.BashComplete(c)
	return strings.Fields(buf.String())
}

func findFlag(flags []cli.Flag, name string) cli.Flag {
	if name == "" {
		return nil
	}
	for _, f := range flags {
		if slices.Contains(f.Names(), name) {
			return f
		}
	}
	return nil
}

func findCommand(cmds []*cli.Command, name string) *cli.Command {
	for _, c := range cmds {
		if c.HasName(name) {
			return c
		}
	}
	return nil
}

// takesValue says whether f is followed by a value (a flag that is not a switch).
func takesValue(f cli.Flag) bool {
	if dg, ok := f.(cli.DocGenerationFlag); ok {
		return dg.TakesValue()
	}
	return false
}

func hidden(f cli.Flag) bool {
	if vf, ok := f.(cli.VisibleFlag); ok {
		return !vf.IsVisible()
	}
	return false
}

// placeholder is the `NAME` in a flag's usage: what its value is.
func placeholder(f cli.Flag) string {
	if dg, ok := f.(cli.DocGenerationFlag); ok {
		_, rest, ok := strings.Cut(dg.GetUsage(), "`")
		name, _, ok2 := strings.Cut(rest, "`")
		if ok && ok2 {
			return name
		}
	}
	return ""
}

// valueKind is how a flag's value is completed: file or directory names when it names one, else
// nothing (a name, a size: there is nothing to offer). A --grant's BENCHPATH (after a ':') is
// inside the Bench, not here.
func valueKind(f cli.Flag, cur string) string {
	p := placeholder(f)
	switch {
	case strings.Contains(cur, ":"):
		return ""
	case p == "DIR":
		return ":dirs"
	case strings.Contains(p, "FILE"), strings.Contains(p, "PATH"), strings.Contains(p, "DIR"):
		return ":files"
	}
	return ""
}

var fileArg = regexp.MustCompile(`\b(FILE|DIR|PATH|WORKSHOP|PROPOSAL)\b`)

// argsKind is how a command's arguments are completed: file names when its usage names a file, a
// directory or a store path.
func argsKind(usage, cur string) string {
	if strings.Contains(cur, ":") || !fileArg.MatchString(usage) {
		return ""
	}
	return ":files"
}

var choiceArg = regexp.MustCompile(`^[a-z]+(\|[a-z]+)+$`)

// choices are the words of an argument that is one of a few (bash|zsh|fish).
func choices(usage string) []string {
	if !choiceArg.MatchString(usage) {
		return nil
	}
	return strings.Split(usage, "|")
}
