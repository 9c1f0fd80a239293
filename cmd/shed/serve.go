//go:build !shed_lean

package main

// The actions of the commands whose libraries only shed-serve links: the supervisor (the E2B API's
// connect and envd messages), the MCP server (the MCP SDK, JSON Schema), containerd's snapshotter (gRPC,
// containerd's API) and the Kubernetes objects (the Kubernetes API types). shed-cli, built with the
// tag shed_lean, runs shed-serve for them (serve_lean.go): every other command, the launches and
// realizes on a store among them, pays none of those libraries' package initialization
// (docs/architecture.md).

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"toolshed.dev/shed/api"
	"toolshed.dev/shed/apikey"
	"toolshed.dev/shed/app"
	"toolshed.dev/shed/e2b"
	"toolshed.dev/shed/internal/fdbudget"
	"toolshed.dev/shed/mcp"
	"toolshed.dev/shed/records"
	"toolshed.dev/shed/sandbox"
	"toolshed.dev/shed/snapshotter"
	"toolshed.dev/shed/store"
)

const lean = false

// daemonServe is `shed daemon`: the supervisor.
func daemonServe(c *cli.Context) error {
	if os.Geteuid() != 0 {
		return withHint(exitUsage, errors.New("the supervisor runs as root"), "start it with systemd (docs/supervisor.md) or sudo")
	}
	etls, err := e2bTLS(c)
	if err != nil {
		return err
	}
	if _, err := e2bDomain(c.String("e2b-domain"), 49982, false); err != nil {
		return err
	}
	mem, err := memoryFlag(c, "user-memory")
	if err != nil {
		return err
	}
	pids, err := countFlag(c, "user-pids", 0, 0, "the most processes a user's Bench may have (0: no bound)")
	if err == nil && pids > 0 && pids < app.MinPids {
		err = withHint(exitUsage, fmt.Errorf("--user-pids %d: below the least a Bench runs in, %d (its init and the command)", pids, app.MinPids), "write 0 (no bound) or at least 2, e.g. 4096")
	}
	if err != nil {
		return err
	}
	kept, err := countFlag(c, "user-kept", 0, 0, "the most kept Benches a user may have (0: no bound)")
	if err != nil {
		return err
	}
	snapshots, err := countFlag(c, "user-snapshots", 0, 0, "the most snapshots a user may have (0: no bound)")
	if err != nil {
		return err
	}
	userDisk, err := sizeFlag(c, "user-disk")
	if err != nil {
		return err
	}
	if c.Duration("task-state-ttl") < time.Minute {
		return usageError("--task-state-ttl %s: at least a minute", c.Duration("task-state-ttl"))
	}
	benches, err := countFlag(c, "user-benches", 0, 0, "the most Benches a user may have (0: no bound)")
	if err != nil {
		return err
	}
	warm, err := countFlag(c, "warm", 0, maxWarm, "the Bench inits kept started ahead")
	if err != nil {
		return err
	}
	svc := service(c)
	svc.StartAuditFlusher() // noted entries (launches, commands) synced within 100 ms
	defer svc.FlushAudit()  // the counts of refusals dropped, which timers would write soon; noted entries
	svc.UserLimits = sandbox.Limits{MemoryBytes: mem, Pids: pids}
	svc.UserKept, svc.UserBenches, svc.UserSnapshots = int(kept), int(benches), int(snapshots)
	svc.TaskStateTTL, svc.UserDisk = c.Duration("task-state-ttl"), userDisk
	svc.Socket = c.String("socket")
	// Benches made by bench.create live in this process, until removed, their lifetime ends
	// or the supervisor stops (they stop with it: their state is swept at the next start).
	svc.Detached = &app.Detached{Ctx: c.Context}
	defer svc.Detached.Wait()
	perWorkshop := map[string]int{}
	total := int(warm)
	for _, w := range c.StringSlice("warm-workshop") {
		name, num, _ := strings.Cut(w, "=")
		n, err := strconv.Atoi(num)
		if !records.IsName(name) || err != nil || n < 0 || n > maxWarm {
			return withHint(exitUsage, fmt.Errorf("--warm-workshop %q: want NAME=N, a record's name and a whole number from 0 to %d", w, maxWarm), "e.g. --warm-workshop jq-tools=2")
		}
		perWorkshop[name] = n
		total += n
	}
	if total > maxWarm {
		return usageError("--warm and --warm-workshop keep %d inits ready: at most %d (each holds one of the 512 sandbox id slots)", total, maxWarm)
	}
	svc.Pool = app.NewPool(c.Context, int(warm), perWorkshop)
	svc.StartMetrics(c.Context)   // each running Bench's use, every 5 s (bench.metrics)
	svc.StartTaskSweep(c.Context) // paused Benches and snapshots past --task-state-ttl, every minute
	// The store must open now: a supervisor that cannot serve says so at start, not per request.
	st, err := store.Open(svc.Root)
	if err != nil {
		return err
	}
	st.Close()
	// The E2B port first: a busy one is said before the supervisor says it is on.
	var eln net.Listener
	if addr := c.String("e2b"); addr != "" {
		if eln, err = net.Listen("tcp", addr); err != nil {
			return listenError("e2b", addr, err)
		}
		defer eln.Close()
	}
	ln, err := api.Listen(c.String("socket"))
	if errors.Is(err, api.ErrListening) {
		return withHint(exitFailure, err, "one supervisor a socket: stop that one first (`systemctl stop shed`, or end its process), or give this one another --socket")
	}
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
	// What each face may hold (docs/supervisor.md): the faces take at most half the descriptors.
	b := fdbudget.Process()
	log.Info("descriptor budget", "limit", b.Limit, "faces", b.Faces(), "socket_requests", b.SocketRequests, "socket_per_user", b.SocketPerUser,
		"e2b_conns", b.E2BConns, "e2b_per_peer", b.E2BPerPeer, "e2b_per_user", b.E2BPerUser, "e2b_in_flight", b.E2BInFlight,
		"propose_conns", b.ProposeConns, "propose_per_bench", b.ProposePerBench, "proxy_conns", b.ProxyConns, "proxy_per_bench", b.ProxyPerBench)
	fmt.Fprintf(c.App.ErrWriter, "shed: supervisor on %s for the store at %s\n", c.String("socket"), svc.Root)
	if eln != nil {
		if ip := eln.Addr().(*net.TCPAddr).IP; !ip.IsLoopback() && etls == nil {
			log.Warn("the E2B API is plain HTTP on a non-loopback address: API keys and tokens cross the network in clear; put TLS in front (--e2b-tls-cert)", "addr", eln.Addr().String())
		}
		domain, err := e2bDomain(c.String("e2b-domain"), eln.Addr().(*net.TCPAddr).Port, etls != nil)
		if err != nil {
			return err
		}
		es := &e2b.Server{Service: svc, Operators: c.String("operators-group"), Log: log, Keys: apikey.Open(svc.Root), CallerOf: api.CallerOf,
			Domain: domain, TLS: etls}
		scheme := "http"
		if etls != nil {
			scheme = "https"
		}
		fmt.Fprintf(c.App.ErrWriter, "shed: E2B API on %s://%s (E2B_API_URL and E2B_SANDBOX_URL), sandboxes' ports at PORT-ID.%s\n", scheme, eln.Addr(), domain)
		go func() {
			if err := es.Serve(c.Context, eln); err != nil {
				log.Error("e2b server", "err", err)
			}
		}()
	}
	srv := &api.Server{Service: svc, Operators: c.String("operators-group"), Log: log}
	return srv.Serve(c.Context, ln)
}

