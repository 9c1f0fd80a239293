package proxy

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Rule allows one destination: a DNS name or IP literal, and a port (0 = the scheme's default port
// only: 80 for http requests, 443 for CONNECT).
type Rule struct {
	Host string
	Port int
}

// Decision is one logged request: every allowed and every refused destination is recorded.
//
// Time is when the request arrived; the Decision is handed to Config.Log when the exchange ends, so that
// Bytes is known. Reason says why a request was refused; on an allowed request it is empty unless the relay
// ended abnormally ("upstream: ...", "client: ...", "idle timeout", "proxy stopped").
type Decision struct {
	Time    time.Time `json:"time"`
	Method  string    `json:"method"` // "GET", "CONNECT", ...
	Host    string    `json:"host"`   // as requested, lowercased
	Port    int       `json:"port"`
	Allowed bool      `json:"allowed"`
	Reason  string    `json:"reason,omitempty"` // why refused: "not in allowlist", "denied by network rules", "resolves to a private address 10.0.0.1", "bad request", "upstream: ..."
	Bytes   int64     `json:"bytes"`            // bytes relayed back to the client
	// Cut is set on an allowed exchange that a change of the network rules ended (SetFilter).
	Cut bool `json:"cut,omitempty"`
	// Brokered is set on a request inside a tunnel the broker terminated; Secret names the secret a
	// refusal was for (never its value).
	Brokered bool   `json:"brokered,omitempty"`
	Secret   string `json:"secret,omitempty"`
}

// Config is what a Proxy allows and how it reaches the outside.
type Config struct {
	Allow []Rule
	// AllowPrivate lets named hosts resolve to loopback/private/link-local addresses. False for Benches
	// (a Bench must never reach the host or its network); true only when the recipe's own package mirror
	// or index is on such an address (a local mirror), which only build steps reach.
	AllowPrivate bool
	// Log receives every Decision (may be nil). Called from many goroutines; the proxy serializes calls.
	Log func(Decision)
	// Dial is used for upstream connections; nil = net.Dialer with a 10 s timeout. (Tests may override.)
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Resolver resolves names; nil = net.DefaultResolver.
	Resolver *net.Resolver
	// MaxConns bounds the client connections served at once (0: DefaultMaxConns); more wait in the
	// listener's queue. A Bench's proxy has one client, the Bench: its excess waits behind its own.
	MaxConns int
	// Shared, if set, bounds the client connections of all the Proxies that share it: a connection
	// past it waits for a slot (one per Serve at most, holding its descriptor).
	Shared *Share
	// Filter, if set, narrows Allow (the sandbox's own rules); SetFilter replaces it later.
	Filter *Filter
	// Broker, if set, puts credentials into the sandbox's requests to the destinations they are
	// bound to (their CONNECTs terminated), and refuses a placeholder sent anywhere else.
	Broker *Broker
}

const (
	defaultDialTimeout   = 10 * time.Second // upstream dial, all addresses of a name together; also bounds the lookup
	defaultHeaderTimeout = 30 * time.Second // a client must send its request line and headers within this
	defaultIdleTimeout   = 90 * time.Second // keep-alive client connection with no request
	defaultTunnelIdle    = 10 * time.Minute // CONNECT tunnel with no byte either way
	maxHeaderBytes       = 64 << 10         // apt and pip send a few hundred bytes
	relayBufSize         = 64 << 10
)

type ruleKey struct {
	host string
	port int
}

// Proxy is an allowlisting forward proxy for HTTP (absolute-form requests) and HTTPS (CONNECT).
// Its policy is fixed at New; one Proxy may Serve several listeners.
type Proxy struct {
	allow        map[ruleKey]bool
	allowPrivate bool

	// filter narrows allow; it changes under activeMu (SetFilter), which also guards active and
	// servers: the exchanges in flight, to cut, and the Serve calls, whose idle connections to close.
	filter   atomic.Pointer[Filter]
	activeMu sync.Mutex
	active   map[*exchange]struct{}
	servers  map[*server]struct{}

	logMu sync.Mutex
	log   func(Decision)

	dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// lookup resolves a name (never an IP literal) and is called exactly once per request, so that the
	// addresses checked are the addresses dialed. A field so that internal tests can fake DNS.
	lookup func(ctx context.Context, host string) ([]netip.Addr, error)

	// serverLog receives net/http's own messages (recovered panics among them); nil = discarded.
	serverLog *log.Logger

	maxConns int
	shared   *Share
	broker   *Broker

	// Timeouts, fields so that internal tests can shorten them.
	dialTimeout   time.Duration
	headerTimeout time.Duration
	idleTimeout   time.Duration
	tunnelIdle    time.Duration
}

// New checks cfg's rules and returns a Proxy that enforces them.
func New(cfg Config) (*Proxy, error) {
	p := &Proxy{
		allow:         make(map[ruleKey]bool, len(cfg.Allow)),
		allowPrivate:  cfg.AllowPrivate,
		log:           cfg.Log,
		dial:          cfg.Dial,
		dialTimeout:   defaultDialTimeout,
		headerTimeout: defaultHeaderTimeout,
		idleTimeout:   defaultIdleTimeout,
		tunnelIdle:    defaultTunnelIdle,
		maxConns:      cfg.MaxConns,
		shared:        cfg.Shared,
		broker:        cfg.Broker,
	}
	if b := p.broker; b != nil && (b.CA == nil || b.Lookup == nil) {
		return nil, errors.New("a broker needs a CA and a Lookup")
	}
	if p.maxConns <= 0 {
		p.maxConns = DefaultMaxConns
	}
	p.filter.Store(cfg.Filter)
	for i, r := range cfg.Allow {
		host, err := ruleHost(r.Host)
		if err != nil {
			return nil, fmt.Errorf("allow rule %d (%q): %w", i, r.Host, err)
		}
		if r.Port < 0 || r.Port > 65535 {
			return nil, fmt.Errorf("allow rule %d (%q): port %d out of range 0-65535", i, r.Host, r.Port)
		}
		p.allow[ruleKey{host, r.Port}] = true
	}
	if p.dial == nil {
		p.dial = (&net.Dialer{Timeout: defaultDialTimeout}).DialContext
	}
	res := cfg.Resolver
	if res == nil {
		res = net.DefaultResolver
	}
	p.lookup = func(ctx context.Context, host string) ([]netip.Addr, error) {
		addrs, err := res.LookupNetIP(ctx, "ip", host)
		// The resolver may hand back IPv4 addresses in their IPv4-mapped IPv6 form.
		for i := range addrs {
			addrs[i] = addrs[i].Unmap()
		}
		return addrs, err
	}
	return p, nil
}

// ruleHost validates a rule's host and returns it in the form requests are matched in.
func ruleHost(h string) (string, error) {
	if h == "" {
		return "", errors.New("empty host")
	}
	if strings.ContainsAny(h, "*?") {
		return "", errors.New("wildcards are not supported: list each host")
	}
	if s, ok := strings.CutPrefix(h, "["); ok {
		s, ok = strings.CutSuffix(s, "]")
		a, err := netip.ParseAddr(s)
		if !ok || err != nil || !a.Is6() {
			return "", errors.New("malformed bracketed IPv6 address")
		}
		h = s
	}
	if a, err := netip.ParseAddr(h); err == nil {
		if a.Zone() != "" {
			return "", errors.New("zoned addresses are not supported")
		}
		return a.String(), nil
	}
	h = strings.ToLower(h)
	if err := checkName(h); err != nil {
		return "", err
	}
	return h, nil
}

// checkName checks that h (lowercased) is a DNS name: dot-separated labels of letters, digits, '-' and '_'.
func checkName(h string) error {
	if len(h) > 253 {
		return errors.New("host name longer than 253 bytes")
	}
	labels := strings.Split(h, ".")
	for _, l := range labels {
		if l == "" || len(l) > 63 {
			return errors.New("malformed host name (empty or over-long label)")
		}
		for _, c := range []byte(l) {
			if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
				return fmt.Errorf("host name has an invalid character %q (a port goes in Port)", c)
			}
		}
	}
	// "127.1" or "0x7f.1" is no name but a C library spelling of an address: refuse the ambiguity.
	if strings.Trim(labels[len(labels)-1], "0123456789") == "" {
		return errors.New("numeric top-level label: not a name and not a valid IP address")
	}
	return nil
}

