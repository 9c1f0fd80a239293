package proxy

import (
	"bytes"
	"cmp"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"
)

// Broker makes a Proxy put credentials into a sandbox's requests at egress, so that the sandbox holds
// only placeholders (docs/proxy.md, "Brokered credentials"). A CONNECT to a destination that one of its
// credentials is bound to, or that an injection names, is not tunnelled but terminated with a
// certificate of CA; the request inside goes on to the real server over a TLS connection of the
// proxy's own, verified as any client verifies it. Every other CONNECT stays a tunnel, end to end.
type Broker struct {
	// CA signs the certificates the sandbox sees for terminated destinations. It is the sandbox's
	// own, made at launch; its key is in this process only.
	CA *CA
	// Secrets are the sandbox's placeholders.
	Secrets []Brokered
	// Inject are headers set on every request to a destination (E2B's network transforms): their
	// values may name secrets as ${e2b.secrets.NAME}.
	Inject []Injection
	// Lookup returns a secret's credential as it is now (asked at every request, so that a revoked
	// or rotated secret counts at the next one); nil and no error when it is gone.
	Lookup func(name string) (*Credential, error)
	// Roots verify the real servers; nil: the system's (SSL_CERT_FILE applies).
	Roots *x509.CertPool
	// Terminate are destinations terminated whatever Lookup says now (those the secrets were bound
	// to at launch): a secret revoked since is refused there by name, not tunnelled unreplaced.
	Terminate []Rule
}

// Brokered is a secret a sandbox may use, and the placeholder it holds for it.
type Brokered struct {
	Name        string
	Placeholder string
}

// Credential is a secret's value and where it may go.
type Credential struct {
	Value []byte
	// Hosts are the destinations it is bound to (Port 0: 443); none: only where an Injection of the
	// sandbox's own launch puts it.
	Hosts []Rule
	Place Place
	// Body lets its placeholder be replaced in request bodies to Hosts (at most MaxBrokeredBody).
	Body bool
}

// Place is where in a request a placeholder is replaced by its value.
type Place struct {
	Header, Template string // the header, and its value with "{}" for the placeholder
	Basic            bool   // the user or password of basic auth
	Query            string // a query parameter
}

// Injection sets Header to Value on every HTTPS request to Host:Port (Port 0: 443), replacing what
// the sandbox sent there. Host is a name, an IP literal, or "*.NAME" for NAME's subdomains at any
// depth; as E2B's rules, an exact host's injections take precedence over wildcards', and the longest
// matching wildcard's over the others', and those of different hosts are not merged.
type Injection struct {
	Host   string
	Port   int
	Header string
	Value  string
}

// MaxBrokeredBody bounds a request body in which a placeholder is replaced: it is read whole.
const MaxBrokeredBody = 1 << 20

// secretRefRE is E2B's reference to a secret in an injected header.
var secretRefRE = regexp.MustCompile(`\$\{e2b\.secrets\.([^{}]+)\}`)

// SecretRefs returns the names of the secrets that an injection's value names.
func SecretRefs(value string) []string {
	var names []string
	for _, m := range secretRefRE.FindAllStringSubmatch(value, -1) {
		names = append(names, m[1])
	}
	return names
}

func (c *Credential) bound(t target) bool {
	for _, h := range c.Hosts {
		port := h.Port
		if port == 0 {
			port = 443
		}
		if canonicalHost(h.Host) == t.host && port == t.port {
			return true
		}
	}
	return false
}

// match says how well in names t: 0 not at all, else the more the better (exact above wildcards,
// a longer wildcard above a shorter one).
func (in Injection) match(t target) int {
	port := cmp.Or(in.Port, 443)
	if port != t.port {
		return 0
	}
	h := canonicalHost(in.Host)
	if h == t.host {
		return 1 << 16
	}
	if suffix, ok := strings.CutPrefix(h, "*"); ok && strings.HasPrefix(suffix, ".") && len(suffix) > 1 && strings.HasSuffix(t.host, suffix) && len(t.host) > len(suffix) {
		return len(suffix)
	}
	return 0
}