// mcpServe is `shed mcp`: an MCP server on stdio.
func mcpServe(c *cli.Context) error {
	if c.NArg() > 0 {
		return usageError("mcp takes no arguments")
	}
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer null.Close()
	// stdin and stdout are the protocol's: the supervisor gets /dev/null for them, and the
	// commands' output comes back in results.
	stdio := &[3]*os.File{null, null, os.Stderr}
	hosts := app.HostPaths{Root: storeRoot(c), Socket: os.Getenv(api.SocketEnv)}
	if hosts.Socket == "" || hosts.Socket == "none" {
		hosts.Socket = api.DefaultSocket
	}
	s := &mcp.Server{
		Version: version,
		Hosts:   hosts,
		Call: func(ctx context.Context, op string, req, resp any) error {
			return callInto(ctx, c, stdio, "mcp", op, req, resp)
		},
	}
	return s.Run(c.Context, &sdk.StdioTransport{})
}

// snapshotterServe is `shed snapshotter`: containerd's snapshots API over the store.
func snapshotterServe(c *cli.Context) error {
	if c.NArg() > 0 {
		return withHint(exitUsage, fmt.Errorf("snapshotter takes no arguments"), "`shed snapshotter --socket PATH`")
	}
	svc := service(c)
	ns, err := svc.OpenNodeStore()
	if err != nil {
		return err
	}
	defer ns.Close()
	dir := c.String("dir")
	if dir == "" {
		dir = filepath.Join(svc.Root, "containerd")
	}
	sn, err := snapshotter.Open(ns, dir)
	if err != nil {
		return err
	}
	defer sn.Close()
	// A service's log: each layer taken from the store, each refused, on stderr (the journal).
	sn.Log = slog.New(slog.NewTextHandler(c.App.ErrWriter, nil))
	sock := c.String("socket")
	if err := os.MkdirAll(filepath.Dir(sock), 0o755); err != nil {
		return err
	}
	fmt.Fprintf(c.App.ErrWriter, "shed snapshotter: serving containerd on %s\n", sock)
	return sn.Serve(c.Context, sock)
}

// k8sManifests is `shed k8s manifests`.
func k8sManifests(c *cli.Context) error {
	if c.NArg() > 1 {
		return usageError("k8s manifests takes one WORKSHOP")
	}
	res, err := call[app.K8sManifestsResult](c, "k8s.manifests", &app.K8sManifestsRequest{
		Workshop: c.Args().First(), Image: c.String("image"), Name: c.String("name"), Namespace: c.String("namespace"),
		RuntimeClass: c.String("runtime-class"), Replicas: int32(c.Int("replicas")), CPU: c.String("cpu"),
		Memory: c.String("memory"), EgressProxy: c.String("egress-proxy"),
	})
	if err != nil {
		return err
	}
	if c.Bool("json") {
		return printJSON(c, res)
	}
	if len(res.Unreachable) > 0 {
		fmt.Fprintf(c.App.ErrWriter, "shed: warning: a NetworkPolicy cannot name hosts: %s unreachable from the pods; --egress-proxy IP:PORT lets them through an allowlisting proxy\n", strings.Join(res.Unreachable, ", "))
	}
	fmt.Fprint(c.App.Writer, res.YAML)
	return nil
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
