// Command shed keeps AI-agent sandbox environments as readable recipes and
// caches everything derived from them in a content-addressed store.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"toolshed.dev/shed/api"
	"toolshed.dev/shed/app"
	"toolshed.dev/shed/internal/sibling"
	"toolshed.dev/shed/internal/userns"
	"toolshed.dev/shed/sandbox"
	"toolshed.dev/shed/store"
)

// Exit codes, documented in README.md and docs/cli.md.
const (
	exitOK       = 0
	exitFailure  = 1 // the operation failed
	exitUsage    = 2 // the command line was wrong
	exitInvalid  = 3 // a recipe (or other input file) is invalid
	exitProblems = 4 // verification found problems

	exitNoCommand = 127 // the command to run in a Bench is not there (as a shell says it)
)

// version is set by the linker (-X main.version=...) in release builds.
var version = "dev"

func main() {
	// A sandbox's init is this binary re-executed: it never returns from here.
	sandbox.Init()
	// shed re-executed by userns.Enter waits here to be root of its user namespace.
	userns.Init()
	// The lean build runs shed-serve for the servers (serve_lean.go) before anything else, so that
	// shed-serve enters a user namespace itself when it needs one: the process userns.Enter relays
	// signals to must be the one that serves, not one that execs it.
	if served(os.Args) {
		os.Exit(execServe(os.Args))
	}
	if userns.Needed() && worksOnStore(os.Args) {
		os.Exit(enterUserns(os.Args))
	}
	os.Exit(run(os.Args, os.Stdout, os.Stderr))
}

// worksOnStore says whether the command line may work on a store directly (not through the
// supervisor), which a user other than root does in a user namespace of its own. Help, completion,
// man pages, recipe checks and the daemon (root's) do not; a call the supervisor takes does not.
func worksOnStore(args []string) bool {
	if _, ok := completionArgs(args); ok {
		return false
	}
	args = helpArgs(newApp(io.Discard, io.Discard), hoistGlobalFlags(args)) // `shed bench help run` is help too
	rootSet := false
	for i := 1; i < len(args); i++ {
		switch a := args[i]; {
		case a == "--root" || a == "-root":
			rootSet = true
			i++
		case strings.HasPrefix(a, "--root=") || strings.HasPrefix(a, "-root="):
			rootSet = true
		case strings.HasPrefix(a, "-"):
		default:
			switch a {
			case "help", "h", "completion", "man", "daemon", "recipe":
				return false
			}
			for _, b := range args[i:] {
				if b == "--" {
					break // what follows is a Bench's command: its -h is its own
				}
				if b == "--help" || b == "-h" {
					return false
				}
			}
			return socketPath(rootSet, a == "init") == ""
		}
	}
	return false // shed alone, or only flags: help or --version
}

// served says whether this is the lean build and args name a command whose action is serve.go's
// (daemon, mcp, snapshotter, k8s).
func served(args []string) bool { return lean && servedCommands[commandWord(args)] }

// commandWord is the command args name: their first word that is not a global flag, or "".
func commandWord(args []string) string {
	args = hoistGlobalFlags(args)
	for i := 1; i < len(args); i++ {
		switch a := args[i]; {
		case a == "--root" || a == "-root":
			i++
		case strings.HasPrefix(a, "-"):
		default:
			return a
		}
	}
	return ""
}

// servedCommands are the commands whose actions are serve.go's.
var servedCommands = map[string]bool{"daemon": true, "mcp": true, "snapshotter": true, "k8s": true}

// ServeName is the file name of the CLI built whole, with the servers.
const ServeName = "shed-serve"

// execServe replaces this process with shed-serve beside it, with the same argv and environment; it
// returns only when that cannot be done, with the exit code of the error it reports.
func execServe(args []string) int {
	p, err := sibling.Find(ServeName)
	if err == nil {
		err = unix.Exec(p, args, os.Environ())
	}
	err = withHint(exitFailure, fmt.Errorf("this command runs in %s: %w", ServeName, err),
		"install shed again (`make install`): shed-cli runs shed-serve for the servers (daemon, mcp, snapshotter) and k8s")
	if wantsJSON(hoistGlobalFlags(args)) {
		return reportJSON(os.Stderr, err)
	}
	return report(os.Stderr, err)
}

