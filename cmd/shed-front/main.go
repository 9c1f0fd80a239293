// Command shed-front is the `shed` users and scripts run (installed as shed; the whole CLI, cmd/shed,
// is shed-cli beside it or in ../libexec/shed/). A Go program runs the package initialization of
// everything it links before main, and the whole CLI links urfave/cli, app, the store, OCI, MCP,
// protobuf...: about 8 ms of every command. This one links the protocol's types (api/wire) and the
// standard library, and handles the commands scripts run in a loop, `bench run` and `bench exec`, when
// a supervisor takes them: it sends the request the whole CLI would send and prints what it would
// print. Any other command line, any flag or form it does not know, and any command on a store
// directly, it hands to shed-cli, unchanged (argv and environment), by exec, as git does its dashed
// commands: what it does not parse, it cannot parse differently. cmd/shed's TestFront runs both
// programs on a table of command lines against a fake supervisor and wants the same requests, output
// and exit codes.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"toolshed.dev/shed/api/wire"
	"toolshed.dev/shed/internal/nospace"
	"toolshed.dev/shed/internal/sibling"
)

// CLIName is the whole CLI's file name, looked for beside this program, then in ../libexec/shed/.
const CLIName = "shed-cli"

func main() {
	if cmd, ok := parse(os.Args); ok {
		if sock := socketPath(); sock != "" {
			os.Exit(run(cmd, sock))
		}
	}
	execCLI()
}

// execCLI replaces this process with the whole CLI, with the same argv and environment.
func execCLI() {
	p, err := sibling.Find(CLIName)
	if err == nil {
		err = unix.Exec(p, os.Args, os.Environ())
	}
	fmt.Fprintf(os.Stderr, "shed: error: the whole CLI: %v\nshed: hint: install shed again (`make install`): shed is a small program that runs %s for most commands\n", err, CLIName)
	os.Exit(exitFailure)
}

// Exit codes, as cmd/shed's (docs/cli.md).
const (
	exitFailure   = 1
	exitUsage     = 2
	exitInvalid   = 3
	exitProblems  = 4
	exitNoCommand = 127
)

// command is a command line this program handles: its operation and request, and what renders the
// result.
type command struct {
	op            string
	req           any
	json, verbose bool
	timeout       time.Duration // bench exec --timeout, for its message
}

// benchRunRequest and benchExecRequest are app.BenchRunRequest and app.BenchExecRequest as JSON
// (TestFront compares the bytes sent with the whole CLI's).
type benchRunRequest struct {
	Workshop     string   `json:"workshop,omitempty"`
	Argv         []string `json:"argv"`
	Grants       []string `json:"grants,omitempty"`
	Net          string   `json:"net,omitempty"`
	Offline      bool     `json:"offline,omitempty"`
	Keep         bool     `json:"keep,omitempty"`
	Name         string   `json:"name,omitempty"`
	TTY          bool     `json:"tty,omitempty"`
	Term         string   `json:"term,omitempty"`
	Substituters []string `json:"substituters,omitempty"`
	Verify       bool     `json:"verify,omitempty"`
	User         string   `json:"user,omitempty"`
	Metrics      bool     `json:"metrics,omitempty"`
}

type benchExecRequest struct {
	Bench    string   `json:"bench"`
	Argv     []string `json:"argv,omitempty"`
	Cwd      string   `json:"cwd,omitempty"`
	Env      []string `json:"env,omitempty"`
	TimeoutS int64    `json:"timeout_s,omitempty"`
	TTY      bool     `json:"tty,omitempty"`
	Term     string   `json:"term,omitempty"`
	User     string   `json:"user,omitempty"`
}

// ExitResult and ExecResult are app's, bench run's and bench exec's results: the fields the CLI
// renders.
type ExitResult struct {
	Exit        int    `json:"exit"`
	OOMKilled   bool   `json:"oom_killed,omitempty"`
	MemoryBytes int64  `json:"memory_bytes,omitempty"`
	NoSpace     string `json:"no_space,omitempty"`
}

