package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"reflect"

	"github.com/urfave/cli/v2"

	"toolshed.dev/shed/api"
	"toolshed.dev/shed/app"
	"toolshed.dev/shed/audit"
	"toolshed.dev/shed/bench"
	"toolshed.dev/shed/builder"
	"toolshed.dev/shed/internal/userns"
	"toolshed.dev/shed/policy"
	"toolshed.dev/shed/records"
	"toolshed.dev/shed/store"
)

// call runs op with req and returns its result: through the supervisor when one listens on its
// socket, else in this process on the store (which only its owner, root, can open). Either way the
// request is the same typed value and the policy decides on it before it runs.
func call[Resp any](c *cli.Context, op string, req any) (*Resp, error) {
	return callWith[Resp](c.Context, c, nil, op, req)
}

// callWith is call with a context of its own and, through the supervisor, the descriptors to send
// (nil: this process's stdio).
func callWith[Resp any](ctx context.Context, c *cli.Context, stdio *[3]*os.File, op string, req any) (*Resp, error) {
	return callVia[Resp](ctx, c, stdio, "", op, req)
}

// callVia is callWith for an agent's face: via ("mcp") marks the requests (api.Request's Via).
func callVia[Resp any](ctx context.Context, c *cli.Context, stdio *[3]*os.File, via, op string, req any) (*Resp, error) {
	var resp Resp
	if err := callInto(ctx, c, stdio, via, op, req, &resp); err != nil {
		return nil, err
	}
	return &resp, nil
}

// callInto is callVia with the result decoded into resp, a pointer to op's result type: for a face
// (package mcp) that names the type itself.
func callInto(ctx context.Context, c *cli.Context, stdio *[3]*os.File, via, op string, req, resp any) error {
	if sock := supervisorSocket(c, op); sock != "" {
		cl := &api.Client{Socket: sock, Progress: progress(c), Verbose: c.Bool("verbose"), Notice: notice(c), Stdio: stdio, Via: via}
		err := cl.Call(ctx, op, req, resp)
		if err != nil {
			if _, ok := err.(*app.Error); !ok && ctx.Err() == nil {
				direct := "set SHED_SOCKET=none to work on the store directly as root"
				if notRoot() {
					direct = "set SHED_SOCKET=none to work on a store of your own (`shed init` makes it, docs/rootless.md)"
				}
				return withHint(exitFailure, fmt.Errorf("supervisor at %s: %w", sock, err), "is `shed daemon` running? (`systemctl status shed`); "+direct)
			}
			return err
		}
		return nil
	}
	svc, call := embedded(c)
	call.Caller.Via = via
	res, err := svc.Do(ctx, call, op, req)
	if call.IO.Status != nil {
		call.IO.Status.End() // whatever the operation left drawn is erased before its result prints
	}
	if err != nil {
		return elsewhere(c, err)
	}
	// The operation's result is the type resp points to: copied, as the socket's client decodes it.
	rv, got := reflect.ValueOf(resp), reflect.ValueOf(res)
	if !got.IsValid() || rv.Kind() != reflect.Pointer || got.Type() != rv.Type() || got.IsNil() {
		return &app.Error{Code: app.CodeInternal, Err: fmt.Errorf("operation %s returned a %T, not a %T (a bug in shed)", op, res, resp)}
	}
	rv.Elem().Set(got.Elem())
	return nil
}

// supervisorSocket returns the supervisor's socket if op's request goes through it (see socketPath).
func supervisorSocket(c *cli.Context, op string) string {
	return socketPath(c.IsSet("root"), op == "init")
}

// socketPath is the supervisor's socket if a command goes through it: the socket exists, and neither
// a --root on the command line nor SHED_SOCKET=none says to work on a store directly. A user other
// than root who names no supervisor (SHED_SOCKET unset) and has a store of their own works on it, as
// a rootless podman does, and `shed init` (init) makes that store: the supervisor's store is root's,
// where such a user may run records only. SHED_SOCKET=PATH reaches the supervisor at PATH whatever
// stores the user has.
func socketPath(rootSet, init bool) string {
	sock := os.Getenv(api.SocketEnv)
	if sock == "none" || rootSet {
		return ""
	}
	if sock == "" {
		if notRoot() && (init || store.Initialized(envRoot())) {
			return ""
		}
		sock = api.DefaultSocket
	}
	if fi, err := os.Stat(sock); err != nil || fi.Mode()&os.ModeSocket == 0 {
		return ""
	}
	return sock
}