// enterUserns runs this command line again as root of a user namespace of its own, and exits with
// it; it returns only when that cannot be done, with the exit code of the error it reports.
func enterUserns(args []string) int {
	err := userns.Enter()
	uid, _ := userns.Owner()
	name := userns.OwnerName()
	var se *userns.SubIDError
	switch {
	case errors.As(err, &se):
		lo := userns.FreeRange()
		other := "or ask an operator for the supervisor (`shed daemon`, docs/supervisor.md)"
		if fi, err := os.Stat(api.DefaultSocket); err == nil && fi.Mode()&os.ModeSocket != 0 {
			// One runs here: the user may run its records without subordinate ids.
			other = fmt.Sprintf("or use the supervisor's Workshop records (`SHED_SOCKET=%s shed workshop ls` lists them)", api.DefaultSocket)
		}
		err = withHint(exitFailure, err, fmt.Sprintf("as root, give %s a range of 65536 ids that no other user has: `usermod --add-subuids %d-%d --add-subgids %d-%d %s` (or add the line %s:%d:65536 to /etc/subuid and /etc/subgid); %s",
			name, lo, lo+65535, lo, lo+65535, name, name, lo, other))
	case errors.Is(err, userns.ErrNoHelper):
		err = withHint(exitFailure, err, "as root: `apt-get install uidmap` (shed without root maps its ids with newuidmap and newgidmap)")
	default:
		err = withHint(exitFailure, err, fmt.Sprintf("shed without root runs in a user namespace (uid %d, with its subordinate ids): see docs/rootless.md", uid))
	}
	if wantsJSON(hoistGlobalFlags(args)) {
		return reportJSON(os.Stderr, err)
	}
	return report(os.Stderr, err)
}

func run(args []string, stdout, stderr io.Writer) int {
	if words, ok := completionArgs(args); ok { // before anything can run: TAB runs nothing
		complete(newApp(stdout, io.Discard), words, stdout)
		return exitOK
	}
	ctx, interrupted, stop := interruptible()
	defer stop()
	app := newApp(stdout, stderr)
	app.Reader = os.Stdin
	unknownCommand = false
	hoisted := helpArgs(app, hoistGlobalFlags(args))
	err := app.RunContext(ctx, hoisted)
	if unknownCommand {
		return exitUsage
	}
	if sig := interrupted(); sig != 0 && err != nil {
		// What failed did so because it was stopped: say that, not what the stopped step said
		// (a build's "exited 137"), and exit as a shell does for the signal.
		err = withHint(128+int(sig), fmt.Errorf("interrupted (%s)", unix.SignalName(sig)),
			"nothing half-made was kept (fetched files were): run the command again to go on")
	}
	if err == nil {
		return exitOK
	}
	if wantsJSON(hoisted) {
		return reportJSON(stderr, err)
	}
	return report(stderr, err)
}

// interruptible is a context that SIGINT, SIGTERM and SIGHUP cancel, and a func that says which of
// them did (0: none). A second signal is not caught: it ends shed at once, as users expect of a
// second ^C.
func interruptible() (context.Context, func() syscall.Signal, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan os.Signal, 1)
	// A signal shed was started with ignored stays ignored (nohup, a script's background job): to
	// catch it would undo what the caller asked for.
	var sigs []os.Signal
	for _, sig := range []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP} {
		if !signal.Ignored(sig) {
			sigs = append(sigs, sig)
		}
	}
	if len(sigs) == 0 {
		// (Notify and Reset with no signals would mean every signal.)
		return ctx, func() syscall.Signal { return 0 }, cancel
	}
	signal.Notify(ch, sigs...)
	var got atomic.Int32
	done := make(chan struct{})
	go func() {
		select {
		case s := <-ch:
			got.Store(int32(s.(syscall.Signal)))
			signal.Reset(sigs...)
			cancel()
		case <-done:
		}
	}()
	return ctx, func() syscall.Signal { return syscall.Signal(got.Load()) }, func() {
		close(done)
		signal.Stop(ch)
		cancel()
	}
}

