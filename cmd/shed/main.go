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
	"syscall"

	"github.com/urfave/cli/v2"

	"toolshed.dev/shed/builder"
	"toolshed.dev/shed/cache"
	"toolshed.dev/shed/recipe"
	"toolshed.dev/shed/sandbox"
	"toolshed.dev/shed/store"
	"toolshed.dev/shed/supervisor"
	"toolshed.dev/shed/trust"
)

// Exit codes, documented in README.md and docs/cli.md.
const (
	exitOK       = 0
	exitFailure  = 1 // the operation failed
	exitUsage    = 2 // the command line was wrong
	exitInvalid  = 3 // a recipe (or other input file) is invalid
	exitProblems = 4 // verification found problems
)

// version is set by the linker (-X main.version=...) in release builds.
var version = "dev"

func main() {
	// A sandbox's init is this binary re-executed: it never returns from here.
	sandbox.Init()
	os.Exit(run(os.Args, os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	args = hoistGlobalFlags(args)
	// With a supervisor, it runs the command (and decides whether this user may); without one, or
	// with an explicit --root, shed works on the store itself.
	if sock := supervisorSocket(args); sock != "" {
		code, err := supervisor.Call(ctx, sock, args[1:])
		if err != nil {
			return report(stderr, withHint(exitFailure, fmt.Errorf("supervisor at %s: %w", sock, err),
				"is `shed daemon` running? (`systemctl status shed`); set SHED_SOCKET=none to work on the store directly as root"))
		}
		return code
	}
	return runApp(ctx, args, os.Stdin, stdout, stderr)
}

// runApp runs a command line (args[0] is the program name) with the given stdio.
func runApp(ctx context.Context, args []string, stdin *os.File, stdout, stderr io.Writer) int {
	app := newApp(stdout, stderr)
	app.Reader = stdin
	err := app.RunContext(ctx, args)
	if err == nil {
		return exitOK
	}
	return report(stderr, err)
}

// supervisorSocket returns the supervisor's socket if commands go through it: it exists, and neither
// --root nor SHED_SOCKET=none says to work on a store directly. `shed daemon` itself never does.
func supervisorSocket(args []string) string {
	sock := os.Getenv(supervisor.SocketEnv)
	if sock == "none" {
		return ""
	}
	if sock == "" {
		sock = supervisor.DefaultSocket
	}
	for _, a := range args[1:] {
		if a == "--root" || a == "-root" || strings.HasPrefix(a, "--root=") || strings.HasPrefix(a, "-root=") {
			return ""
		}
		if a == "daemon" || a == "--" {
			break
		}
	}
	if len(args) > 1 && args[1] == "daemon" {
		return ""
	}
	if fi, err := os.Stat(sock); err != nil || fi.Mode()&os.ModeSocket == 0 {
		return ""
	}
	return sock
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

// report prints err for people, "shed: error: ..." then "shed: hint: ...",
// and returns the exit code. Only the CLI formats errors; packages return them.
func report(w io.Writer, err error) int {
	code, hint := exitFailure, ""
	var ee *exitError
	if errors.As(err, &ee) {
		code, hint = ee.code, ee.hint
	}
	var re *recipe.Error
	if errors.As(err, &re) {
		code = exitInvalid
		if hint == "" {
			hint = re.Hint
		}
	}
	if hint == "" {
		hint = hintFor(err)
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

// hintFor suggests what to do about errors that come from packages, which
// know what went wrong but not which command the user typed.
func hintFor(err error) string {
	var be *builder.BuildError
	if errors.As(err, &be) {
		return "the build log says more: `shed log " + be.Path.String() + "` (" + be.Log + ")"
	}
	switch {
	case errors.Is(err, builder.ErrGone):
		return "the mirror (or index) no longer serves that pinned version: a store that has it still realizes; " +
			"otherwise pin a version it serves (`shed lock --update PKG`), or for Debian packages use a snapshot seed"
	case errors.Is(err, builder.ErrHashMismatch):
		return "the bytes served are not the ones the lock pinned: nothing was stored; check the mirror (or a proxy in between) and run again"
	case errors.Is(err, builder.ErrMissing), errors.Is(err, builder.ErrOffline):
		return "run once with network (without --offline), or import the paths from a cache"
	case errors.Is(err, builder.ErrNoPip):
		return "add python3 and python3-pip to [apt] packages: pip packages are installed by the Workshop's own pip"
	case errors.Is(err, builder.ErrPipResolve):
		return "check the names and pins against the index (its /simple/NAME/ page lists every file); shed installs wheels only: " +
			"a package that ships only an sdist must be built into a wheel (pip wheel NAME) and served from your index, or taken from Debian as python3-NAME"
	case errors.Is(err, builder.ErrResolve):
		return "check the package names and pins against the mirror (apt-cache policy NAME on a Debian machine)"
	case errors.Is(err, cache.ErrUnauthorized):
		return "set SHED_REGISTRY_USERNAME and SHED_REGISTRY_PASSWORD (or log in with a Docker credentials file: $DOCKER_CONFIG/config.json)"
	case errors.Is(err, trust.ErrNoKey):
		return "run `shed init`: it makes the store's signing key (the store was made before shed signed what it builds)"
	case errors.Is(err, trust.ErrUntrusted):
		return "trust the signer's public key if you mean to (`shed key trust NAME:BASE64`); without it the path is built here, or refused offline"
	case errors.Is(err, trust.ErrUnsigned), errors.Is(err, trust.ErrBadSignature), errors.Is(err, trust.ErrMismatch), errors.Is(err, trust.ErrReplay):
		return "nothing was registered; the cache served something the policy refuses (docs/trust.md): build locally, or check the cache"
	case errors.Is(err, store.ErrNotInitialized):
		return "run `shed init` first (as root), or point --root / SHED_ROOT at an initialized store"
	case errors.Is(err, store.ErrUnsafe):
		return "the store must be owned by you and writable by nobody else: check the owner and run `chmod go-w` on it"
	case errors.Is(err, os.ErrPermission):
		return "the store is root-only: run shed as root, or use --root with a directory you own"
	case errors.Is(err, store.ErrBadPath):
		return "a store path looks like /var/lib/toolshed/store/<32-char hash>-<name>; `shed store ls` lists them"
	case errors.Is(err, store.ErrNotExist):
		return "`shed store ls` lists the valid paths"
	case errors.Is(err, store.ErrRootNotExist):
		return "`shed root ls` lists the roots"
	case errors.Is(err, context.Canceled):
		return "interrupted: nothing half-written was kept; run the command again to finish"
	}
	return ""
}

func usageError(format string, a ...any) error {
	return withHint(exitUsage, fmt.Errorf(format, a...), "see `shed help` or docs/cli.md")
}

func newApp(stdout, stderr io.Writer) *cli.App {
	app := &cli.App{
		Name:    "shed",
		Usage:   "keep agent sandbox environments as recipes, cached in a content-addressed store",
		Version: version,
		Description: "shed compiles a Workshop recipe (workshop.toml) to derivations, builds their outputs into\n" +
			"the Tool Shed (a content-addressed store), and keeps the store valid across crashes and\n" +
			"concurrent use. The recipe is the only truth; the store is a cache.",
		Writer:               stdout,
		ErrWriter:            stderr,
		EnableBashCompletion: true,
		HideHelpCommand:      false,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "root", Value: store.DefaultRoot, EnvVars: []string{"SHED_ROOT"}, Usage: "store root `DIR`"},
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
			cmdDiff(),
			cmdStore(),
			cmdKey(),
			cmdWorkshop(),
			cmdDaemon(),
			cmdCopy(),
			cmdExport(),
			cmdImport(),
			cmdRoot(),
			cmdGC(),
			cmdCompletion(),
			cmdMan(),
		},
		// Usage errors (unknown flag, missing argument) exit 2 with a hint.
		OnUsageError: func(c *cli.Context, err error, isSub bool) error {
			return withHint(exitUsage, err, "see `shed "+c.Command.FullName()+" --help`")
		},
		CommandNotFound: func(c *cli.Context, name string) {
			fmt.Fprintf(stderr, "shed: error: unknown command %q\nshed: hint: `shed help` lists the commands\n", name)
			os.Exit(exitUsage)
		},
		ExitErrHandler: func(*cli.Context, error) {}, // run() reports errors
	}
	// urfave/cli asks each command, not the app, about its own flags.
	var setUsage func([]*cli.Command)
	setUsage = func(cmds []*cli.Command) {
		for _, c := range cmds {
			c.OnUsageError = app.OnUsageError
			setUsage(c.Subcommands)
		}
	}
	setUsage(app.Commands)
	return app
}

// logger returns the logger the --verbose flag asks for: silent by default.
func logger(c *cli.Context) *slog.Logger {
	if !c.Bool("verbose") {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(c.App.ErrWriter, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// openStore opens the store named by --root.
func openStore(c *cli.Context) (*store.Store, error) {
	s, err := store.Open(c.String("root"))
	if err != nil {
		return nil, err
	}
	logger(c).Debug("opened store", "root", s.Root())
	// Every path this process registers is signed with the store's key. A store made before shed
	// signed its paths still opens, for reading; registering then fails with what to do.
	if t, err := trust.Open(s, version); err == nil {
		s.SetAttestor(t.Attest)
	} else {
		s.SetAttestor(func(*store.PathInfo, any) ([]byte, error) { return nil, err })
	}
	sweepBenches(c.Context, s)
	return s, nil
}

// openTrust returns the trust of an open store: its key and its policy.
func openTrust(s *store.Store) (*trust.Store, error) {
	return trust.Open(s, version)
}

// printJSON writes v as indented JSON.
func printJSON(c *cli.Context, v any) error {
	enc := json.NewEncoder(c.App.Writer)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// parsePathArg accepts a store path as a base name or as a file name under
// the store directory, and checks it is under this store when given in full.
func parsePathArg(s *store.Store, arg string) (store.Path, error) {
	p, err := store.ParsePath(arg)
	if err != nil {
		return store.Path{}, err
	}
	if arg != p.String() && arg != s.Location(p) {
		return store.Path{}, withHint(exitUsage, fmt.Errorf("%s is not in the store at %s", arg, s.Root()), "pass a path under "+s.Location(p)[:len(s.Location(p))-len(p.String())]+" or its base name")
	}
	return p, nil
}
