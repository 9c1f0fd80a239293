package e2b

import (
	"context"
	"crypto/subtle"
	"crypto/tls"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"os/user"
	"strconv"
	"strings"
	"time"

	"toolshed.dev/shed/app"
	"toolshed.dev/shed/internal/sockdiag"
)

// EnvdPort is envd's port in an E2B sandbox: its host, 49983-ID.DOMAIN, is this server's data plane
// for that sandbox, not a port of the Bench.
const EnvdPort = 49983

// trafficHeader carries the traffic access token of a sandbox made with allowPublicTraffic false.
const trafficHeader = "E2b-Traffic-Access-Token"

// DefaultDomain is the domain create answers when the server names none: *.localhost is loopback
// (RFC 6761: browsers and curl resolve it so without DNS).
const DefaultDomain = "localhost"

// domain is the sandboxes' domain: the SDK's getHost(port) is PORT-ID.DOMAIN.
func (s *Server) domain() string {
	if s.Domain != "" {
		return s.Domain
	}
	return DefaultDomain
}

// hostOnly is a Host header's or a domain's name, without a port, in lower case.
func hostOnly(h string) string {
	if host, _, err := net.SplitHostPort(h); err == nil {
		h = host
	}
	return strings.ToLower(strings.TrimSuffix(h, "."))
}

// portHost splits a Host under the domain, PORT-ID.DOMAIN, into its label's port and sandbox id.
// under is false for any other host (the API's own address): that is the API.
func (s *Server) portHost(h string) (label string, port int, id string, under bool) {
	name, dom := hostOnly(h), hostOnly(s.domain())
	label, ok := strings.CutSuffix(name, "."+dom)
	if !ok || label == "" || strings.Contains(label, ".") {
		return "", 0, "", false
	}
	p, id, _ := strings.Cut(label, "-")
	n, err := strconv.Atoi(p)
	if err != nil || n < 1 || n > 65535 || p != strconv.Itoa(n) || id == "" {
		return label, 0, id, true
	}
	return label, n, id, true
}

// hosts sends a request for PORT-ID.DOMAIN to the port PORT of sandbox ID, and one for envd's port
// there (49983-ID.DOMAIN, the SDK's data plane when E2B_SANDBOX_URL is unset) to this API for that
// sandbox. Every other host is the API's.
func (s *Server) hosts(api http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		label, port, id, under := s.portHost(r.Host)
		switch {
		case !under:
			api.ServeHTTP(w, r)
		case port == 0:
			dropBody(w, r, true)
			writeError(w, http.StatusBadRequest, "host %q: a sandbox's port is PORT-ID.%s, PORT from 1 to 65535 (the SDK's getHost(port) makes it)", label+"."+hostOnly(s.domain()), hostOnly(s.domain()))
		case port == EnvdPort:
			// The host names the sandbox: the SDK's requests say it again; a signed URL's do not.
			if r.Header.Get("E2b-Sandbox-Id") == "" {
				r.Header.Set("E2b-Sandbox-Id", id)
			}
			api.ServeHTTP(w, r)
		default:
			s.port(w, r, id, port)
		}
	})
}

// portError is the body of E2B's proxy's refusals: a sandbox that is not running (no port), a port
// nothing listens on.
type portError struct {
	SandboxID string `json:"sandboxId"`
	Message   string `json:"message"`
	Port      int    `json:"port,omitempty"`
	Code      int    `json:"code"`
}

func writePortError(w http.ResponseWriter, status int, id string, port int, msg string) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(portError{SandboxID: id, Message: msg, Port: port, Code: status})
}

const (
	msgNotFound   = "The sandbox was not found"
	msgPortClosed = "The sandbox is running but port is not open"
)

// port proxies a request (HTTP, or a WebSocket's upgrade and then its bytes) to a port on the
// loopback of sandbox id. Who may: with the sandbox's traffic access token, anyone (a sandbox made
// with allowPublicTraffic false needs it); without, on loopback, where the kernel names the client's
// user, the sandbox's owner and root only, and off loopback anyone (E2B's public URLs: the address
// the daemon serves is the operator's choice, loopback by default).
func (s *Server) port(w http.ResponseWriter, r *http.Request, id string, port int) {
	start := time.Now()
	status := http.StatusBadGateway
	defer func() {
		s.log().Info("e2b port request", "sandbox", id, "port", port, "method", r.Method, "status", status, "ms", time.Since(start).Milliseconds())
	}()
	s.mu.Lock()
	sb := s.sandboxes[id]
	s.mu.Unlock()
	if sb == nil || !s.keyLive(sb.keyID) {
		dropBody(w, r, true)
		writePortError(w, status, id, 0, msgNotFound)
		return
	}
	if why := s.mayReach(r, sb); why != "" {
		status = http.StatusForbidden
		dropBody(w, r, true)
		writePortError(w, status, id, port, why)
		return
	}
	lim := s.limits()
	if c, _ := r.Context().Value(connKey{}).(*conn); c != nil && !lim.promote(c, sb.user) {
		status = http.StatusTooManyRequests
		dropBody(w, r, false)
		writeError(w, status, "too many connections of this sandbox's owner: close some")
		return
	}
	release, ok := lim.start(sb.user)
	if !ok {
		status = http.StatusTooManyRequests
		dropBody(w, r, false)
		writeError(w, status, "too many requests of this sandbox's owner in flight: wait for some to end")
		return
	}
	defer release()
	c, err := s.callerOfUser(sb.user, sb.keyID)
	if err != nil {
		writePortError(w, status, id, 0, msgNotFound)
		return
	}
	if sb.autoResume && !s.wake(r, c, sb) {
		writePortError(w, status, id, 0, msgNotFound)
		return
	}
	host := r.Host
	if sb.maskHost != "" {
		host = strings.ReplaceAll(sb.maskHost, "${PORT}", strconv.Itoa(port))
	}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = "http", net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
			pr.Out.Host = host
			// The token is the caller's proof, never the sandbox's to read.
			pr.Out.Header.Del(trafficHeader)
			pr.SetXForwarded()
		},
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return s.Service.DialPort(ctx, &app.Call{Caller: c}, sb.bench, port)
			},
			DisableKeepAlives: true, // one connection in the Bench per request: nothing pooled outlives it
		},
		FlushInterval: -1, // streams (server-sent events) as they come
		// A client or server that goes away mid-body is theirs to see, not the supervisor's log's.
		ErrorLog: slog.NewLogLogger(s.log().Handler(), slog.LevelDebug),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			switch {
			case errors.Is(err, app.ErrPortClosed):
				writePortError(w, http.StatusBadGateway, id, port, msgPortClosed)
			case errors.Is(err, app.ErrNotRunning):
				// The Bench ended (its timeout, a kill, `shed bench rm`): E2B's answer for a sandbox
				// that is gone.
				writePortError(w, http.StatusBadGateway, id, 0, msgNotFound)
			default:
				s.log().Warn("e2b port", "sandbox", id, "port", port, "err", err)
				writePortError(w, http.StatusBadGateway, id, port, "the sandbox's server on this port failed: "+err.Error())
			}
		},
	}
	sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
	proxy.ServeHTTP(sw, r)
	status = sw.status
}