// injections are the injections of the host key that names t best.
func (b *Broker) injections(t target) []Injection {
	best, key := 0, ""
	for _, in := range b.Inject {
		if m := in.match(t); m > best {
			best, key = m, in.Host
		}
	}
	var out []Injection
	for _, in := range b.Inject {
		if best > 0 && in.Host == key && in.match(t) == best {
			out = append(out, in)
		}
	}
	return out
}

// terminates reports whether a CONNECT to t is terminated: a credential is bound to it, or an
// injection names it.
func (b *Broker) terminates(t target) bool {
	if b == nil {
		return false
	}
	if len(b.injections(t)) > 0 {
		return true
	}
	if (&Credential{Hosts: b.Terminate}).bound(t) {
		return true
	}
	for _, s := range b.Secrets {
		if c, err := b.Lookup(s.Name); err == nil && c != nil && c.bound(t) {
			return true
		}
	}
	return false
}

// refusal is a request refused for a secret's sake. It names the secret, never its value.
type refusal struct{ secret, why string }

func (r *refusal) Error() string { return "secret " + r.secret + ": " + r.why }

// request is the broker's work on one request: the credentials it looked up and the values it put in
// (to be masked in the answer).
type request struct {
	b     *Broker
	t     target
	tls   bool
	creds map[string]*Credential
	used  [][]byte
}

func (q *request) lookup(name string) (*Credential, error) {
	if c, ok := q.creds[name]; ok {
		return c, nil
	}
	c, err := q.b.Lookup(name)
	if err != nil {
		return nil, err
	}
	q.creds[name] = c
	return c, nil
}

// may says whether the named secret may go to this request's destination, or why not.
func (q *request) may(name string, injected bool) (*Credential, *refusal) {
	c, err := q.lookup(name)
	switch {
	case err != nil:
		return nil, &refusal{name, "cannot be read (the supervisor's log says why)"}
	case c == nil:
		return nil, &refusal{name, "revoked"}
	case !q.tls:
		return nil, &refusal{name, "secrets go over https only, not to http://" + q.t.String()}
	case len(c.Hosts) == 0 && injected:
		return c, nil
	case !c.bound(q.t):
		return nil, &refusal{name, "not bound to " + q.t.String()}
	}
	return c, nil
}

// prepare rewrites out, a request to q.t, for the broker: each placeholder at its secret's place
// becomes the value (a placeholder elsewhere in a request to a bound host goes as it is: it is
// worthless there), the injections are set, and the body is checked: read whole first when it is at
// most MaxBrokeredBody long, else as it streams (a placeholder then stops it on its way). A
// placeholder of a secret that may not go to the destination refuses the request.
func (q *request) prepare(out *http.Request) *refusal {
	for _, s := range q.b.Secrets {
		ph := s.Placeholder
		if !strings.Contains(out.URL.RawQuery, ph) && !strings.Contains(out.URL.EscapedPath(), ph) && !headersHold(out.Header, ph) {
			continue
		}
		c, ref := q.may(s.Name, false)
		if ref != nil {
			return ref
		}
		q.place(out, c, ph)
	}
	// Every value that may go here is masked in the answer, sent in this request or not: an API
	// that stores what it got (a body with --body) would hand it back to a later request.
	for _, s := range q.b.Secrets {
		if c, ref := q.may(s.Name, false); ref == nil {
			q.use(c.Value)
		}
	}
	for _, in := range q.b.injections(q.t) {
		if !q.tls {
			break // E2B's transforms are for HTTPS requests
		}
		v := in.Value
		for _, name := range SecretRefs(in.Value) {
			c, ref := q.may(name, true)
			if ref != nil {
				return ref
			}
			v = strings.ReplaceAll(v, "${e2b.secrets."+name+"}", string(c.Value))
			q.use(c.Value)
		}
		out.Header.Set(in.Header, v)
	}
	if out.Body == nil {
		return nil
	}
	// A body to a bound host whose credential allows it is read whole and its placeholders replaced;
	// any other body streams through a check that stops it before a placeholder that may not go there.
	var pats [][]byte
	var names []string
	replace := false
	for _, s := range q.b.Secrets {
		pats, names = append(pats, []byte(s.Placeholder)), append(names, s.Name)
		if c, ref := q.may(s.Name, false); ref == nil && c.Body {
			replace = true
		}
	}
	if replace || out.ContentLength > 0 && out.ContentLength <= MaxBrokeredBody {
		// Read whole and checked before a byte of the request leaves: a placeholder that may not go
		// there refuses it before the destination hears of it.
		return q.replaceBody(out)
	}
	out.Body = &scanner{src: out.Body, pats: pats, act: func(i int) ([]byte, error) {
		if _, ref := q.may(names[i], false); ref != nil {
			return nil, ref
		}
		return pats[i], nil // bound there, but not in bodies: it goes as it is
	}}
	return nil
}

