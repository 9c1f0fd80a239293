package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/urfave/cli/v2"

	"toolshed.dev/shed/api"
	"toolshed.dev/shed/app"
	"toolshed.dev/shed/sandbox"
	"toolshed.dev/shed/store"
)

func cmdDaemon() *cli.Command {
	return &cli.Command{
		Name:  "daemon",
		Usage: "run the supervisor: it owns the store, the Workshop records and the key, and answers typed requests from local users by role",
		Description: "Listens on SOCKET (default /run/toolshed/shed.sock; its directory is root's, mode 0755,\n" +
			"the socket 0666). Every shed command then goes to it while the socket exists (SHED_SOCKET\n" +
			"names another; SHED_SOCKET=none, or --root, works on a store directly as root). Requests are\n" +
			"typed operations (docs/api.md), never command lines; callers are identified by the kernel\n" +
			"(SO_PEERCRED): root and members of --operators-group may do everything; other users may read\n" +
			"the records and realize and launch the Workshops a record allows them (`shed workshop allow\n" +
			"NAME USER`), without grants or substituters and within --user-memory and --user-pids, and\n" +
			"list, exec into, read the logs of, propose from and remove the Benches they launched. Agents\n" +
			"in Benches reach only their Bench's propose socket. See docs/supervisor.md for the systemd unit.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "socket", Value: api.DefaultSocket, Usage: "the socket's `PATH`"},
			&cli.StringFlag{Name: "operators-group", Value: "shed-ops", Usage: "`GROUP` whose members are operators"},
			&cli.StringFlag{Name: "user-memory", Value: "4G", Usage: "the most memory a user's Bench may have (and the limit of one that names none)"},
			&cli.Int64Flag{Name: "user-pids", Value: 4096, Usage: "the most processes a user's Bench may have (and the limit of one that names none)"},
			&cli.IntFlag{Name: "user-kept", Value: 4, Usage: "the most kept Benches (--keep) a user may have at once"},
			&cli.IntFlag{Name: "user-benches", Value: 8, Usage: "the most Benches (running, created or kept) a user may have at once"},
			&cli.IntFlag{Name: "warm", Value: 2, Usage: "`N` Bench inits kept started ahead for API creates (each holds one of the 512 id slots)"},
		},
		Action: func(c *cli.Context) error {
			if os.Geteuid() != 0 {
				return withHint(exitUsage, errors.New("the supervisor runs as root"), "start it with systemd (docs/supervisor.md) or sudo")
			}
			mem, err := parseSize(c.String("user-memory"))
			if err != nil {
				return usageError("--user-memory %q: %v", c.String("user-memory"), err)
			}
			svc := service(c)
			svc.UserLimits = sandbox.Limits{MemoryBytes: mem, Pids: c.Int64("user-pids")}
			svc.UserKept, svc.UserBenches = c.Int("user-kept"), c.Int("user-benches")
			// Benches made by bench.create live in this process, until removed, their lifetime ends
			// or the supervisor stops (they stop with it: their state is swept at the next start).
			svc.Detached = &app.Detached{Ctx: c.Context}
			defer svc.Detached.Wait()
			svc.Pool = app.NewPool(c.Context, c.Int("warm"))
			// The store must open now: a supervisor that cannot serve says so at start, not per request.
			st, err := store.Open(svc.Root)
			if err != nil {
				return err
			}
			st.Close()
			ln, err := api.Listen(c.String("socket"))
			if err != nil {
				return err
			}
			// The supervisor logs every request (who, what, the outcome) to stderr, for journald;
			// --verbose adds the debug lines.
			log := logger(c)
			if !c.Bool("verbose") {
				log = slog.New(slog.NewTextHandler(c.App.ErrWriter, &slog.HandlerOptions{Level: slog.LevelInfo}))
			}
			svc.Log = log
			log.Info("supervisor listening", "socket", c.String("socket"), "root", svc.Root)
			fmt.Fprintf(c.App.ErrWriter, "shed: supervisor on %s for the store at %s\n", c.String("socket"), svc.Root)
			srv := &api.Server{Service: svc, Operators: c.String("operators-group"), Log: log}
			return srv.Serve(c.Context, ln)
		},
	}
}
