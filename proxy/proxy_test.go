package proxy_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"toolshed.dev/shed/proxy"
)

// Tests send traffic to loopback only: the proxies they start get a resolver that cannot reach a DNS
// server and a dialer that fails the test for any other address.

const bigSize = 50 << 20

var bigBody = sync.OnceValue(func() []byte {
	b := make([]byte, bigSize)
	rand.NewChaCha8([32]byte{1}).Read(b)
	return b
})

// newUpstream serves /big (50 MB), /small and /headers (the request's headers as JSON, Host included).
func newUpstream(t testing.TB, tlsServer bool) *httptest.Server {
	mux := http.NewServeMux()
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(bigSize))
		w.Write(bigBody())
	})
	mux.HandleFunc("/small", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "small body\n")
	})
	mux.HandleFunc("/headers", func(w http.ResponseWriter, r *http.Request) {
		h := r.Header.Clone()
		h.Set("Host", r.Host)
		w.Header().Set("Connection", "X-Resp-Hop")
		w.Header().Set("X-Resp-Hop", "1")
		w.Header().Set("Keep-Alive", "timeout=5")
		w.Header().Set("X-Resp-Keep", "1")
		json.NewEncoder(w).Encode(h)
	})
	var s *httptest.Server
	if tlsServer {
		s = httptest.NewTLSServer(mux)
	} else {
		s = httptest.NewServer(mux)
	}
	t.Cleanup(s.Close)
	return s
}

// newEcho starts a TCP server on loopback that echoes what it reads and closes after the client's EOF.
func newEcho(t testing.TB) netip.AddrPort {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { l.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	return netip.MustParseAddrPort(l.Addr().String())
}

func hostPort(t testing.TB, rawURL string) (string, int) {
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	port, _ := strconv.Atoi(u.Port())
	return u.Hostname(), port
}

type recorder struct {
	mu sync.Mutex
	ds []proxy.Decision
}

func (r *recorder) log(d proxy.Decision) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ds = append(r.ds, d)
}

// wait returns the decisions once there are n (a Decision is logged when its exchange ends, which may
// be just after the client has read the last byte).
func (r *recorder) wait(t testing.TB, n int) []proxy.Decision {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		r.mu.Lock()
		ds := append([]proxy.Decision(nil), r.ds...)
		r.mu.Unlock()
		if len(ds) >= n || time.Now().After(deadline) {
			if len(ds) != n {
				t.Fatalf("got %d decisions, want %d: %+v", len(ds), n, ds)
			}
			return ds
		}
	}
}

type running struct {
	addr   string // the proxy's listening address
	url    *url.URL
	rec    *recorder
	cancel context.CancelFunc
	done   chan error
}

// stop cancels Serve and returns its result.
func (r *running) stop(t testing.TB) error {
	t.Helper()
	r.cancel()
	select {
	case err := <-r.done:
		r.done <- err // stop may be called again (Cleanup)
		return err
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return within 5 s of cancellation")
		return nil
	}
}

func loopbackOnly(t testing.TB) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		ap, err := netip.ParseAddrPort(addr)
		if err != nil || !ap.Addr().Unmap().IsLoopback() {
			t.Errorf("proxy dialed %s %s: tests reach loopback only", network, addr)
			return nil, errors.New("test: not a loopback address")
		}
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
}

// noDNS is a resolver that cannot send a query.
var noDNS = &net.Resolver{PreferGo: true, Dial: func(context.Context, string, string) (net.Conn, error) {
	return nil, errors.New("test: no DNS")
}}

func start(t testing.TB, cfg proxy.Config) *running {
	t.Helper()
	rec := &recorder{}
	if cfg.Log == nil {
		cfg.Log = rec.log
	}
	if cfg.Dial == nil {
		cfg.Dial = loopbackOnly(t)
	}
	if cfg.Resolver == nil {
		cfg.Resolver = noDNS
	}
	p, err := proxy.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{addr: l.Addr().String(), url: &url.URL{Scheme: "http", Host: l.Addr().String()}, rec: rec,
		cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- p.Serve(ctx, l) }()
	t.Cleanup(func() {
		if err := r.stop(t); err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return r
}

func clientVia(proxyURL *url.URL, tlsConfig *tls.Config) *http.Client {
	return &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxyURL), TLSClientConfig: tlsConfig}}
}

