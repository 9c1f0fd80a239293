package e2b

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	"toolshed.dev/shed/internal/fdbudget"
	"toolshed.dev/shed/internal/sockdiag"
)

// What the port holds for whom. A connection counts against its peer (a remote address, or on
// loopback the uid that made the client's socket) until a request on it authenticates, then against
// the key's user; a request that does not authenticate is answered 401 from its headers alone, its
// body never read, and its connection closed. So a stranger holds a few connections for a few
// seconds each, and a key's user holds at most its share: neither leaves /health, other users or the
// supervisor's socket without descriptors.
//
// Variables so that tests can shorten them.
var (
	headerTimeout = 5 * time.Second  // a request's line and headers, from the connection or from its first byte
	idleTimeout   = 30 * time.Second // an authenticated keep-alive connection with no request
	bodyTimeout   = 60 * time.Second // a request's body (8 MiB uploads included); a client stream's next message gets streamIdle
	streamIdle    = 10 * time.Minute // between two messages of a client stream (a command's stdin)
	writeTimeout  = 60 * time.Second // each write of an answer (a stream's client that stops reading is dropped)
)

const maxHeader = 64 << 10

// smallBody is the most a refused request's body may be for it to be drained (for a second at most).
const smallBody = 64 << 10

// limits are the port's caps (zero fields: the process's descriptor budget) and its counts.
type limits struct {
	conns, preAuth, perPeer, perUser, inFlight int

	mu      sync.Mutex
	total   int            // connections open
	pre     int            // of which not yet authenticated
	parties map[string]int // connections by party: "peer ..." or "user NAME"
	busy    map[string]int // requests in flight by key's user
	refused atomic.Int64   // requests refused (logged one in a thousand)
}

func (s *Server) limits() *limits {
	s.limOnce.Do(func() {
		b := fdbudget.Process()
		s.lim = &limits{
			conns: cmpOr(s.MaxConns, b.E2BConns), preAuth: cmpOr(s.MaxPreAuth, b.E2BPreAuth),
			perPeer: cmpOr(s.MaxPerPeer, b.E2BPerPeer), perUser: cmpOr(s.MaxPerUser, b.E2BPerUser),
			inFlight: cmpOr(s.MaxInFlight, b.E2BInFlight),
			parties:  map[string]int{}, busy: map[string]int{},
		}
	})
	return s.lim
}

func cmpOr(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}

// conn is an accepted connection and the party it counts against.
type conn struct {
	net.Conn
	lim    *limits
	party  string // guarded by lim.mu
	authed bool   // guarded by lim.mu: party is a key's user
	once   sync.Once
}

func (c *conn) Close() error {
	c.once.Do(func() {
		l := c.lim
		l.mu.Lock()
		defer l.mu.Unlock()
		l.total--
		if !c.authed {
			l.pre--
		}
		if l.parties[c.party]--; l.parties[c.party] <= 0 {
			delete(l.parties, c.party)
		}
	})
	return c.Conn.Close()
}

// admit counts a new connection of peer, or says it is one too many.
func (l *limits) admit(nc net.Conn, peer string) (*conn, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.total >= l.conns || l.pre >= l.preAuth || l.parties[peer] >= l.perPeer {
		return nil, false
	}
	l.total++
	l.pre++
	l.parties[peer]++
	return &conn{Conn: nc, lim: l, party: peer}, true
}

// promote counts c against user from now on, or says the user holds all its share already.
func (l *limits) promote(c *conn, user string) bool {
	party := "user " + user
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.party == party {
		return true
	}
	if l.parties[party] >= l.perUser {
		return false
	}
	if l.parties[c.party]--; l.parties[c.party] <= 0 {
		delete(l.parties, c.party)
	}
	if !c.authed {
		l.pre--
	}
	c.party, c.authed = party, true
	l.parties[party]++
	return true
}

func (l *limits) preAuthConn(c *conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !c.authed
}

// start counts a request of user in flight; release ends it.
func (l *limits) start(user string) (release func(), ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.busy[user] >= l.inFlight {
		return nil, false
	}
	l.busy[user]++
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.busy[user]--; l.busy[user] <= 0 {
			delete(l.busy, user)
		}
	}, true
}

// listener admits connections by peer. One over a cap is answered 503 and closed at once, never
// queued: a peer that holds its share must not stop the others' connections in the kernel's queue.
type listener struct {
	net.Listener
	lim *limits
	log func(peer string)
}

var tooMany = func() []byte {
	msg := "too many connections from this peer at once: close some, then retry\n"
	return fmt.Appendf(nil, "HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s", len(msg), msg)
}()

func (l *listener) Accept() (net.Conn, error) {
	for {
		nc, err := l.Listener.Accept()
		if err != nil {
			return nil, err // net/http backs off on EMFILE and the like
		}
		peer := peerOf(nc)
		if c, ok := l.lim.admit(nc, peer); ok {
			return c, nil
		}
		// A fresh socket's buffer is empty: this write does not wait.
		_ = nc.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
		_, _ = nc.Write(tooMany)
		nc.Close()
		if l.log != nil {
			l.log(peer)
		}
	}
}

// peerOf is who is at the other end of nc, as far as the kernel can tell: on loopback, where every
// local user is 127.0.0.1, the uid that made the client's socket (sock_diag); elsewhere its address,
// an IPv6 one by its /64 (one host's share of addresses).
func peerOf(nc net.Conn) string {
	ra, ok1 := nc.RemoteAddr().(*net.TCPAddr)
	la, ok2 := nc.LocalAddr().(*net.TCPAddr)
	if !ok1 || !ok2 {
		return "peer " + nc.RemoteAddr().String()
	}
	remote, local := ra.AddrPort(), la.AddrPort()
	ip := remote.Addr().Unmap()
	if ip.IsLoopback() {
		if uid, err := sockdiag.TCPOwner(remote, local); err == nil {
			return "peer uid " + strconv.FormatUint(uint64(uid), 10)
		}
	}
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		return "peer " + p.String()
	}
	return "peer " + ip.String()
}