// target is a request's destination.
type target struct {
	host string // lowercased; IP literals in canonical form, without brackets
	port int
}

func (t target) String() string { return net.JoinHostPort(t.host, strconv.Itoa(t.port)) }

// parseTarget returns r's destination, and false if r is not a proxy request: CONNECT host:port, or an
// absolute-form http:// request.
func parseTarget(r *http.Request) (target, bool) {
	var host, port string
	if r.Method == http.MethodConnect {
		if r.URL.Path != "" || r.URL.RawQuery != "" {
			return target{}, false
		}
		h, p, err := net.SplitHostPort(r.URL.Host)
		if err != nil {
			return target{host: canonicalHost(r.URL.Host)}, false
		}
		host, port = h, p
	} else {
		u := r.URL
		if u.Scheme != "http" || u.Opaque != "" {
			return target{host: canonicalHost(u.Hostname())}, false
		}
		host, port = u.Hostname(), u.Port()
		if port == "" {
			port = "80"
		}
	}
	t := target{host: canonicalHost(host)}
	if !validHost(t.host) || port == "" || len(port) > 5 || strings.Trim(port, "0123456789") != "" {
		return t, false
	}
	t.port, _ = strconv.Atoi(port)
	if t.port < 1 || t.port > 65535 {
		return target{host: t.host}, false
	}
	return t, true
}