// rawRequest sends req as is on a new connection to the proxy and reads one response.
func rawRequest(t testing.TB, addr, req string) (*http.Response, string, net.Conn) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("read response to %q: %v", req, err)
	}
	if strings.HasPrefix(req, "CONNECT ") && resp.StatusCode == 200 {
		return resp, "", &bufConn{c, br} // the tunnel follows, not a body
	}
	body, _ := io.ReadAll(resp.Body)
	return resp, string(body), &bufConn{c, br}
}

type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufConn) Read(b []byte) (int, error) { return c.r.Read(b) }

func TestGetLarge(t *testing.T) {
	up := newUpstream(t, false)
	host, port := hostPort(t, up.URL)
	px := start(t, proxy.Config{Allow: []proxy.Rule{{Host: host, Port: port}}, AllowPrivate: true})
	c := clientVia(px.url, nil)
	defer c.CloseIdleConnections()

	resp, err := c.Get(up.URL + "/big")
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	n, err := io.Copy(h, resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || n != bigSize {
		t.Fatalf("got status %d, %d bytes; want 200, %d bytes", resp.StatusCode, n, bigSize)
	}
	if got, want := h.Sum(nil), sha256.Sum256(bigBody()); !bytes.Equal(got, want[:]) {
		t.Fatalf("body sha256 %x, want %x", got, want)
	}
	if resp.ContentLength != bigSize {
		t.Errorf("got Content-Length %d, want %d (the upstream's, relayed)", resp.ContentLength, bigSize)
	}
	d := px.rec.wait(t, 1)[0]
	if d.Method != "GET" || d.Host != host || d.Port != port || !d.Allowed || d.Bytes != bigSize || d.Reason != "" || d.Time.IsZero() {
		t.Errorf("got decision %+v, want an allowed GET of %s:%d with %d bytes", d, host, port, bigSize)
	}
}

func TestHeaders(t *testing.T) {
	up := newUpstream(t, false)
	host, port := hostPort(t, up.URL)
	px := start(t, proxy.Config{Allow: []proxy.Rule{{Host: host, Port: port}}, AllowPrivate: true})
	hp := net.JoinHostPort(host, strconv.Itoa(port))
	// The Host header lies: the absolute URL decides where the request goes, and what Host upstream sees.
	resp, body, _ := rawRequest(t, px.addr, "GET http://"+hp+"/headers HTTP/1.1\r\nHost: other.example\r\n"+
		"Proxy-Authorization: Basic eDp5\r\nProxy-Connection: keep-alive\r\nConnection: X-Hop\r\nX-Hop: 1\r\n"+
		"Keep-Alive: 300\r\nTe: trailers\r\nX-Keep: 2\r\n\r\n")
	if resp.StatusCode != 200 {
		t.Fatalf("got status %d, want 200: %s", resp.StatusCode, body)
	}
	var got http.Header
	if err := json.Unmarshal([]byte(body), &got); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"Proxy-Authorization", "Proxy-Connection", "Connection", "X-Hop", "Keep-Alive", "Te"} {
		if v, ok := got[k]; ok {
			t.Errorf("upstream got hop-by-hop header %s: %q", k, v)
		}
	}
	if got.Get("X-Keep") != "2" || got.Get("Host") != hp {
		t.Errorf("upstream got X-Keep %q, Host %q; want 2, %s", got.Get("X-Keep"), got.Get("Host"), hp)
	}
	for _, k := range []string{"X-Resp-Hop", "Keep-Alive"} {
		if v, ok := resp.Header[k]; ok {
			t.Errorf("client got hop-by-hop header %s: %q", k, v)
		}
	}
	if resp.Header.Get("X-Resp-Keep") != "1" {
		t.Errorf("client did not get X-Resp-Keep: %v", resp.Header)
	}
	px.rec.wait(t, 1)
}