// wantsJSON says whether the global flags (hoisted to the front) ask for JSON.
func wantsJSON(args []string) bool {
	for i := 1; i < len(args); i++ {
		switch a := args[i]; {
		case a == "--json" || a == "-json" || a == "--json=true":
			return true
		case a == "--root" || a == "-root":
			i++ // its value
		case !strings.HasPrefix(a, "-"), a == "--":
			return false
		}
	}
	return false
}

// errorJSON is an error as `--json` prints it, on stderr: scripts read the code, people the rest.
type errorJSON struct {
	Error string `json:"error"`
	Hint  string `json:"hint,omitempty"`
	Code  string `json:"code"` // the API's error code (docs/api.md): failed, usage, invalid, problems, denied, not_found, ...
	Exit  int    `json:"exit"` // the exit code shed ends with
}

// reportJSON prints err as one JSON object and returns the exit code, as report does.
func reportJSON(w io.Writer, err error) int {
	var buf strings.Builder
	code := report(&buf, err)
	if errors.Is(err, errSilent) {
		return code
	}
	e := errorJSON{Error: err.Error(), Exit: code, Code: string(codeOf(err, code))}
	var ee *exitError
	if errors.As(err, &ee) {
		e.Hint = ee.hint
	} else {
		e.Hint = app.Classify(err).Hint
	}
	b, _ := json.Marshal(e)
	fmt.Fprintf(w, "%s\n", b)
	return code
}

// codeOf is err's API code; a CLI error (exitError) has the code its exit code means.
func codeOf(err error, exit int) app.Code {
	var ee *exitError
	if !errors.As(err, &ee) {
		return app.Classify(err).Code
	}
	switch {
	case exit > 128:
		return "interrupted"
	case exit == exitUsage:
		return app.CodeUsage
	case exit == exitInvalid:
		return app.CodeInvalid
	case exit == exitProblems:
		return app.CodeProblems
	}
	return app.CodeFailed
}

// hoistGlobalFlags moves the global flags (--json, --verbose, --root) given
// after a command name to the front, so that `shed realize --json` works as
// users expect; urfave/cli v2 only reads global flags before the command.
// Everything after "--" is left alone.
func hoistGlobalFlags(args []string) []string {
	if len(args) < 2 {
		return args
	}
	var global, rest []string
	for i := 1; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			rest = append(rest, args[i:]...)
			i = len(args)
		case a == "--json" || a == "-json" || a == "--verbose" || a == "-verbose" || strings.HasPrefix(a, "--root=") || strings.HasPrefix(a, "-root="):
			global = append(global, a)
		case (a == "--root" || a == "-root") && i+1 < len(args):
			global = append(global, a, args[i+1])
			i++
		default:
			rest = append(rest, a)
		}
	}
	return append(append([]string{args[0]}, global...), rest...)
}