type ExecResult struct {
	Exit        int    `json:"exit"`
	TimedOut    bool   `json:"timed_out,omitempty"`
	OOMKilled   bool   `json:"oom_killed,omitempty"`
	MemoryBytes int64  `json:"memory_bytes,omitempty"`
	NoSpace     string `json:"no_space,omitempty"`
}

// A flag's kind, as urfave/cli defines the whole CLI's.
const (
	boolFlag = iota
	stringFlag
	sliceFlag
)

// The flags of bench run and bench exec this program knows, by every name. --memory, --pids and
// anything else are the whole CLI's (their values need its parsing and its errors).
var runFlags = map[string]struct {
	name string
	kind int
}{
	"grant": {"grant", sliceFlag}, "net": {"net", stringFlag}, "offline": {"offline", boolFlag}, "keep": {"keep", boolFlag},
	"name": {"name", stringFlag}, "user": {"user", stringFlag}, "u": {"user", stringFlag}, "tty": {"tty", boolFlag}, "t": {"tty", boolFlag},
	"file": {"file", stringFlag}, "f": {"file", stringFlag}, "metrics": {"metrics", boolFlag}, "verify": {"verify", boolFlag},
	"substituter": {"substituter", sliceFlag},
}

var execFlags = map[string]struct {
	name string
	kind int
}{
	"tty": {"tty", boolFlag}, "t": {"tty", boolFlag}, "workdir": {"workdir", stringFlag}, "w": {"workdir", stringFlag},
	"user": {"user", stringFlag}, "u": {"user", stringFlag}, "env": {"env", sliceFlag}, "e": {"env", sliceFlag},
	"timeout": {"timeout", stringFlag},
}

// parse reads the command lines this program handles: `shed [--json] [--verbose] bench run|exec
// FLAGS [--] ARGS`, with the global flags anywhere before "--" (as the whole CLI hoists them). It
// says no to anything else, and to any form whose parse or error is the whole CLI's: an unknown
// flag, help, a flag given twice, a list flag's value with a comma (urfave/cli splits it), a missing
// command.
func parse(args []string) (*command, bool) {
	if n := len(args); n >= 2 && args[n-1] == "--generate-bash-completion" { // completion
		return nil, false
	}
	args = hoistGlobalFlags(args)
	cmd := &command{}
	i := 1
	for ; i < len(args); i++ {
		switch args[i] {
		case "--json", "-json":
			cmd.json = true
			continue
		case "--verbose", "-verbose":
			cmd.verbose = true
			continue
		}
		break
	}
	if i+1 >= len(args) || args[i] != "bench" {
		return nil, false
	}
	sub := args[i+1]
	spec := runFlags
	if sub == "exec" {
		spec = execFlags
	} else if sub != "run" {
		return nil, false
	}
	bools, strs, slices, rest, ok := parseFlags(spec, args[i+2:])
	if !ok {
		return nil, false
	}
	term := os.Getenv("TERM")
	if sub == "run" {
		if len(rest) == 0 {
			return nil, false
		}
		file, net := "workshop.toml", "recipe" // the flags' defaults (app.DefaultRecipe)
		if v, ok := strs["file"]; ok {
			file = v
		}
		if v, ok := strs["net"]; ok {
			net = v
		}
		cmd.op = "bench.run"
		cmd.req = &benchRunRequest{Workshop: file, Argv: rest, Grants: slices["grant"], Net: net, Offline: bools["offline"],
			Keep: bools["keep"], Name: strs["name"], TTY: bools["tty"], Term: term, Substituters: slices["substituter"],
			Verify: bools["verify"], User: strs["user"], Metrics: bools["metrics"]}
		return cmd, true
	}
	if len(rest) < 2 {
		return nil, false
	}
	argv := rest[1:]
	if argv[0] == "--" {
		argv = argv[1:]
	}
	if len(argv) == 0 {
		return nil, false
	}
	if s, ok := strs["timeout"]; ok {
		// As cmd/shed's durationFlag; whatever it refuses is its to say.
		s = strings.TrimSpace(s)
		if s != "" {
			d, err := time.ParseDuration(s)
			if err != nil || d < time.Second || d%time.Second != 0 {
				return nil, false
			}
			cmd.timeout = d
		}
	}
	cmd.op = "bench.exec"
	cmd.req = &benchExecRequest{Bench: rest[0], Argv: argv, TTY: bools["tty"], Term: term, Cwd: strs["workdir"], User: strs["user"],
		Env: slices["env"], TimeoutS: int64(cmd.timeout / time.Second)}
	return cmd, true
}