func TestRefused(t *testing.T) {
	up := newUpstream(t, false)
	host, port := hostPort(t, up.URL)
	px := start(t, proxy.Config{Allow: []proxy.Rule{{Host: host, Port: port}, {Host: host}}, AllowPrivate: true})
	c := clientVia(px.url, nil)
	defer c.CloseIdleConnections()

	cases := []struct {
		url, host string
		port      int
	}{
		{"http://forbidden.example/x", "forbidden.example", 80},
		{"http://FORBIDDEN.example:8080/x", "forbidden.example", 8080},
		{fmt.Sprintf("http://%s:%d/small", host, port+1), host, port + 1}, // wrong port
		{fmt.Sprintf("http://%s:443/small", host), host, 443},             // Port 0 means 80 for http
		{fmt.Sprintf("http://127.0.0.2:%d/small", port), "127.0.0.2", port},
		{fmt.Sprintf("http://[::1]:%d/small", port), "::1", port},
	}
	for i, tc := range cases {
		resp, err := c.Get(tc.url)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		want := fmt.Sprintf("shed proxy: %s is not in this sandbox's allowlist\n", net.JoinHostPort(tc.host, strconv.Itoa(tc.port)))
		if resp.StatusCode != http.StatusForbidden || string(body) != want {
			t.Errorf("%s: got %d %q, want 403 %q", tc.url, resp.StatusCode, body, want)
		}
		d := px.rec.wait(t, i+1)[i]
		if d.Allowed || d.Reason != "not in allowlist" || d.Host != tc.host || d.Port != tc.port || d.Method != "GET" || d.Bytes != 0 {
			t.Errorf("%s: got decision %+v", tc.url, d)
		}
	}
	// The allowed destination still works on the same keep-alive connection.
	resp, err := c.Get(up.URL + "/small")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "small body\n" {
		t.Errorf("got %d %q after refusals", resp.StatusCode, body)
	}
	if err := px.stop(t); err != nil {
		t.Fatal(err)
	}
	if ds := px.rec.wait(t, len(cases)+1); !ds[len(cases)].Allowed || ds[len(cases)].Bytes != int64(len(body)) {
		t.Errorf("got decision %+v for the allowed request", ds[len(cases)])
	}
}

func TestConnect(t *testing.T) {
	up := newUpstream(t, true)
	host, port := hostPort(t, up.URL)
	px := start(t, proxy.Config{Allow: []proxy.Rule{{Host: host, Port: port}}, AllowPrivate: true})
	c := clientVia(px.url, up.Client().Transport.(*http.Transport).TLSClientConfig)

	resp, err := c.Get(up.URL + "/big")
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	n, err := io.Copy(h, resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if want := sha256.Sum256(bigBody()); resp.StatusCode != 200 || n != bigSize || !bytes.Equal(h.Sum(nil), want[:]) {
		t.Fatalf("got status %d, %d bytes, sha256 %x; want the 50 MB body", resp.StatusCode, n, h.Sum(nil))
	}
	c.CloseIdleConnections() // ends the tunnel, which logs its Decision
	d := px.rec.wait(t, 1)[0]
	if d.Method != "CONNECT" || d.Host != host || d.Port != port || !d.Allowed || d.Bytes <= bigSize || d.Reason != "" {
		t.Errorf("got decision %+v, want an allowed CONNECT of %s:%d with more than %d bytes", d, host, port, bigSize)
	}
}

// TestConnectClientResets: a client that ends its tunnel with a reset (it hung up with bytes unread,
// as a TLS client may with a session ticket) ended the tunnel; the relay did not fail.
func TestConnectClientResets(t *testing.T) {
	up := newUpstream(t, true)
	host, port := hostPort(t, up.URL)
	px := start(t, proxy.Config{Allow: []proxy.Rule{{Host: host, Port: port}}, AllowPrivate: true})
	c, err := net.Dial("tcp", px.url.Host)
	if err != nil {
		t.Fatal(err)
	}
	target := net.JoinHostPort(host, strconv.Itoa(port))
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %v %v", resp, err)
	}
	c.(*net.TCPConn).SetLinger(0) // close sends a reset
	c.Close()
	d := px.rec.wait(t, 1)[0]
	if !d.Allowed || d.Reason != "" {
		t.Errorf("got decision %+v, want an allowed CONNECT that ended without a reason", d)
	}
}