// dropBody ends a refused request's connection after the answer, as guard's refusals do: its body is
// not read, but with grace a small one gets a second (so that its client reads the answer, not a
// reset); an owner past its share gets none.
func dropBody(w http.ResponseWriter, r *http.Request, grace bool) {
	w.Header().Set("Connection", "close")
	if r.ContentLength != 0 {
		d := time.Now()
		if grace && r.ContentLength > 0 && r.ContentLength <= smallBody {
			d = d.Add(time.Second)
		}
		_ = http.NewResponseController(w).SetReadDeadline(d)
	}
}

// mayReach says why the request may not reach sb's ports, or "".
func (s *Server) mayReach(r *http.Request, sb *sandbox) string {
	if tok := r.Header.Get(trafficHeader); tok != "" || sb.traffic != "" {
		if sb.traffic != "" && subtle.ConstantTimeCompare([]byte(tok), []byte(sb.traffic)) == 1 {
			return ""
		}
		if sb.traffic == "" {
			return "this sandbox has no traffic access token (it was made with allowPublicTraffic true): send none"
		}
		return "this sandbox was made with allowPublicTraffic false: send its trafficAccessToken in the e2b-traffic-access-token header"
	}
	uid, local := peerUID(r)
	if !local {
		return ""
	}
	if uid == 0 || uid == ownerUID(sb.user) {
		return ""
	}
	return "this sandbox is another user's: on this host only its owner reaches its ports without its traffic access token"
}

// peerUID is the uid of the client of r's connection when it is on loopback (local true), as the
// kernel tells (sock_diag).
func peerUID(r *http.Request) (uid uint32, local bool) {
	var nc net.Conn
	switch c := r.Context().Value(connKey{}).(type) {
	case *conn:
		nc = c.Conn
	case net.Conn:
		nc = c
	}
	if nc == nil {
		return 0, false
	}
	ra, ok1 := nc.RemoteAddr().(*net.TCPAddr)
	la, ok2 := nc.LocalAddr().(*net.TCPAddr)
	if !ok1 || !ok2 || !ra.AddrPort().Addr().Unmap().IsLoopback() {
		return 0, false
	}
	u, err := sockdiag.TCPOwner(ra.AddrPort(), la.AddrPort())
	if err != nil {
		return ^uint32(0), true // on loopback but unknown: no one's
	}
	return u, true
}

// ownerUID is the uid of the user named, or one no socket has.
func ownerUID(name string) uint32 {
	u, err := user.Lookup(name)
	if err != nil {
		return ^uint32(0)
	}
	n, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return ^uint32(0)
	}
	return uint32(n)
}

// networkAccess takes what create's network object says of the sandbox's URLs (allowPublicTraffic,
// maskRequestHost) out of it, and returns the rest for the checks of the other fields.
func networkAccess(raw json.RawMessage) (public bool, mask string, rest json.RawMessage, err error) {
	public = true
	if s := strings.TrimSpace(string(raw)); s == "" || s == "null" {
		return public, "", raw, nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return false, "", nil, errors.New("network: an object")
	}
	if v, ok := m["allowPublicTraffic"]; ok {
		if err := json.Unmarshal(v, &public); err != nil {
			return false, "", nil, errors.New("network.allowPublicTraffic: true or false")
		}
		delete(m, "allowPublicTraffic")
	}
	if v, ok := m["maskRequestHost"]; ok {
		if err := json.Unmarshal(v, &mask); err != nil || !validMask(mask) {
			return false, "", nil, errors.New("network.maskRequestHost: a host name (${PORT} stands for the port), without spaces or control characters")
		}
		delete(m, "maskRequestHost")
	}
	if len(m) == 0 {
		return public, mask, nil, nil
	}
	rest, _ = json.Marshal(m)
	return public, mask, rest, nil
}

func validMask(m string) bool {
	if m == "" || len(m) > 253 {
		return m == ""
	}
	for _, r := range m {
		if r <= ' ' || r == 0x7f || r == '/' || r == '\\' {
			return false
		}
	}
	return true
}

// tlsConn is the connection a TLS connection wraps (the limits count that one).
func tlsConn(c net.Conn) net.Conn {
	if tc, ok := c.(*tls.Conn); ok {
		return tc.NetConn()
	}
	return c
}