// parseFlags parses args as Go's flag package does for urfave/cli (-name, --name, -name=value, a
// string flag's value in the next argument, "--" ending the flags and dropped, the first argument
// that is not a flag ending them), and returns the rest; ok is false for anything it leaves to the
// whole CLI.
func parseFlags(spec map[string]struct {
	name string
	kind int
}, args []string) (bools map[string]bool, strs map[string]string, slices map[string][]string, rest []string, ok bool) {
	bools, strs, slices = map[string]bool{}, map[string]string{}, map[string][]string{}
	form := map[string]string{} // the name each flag was given by: urfave/cli refuses two of one flag's
	for len(args) > 0 {
		s := args[0]
		if len(s) < 2 || s[0] != '-' {
			break
		}
		name := s[1:]
		if s[1] == '-' {
			if len(s) == 2 {
				args = args[1:]
				break
			}
			name = s[2:]
		}
		args = args[1:]
		value, hasValue := "", false
		if k := strings.IndexByte(name, '='); k >= 0 {
			name, value, hasValue = name[:k], name[k+1:], true
		}
		f, known := spec[name]
		if !known || (form[f.name] != "" && form[f.name] != name) {
			return nil, nil, nil, nil, false
		}
		form[f.name] = name
		switch f.kind {
		case boolFlag:
			if hasValue {
				return nil, nil, nil, nil, false
			}
			bools[f.name] = true
		default:
			if !hasValue {
				if len(args) == 0 {
					return nil, nil, nil, nil, false
				}
				value, args = args[0], args[1:]
			}
			if f.kind == stringFlag {
				if _, twice := strs[f.name]; twice {
					return nil, nil, nil, nil, false
				}
				strs[f.name] = value
				break
			}
			// urfave/cli splits a list flag's value at commas, trims it, and reads a prefix of its own.
			if strings.Contains(value, ",") || strings.TrimSpace(value) != value || strings.HasPrefix(value, "slfl") {
				return nil, nil, nil, nil, false
			}
			slices[f.name] = append(slices[f.name], value)
		}
	}
	return bools, strs, slices, args, true
}

// hoistGlobalFlags is cmd/shed's: the global flags given after a command name move to the front,
// up to "--".
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

// socketPath is the supervisor's socket when the whole CLI would use it (cmd/shed's socketPath, with
// no --root: parse refuses it): SHED_SOCKET, else the default one, unless a user other than root has
// a store of their own, which the whole CLI then works on.
func socketPath() string {
	sock := os.Getenv(wire.SocketEnv)
	switch {
	case sock == "none":
		return ""
	case sock == "":
		if notRoot() && ownStore() {
			return ""
		}
		sock = wire.DefaultSocket
	}
	if fi, err := os.Stat(sock); err != nil || fi.Mode()&os.ModeSocket == 0 {
		return ""
	}
	return sock
}

// notRoot: this process is not root of the host (cmd/shed's notRoot).
func notRoot() bool { return os.Geteuid() != 0 || inUserNamespace() }