// exitError carries an exit code and an optional hint through urfave/cli.
type exitError struct {
	code int
	err  error
	hint string
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func withHint(code int, err error, hint string) error { return &exitError{code, err, hint} }

// report prints err for people, "shed: error: ..." then "shed: hint: ...", and returns the exit
// code. Only the CLI formats errors; the application layer returns them with a code and a hint.
func report(w io.Writer, err error) int {
	code, hint := exitFailure, ""
	var ee *exitError
	var ae *app.Error
	switch {
	case errors.As(err, &ee):
		code, hint = ee.code, ee.hint
	case errors.As(err, &ae):
		ae = app.Classify(err)
		code, hint = exitFor(ae.Code), ae.Hint
	default:
		ae = app.Classify(err)
		code, hint = exitFor(ae.Code), ae.Hint
	}
	if errors.Is(err, errSilent) {
		return code // a Bench command's own exit code: it said what it had to
	}
	fmt.Fprintf(w, "shed: error: %v\n", err)
	if hint != "" {
		fmt.Fprintf(w, "shed: hint: %s\n", hint)
	}
	return code
}

// exitFor is the exit code of an error code (docs/cli.md).
func exitFor(c app.Code) int {
	switch c {
	case app.CodeUsage, app.CodeDenied, app.CodeBadRequest, app.CodeUnknownOperation:
		return exitUsage
	case app.CodeInvalid:
		return exitInvalid
	case app.CodeProblems:
		return exitProblems
	case app.CodeNoCommand:
		return exitNoCommand
	}
	return exitFailure
}

func usageError(format string, a ...any) error {
	return withHint(exitUsage, fmt.Errorf(format, a...), "see `shed help` or docs/cli.md")
}

func newApp(stdout, stderr io.Writer) *cli.App {
	app := &cli.App{
		Name:    "shed",
		Usage:   "keep agent sandbox environments as recipes, cached in a content-addressed store",
		Version: buildVersion(),
		Description: "shed compiles a Workshop recipe (workshop.toml) to derivations, builds their outputs into\n" +
			"the Tool Shed (a content-addressed store), and keeps the store valid across crashes and\n" +
			"concurrent use. The recipe is the only truth; the store is a cache.",
		Writer:               stdout,
		ErrWriter:            stderr,
		EnableBashCompletion: false, // shed __complete (complete.go): urfave's runs the Action after "--"
		HideHelpCommand:      false,
		Flags: []cli.Flag{
			// Not an EnvVars flag: only a --root on the command line says to work on a store directly
			// (see socketPath), SHED_ROOT names the store when there is no supervisor, or when a user's
			// other than root holds one.
			&cli.StringFlag{Name: "root", Value: store.DefaultRoot, Usage: "work on the store at `DIR` directly, not through the supervisor (default: $SHED_ROOT, else /var/lib/toolshed as root, ~/.local/share/toolshed for anyone else)"},
			&cli.BoolFlag{Name: "json", Usage: "print results as JSON (for scripts and CI)"},
			&cli.BoolFlag{Name: "verbose", Usage: "log what shed does to stderr"},
		},
		Commands: []*cli.Command{
			cmdInit(),
			cmdRecipe(),
			cmdInstantiate(),
			cmdLock(),
			cmdRealize(),
			cmdLog(),
			cmdWhy(),
			cmdBench(),
			cmdSnapshot(),
			cmdDiff(),
			cmdStore(),
			cmdKey(),
			cmdWorkshop(),
			cmdDaemon(),
			cmdSnapshotter(),
			cmdK8s(),
			cmdMCP(),
			cmdAudit(),
			cmdAgent(),
			cmdSecret(),
			cmdCopy(),
			cmdExport(),
			cmdImport(),
			cmdRoot(),
			cmdGC(),
			cmdCompletion(),
			cmdMan(),
		},
		// Usage errors (unknown flag, missing argument) exit 2 with a hint.
		OnUsageError: onUsageError,
		CommandNotFound: func(c *cli.Context, name string) {
			err := unknownCommandError(c, name)
			if c.Bool("json") {
				reportJSON(stderr, err)
			} else {
				report(stderr, err)
			}
			unknownCommand = true
		},
		ExitErrHandler: func(*cli.Context, error) {}, // run() reports errors
	}
	// urfave/cli asks each command, not the app, about its own flags.
	setupUsage(app)
	return app
}

// unknownCommand is set by CommandNotFound, which urfave/cli gives no way to return an error from.
var unknownCommand bool

// logger returns the logger the --verbose flag asks for: silent by default.
func logger(c *cli.Context) *slog.Logger {
	if !c.Bool("verbose") {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(c.App.ErrWriter, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// printJSON writes v as indented JSON.
func printJSON(c *cli.Context, v any) error {
	enc := json.NewEncoder(c.App.Writer)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