func (q *request) replaceBody(out *http.Request) *refusal {
	b, err := io.ReadAll(io.LimitReader(out.Body, MaxBrokeredBody+1))
	out.Body.Close()
	if err != nil {
		return &refusal{"", "reading the request body: " + err.Error()}
	}
	if len(b) > MaxBrokeredBody {
		return &refusal{"", fmt.Sprintf("a body in which secrets are replaced is at most %d bytes", MaxBrokeredBody)}
	}
	for _, s := range q.b.Secrets {
		if !bytes.Contains(b, []byte(s.Placeholder)) {
			continue
		}
		c, ref := q.may(s.Name, false)
		if ref != nil {
			return ref
		}
		if c.Body {
			b = bytes.ReplaceAll(b, []byte(s.Placeholder), c.Value)
		}
	}
	out.Body, out.ContentLength = io.NopCloser(bytes.NewReader(b)), int64(len(b))
	out.Header.Del("Content-Length")
	return nil
}

// headersHold reports whether a header's name or value holds s, basic auth's decoded too.
func headersHold(h http.Header, s string) bool {
	if u, p, ok := (&http.Request{Header: h}).BasicAuth(); ok && (strings.Contains(u, s) || strings.Contains(p, s)) {
		return true
	}
	for k, vs := range h {
		if strings.Contains(k, s) {
			return true
		}
		for _, v := range vs {
			if strings.Contains(v, s) {
				return true
			}
		}
	}
	return false
}

// use adds v to the values masked in the answer, with the forms a request carries it in (escaped in
// a URL, base64 as basic auth does), and extra forms.
func (q *request) use(v []byte, extra ...string) {
	forms := append([]string{string(v), url.QueryEscape(string(v)), url.PathEscape(string(v)), base64.StdEncoding.EncodeToString(v), base64.RawStdEncoding.EncodeToString(v)}, extra...)
	for _, f := range forms {
		if f != "" && !slices.ContainsFunc(q.used, func(u []byte) bool { return string(u) == f }) {
			q.used = append(q.used, []byte(f))
		}
	}
}

// scrub masks the values used in s (an error that may quote the server's bytes).
func (q *request) scrub(s string) string {
	for _, u := range q.used {
		s = strings.ReplaceAll(s, string(u), strings.Repeat("*", len(u)))
	}
	return s
}

