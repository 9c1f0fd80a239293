package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
	"toolshed.dev/shed/proposal"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"
	"golang.org/x/term"

	"toolshed.dev/shed/bench"
	"toolshed.dev/shed/builder"
	"toolshed.dev/shed/sandbox"
	"toolshed.dev/shed/store"
	"toolshed.dev/shed/supervisor"
)

func cmdBench() *cli.Command {
	runFlags := []cli.Flag{
		&cli.StringSliceFlag{Name: "grant", Usage: "mount `HOSTPATH[:BENCHPATH][:ro|rw]`, within the recipe's [[grant]] bounds (repeatable)"},
		&cli.StringFlag{Name: "net", Value: "recipe", Usage: "network: `recipe` (the recipe's allowlist, through a proxy) or none (loopback only)"},
		&cli.BoolFlag{Name: "offline", Usage: "realize without touching the network (the Workshop must be in the store)"},
		&cli.BoolFlag{Name: "keep", Usage: "keep the Bench's upper layer after the command exits (`shed bench rm` deletes it)"},
		&cli.StringFlag{Name: "name", Usage: "the Bench's `NAME` (default: the Workshop's name and a random suffix)"},
		&cli.BoolFlag{Name: "tty", Aliases: []string{"t"}, Usage: "attach a pseudo-terminal"},
		&cli.StringFlag{Name: "file", Aliases: []string{"f"}, Value: defaultRecipe, Usage: "the Workshop's recipe `FILE`"},
		&cli.StringFlag{Name: "memory", Usage: "memory limit, e.g. 512M"},
		&cli.Int64Flag{Name: "pids", Usage: "limit on the number of processes"},
		substituterFlag,
	}
	return &cli.Command{
		Name:  "bench",
		Usage: "launch and manage Benches: disposable sandboxes of a Workshop",
		Description: "A Bench is an overlay of the Workshop's store layers (read-only) and an empty upper layer,\n" +
			"in fresh mount, pid, uts, ipc and network namespaces, as root of a user namespace of its own\n" +
			"(root over its files, nothing over the host's). Its writes are\n" +
			"thrown away when the command exits, unless --keep.",
		Subcommands: []*cli.Command{
			{
				Name:      "run",
				Usage:     "run a command in a new Bench of a Workshop",
				ArgsUsage: "[-f FILE] [OPTIONS] -- CMD [ARG...]",
				Description: "Realizes the Workshop (a cache hit when warm), launches a Bench and runs CMD with stdio\n" +
					"attached; shed exits with CMD's exit code. Grants are refused unless they lie within the\n" +
					"recipe's [[grant]] bounds (narrower paths, ro instead of rw). The network is the recipe's\n" +
					"allowlist through a proxy inside the Bench (http_proxy/https_proxy point at it); there is\n" +
					"no DNS, no route, no NAT.",
				Flags: runFlags,
				Action: func(c *cli.Context) error {
					if c.NArg() == 0 {
						return usageError("bench run wants a command: shed bench run [-f FILE] -- CMD [ARG...]")
					}
					return benchRun(c, c.Args().Slice())
				},
			},
			{
				Name:        "shell",
				Usage:       "open an interactive shell in a new Bench",
				Description: "bench run -t -- /bin/bash (or /bin/sh when the Workshop has no bash).",
				Flags:       runFlags,
				Action: func(c *cli.Context) error {
					return benchRun(c, nil)
				},
			},
			{
				Name:  "ls",
				Usage: "list running and kept Benches (through the supervisor, a user sees the ones they launched)",
				Action: func(c *cli.Context) error {
					s, err := openStore(c)
					if err != nil {
						return err
					}
					defer s.Close()
					all, err := bench.List(s)
					if err != nil {
						return err
					}
					recs := slices.DeleteFunc(all, func(r *bench.Record) bool { return !mayUse(c, r) })
					if c.Bool("json") {
						if recs == nil {
							recs = []*bench.Record{}
						}
						return printJSON(c, recs)
					}
					tw := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
					fmt.Fprintln(tw, "NAME\tSTATE\tSTARTED\tCOMMAND\tWORKSHOP")
					for _, r := range recs {
						state := "running"
						if !r.Running {
							state = "exited " + fmt.Sprint(deref(r.Exit))
						}
						fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.Name, state, r.Started.Local().Format(time.DateTime), strings.Join(r.Argv, " "), r.Workshop)
					}
					return tw.Flush()
				},
			},
			proposeCommand(),
			{
				Name:      "exec",
				Usage:     "run a command in a running Bench",
				ArgsUsage: "BENCH -- CMD [ARG...]",
				Flags:     []cli.Flag{&cli.BoolFlag{Name: "tty", Aliases: []string{"t"}, Usage: "attach a pseudo-terminal"}},
				Action: func(c *cli.Context) error {
					if c.NArg() < 2 {
						return usageError("bench exec wants BENCH and a command")
					}
					s, err := openStore(c)
					if err != nil {
						return err
					}
					defer s.Close()
					argv := c.Args().Slice()[1:]
					if argv[0] == "--" { // BENCH -- CMD: urfave/cli keeps a "--" after a positional
						argv = argv[1:]
					}
					if len(argv) == 0 {
						return usageError("bench exec wants a command after BENCH")
					}
					rec, err := ownBench(c, s, c.Args().First())
					if err != nil {
						return err
					}
					req := sandbox.ExecRequest{Argv: argv, Dir: "/root"}
					code, err := withStdio(c, c.Bool("tty"), func(stdio sandbox.Stdio, env []string) (int, error) {
						req.Env = env
						return bench.Exec(c.Context, s, rec.ID, req, stdio)
					})
					if err != nil {
						return err
					}
					return exitCode(code)
				},
			},
			{
				Name:      "logs",
				Usage:     "print a Bench's network log: every destination allowed or refused",
				ArgsUsage: "BENCH",
				Action: func(c *cli.Context) error {
					if c.NArg() != 1 {
						return usageError("bench logs wants BENCH")
					}
					s, err := openStore(c)
					if err != nil {
						return err
					}
					defer s.Close()
					rec, err := ownBench(c, s, c.Args().First())
					if err != nil {
						return err
					}
					return bench.Logs(s, rec.ID, c.App.Writer)
				},
			},
			{
				Name:      "rm",
				Usage:     "stop a running Bench or delete a kept one",
				ArgsUsage: "BENCH...",
				Action: func(c *cli.Context) error {
					if c.NArg() == 0 {
						return usageError("bench rm wants BENCH")
					}
					s, err := openStore(c)
					if err != nil {
						return err
					}
					defer s.Close()
					for _, b := range c.Args().Slice() {
						rec, err := ownBench(c, s, b)
						if err != nil {
							return err
						}
						if err := bench.Remove(s, rec.ID); err != nil {
							return err
						}
					}
					return nil
				},
			},
		},
	}
}

