package main

import (
	"github.com/urfave/cli/v2"

	"toolshed.dev/shed/api"
	"toolshed.dev/shed/app"
)

// maxWarm bounds the inits kept ready: each holds a sandbox id slot that builds and Benches need.
const maxWarm = 64

func cmdDaemon() *cli.Command {
	return &cli.Command{
		Name:  "daemon",
		Usage: "run the supervisor: it owns the store, the Workshop records and the key, and answers typed requests from local users by role",
		Description: "Listens on SOCKET (default /run/toolshed/shed.sock; its directory is root's, mode 0755,\n" +
			"the socket 0666). Every shed command then goes to it while the socket exists (SHED_SOCKET\n" +
			"names another; SHED_SOCKET=none, or --root, works on a store directly), except a user's\n" +
			"other than root with a store of their own (shed init makes it, docs/rootless.md): theirs work\n" +
			"on it unless SHED_SOCKET names the socket. Requests are typed operations (docs/api.md),\n" +
			"never command lines; callers are identified by the kernel\n" +
			"(SO_PEERCRED): root and members of --operators-group may do everything; other users may read\n" +
			"the records and realize and launch the Workshops a record allows them (`shed workshop allow\n" +
			"NAME USER`), without grants or substituters and within --user-memory and --user-pids, and\n" +
			"list, exec into, read the logs of, propose from and remove the Benches they launched. Agents\n" +
			"in Benches reach only their Bench's propose socket. See docs/supervisor.md for the systemd unit.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "socket", Value: api.DefaultSocket, Usage: "the socket's `PATH`"},
			&cli.StringFlag{Name: "operators-group", Value: "shed-ops", Usage: "`GROUP` whose members are operators"},
			&cli.StringFlag{Name: "user-memory", Value: "4G", Usage: "the most memory `SIZE` a user's Bench may have (and the limit of one that names none; at least 16M, 0: no bound)"},
			&cli.StringFlag{Name: "user-pids", Value: "4096", Usage: "the most processes, `N`, a user's Bench may have (and the limit of one that names none; at least 2, 0: no bound)"},
			&cli.StringFlag{Name: "user-kept", Value: "4", Usage: "the most kept Benches, `N` (--keep), a user may have at once (0: no bound)"},
			&cli.StringFlag{Name: "user-benches", Value: "8", Usage: "the most Benches, `N` (running, created or kept), a user may have at once (0: no bound)"},
			&cli.StringFlag{Name: "user-snapshots", Value: "16", Usage: "the most snapshots, `N`, a user may have at once (0: no bound)"},
			&cli.StringFlag{Name: "user-disk", Value: "4G", Usage: "the most disk `SIZE` a user's created Benches, forks and snapshots may hold together on the uppers (the kernel stops their writes there; 0: no bound)"},
			&cli.DurationFlag{Name: "task-state-ttl", Value: app.DefaultTaskStateTTL, Usage: "how long a paused Bench and a snapshot live (`DURATION`, e.g. 24h)"},
			&cli.StringFlag{Name: "warm", Value: "2", Usage: "`N` Bench inits kept started ahead for API creates (each holds one of the 512 id slots; at most 64 with --warm-workshop's)"},
			&cli.StringSliceFlag{Name: "warm-workshop", Usage: "`NAME=N`: N more inits kept ready for creates of the Workshop record NAME only (repeatable)"},
			&cli.StringFlag{Name: "e2b", Usage: "also serve the E2B API (control and data plane, and the sandboxes' ports at PORT-ID.DOMAIN) on `ADDR` (host:port; docs/agents.md): plain HTTP unless --e2b-tls-cert, so keep it on loopback or behind TLS"},
			&cli.StringFlag{Name: "e2b-domain", Usage: "the sandboxes' `DOMAIN` the E2B API answers (the SDK's getHost(port) is PORT-ID.DOMAIN, sent to --e2b's address; default localhost:PORT of --e2b, whose names are loopback)"},
			&cli.StringFlag{Name: "e2b-tls-cert", Usage: "serve --e2b over TLS with the certificate chain in `FILE` (PEM; for *.DOMAIN too, to reach the ports by https://PORT-ID.DOMAIN)"},
			&cli.StringFlag{Name: "e2b-tls-key", Usage: "the private key of --e2b-tls-cert, in `FILE` (PEM)"},
		},
		Action: daemonServe, // serve.go
	}
}