// TestConnectClientResetsWhileSent is the reset's other face: the client has half-closed its side, so
// the proxy no longer reads from it, and hangs up while upstream still sends. The reset surfaces on the
// proxy's write to the client (ECONNRESET or EPIPE); that too is the client's end, not a relay failure.
func TestConnectClientResetsWhileSent(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { // a server that streams until its peer goes, whatever the peer sends or closes
				defer c.Close()
				chunk := bytes.Repeat([]byte("x"), 32<<10)
				for {
					if _, err := c.Write(chunk); err != nil {
						return
					}
				}
			}()
		}
	}()
	host, port := hostPort(t, "http://"+ln.Addr().String())
	px := start(t, proxy.Config{Allow: []proxy.Rule{{Host: host, Port: port}}, AllowPrivate: true})
	c, err := net.Dial("tcp", px.url.Host)
	if err != nil {
		t.Fatal(err)
	}
	target := net.JoinHostPort(host, strconv.Itoa(port))
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %v %v", resp, err)
	}
	if _, err := io.ReadFull(br, make([]byte, 64<<10)); err != nil {
		t.Fatalf("reading the stream: %v", err)
	}
	c.(*net.TCPConn).CloseWrite() // the proxy's client-to-upstream copy ends here, cleanly
	c.(*net.TCPConn).SetLinger(0)
	c.Close() // a reset, with the stream still coming
	d := px.rec.wait(t, 1)[0]
	if !d.Allowed || d.Reason != "" {
		t.Errorf("got decision %+v, want an allowed CONNECT that ended without a reason", d)
	}
}

func TestConnectRefused(t *testing.T) {
	up := newUpstream(t, true)
	host, port := hostPort(t, up.URL)
	px := start(t, proxy.Config{Allow: []proxy.Rule{{Host: host, Port: port}}, AllowPrivate: true})

	// Through a real client: the tunnel is refused.
	c := clientVia(px.url, up.Client().Transport.(*http.Transport).TLSClientConfig)
	if _, err := c.Get("https://forbidden.example/"); err == nil || !strings.Contains(err.Error(), "Forbidden") {
		t.Errorf("got %v, want a Forbidden error", err)
	}
	// By hand: 403, the one-line body, and the connection closed (pipelined tunnel bytes are not read
	// as a request).
	for i, target := range []string{fmt.Sprintf("%s:%d", host, port+1), "forbidden.example:443", fmt.Sprintf("%s:443", host)} {
		resp, body, conn := rawRequest(t, px.addr, "CONNECT "+target+" HTTP/1.1\r\nHost: "+target+"\r\n\r\n\x16\x03\x01garbage")
		if want := "shed proxy: " + target + " is not in this sandbox's allowlist\n"; resp.StatusCode != 403 || body != want {
			t.Errorf("CONNECT %s: got %d %q, want 403 %q", target, resp.StatusCode, body, want)
		}
		if n, err := conn.Read(make([]byte, 1)); err == nil {
			t.Errorf("CONNECT %s: connection still open after refusal (read %d bytes)", target, n)
		}
		d := px.rec.wait(t, i+2)[i+1]
		if d.Allowed || d.Method != "CONNECT" || d.Reason != "not in allowlist" {
			t.Errorf("CONNECT %s: got decision %+v", target, d)
		}
	}
	if d := px.rec.wait(t, 4)[0]; d.Host != "forbidden.example" || d.Port != 443 || d.Allowed {
		t.Errorf("got decision %+v", d)
	}
}

func TestBadRequest(t *testing.T) {
	up := newUpstream(t, false)
	host, port := hostPort(t, up.URL)
	px := start(t, proxy.Config{Allow: []proxy.Rule{{Host: host, Port: port}}, AllowPrivate: true})
	hp := net.JoinHostPort(host, strconv.Itoa(port))
	reqs := []string{
		"GET /x HTTP/1.1\r\nHost: " + hp + "\r\n\r\n",          // origin form
		"GET https://" + hp + "/x HTTP/1.1\r\nHost: a\r\n\r\n", // https in absolute form: CONNECT is the way
		"GET ftp://" + hp + "/x HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET http://" + host + ":0/x HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET http:///x HTTP/1.1\r\nHost: a\r\n\r\n",
		"CONNECT " + host + " HTTP/1.1\r\n\r\n", // no port
		"CONNECT /rpc HTTP/1.1\r\n\r\n",
		"CONNECT " + host + ":99999 HTTP/1.1\r\n\r\n",
		"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET http://a!b/ HTTP/1.1\r\nHost: a\r\n\r\n", // not a name
	}
	for i, req := range reqs {
		resp, body, _ := rawRequest(t, px.addr, req)
		if resp.StatusCode != http.StatusBadRequest || !strings.HasPrefix(body, "shed proxy: bad request") {
			t.Errorf("%q: got %d %q, want 400", req, resp.StatusCode, body)
		}
		if d := px.rec.wait(t, i+1)[i]; d.Allowed || d.Reason != "bad request" || d.Bytes != 0 {
			t.Errorf("%q: got decision %+v", req, d)
		}
	}
}