// place replaces ph by c's value where c's place is in out, and reports whether it did.
func (q *request) place(out *http.Request, c *Credential, ph string) bool {
	p, done := c.Place, false
	if p.Header != "" {
		defer func() {
			if done {
				q.use(c.Value)
			}
		}()
	}
	switch {
	case p.Header != "":
		want := strings.Replace(p.Template, "{}", ph, 1)
		vs := out.Header.Values(p.Header)
		for i, v := range vs {
			if strings.TrimSpace(v) == want {
				vs[i], done = strings.Replace(p.Template, "{}", string(c.Value), 1), true
			}
		}
	case p.Basic:
		user, pass, ok := out.BasicAuth()
		if ok && (user == ph || pass == ph) {
			if user == ph {
				user = string(c.Value)
			}
			if pass == ph {
				pass = string(c.Value)
			}
			cred := base64.StdEncoding.EncodeToString([]byte(user + ":" + pass))
			out.Header.Set("Authorization", "Basic "+cred)
			q.use(c.Value, cred)
			done = true
		}
	case p.Query != "":
		// Only the parameter's value is replaced, in place: the query's order and encoding stay
		// (a signed URL's signature covers them).
		pairs := strings.Split(out.URL.RawQuery, "&")
		for i, pair := range pairs {
			k, v, _ := strings.Cut(pair, "=")
			if uk, err := url.QueryUnescape(k); err == nil && uk == p.Query {
				if uv, err := url.QueryUnescape(v); err == nil && uv == ph {
					pairs[i], done = k+"="+url.QueryEscape(string(c.Value)), true
				}
			}
		}
		if done {
			out.URL.RawQuery = strings.Join(pairs, "&")
		}
	}
	if done {
		q.use(c.Value)
	}
	return done
}

// mask hides the values used in a request from its answer (a server that echoes what it got): each
// becomes as many '*', so that lengths stay right.
func (q *request) mask(resp *http.Response) {
	if len(q.used) == 0 {
		return
	}
	q.maskHeader(resp.Header)
	used := q.used
	resp.Body = &scanner{src: resp.Body, pats: used, act: func(i int) ([]byte, error) {
		return bytes.Repeat([]byte("*"), len(used[i])), nil
	}}
}

// maskHeader masks the values used in h (an answer's header or trailer).
func (q *request) maskHeader(h http.Header) {
	for _, vs := range h {
		for i, v := range vs {
			vs[i] = q.scrub(v)
		}
	}
}

// scanner streams src, handing each occurrence of one of pats to act, which returns what goes in its
// place or an error that ends the stream there. No byte of an occurrence is returned before act
// decided: it holds back the longest pattern's length less one.
type scanner struct {
	src  io.ReadCloser
	pats [][]byte
	act  func(i int) ([]byte, error)

	buf, out []byte
	err      error // src's end or failure, returned once buf and out are empty
}

func (s *scanner) Read(p []byte) (int, error) {
	for len(s.out) == 0 {
		if len(s.buf) == 0 && s.err != nil {
			return 0, s.err
		}
		if s.err == nil {
			var chunk [32 << 10]byte
			n, err := s.src.Read(chunk[:])
			s.buf = append(s.buf, chunk[:n]...)
			s.err = err
		}
		longest := 0
		for _, pat := range s.pats {
			longest = max(longest, len(pat))
		}
		at, which := -1, -1
		for i, pat := range s.pats {
			if len(pat) == 0 {
				continue
			}
			// The earliest match; at one place, the longest pattern (a value may begin another).
			if j := bytes.Index(s.buf, pat); j >= 0 && (at < 0 || j < at || j == at && len(pat) > len(s.pats[which])) {
				at, which = j, i
			}
		}
		if at >= 0 && s.err == nil && len(s.buf) < at+longest {
			// A longer pattern may still match here, or begin before here, once more bytes come:
			// decide then. What goes now is what no pattern can begin in: before the match, and
			// before the last longest-1 bytes (a match begun earlier would have been found).
			if n := min(at, max(0, len(s.buf)-(longest-1))); n > 0 {
				s.out = append(s.out, s.buf[:n]...)
				s.buf = append([]byte(nil), s.buf[n:]...)
			}
			continue
		}
		if at >= 0 {
			repl, err := s.act(which)
			if err != nil {
				s.out = append(s.out, s.buf[:at]...)
				s.buf, s.err = nil, err
				continue
			}
			s.out = append(append(s.out, s.buf[:at]...), repl...)
			s.buf = s.buf[at+len(s.pats[which]):]
			continue
		}
		keep := 0
		if s.err == nil {
			keep = max(longest-1, 0)
		}
		if len(s.buf) > keep {
			s.out = append(s.out, s.buf[:len(s.buf)-keep]...)
			s.buf = append([]byte(nil), s.buf[len(s.buf)-keep:]...)
		}
	}
	n := copy(p, s.out)
	s.out = s.out[n:]
	return n, nil
}