type connKey struct{}

type deadlineKey struct{}

// extendBody gives a client stream's next message streamIdle more (see StreamInput).
func extendBody(ctx context.Context) {
	if rc, ok := ctx.Value(deadlineKey{}).(*http.ResponseController); ok {
		_ = rc.SetReadDeadline(time.Now().Add(streamIdle))
	}
}

// isConnect says whether a path is one of the Connect services'.
func isConnect(path string) bool {
	return strings.HasPrefix(path, "/process.Process/") || strings.HasPrefix(path, "/filesystem.Filesystem/")
}

// userOf is the key's user a request acts as, from its headers alone: the sandbox's, for the data
// plane's token; the key's, for the control plane's key. "" is not authenticated.
func (s *Server) userOf(r *http.Request) string {
	if isConnect(r.URL.Path) || r.URL.Path == "/files" || r.URL.Path == "/health" {
		if sb := s.sandboxOf(r.Header); sb != nil {
			return sb.user
		}
		return ""
	}
	if k := r.Header.Get("X-API-Key"); k != "" {
		if key, err := s.Keys.Lookup(k); err == nil {
			return key.User
		}
	}
	return ""
}

// guard authenticates each request before anything reads its body, counts it against its user, and
// gives its body and each write of its answer a deadline.
func (s *Server) guard(h http.Handler) http.Handler {
	ew := connect.NewErrorWriter()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		lim := s.limits()
		rc := http.NewResponseController(w)
		c, _ := r.Context().Value(connKey{}).(*conn)
		// refuse answers without reading the body, and closes the connection: what is left of the
		// body is never read either (a deadline in the past ends net/http's drain at once).
		refuse := func(status int, code connect.Code, err error) {
			if n := lim.refused.Add(1); n%1000 == 1 {
				s.log().Warn("e2b requests refused", "last", err.Error(), "path", r.URL.Path, "refused", n)
			}
			w.Header().Set("Connection", "close")
			if r.ContentLength != 0 {
				// A stranger's small body that is all but sent (a signed URL's form) gets a second to
				// arrive, so that net/http drains it and the client reads the 401, not a reset. A key's
				// user past its share is not held a second longer.
				d := time.Now()
				if status == http.StatusUnauthorized && r.ContentLength > 0 && r.ContentLength <= smallBody {
					d = d.Add(time.Second)
				}
				_ = rc.SetReadDeadline(d)
			}
			if isConnect(r.URL.Path) {
				_ = ew.Write(w, r, connect.NewError(code, err))
				return
			}
			writeError(w, status, "%v", err)
		}
		// /health without a sandbox is the port's liveness, for anyone; a sandbox's (isRunning) costs a
		// lookup of its Bench, so it is its user's request like any other.
		if r.URL.Path == "/health" && r.Method == http.MethodGet && r.Header.Get("E2b-Sandbox-Id") == "" {
			if c == nil || lim.preAuthConn(c) {
				w.Header().Set("Connection", "close") // a connection that has not authenticated is not kept
			}
			h.ServeHTTP(w, r)
			return
		}
		// A signed URL, or a sandbox made with secure false (secure.go).
		if status, err := s.dataAuth(r); err != nil {
			refuse(status, connect.CodeUnauthenticated, err)
			return
		}
		user := s.userOf(r)
		switch {
		case user == "" && r.URL.Path == "/health":
			refuse(http.StatusBadGateway, connect.CodeUnavailable, errNoSandbox) // E2B's answer for a sandbox that is not running
			return
		case user == "" && (isConnect(r.URL.Path) || r.URL.Path == "/files"):
			refuse(http.StatusUnauthorized, connect.CodeUnauthenticated, errNoSandbox)
			return
		case user == "":
			refuse(http.StatusUnauthorized, connect.CodeUnauthenticated, errNoKey)
			return
		case c != nil && !lim.promote(c, user):
			refuse(http.StatusTooManyRequests, connect.CodeResourceExhausted, errors.New("too many connections of this key's user: close some (idle ones close after "+idleTimeout.String()+")"))
			return
		}
		release, ok := lim.start(user)
		if !ok {
			refuse(http.StatusTooManyRequests, connect.CodeResourceExhausted, errors.New("too many requests of this key's user in flight: wait for some to end"))
			return
		}
		defer release()
		if r.ContentLength != 0 {
			// net/http clears it when the body reaches its end: it then watches for the client's close.
			_ = rc.SetReadDeadline(time.Now().Add(bodyTimeout))
		}
		r = r.WithContext(context.WithValue(r.Context(), deadlineKey{}, rc))
		h.ServeHTTP(&deadlineWriter{ResponseWriter: w, rc: rc}, r)
		_ = rc.SetWriteDeadline(time.Now().Add(writeTimeout)) // for what net/http writes after
	})
}

// deadlineWriter gives each write writeTimeout: a client that stops reading a stream is dropped,
// and one that reads slowly is not.
type deadlineWriter struct {
	http.ResponseWriter
	rc *http.ResponseController
}

func (w *deadlineWriter) Write(b []byte) (int, error) {
	_ = w.rc.SetWriteDeadline(time.Now().Add(writeTimeout))
	return w.ResponseWriter.Write(b)
}

func (w *deadlineWriter) Flush() {
	_ = w.rc.SetWriteDeadline(time.Now().Add(writeTimeout))
	_ = w.rc.Flush()
}

func (w *deadlineWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