func TestUpstreamDown(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	host, port := hostPort(t, "http://"+addr)
	px := start(t, proxy.Config{Allow: []proxy.Rule{{Host: host, Port: port}}, AllowPrivate: true})
	for i, req := range []string{"GET http://" + addr + "/ HTTP/1.1\r\nHost: " + addr + "\r\n\r\n", "CONNECT " + addr + " HTTP/1.1\r\n\r\n"} {
		resp, body, _ := rawRequest(t, px.addr, req)
		if resp.StatusCode != http.StatusBadGateway {
			t.Errorf("%q: got %d %q, want 502", req, resp.StatusCode, body)
		}
		if d := px.rec.wait(t, i+1)[i]; d.Allowed || !strings.HasPrefix(d.Reason, "upstream: ") {
			t.Errorf("%q: got decision %+v", req, d)
		}
	}
}

// connectRaw opens a tunnel to target through the proxy and returns the connection after the 200.
func connectRaw(t testing.TB, proxyAddr, target string) net.Conn {
	t.Helper()
	resp, body, c := rawRequest(t, proxyAddr, "CONNECT "+target+" HTTP/1.1\r\nHost: "+target+"\r\n\r\n")
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT %s: got %d %q", target, resp.StatusCode, body)
	}
	c.SetDeadline(time.Time{})
	return c
}

func TestConnectHalfClose(t *testing.T) {
	echo := newEcho(t)
	px := start(t, proxy.Config{Allow: []proxy.Rule{{Host: echo.Addr().String(), Port: int(echo.Port())}}, AllowPrivate: true})
	c := connectRaw(t, px.addr, echo.String())
	msg := bytes.Repeat([]byte("half-close "), 100000)
	go func() {
		c.Write(msg)
		c.(*bufConn).Conn.(*net.TCPConn).CloseWrite() // the echo server sees EOF only if the proxy passes it on
	}()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, msg) {
		t.Fatalf("got %d bytes back, want the %d sent", len(got), len(msg))
	}
	if d := px.rec.wait(t, 1)[0]; !d.Allowed || d.Bytes != int64(len(msg)) || d.Reason != "" {
		t.Errorf("got decision %+v, want allowed with %d bytes", d, len(msg))
	}
}

// Bytes sent right behind the CONNECT head, before the 200, reach the upstream first.
func TestConnectPipelined(t *testing.T) {
	echo := newEcho(t)
	px := start(t, proxy.Config{Allow: []proxy.Rule{{Host: echo.Addr().String(), Port: int(echo.Port())}}, AllowPrivate: true})
	resp, _, c := rawRequest(t, px.addr, "CONNECT "+echo.String()+" HTTP/1.1\r\n\r\nearly bytes|")
	if resp.StatusCode != 200 {
		t.Fatalf("got %d", resp.StatusCode)
	}
	io.WriteString(c, "late bytes")
	buf := make([]byte, len("early bytes|late bytes"))
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "early bytes|late bytes" {
		t.Fatalf("got %q, %v", buf, err)
	}
}

// waitGoroutines waits until no more goroutines run than before; it fails with their stacks otherwise.
func waitGoroutines(t *testing.T, before int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); runtime.NumGoroutine() > before; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines, %d before:\n%s", runtime.NumGoroutine(), before, buf[:runtime.Stack(buf, true)])
		}
	}
}