// bypassed is the supervisor's socket when this process works on the user's own store beside it
// (socketPath): the default socket exists, and only the user's store made the command skip it.
func bypassed(c *cli.Context) string {
	if c.IsSet("root") || os.Getenv(api.SocketEnv) != "" || !notRoot() {
		return ""
	}
	if fi, err := os.Stat(api.DefaultSocket); err != nil || fi.Mode()&os.ModeSocket == 0 {
		return ""
	}
	return api.DefaultSocket
}

// elsewhere adds to a "not found" of a record, a Bench or a recipe file, when the user's own store
// was used instead of a supervisor, how to reach what the supervisor has: it may be there.
func elsewhere(c *cli.Context, err error) error {
	sock := bypassed(c)
	if sock == "" || !(errors.Is(err, records.ErrNoRecord) || errors.Is(err, bench.ErrNoBench) || errors.Is(err, fs.ErrNotExist)) {
		return err
	}
	ae := app.Classify(err)
	if ae.Code != app.CodeNotFound {
		return err
	}
	hint := fmt.Sprintf("this is your own store (%s); root's supervisor serves its records and Benches to `SHED_SOCKET=%s shed ...` (`SHED_SOCKET=%s shed workshop ls` lists the records)", storeRoot(c), sock, sock)
	if ae.Hint != "" {
		hint = ae.Hint + "; " + hint
	}
	return &app.Error{Code: ae.Code, Err: ae.Err, Hint: hint}
}

// notRoot: this process is not root of the host (an ordinary user, or root of a user namespace),
// whose default store is its own (defaultRoot).
func notRoot() bool { return userns.Active() || os.Geteuid() != 0 }

// storeRoot is the store this process works on directly: --root, else $SHED_ROOT, else the default.
func storeRoot(c *cli.Context) string {
	if c.IsSet("root") {
		return c.String("root")
	}
	return envRoot()
}

// envRoot is the store with no --root: $SHED_ROOT, else the default.
func envRoot() string {
	if r := os.Getenv("SHED_ROOT"); r != "" {
		return r
	}
	return defaultRoot()
}

// defaultRoot is root's store, /var/lib/toolshed, or for anyone else theirs (store.UserRoot).
func defaultRoot() string {
	if !userns.Active() && os.Geteuid() == 0 {
		return store.DefaultRoot
	}
	if r := store.UserRoot(); r != "" {
		return r
	}
	return store.DefaultRoot
}

// service is the application layer on the store this process opens itself.
func service(c *cli.Context) *app.Service {
	root := storeRoot(c)
	return &app.Service{Root: root, Version: version, Log: logger(c), Policy: policy.Check, Audit: audit.Open(root)}
}

// embedded is the service and the call for working on a store directly: whoever can open the store
// owns it, so this process's user is its operator.
func embedded(c *cli.Context) (*app.Service, *app.Call) {
	dir, _ := os.Getwd()
	// In a user namespace (shed without root) this process is its root: the caller is the user.
	uid, gid := userns.Owner()
	name := userns.OwnerName()
	in, _ := c.App.Reader.(*os.File)
	io := &app.IO{Stdin: in, Stdout: c.App.Writer, Stderr: c.App.ErrWriter, Notice: notice(c)}
	if progress(c) {
		tp := builder.NewTerminalProgress(c.App.ErrWriter, c.Bool("verbose"))
		io.Progress = tp
		if !c.Bool("verbose") { // the builds' own output instead
			io.Status = tp
		}
	}
	if c.Bool("verbose") {
		io.BuildOutput = c.App.ErrWriter
	}
	caller := &app.Caller{UID: uid, GID: gid, PID: int32(os.Getpid()), User: name, Role: app.Operator, Dir: dir}
	return service(c), &app.Call{Caller: caller, IO: io}
}

// progress: progress bars unless --json asks for quiet (--verbose brings them back).
func progress(c *cli.Context) bool { return !c.Bool("json") || c.Bool("verbose") }

// notice prints an operation's notices on stderr as they come.
func notice(c *cli.Context) func(app.Notice) {
	return func(n app.Notice) {
		if n.Kind == "warning" {
			fmt.Fprintf(c.App.ErrWriter, "shed: warning: %s\n", n.Message)
			return
		}
		fmt.Fprintf(c.App.ErrWriter, "shed: %s\n", n.Message)
	}
}