// ownStore says whether the store a user other than root works on directly is there (cmd/shed's
// envRoot and defaultRoot, store.Initialized): $SHED_ROOT, else the user's (store.UserRoot), else
// root's.
func ownStore() bool {
	root := os.Getenv("SHED_ROOT")
	if root == "" {
		root = "/var/lib/toolshed" // store.DefaultRoot
		if d := os.Getenv("XDG_DATA_HOME"); filepath.IsAbs(d) {
			root = filepath.Join(d, "toolshed")
		} else if home, err := os.UserHomeDir(); err == nil && filepath.IsAbs(home) {
			root = filepath.Join(home, ".local", "share", "toolshed")
		}
	}
	fi, err := os.Lstat(filepath.Join(root, "config.toml"))
	return err == nil && fi.Mode().IsRegular()
}

// inUserNamespace: this process is not in the initial user namespace (internal/userns's Active),
// whose map is one extent of every id to itself.
func inUserNamespace() bool {
	b, err := os.ReadFile("/proc/self/uid_map")
	return err == nil && strings.Join(strings.Fields(string(b)), " ") != "0 0 4294967295"
}

// cliError is an error as cmd/shed reports it: its text, hint, API code and exit code.
type cliError struct {
	msg, hint, code string
	exit            int
	silent          bool // a Bench command's own exit code: nothing to print
}

// run sends cmd to the supervisor at sock, prints what the whole CLI prints, and returns its exit code.
func run(cmd *command, sock string) int {
	interrupted, stop := interruptible()
	e := call(cmd, sock)
	stop()
	if sig := interrupted.Load(); sig != 0 && e != nil {
		// What failed did so because it was stopped (cmd/shed's run).
		e = &cliError{msg: fmt.Sprintf("interrupted (%s)", unix.SignalName(syscall.Signal(sig))),
			hint: "nothing half-made was kept (fetched files were): run the command again to go on", code: "interrupted", exit: 128 + int(sig)}
	}
	if e == nil {
		return 0
	}
	if e.silent {
		return e.exit
	}
	if cmd.json {
		b, _ := json.Marshal(struct {
			Error string `json:"error"`
			Hint  string `json:"hint,omitempty"`
			Code  string `json:"code"`
			Exit  int    `json:"exit"`
		}{e.msg, e.hint, e.code, e.exit})
		fmt.Fprintf(os.Stderr, "%s\n", b)
		return e.exit
	}
	fmt.Fprintf(os.Stderr, "shed: error: %s\n", e.msg)
	if e.hint != "" {
		fmt.Fprintf(os.Stderr, "shed: hint: %s\n", e.hint)
	}
	return e.exit
}

// interruptible is cmd/shed's: SIGINT, SIGTERM and SIGHUP (unless ignored) cancel ctx, and the
// returned value says which; a second one ends this process at once.
func interruptible() (*atomic.Int32, func()) {
	var got atomic.Int32
	var sigs []os.Signal
	for _, sig := range []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP} {
		if !signal.Ignored(sig) {
			sigs = append(sigs, sig)
		}
	}
	if len(sigs) == 0 {
		return &got, func() {}
	}
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, sigs...)
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
	return &got, func() {
		close(done)
		signal.Stop(ch)
	}
}

// ctx is the call's, cancelled by a signal: it stops the dial, and closing the connection cancels
// the operation.
var ctx, cancel = context.WithCancel(context.Background())

// errNoAnswer is api's ErrNoAnswer.
const errNoAnswer = "the supervisor ended the request without an answer"