func (s *scanner) Close() error { return s.src.Close() }

// CA is a sandbox's own certificate authority: it signs the certificates its proxy shows for the
// destinations it terminates. The key never leaves this process and is dropped with the CA.
type CA struct {
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	leafKey *ecdsa.PrivateKey
	pem     []byte

	mu     sync.Mutex
	leaves map[string]*tls.Certificate
}

// NewCA makes a CA named name (the sandbox's, for a reader of its certificate).
func NewCA(name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "shed proxy CA for " + name, Organization: []string{"Toolshed"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.AddDate(1, 0, 0),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{cert: cert, key: key, leafKey: leafKey, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), leaves: map[string]*tls.Certificate{}}, nil
}

// PEM is the CA's certificate, for the sandbox to trust.
func (c *CA) PEM() []byte { return c.pem }

// leaf returns the certificate for host (a name or an IP literal), made once.
func (c *CA) leaf(host string) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if l, ok := c.leaves[host]; ok {
		return l, nil
	}
	serial, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: host},
		NotBefore:    c.cert.NotBefore,
		NotAfter:     c.cert.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if a, err := netip.ParseAddr(host); err == nil {
		tmpl.IPAddresses = []net.IP{a.AsSlice()}
	} else {
		tmpl.DNSNames = []string{host}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &c.leafKey.PublicKey, c.key)
	if err != nil {
		return nil, err
	}
	l := &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: c.leafKey}
	c.leaves[host] = l
	return l, nil
}

// errNotTunnelHost is a request inside a terminated tunnel for another host than the tunnel's.
var errNotTunnelHost = errors.New("the request's host is not the tunnel's")

// terminate serves an allowed CONNECT to a destination the broker terminates: TLS with a certificate
// of the sandbox's CA, then HTTP/1.1 requests, each forwarded to the real destination over TLS.
func (s *server) terminate(w http.ResponseWriter, r *http.Request, t target, addrs []netip.Addr, d *Decision) {
	client, rw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		d.Reason = "hijack: " + err.Error()
		refuse(w, http.StatusInternalServerError, true, "shed proxy: cannot open a tunnel")
		return
	}
	defer client.Close()
	ex := &exchange{host: t.host, addrs: addrs, cut: func() { client.Close() }}
	if !s.p.begin(ex) {
		io.WriteString(client, "HTTP/1.1 403 Forbidden\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
		d.Reason = "denied by network rules"
		return
	}
	defer s.p.end(ex)
	d.Allowed, d.Brokered = true, true
	// Serve's context is the tunnel's lifetime, not the CONNECT's: net/http ended that one after the
	// first request inside (seen in tests), which would cut a kept-alive connection.
	stop := context.AfterFunc(s.ctx, func() { client.Close() })
	defer stop()
	client.SetDeadline(time.Now().Add(s.p.headerTimeout))
	if _, err := io.WriteString(client, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		d.Reason = "client: " + err.Error()
		return
	}
	conn := &bufferedConn{Conn: client, r: rw.Reader}
	tc := tls.Server(conn, &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"http/1.1"},
		GetCertificate: func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
			// The name the client asks for is the tunnel's, or none (an IP literal's).
			if hello.ServerName != "" && canonicalHost(strings.TrimSuffix(hello.ServerName, ".")) != t.host {
				return nil, fmt.Errorf("server name %q is not the tunnel's %s", hello.ServerName, t.host)
			}
			return s.p.broker.CA.leaf(t.host)
		},
	})
	if err := tc.Handshake(); err != nil {
		d.Reason = "client: tls: " + err.Error()
		return
	}
	client.SetDeadline(time.Time{})
	l := &oneConn{c: tc, done: make(chan struct{})}
	inner := &http.Server{
		Handler:           http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { s.brokered(w, r, t, addrs) }),
		ReadHeaderTimeout: s.p.headerTimeout,
		IdleTimeout:       s.p.idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          s.errorLog,
		BaseContext:       func(net.Listener) context.Context { return s.ctx },
		ConnState: func(_ net.Conn, st http.ConnState) {
			if st == http.StateClosed || st == http.StateHijacked {
				l.Close()
			}
		},
	}
	inner.Serve(l)
	<-l.done
}

