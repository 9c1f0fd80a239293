package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

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

// e2bTLS is the TLS configuration of --e2b-tls-cert and --e2b-tls-key, or nil without them. The
// files are read at start: a bad pair is said before the supervisor is on.
func e2bTLS(c *cli.Context) (*tls.Config, error) {
	cert, key := c.String("e2b-tls-cert"), c.String("e2b-tls-key")
	switch {
	case cert == "" && key == "":
		return nil, nil
	case cert == "" || key == "":
		return nil, usageError("--e2b-tls-cert and --e2b-tls-key go together: the certificate chain and its private key, PEM files")
	case c.String("e2b") == "":
		return nil, usageError("--e2b-tls-cert serves --e2b over TLS: name the address too, e.g. --e2b 127.0.0.1:443")
	}
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		return nil, withHint(exitUsage, fmt.Errorf("--e2b-tls-cert %s, --e2b-tls-key %s: %w", cert, key, err), "PEM files: the certificate (its chain after it) and its unencrypted private key, e.g. made with `openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=e2b.localhost -addext subjectAltName=DNS:e2b.localhost,DNS:*.e2b.localhost -keyout key.pem -out cert.pem` (with --e2b-domain e2b.localhost)")
	}
	// HTTP/1.1 only: a port's WebSocket is an HTTP/1.1 upgrade.
	return &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}}, nil
}

// e2bDomain is --e2b-domain, or localhost with the E2B address's port (none for 443 over TLS or 80
// without): the SDK appends no port to PORT-ID.DOMAIN, so the domain carries it.
func e2bDomain(flag string, port int, tls bool) (string, error) {
	if flag != "" {
		host, bad := flag, false
		if h, p, err := net.SplitHostPort(flag); err == nil {
			n, perr := strconv.Atoi(p)
			host, bad = h, perr != nil || n < 1 || n > 65535
		}
		if bad || host == "" || strings.ContainsAny(host, "/ \t@:") {
			return "", usageError("--e2b-domain %q: a domain, with a port if the address has no default one, e.g. localhost:%d or sandboxes.example.com", flag, port)
		}
		return flag, nil
	}
	if (tls && port == 443) || (!tls && port == 80) {
		return "localhost", nil
	}
	return net.JoinHostPort("localhost", strconv.Itoa(port)), nil
}

// listenError says why --NAME ADDR could not be listened on, and names what to do: for a port in use,
// a port that is free on the same host now (the kernel's pick), or port 0 (any free port).
func listenError(flag, addr string, err error) error {
	err = fmt.Errorf("--%s %s: %w", flag, addr, err)
	host, _, serr := net.SplitHostPort(addr)
	if serr != nil {
		return withHint(exitUsage, err, "write HOST:PORT, e.g. 127.0.0.1:49982 (port 0: any free port)")
	}
	switch {
	case errors.Is(err, unix.EADDRINUSE):
		hint := fmt.Sprintf("another program listens there (`ss -ltnp 'sport = :%s'` names it): name a free port", portOf(addr))
		if l, lerr := net.Listen("tcp", net.JoinHostPort(host, "0")); lerr == nil {
			hint += fmt.Sprintf(", e.g. --%s %s", flag, l.Addr())
			l.Close()
		}
		return withHint(exitFailure, err, hint+fmt.Sprintf(", or --%s %s for any free one (the supervisor prints the one it took)", flag, net.JoinHostPort(host, "0")))
	case errors.Is(err, unix.EADDRNOTAVAIL):
		return withHint(exitUsage, err, fmt.Sprintf("%s is not an address of this host (`ip -brief address` lists them): e.g. --%s 127.0.0.1:%s", host, flag, portOf(addr)))
	case errors.Is(err, unix.EACCES):
		return withHint(exitFailure, err, "ports below 1024 are root's (CAP_NET_BIND_SERVICE): name a port above 1023")
	}
	return withHint(exitUsage, err, "name a free HOST:PORT, e.g. 127.0.0.1:49982 (port 0: any free port)")
}

func portOf(addr string) string {
	_, port, _ := net.SplitHostPort(addr)
	return port
}