// validHost reports whether a request's host (canonical) is an IP literal or a DNS name; the absolute form
// of a name, with its final dot, is well formed (and then not in the allowlist, which has no such names).
func validHost(h string) bool {
	if _, err := netip.ParseAddr(h); err == nil {
		return true
	}
	return checkName(strings.TrimSuffix(h, ".")) == nil
}

func canonicalHost(h string) string {
	if a, err := netip.ParseAddr(h); err == nil {
		return a.String()
	}
	return strings.ToLower(h)
}

// allowed reports whether the allowlist has t, for a CONNECT tunnel or a plain http request.
func (p *Proxy) allowed(t target, connect bool) bool {
	def := 80
	if connect {
		def = 443
	}
	return p.allow[ruleKey(t)] || t.port == def && p.allow[ruleKey{t.host, 0}]
}

// resolve returns the addresses of host: the literal itself, or the answer of a single lookup.
func (p *Proxy) resolve(ctx context.Context, host string) ([]netip.Addr, error) {
	if a, err := netip.ParseAddr(host); err == nil {
		return []netip.Addr{a}, nil
	}
	ctx, cancel := context.WithTimeout(ctx, p.dialTimeout)
	defer cancel()
	addrs, err := p.lookup(ctx, host)
	if err != nil {
		return nil, err
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("lookup %s: no addresses", host)
	}
	return addrs, nil
}

// refusedAddr returns the first address the sandbox may not reach. One is enough to refuse the name:
// dialing only the others would leave the choice to whoever controls the name's DNS.
func (p *Proxy) refusedAddr(addrs []netip.Addr) (netip.Addr, bool) {
	if p.allowPrivate {
		return netip.Addr{}, false
	}
	for _, a := range addrs {
		if forbidden(a) {
			return a, true
		}
	}
	return netip.Addr{}, false
}

// dialChecked connects to one of addrs, in order, never to anything else: the name is not resolved
// again, so DNS cannot answer differently between the check and the dial (rebinding).
func (p *Proxy) dialChecked(ctx context.Context, addrs []netip.Addr, port int) (net.Conn, netip.Addr, error) {
	ctx, cancel := context.WithTimeout(ctx, p.dialTimeout)
	defer cancel()
	var first error
	for i, a := range addrs {
		// Each address gets a fair share of the time left, as net.Dialer does with a name's addresses,
		// so that one black-holed address does not use up the whole budget.
		dl, _ := ctx.Deadline()
		actx, acancel := context.WithTimeout(ctx, time.Until(dl)/time.Duration(len(addrs)-i))
		c, err := p.dial(actx, "tcp", netip.AddrPortFrom(a.Unmap(), uint16(port)).String())
		acancel()
		if err == nil {
			return c, a, nil
		}
		if first == nil {
			first = err
		}
		if ctx.Err() != nil {
			break
		}
	}
	return nil, netip.Addr{}, first
}

func (p *Proxy) record(d Decision) {
	if p.log == nil {
		return
	}
	p.logMu.Lock()
	defer p.logMu.Unlock()
	p.log(d)
}