// brokered serves one request inside a terminated tunnel to t.
func (s *server) brokered(w http.ResponseWriter, r *http.Request, t target, addrs []netip.Addr) {
	s.wg.Add(1)
	defer s.wg.Done()
	d := Decision{Time: time.Now(), Method: r.Method, Host: t.host, Port: t.port, Brokered: true}
	defer func() { s.p.record(d) }()
	if r.ContentLength != 0 {
		_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(s.p.idleTimeout))
	}
	// The request goes where the CONNECT said, and its credentials with it: a Host header, or an
	// absolute URL, that names another host is refused, not followed.
	host := r.Host
	if r.URL.Host != "" {
		host = r.URL.Host
	}
	if h, p, err := net.SplitHostPort(host); err == nil {
		if p != fmt.Sprint(t.port) {
			host = "" // another port
		} else {
			host = h
		}
	}
	if canonicalHost(strings.Trim(host, "[]")) != t.host {
		d.Reason = errNotTunnelHost.Error()
		w.Header().Set("Connection", "close")
		http.Error(w, "shed proxy: "+errNotTunnelHost.Error()+" ("+t.String()+")", http.StatusMisdirectedRequest)
		return
	}
	s.forwardTo(w, r, t, addrs, &d, "https")
}

// bufferedConn reads first what net/http read ahead of a hijack.
type bufferedConn struct {
	net.Conn
	r io.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// oneConn is a listener that yields one connection, then waits until it is closed.
type oneConn struct {
	c    net.Conn
	once sync.Once
	done chan struct{}
	shut sync.Once
}

func (l *oneConn) Accept() (net.Conn, error) {
	var c net.Conn
	l.once.Do(func() { c = l.c })
	if c != nil {
		return c, nil
	}
	<-l.done
	return nil, net.ErrClosed
}

func (l *oneConn) Close() error {
	l.shut.Do(func() { close(l.done) })
	return nil
}

func (l *oneConn) Addr() net.Addr { return l.c.LocalAddr() }

// CheckInjection refuses an injection that could not be what its caller meant or that would corrupt
// a request: a host that is not a name, an IP literal or "*.name", a header that is not a token or is
// one the proxy owns (Host, Proxy-*, the framing and hop-by-hop headers), a value with control
// characters.
func CheckInjection(in Injection) error {
	host := strings.TrimPrefix(in.Host, "*.")
	if !validHost(canonicalHost(host)) || strings.HasSuffix(host, ".") || strings.Contains(host, "*") {
		return fmt.Errorf("host %q: a DNS name, an IP address or *.NAME", in.Host)
	}
	if in.Port < 0 || in.Port > 65535 {
		return fmt.Errorf("port %d out of range", in.Port)
	}
	if in.Header == "" || strings.IndexFunc(in.Header, func(r rune) bool {
		return !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || strings.ContainsRune("!#$%&'*+-.^_`|~", r))
	}) >= 0 {
		return fmt.Errorf("header %q: not a header name", in.Header)
	}
	h := http.CanonicalHeaderKey(in.Header)
	if h == "Host" || h == "Content-Length" || strings.HasPrefix(h, "Proxy-") || slices.Contains(hopHeaders, h) {
		return fmt.Errorf("header %q: the proxy's own, not a header to set", in.Header)
	}
	if strings.ContainsFunc(in.Value, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return fmt.Errorf("header %s: the value holds a control character", in.Header)
	}
	return nil
}