func TestCancel(t *testing.T) {
	echo := newEcho(t)
	blocked := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("first part"))
		w.(http.Flusher).Flush()
		close(blocked)
		<-r.Context().Done() // until the proxy drops the request
	}))
	defer slow.Close()
	up := newUpstream(t, false)
	sh, sp := hostPort(t, slow.URL)
	uh, upPort := hostPort(t, up.URL)
	before := runtime.NumGoroutine()

	// A slow Log: Serve must still return only after the Decisions of the connections it closed are in.
	rec := &recorder{}
	slowLog := func(d proxy.Decision) {
		if d.Reason == "proxy stopped" {
			time.Sleep(100 * time.Millisecond)
		}
		rec.log(d)
	}
	px := start(t, proxy.Config{Allow: []proxy.Rule{{Host: echo.Addr().String(), Port: int(echo.Port())}, {Host: sh, Port: sp}, {Host: uh, Port: upPort}},
		AllowPrivate: true, Log: slowLog})
	px.rec = rec
	tun := connectRaw(t, px.addr, echo.String())
	if _, err := tun.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(tun, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("tunnel echo: got %q, %v", buf, err)
	}
	// A response in the middle of its body.
	sc, err := net.Dial("tcp", px.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	fmt.Fprintf(sc, "GET %s/ HTTP/1.1\r\nHost: %s\r\n\r\n", slow.URL, sh)
	<-blocked
	sc.SetReadDeadline(time.Now().Add(5 * time.Second))
	var got []byte
	for !bytes.Contains(got, []byte("first part")) { // the body has started to flow
		b := make([]byte, 512)
		n, err := sc.Read(b)
		if err != nil {
			t.Fatalf("slow response: got %q, %v", got, err)
		}
		got = append(got, b[:n]...)
	}
	// An idle keep-alive connection, after a complete request.
	kc := clientVia(px.url, nil)
	resp, err := kc.Get(up.URL + "/small")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()

	if err := px.stop(t); err != nil {
		t.Fatalf("Serve returned %v after cancellation, want nil", err)
	}
	for _, c := range []net.Conn{tun, sc} {
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := io.Copy(io.Discard, c); err != nil {
			t.Errorf("connection not closed by the proxy: %v", err)
		}
	}
	// Serve has returned: every Decision is in, without waiting.
	px.rec.mu.Lock()
	ds := px.rec.ds
	px.rec.mu.Unlock()
	if len(ds) != 3 {
		t.Fatalf("got %d decisions when Serve returned, want 3: %+v", len(ds), ds)
	}
	reasons := map[string]string{}
	for _, d := range ds {
		reasons[d.Method+" "+d.Host+":"+strconv.Itoa(d.Port)] = d.Reason
	}
	if r := reasons["CONNECT "+echo.String()]; r != "proxy stopped" {
		t.Errorf("tunnel decision reason %q, want \"proxy stopped\"", r)
	}
	if r := reasons["GET "+sh+":"+strconv.Itoa(sp)]; r != "proxy stopped" {
		t.Errorf("interrupted GET decision reason %q, want \"proxy stopped\" (%+v)", r, ds)
	}
	tun.Close()
	sc.Close()
	kc.CloseIdleConnections()
	slow.CloseClientConnections()
	waitGoroutines(t, before)
}

func TestListenerClosed(t *testing.T) {
	echo := newEcho(t)
	before := runtime.NumGoroutine()
	p, err := proxy.New(proxy.Config{Allow: []proxy.Rule{{Host: echo.Addr().String(), Port: int(echo.Port())}}, AllowPrivate: true,
		Dial: loopbackOnly(t), Resolver: noDNS})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.Serve(context.Background(), l) }()
	tun := connectRaw(t, l.Addr().String(), echo.String())
	l.Close()
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("Serve returned %v, want an error wrapping net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after its listener was closed")
	}
	tun.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.Copy(io.Discard, tun); err != nil {
		t.Errorf("tunnel not closed: %v", err)
	}
	tun.Close()
	waitGoroutines(t, before)
}

func TestNew(t *testing.T) {
	bad := []proxy.Rule{
		{Host: ""}, {Host: "*.debian.org"}, {Host: "deb.debian.org:80"}, {Host: "deb.debian.org."}, {Host: ".org"},
		{Host: "a..b"}, {Host: "deb debian"}, {Host: "deb.debian.org", Port: -1}, {Host: "deb.debian.org", Port: 65536},
		{Host: "127.1"}, {Host: "0x7f.1"}, {Host: "[127.0.0.1]"}, {Host: "[::1"}, {Host: "fe80::1%eth0"},
		{Host: strings.Repeat("a", 64) + ".org"},
	}
	for _, r := range bad {
		if _, err := proxy.New(proxy.Config{Allow: []proxy.Rule{r}}); err == nil {
			t.Errorf("New accepted rule %+v", r)
		}
	}
	good := []proxy.Rule{{Host: "deb.debian.org"}, {Host: "Deb.Debian.ORG", Port: 8080}, {Host: "127.0.0.1", Port: 1},
		{Host: "::1"}, {Host: "[2001:db8::1]", Port: 443}, {Host: "_acme.example.org"}, {Host: "localhost", Port: 65535}}
	if _, err := proxy.New(proxy.Config{Allow: good}); err != nil {
		t.Errorf("New refused good rules: %v", err)
	}
}