// Serve accepts on l until ctx is done or l is closed; returns nil on ctx cancellation. It closes l on return.
//
// When Serve returns, every connection it accepted is closed, every tunnel torn down, every Decision
// logged, and the goroutines it started have ended or are past their last blocking call (net/http's
// connection goroutines return just after reporting StateClosed). If l was closed by someone else, Serve
// cleans up the same way and returns the accept error (errors.Is(err, net.ErrClosed)).
func (p *Proxy) Serve(ctx context.Context, l net.Listener) error {
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s := &server{p: p, ctx: ctx}
	// One transport per Serve, so that closing its idle connections at the end also closes those that
	// become idle later (http.Transport remembers CloseIdleConnections until its next request).
	s.transport = &http.Transport{
		Proxy:               nil, // never the host's http_proxy environment
		DialContext:         s.dialTransport,
		DisableCompression:  true,    // relay the bytes as they are, Content-Length included
		MaxIdleConns:        MaxIdle, // the descriptors a Proxy holds beyond its clients' (fdbudget)
		MaxIdleConnsPerHost: MaxIdle / 2,
		IdleConnTimeout:     p.idleTimeout,
	}
	if p.broker != nil {
		// The real servers of terminated destinations, verified as any client verifies them.
		s.transport.TLSClientConfig = &tls.Config{RootCAs: p.broker.Roots, MinVersion: tls.VersionTLS12}
	}
	errorLog := p.serverLog
	if errorLog == nil {
		errorLog = log.New(io.Discard, "", 0) // libraries do not print
	}
	s.errorLog = errorLog
	srv := &http.Server{
		Handler:                      s,
		ReadHeaderTimeout:            p.headerTimeout,
		IdleTimeout:                  p.idleTimeout,
		MaxHeaderBytes:               maxHeaderBytes,
		DisableGeneralOptionsHandler: true, // "OPTIONS *" is not a proxy request: refuse and log it
		ErrorLog:                     errorLog,
		BaseContext:                  func(net.Listener) context.Context { return ctx },
		ConnState:                    s.connState,
		// No ReadTimeout or WriteTimeout: they would cut off a long download (a 100 MB .deb on a
		// slow mirror). Stalled connections end by the idle timeouts and on ctx cancellation.
	}
	stop := context.AfterFunc(ctx, func() { srv.Close() })
	defer stop()
	p.activeMu.Lock()
	if p.servers == nil {
		p.servers = map[*server]struct{}{}
	}
	p.servers[s] = struct{}{}
	p.activeMu.Unlock()
	defer func() {
		p.activeMu.Lock()
		delete(p.servers, s)
		p.activeMu.Unlock()
	}()

	err := srv.Serve(&limitListener{Listener: l, own: make(chan struct{}, p.maxConns), shared: p.shared, done: ctx.Done()})
	cancel()    // ends tunnels, upstream requests and dials still running
	srv.Close() // if l was closed by the caller, net/http's connections are still open
	l.Close()
	s.wg.Wait()
	s.transport.CloseIdleConnections()
	if parent.Err() != nil {
		return nil
	}
	return fmt.Errorf("serve proxy: %w", err)
}

// server is one Serve call: its transport and everything it must wait for before returning.
type server struct {
	p         *Proxy
	ctx       context.Context // Serve's: canceled when Serve stops
	transport *http.Transport
	errorLog  *log.Logger
	// wg counts net/http connections until they close or are hijacked, handlers, and upstream dials.
	// Each Add for a handler or dial happens while its connection is counted, so never from zero
	// after Serve started waiting.
	wg sync.WaitGroup
}

func (s *server) connState(_ net.Conn, st http.ConnState) {
	switch st {
	case http.StateNew:
		s.wg.Add(1)
	case http.StateHijacked, http.StateClosed:
		s.wg.Done()
	}
}

type checkedKey struct{}

// checked is the destination of a plain http request, after the allowlist and address checks; the
// transport's dialer reads it from the request's context.
type checked struct {
	hostport string
	port     int
	addrs    []netip.Addr
}

// dialTransport is the http.Transport's dialer: it dials only addresses that were checked for the
// request that caused the dial. (A connection dialed for one request may serve a later one for the same
// host and port; that one passed the same checks.)
func (s *server) dialTransport(ctx context.Context, network, addr string) (net.Conn, error) {
	c, _ := ctx.Value(checkedKey{}).(*checked)
	if c == nil || addr != c.hostport {
		return nil, fmt.Errorf("refusing to dial unchecked address %s", addr)
	}
	s.wg.Add(1)
	defer s.wg.Done()
	// net/http detaches dials from the request's cancellation; tie them to Serve's instead.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(s.ctx, cancel)()
	conn, _, err := s.p.dialChecked(ctx, c.addrs, c.port)
	return conn, err
}