func deref(p *int) int {
	if p == nil {
		return -1
	}
	return *p
}

// exitCode makes shed exit with the Bench command's code, printing nothing.
func exitCode(code int) error {
	if code == 0 {
		return nil
	}
	return &exitError{code: code, err: errSilent}
}

var errSilent = errors.New("")

func benchRun(c *cli.Context, argv []string) error {
	tty := c.Bool("tty")
	if argv == nil { // shell
		tty = true
		argv = []string{"/bin/sh", "-c", "if [ -x /bin/bash ]; then exec /bin/bash -l; else exec /bin/sh -l; fi"}
	}
	var grants []bench.Grant
	for _, g := range c.StringSlice("grant") {
		gr, err := bench.ParseGrant(g)
		if err != nil {
			return withHint(exitUsage, err, "e.g. --grant /srv/project:/work:rw")
		}
		grants = append(grants, gr)
	}
	var limits sandbox.Limits
	if m := c.String("memory"); m != "" {
		n, err := parseSize(m)
		if err != nil {
			return usageError("--memory %q: %v", m, err)
		}
		limits.MemoryBytes = n
	}
	limits.Pids = c.Int64("pids")
	// Without a terminal, the Bench's init starts now and initializes while the Workshop is realized
	// (a cache hit takes about as long); with one, realizing may print progress before the terminal
	// is made raw, so init starts after.
	var pending *sandbox.Pending
	if !tty {
		var err error
		if pending, err = sandbox.Prestart(c.Context, cmdStdio(c)); err != nil {
			return err
		}
		defer pending.Close()
	}
	w, err := realizeWorkshop(c, c.String("file"), c.Bool("offline"))
	if err != nil {
		return err
	}
	defer w.s.Close()
	code, err := withStdio(c, tty, func(stdio sandbox.Stdio, env []string) (int, error) {
		return bench.Run(c.Context, w.s, w.r, w.plan.Layers, bench.Options{
			Name: c.String("name"), Owner: caller(c), Grants: grants, Net: c.String("net"), Keep: c.Bool("keep"),
			Argv: argv, Env: env, Limits: limits, Stdio: stdio, Init: pending,
			// The agent's one way to shed: a proposal, which a human then reads and confirms.
			Propose: func(ctx context.Context, id string) (string, error) {
				sv := proposal.New(w.s, &builder.Builder{Store: w.s, Log: logger(c)})
				p, diff, err := sv.Propose(ctx, id)
				if err != nil {
					return "", err
				}
				return proposal.Visible(diff) + fmt.Sprintf("shed: proposal %s: an operator promotes it with `shed workshop promote %s`\n", p.ID, p.ID), nil
			},
		})
	})
	if err != nil {
		switch {
		case errors.Is(err, bench.ErrGrantRoot):
			return withHint(exitUsage, err, "give the directory to the user the Bench works for (chown -R USER DIR), or grant it :ro")
		case errors.Is(err, bench.ErrGrantGroup):
			return withHint(exitUsage, err, "give the directory to a group of its owner's (chgrp GROUP DIR; `id OWNER` lists them), and to a user of this host")
		case errors.Is(err, bench.ErrGrantSymlink):
			return withHint(exitUsage, err, "grants follow no symlink: name the directory it points to, inside the recipe's [[grant]] bounds")
		case errors.Is(err, bench.ErrGrant):
			return withHint(exitUsage, err, "a launch may narrow the recipe's [[grant]] bounds (a sub-path, ro instead of rw), never widen them")
		}
		return err
	}
	return exitCode(code)
}