// call is api.Client's Call and cmd/shed's rendering of the result.
func call(cmd *command, sock string) (e *cliError) {
	var err error
	var ran ExitResult
	var res ExecResult
	if cmd.op == "bench.exec" {
		err = send(cmd, sock, &res)
	} else if err = send(cmd, sock, &ran); err == nil {
		res = ExecResult{Exit: ran.Exit, OOMKilled: ran.OOMKilled, MemoryBytes: ran.MemoryBytes, NoSpace: ran.NoSpace}
	}
	if err != nil {
		if e, ok := err.(*cliError); ok {
			return e
		}
		if ctx.Err() != nil {
			return &cliError{msg: ctx.Err().Error(), code: "failed", exit: exitFailure}
		}
		direct := "set SHED_SOCKET=none to work on the store directly as root"
		if notRoot() {
			direct = "set SHED_SOCKET=none to work on a store of your own (`shed init` makes it, docs/rootless.md)"
		}
		return &cliError{msg: fmt.Sprintf("supervisor at %s: %v", sock, err), code: "failed", exit: exitFailure,
			hint: "is `shed daemon` running? (`systemctl status shed`); " + direct}
	}
	if res.TimedOut {
		fmt.Fprintf(os.Stderr, "shed: the command ran past --timeout %s and was killed\n", cmd.timeout)
	}
	if res.OOMKilled {
		at := "the host's memory: the Bench had no limit of its own"
		if res.MemoryBytes > 0 {
			at = nospace.FormatBytes(uint64(res.MemoryBytes))
		}
		fmt.Fprintf(os.Stderr, "shed: warning: out of memory: the kernel killed a process of the command at the Bench's memory limit (%s); exit %d\n"+
			"shed: hint: give the Bench more with --memory (512M, 4G)\n", at, res.Exit)
	}
	if res.NoSpace != "" {
		fmt.Fprintf(os.Stderr, "shed: warning: the command failed (exit %d) with its disk full: %s\n"+
			"shed: hint: free space there (`shed gc`, `shed bench rm` of kept Benches you are done with), or keep the Bench on a store of a larger filesystem (--root)\n", res.Exit, res.NoSpace)
	}
	if res.Exit != 0 {
		return &cliError{exit: res.Exit, silent: true}
	}
	return nil
}

// send is api.Client's Call: the request frame with this process's stdio, then the notices as they
// come and the result or error. An operation's error is a *cliError.
func send(cmd *command, sock string, res any) error {
	body, err := json.Marshal(cmd.req)
	if err != nil {
		return err
	}
	dir, _ := os.Getwd()
	frame, err := json.Marshal(wire.Request{Protocol: wire.Protocol, Op: cmd.op, Request: body, Dir: dir,
		Progress: !cmd.json || cmd.verbose, Verbose: cmd.verbose})
	if err != nil {
		return err
	}
	c, done, err := wire.Open(ctx, sock, frame, [3]int{0, 1, 2})
	if err != nil {
		return err
	}
	defer done()
	defer wire.RelayResizes(c, 0)()
	dec := json.NewDecoder(c)
	for {
		var m wire.Message
		if err := dec.Decode(&m); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("%s: %v", errNoAnswer, err)
		}
		switch {
		case m.Notice != nil:
			if m.Notice.Kind == "warning" {
				fmt.Fprintf(os.Stderr, "shed: warning: %s\n", m.Notice.Message)
			} else {
				fmt.Fprintf(os.Stderr, "shed: %s\n", m.Notice.Message)
			}
		case m.Error != nil:
			return &cliError{msg: m.Error.Message, hint: m.Error.Hint, code: m.Error.Code, exit: exitFor(m.Error.Code)}
		case m.Result != nil:
			err := json.Unmarshal(*m.Result, res)
			var te *json.UnmarshalTypeError
			if errors.As(err, &te) && te.Struct == "" && te.Field == "" {
				// The whole CLI names the type it decodes into, app's.
				return fmt.Errorf("json: cannot unmarshal %s into Go value of type app.%s", te.Value, te.Type.Name())
			}
			return err
		default:
			return fmt.Errorf("%s: an empty message", errNoAnswer)
		}
	}
}

// exitFor is cmd/shed's: the exit code of an API error code.
func exitFor(code string) int {
	switch code {
	case "usage", "denied", "bad_request", "unknown_operation":
		return exitUsage
	case "invalid":
		return exitInvalid
	case "problems":
		return exitProblems
	case "no_command":
		return exitNoCommand
	}
	return exitFailure
}

func (e *cliError) Error() string { return e.msg }