func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.wg.Add(1)
	defer s.wg.Done()
	d := Decision{Time: time.Now(), Method: r.Method}
	defer func() { s.p.record(d) }()

	connect := r.Method == http.MethodConnect
	if !connect && r.ContentLength != 0 {
		// A body must not stall, even one refused (net/http reads it to reuse the connection):
		// forward extends this as the body comes.
		_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(s.p.idleTimeout))
	}
	t, ok := parseTarget(r)
	d.Host, d.Port = t.host, t.port
	if !ok {
		d.Reason = "bad request"
		w.Header().Set("Connection", "close")
		http.Error(w, "shed proxy: bad request: send CONNECT host:port, or an absolute-form request (GET http://host/path)", http.StatusBadRequest)
		return
	}
	if !s.p.allowed(t, connect) {
		d.Reason = "not in allowlist"
		refuse(w, http.StatusForbidden, connect, fmt.Sprintf("shed proxy: %s is not in this sandbox's allowlist", t))
		return
	}
	if s.p.filter.Load().refusesName(t.host) {
		s.denied(w, connect, t, &d)
		return
	}
	addrs, err := s.p.resolve(r.Context(), t.host)
	if err != nil {
		d.Reason = "upstream: " + err.Error()
		refuse(w, http.StatusBadGateway, connect, fmt.Sprintf("shed proxy: cannot resolve %s", t.host))
		return
	}
	if a, bad := s.p.refusedAddr(addrs); bad {
		d.Reason = "resolves to a private address " + a.String()
		// The address itself stays in the log: the sandbox need not learn the host's networks.
		refuse(w, http.StatusForbidden, connect, fmt.Sprintf("shed proxy: %s resolves to a private address, which this sandbox may not reach", t))
		return
	}
	// The sandbox's own rules may narrow the addresses further (an address denied is never dialed).
	if addrs = s.p.filter.Load().pass(t.host, addrs); len(addrs) == 0 {
		s.denied(w, connect, t, &d)
		return
	}
	switch {
	case connect && s.p.broker.terminates(t):
		s.terminate(w, r, t, addrs, &d)
	case connect:
		s.tunnel(w, r, t, addrs, &d)
	default:
		s.forwardTo(w, r, t, addrs, &d, "http")
	}
}

// denied refuses a destination of the allowlist that the sandbox's network rules deny.
func (s *server) denied(w http.ResponseWriter, connect bool, t target, d *Decision) {
	d.Reason = "denied by network rules"
	refuse(w, http.StatusForbidden, connect, fmt.Sprintf("shed proxy: %s is denied by this sandbox's network rules", t))
}

// refuse answers a request that is not let through. A refused CONNECT closes the connection: the client
// may already have sent bytes meant for the tunnel, which must not be read as a next request.
func refuse(w http.ResponseWriter, code int, connect bool, msg string) {
	if connect {
		w.Header().Set("Connection", "close")
	}
	http.Error(w, msg, code)
}