// cmdStdio is the command's stdio: this process's, or through the supervisor, the client's.
func cmdStdio(c *cli.Context) sandbox.Stdio {
	in, _ := c.App.Reader.(*os.File)
	if in == nil {
		in = os.Stdin
	}
	return sandbox.Stdio{Stdin: in, Stdout: c.App.Writer, Stderr: c.App.ErrWriter}
}

// withStdio runs fn with the process's stdio, or with a pseudo-terminal that
// the Bench allocates from its own /dev/pts: ours is put in raw mode and its
// window size followed, so that the terminal inside behaves as ours would.
func withStdio(c *cli.Context, tty bool, fn func(sandbox.Stdio, []string) (int, error)) (int, error) {
	stdio := cmdStdio(c)
	if !tty {
		return fn(stdio, nil)
	}
	in := stdio.Stdin.(*os.File)
	t := &sandbox.Terminal{}
	stdio.Terminal = t
	env := []string{"TERM=" + envOr("TERM", "xterm")}
	fd := int(in.Fd())
	if term.IsTerminal(fd) {
		if old, err := term.MakeRaw(fd); err == nil {
			defer term.Restore(fd, old)
		}
		size := func() sandbox.Winsize {
			ws, err := unix.IoctlGetWinsize(fd, unix.TIOCGWINSZ)
			if err != nil {
				return sandbox.Winsize{}
			}
			return sandbox.Winsize{Rows: ws.Row, Cols: ws.Col}
		}
		t.Size = size()
		// Resizes come as SIGWINCH, or, when the daemon runs this for a client, from the client.
		winch := make(chan os.Signal, 1)
		signal.Notify(winch, syscall.SIGWINCH)
		defer signal.Stop(winch)
		remote := supervisor.WindowChanges(c.Context)
		resize := make(chan sandbox.Winsize, 1)
		t.Resize = resize
		done := make(chan struct{})
		defer close(done)
		go func() {
			for {
				select {
				case <-winch:
				case <-remote:
				case <-done:
					return
				}
				// Only the latest size matters: replace one still pending.
				select {
				case <-resize:
				default:
				}
				resize <- size()
			}
		}()
	}
	return fn(stdio, env)
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// sweepBenches removes what dead Benches left; run by every command that
// opens the store, so that a SIGKILLed shed leaves nothing for long.
func sweepBenches(ctx context.Context, s *store.Store) {
	_ = ctx
	bench.Sweep(s)
}

// mayUse says whether the caller may act on the Bench rec: operators on every Bench, users on the ones
// they launched.
func mayUse(c *cli.Context, rec *bench.Record) bool {
	p := peer(c)
	return p == nil || p.Operator || rec.Owner == p.User
}

// ownBench finds the Bench nameOrID for a command that acts on it, if the caller may.
func ownBench(c *cli.Context, s *store.Store, nameOrID string) (*bench.Record, error) {
	rec, err := bench.Find(s, nameOrID)
	if err != nil {
		return nil, err
	}
	if !mayUse(c, rec) {
		return nil, withHint(exitUsage, fmt.Errorf("%w: bench %s was launched by another user", supervisor.ErrDenied, nameOrID),
			"`shed bench ls` lists your Benches; an operator may act on any")
	}
	return rec, nil
}
