package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"toolshed.dev/shed/records"

	"github.com/urfave/cli/v2"

	"toolshed.dev/shed/supervisor"
)

func cmdDaemon() *cli.Command {
	return &cli.Command{
		Name:  "daemon",
		Usage: "run the supervisor: it owns the store, the Workshop records and the key, and runs commands for local users by role",
		Description: "Listens on SOCKET (default /run/toolshed/shed.sock; its directory is root's, mode 0755,\n" +
			"the socket 0666). Every shed command then goes to it while the socket exists (SHED_SOCKET\n" +
			"names another; SHED_SOCKET=none, or --root, works on a store directly as root). Callers are\n" +
			"identified by the kernel (SO_PEERCRED): root and members of --operators-group may do\n" +
			"everything; other users may read the records and realize and launch the Workshops a record\n" +
			"allows them (`shed workshop allow NAME USER`), without --grant or --substituter, and list,\n" +
			"exec into, read the logs of, propose from and remove the Benches they launched. Agents in\n" +
			"Benches reach only their Bench's propose socket. See docs/supervisor.md for the systemd unit.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "socket", Value: supervisor.DefaultSocket, Usage: "the socket's `PATH`"},
			&cli.StringFlag{Name: "operators-group", Value: "shed-ops", Usage: "`GROUP` whose members are operators"},
		},
		Action: func(c *cli.Context) error {
			if os.Geteuid() != 0 {
				return withHint(exitUsage, errors.New("the supervisor runs as root"), "start it with systemd (docs/supervisor.md) or sudo")
			}
			s, err := openStore(c)
			if err != nil {
				return err
			}
			root := s.Root()
			rs := records.Open(root)
			s.Close()
			ln, err := supervisor.Listen(c.String("socket"))
			if err != nil {
				return err
			}
			logger(c).Info("supervisor listening", "socket", c.String("socket"), "root", root)
			fmt.Fprintf(c.App.ErrWriter, "shed: supervisor on %s for the store at %s\n", c.String("socket"), root)
			return supervisor.Serve(c.Context, ln, c.String("operators-group"), func(ctx context.Context, p *supervisor.Peer, args []string, stdio [3]*os.File) int {
				logger(c).Info("request", "user", p.User, "uid", p.UID, "pid", p.PID, "operator", p.Operator, "args", strings.Join(args, " "))
				if slices.ContainsFunc(args, func(a string) bool { return a == "--root" || strings.HasPrefix(a, "--root=") }) {
					return report(stdio[2], withHint(exitUsage, errors.New("--root: the supervisor owns its store"), "leave --root out"))
				}
				if err := supervisor.Authorize(rs, p, args); err != nil {
					return report(stdio[2], withHint(exitUsage, err, "`shed workshop ls` lists the records you may use; an operator decides the rest"))
				}
				ctx = context.WithValue(ctx, callerKey{}, p)
				return runApp(ctx, append([]string{"shed", "--root", root}, args...), stdio[0], stdio[1], stdio[2])
			})
		},
	}
}