// hopHeaders concern one connection, not the exchange: they are not relayed (RFC 9110 §7.6.1), and the
// Proxy-* ones are meant for this proxy alone.
var hopHeaders = []string{
	"Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Proxy-Connection",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

func removeHopHeaders(h http.Header) {
	for _, v := range h["Connection"] {
		for f := range strings.SplitSeq(v, ",") {
			if f = strings.TrimSpace(f); f != "" {
				h.Del(f)
			}
		}
	}
	for _, k := range hopHeaders {
		h.Del(k)
	}
}

// forwardTo relays a request to the checked addresses over scheme ("http", or "https" from inside a
// terminated tunnel) and streams the response back.
func (s *server) forwardTo(w http.ResponseWriter, r *http.Request, t target, addrs []netip.Addr, d *Decision, scheme string) {
	ctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	ex := &exchange{host: t.host, addrs: addrs, cut: func() { cancel(errCut) }}
	if !s.p.begin(ex) {
		s.denied(w, false, t, d)
		return
	}
	defer s.p.end(ex)
	cut := func() bool { return errors.Is(context.Cause(ctx), errCut) }
	out := r.Clone(context.WithValue(ctx, checkedKey{}, &checked{t.String(), t.port, addrs}))
	out.RequestURI = ""
	// The transport dials, and pools connections, by URL host: the canonical checked destination.
	// The Host header stays what the client asked for (the same host, as it spelled it).
	out.URL.Scheme, out.URL.Host = scheme, t.String()
	out.Host = cmp.Or(r.URL.Host, r.Host)
	out.Close = false
	if r.ContentLength == 0 {
		out.Body = nil
	} else {
		// A body that stalls for the idle timeout ends the request; net/http lifts the deadline at
		// the body's end.
		b := &idleBody{ReadCloser: r.Body, rc: http.NewResponseController(w), idle: s.p.idleTimeout}
		defer b.stop() // the transport may read on after the exchange: the connection is no longer this request's
		out.Body = b
	}
	removeHopHeaders(out.Header)
	var q *request
	if s.p.broker != nil {
		q = &request{b: s.p.broker, t: t, tls: scheme == "https", creds: map[string]*Credential{}}
		// An error may quote what the server sent: the reason logged never holds a value.
		defer func() { d.Reason = q.scrub(d.Reason) }()
		if ref := q.prepare(out); ref != nil {
			d.Reason, d.Secret = ref.why, ref.secret
			w.Header().Set("Connection", "close")
			http.Error(w, "shed proxy: "+ref.Error(), http.StatusForbidden)
			return
		}
	}

	resp, err := s.transport.RoundTrip(out)
	var ref *refusal
	if errors.As(err, &ref) {
		// A placeholder in the body that may not go there: the body stopped before it.
		d.Reason, d.Secret = ref.why, ref.secret
		w.Header().Set("Connection", "close")
		http.Error(w, "shed proxy: "+ref.Error(), http.StatusForbidden)
		return
	}
	if err != nil {
		d.Reason = "upstream: " + err.Error()
		if s.ctx.Err() != nil {
			d.Reason = "proxy stopped"
		} else if cut() {
			d.Reason, d.Allowed, d.Cut = errCut.Error(), true, true
			refuse(w, http.StatusForbidden, false, "shed proxy: "+t.String()+" is denied by this sandbox's network rules (changed while the request was on its way)")
			return
		}
		http.Error(w, fmt.Sprintf("shed proxy: cannot reach %s", t), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	d.Allowed = true
	removeHopHeaders(resp.Header)
	if q != nil {
		q.mask(resp)
	}
	h := w.Header()
	for k, v := range resp.Header {
		h[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	n, rerr, werr := relay(w, resp.Body, s.p.idleTimeout)
	d.Bytes = n
	switch {
	case s.ctx.Err() != nil && (werr != nil || rerr != nil):
		d.Reason = "proxy stopped"
		panic(http.ErrAbortHandler)
	case cut() && (werr != nil || rerr != nil):
		// Aborted like a broken upstream: the client must not take the part it got for the whole.
		d.Reason, d.Cut = errCut.Error(), true
		panic(http.ErrAbortHandler)
	case werr != nil:
		d.Reason = "client: " + werr.Error()
		return
	case rerr != nil:
		d.Reason = "upstream: " + rerr.Error()
		// Abort rather than end the response cleanly: a chunked body would otherwise look complete.
		// net/http recovers this panic silently and closes the connection.
		panic(http.ErrAbortHandler)
	}
	if q != nil {
		q.maskHeader(resp.Trailer)
	}
	for k, v := range resp.Trailer {
		h[http.TrailerPrefix+k] = v
	}
}

// relay copies body to w, flushing each piece so that slow streams reach the client as they come.
// Nothing is buffered beyond one piece: 100 MB downloads stream. Each piece must reach the client
// within idle: one that stops reading is dropped.
func relay(w http.ResponseWriter, body io.Reader, idle time.Duration) (n int64, rerr, werr error) {
	rc := http.NewResponseController(w)
	// And what net/http writes after, the end of a chunked body.
	defer func() { _ = rc.SetWriteDeadline(time.Now().Add(idle)) }()
	buf := make([]byte, relayBufSize)
	for {
		nr, err := body.Read(buf)
		if nr > 0 {
			_ = rc.SetWriteDeadline(time.Now().Add(idle))
			nw, err := w.Write(buf[:nr])
			n += int64(nw)
			if err != nil {
				return n, nil, err
			}
			if err := rc.Flush(); err != nil {
				return n, nil, err
			}
		}
		if err == io.EOF {
			return n, nil, nil
		}
		if err != nil {
			return n, err, nil
		}
	}
}

// idleBody is a client's request body that must not stall: each read pushes the connection's read
// deadline idle ahead.
type idleBody struct {
	io.ReadCloser
	rc   *http.ResponseController
	idle time.Duration

	mu      sync.Mutex
	stopped bool
}

func (b *idleBody) extend() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.stopped {
		_ = b.rc.SetReadDeadline(time.Now().Add(b.idle))
	}
}

func (b *idleBody) stop() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.stopped = true
}

func (b *idleBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == nil {
		b.extend()
	}
	return n, err
}
