package proxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func TestForbidden(t *testing.T) {
	cases := map[string]bool{
		"10.0.0.1": true, "10.255.255.255": true, "127.0.0.1": true, "127.8.9.10": true, "169.254.169.254": true,
		"172.16.0.1": true, "172.31.255.255": true, "192.168.1.1": true, "100.64.0.1": true, "100.127.255.254": true,
		"0.0.0.0": true, "0.1.2.3": true, "224.0.0.1": true, "239.255.255.250": true, "255.255.255.255": true, "240.0.0.1": true,
		"::": true, "::1": true, "::ffff:127.0.0.1": true, "::ffff:10.0.0.1": true, "::ffff:169.254.169.254": true,
		"::127.0.0.1": true, "fc00::1": true, "fd12:3456::1": true, "fe80::1": true, "fe80::1%eth0": true, "fec0::1": true,
		"ff02::1": true, "64:ff9b::a00:1": true, "64:ff9b::7f00:1": true, "64:ff9b:1::1": true,

		"1.1.1.1": false, "151.101.2.132": false, "100.63.255.255": false, "100.128.0.0": false, "172.15.255.255": false,
		"172.32.0.0": false, "169.253.255.255": false, "192.169.0.1": false, "203.0.113.7": false, "223.255.255.255": false,
		"2a04:4e42::644": false, "::ffff:151.101.2.132": false, "64:ff9b::808:808": false, "2001:db8::1": false,
	}
	for s, want := range cases {
		if got := forbidden(netip.MustParseAddr(s)); got != want {
			t.Errorf("forbidden(%s) = %v, want %v", s, got, want)
		}
	}
	if !forbidden(netip.Addr{}) {
		t.Error("forbidden(zero Addr) = false, want true")
	}
}

// fakeNet is DNS and a network for one test: lookups answer from a table (and count), dials go to
// loopback servers standing in for the addresses dialed (and are recorded).
type fakeNet struct {
	t       testing.TB
	mu      sync.Mutex
	answers map[string][][]netip.Addr // successive answers per name; the last one repeats
	lookups map[string]int
	routes  map[string]string // dialed address -> loopback address that serves it
	dialed  []string
}

func (f *fakeNet) lookup(_ context.Context, host string) ([]netip.Addr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	as, ok := f.answers[host]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	n := f.lookups[host]
	f.lookups[host]++
	return as[min(n, len(as)-1)], nil
}

func (f *fakeNet) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	f.mu.Lock()
	f.dialed = append(f.dialed, addr)
	to, ok := f.routes[addr]
	f.mu.Unlock()
	if !ok {
		f.t.Errorf("dial of %s, which the test does not route", addr)
		return nil, errors.New("test: no route")
	}
	var d net.Dialer
	return d.DialContext(ctx, network, to)
}

type testProxy struct {
	*Proxy
	addr string
	mu   sync.Mutex
	ds   []Decision
	logs bytes.Buffer // net/http's error log: must never mention a panic
}

func (tp *testProxy) decisions(t *testing.T, n int) []Decision {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		tp.mu.Lock()
		ds := append([]Decision(nil), tp.ds...)
		tp.mu.Unlock()
		if len(ds) >= n || time.Now().After(deadline) {
			if len(ds) != n {
				t.Fatalf("got %d decisions, want %d: %+v", len(ds), n, ds)
			}
			return ds
		}
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (w lockedWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.Write(b)
}

// serve starts p (with the fake network, if any) on a loopback listener until the test ends.
func serve(t testing.TB, cfg Config, fn *fakeNet, adjust func(*Proxy)) *testProxy {
	t.Helper()
	tp := &testProxy{}
	cfg.Log = func(d Decision) {
		tp.mu.Lock()
		defer tp.mu.Unlock()
		tp.ds = append(tp.ds, d)
	}
	if fn != nil {
		cfg.Dial = fn.dial
	} else {
		cfg.Dial = func(context.Context, string, string) (net.Conn, error) {
			t.Error("unexpected dial")
			return nil, errors.New("test: no dial")
		}
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	p.lookup = func(context.Context, string) ([]netip.Addr, error) {
		t.Error("unexpected lookup")
		return nil, errors.New("test: no DNS")
	}
	if fn != nil {
		p.lookup = fn.lookup
	}
	p.serverLog = log.New(lockedWriter{&tp.mu, &tp.logs}, "", 0)
	if adjust != nil {
		adjust(p)
	}
	tp.Proxy = p
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tp.addr = l.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Serve(ctx, l) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		tp.mu.Lock()
		defer tp.mu.Unlock()
		if s := tp.logs.String(); strings.Contains(s, "panic") {
			t.Errorf("net/http recovered a panic:\n%s", s)
		}
	})
	return tp
}

// roundTrip sends req on a new connection and returns the response status and body.
func roundTrip(t *testing.T, addr, req string) (int, string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, req)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("%q: %v", req, err)
	}
	if resp.StatusCode == 200 && strings.HasPrefix(req, "CONNECT") {
		// Through the tunnel to an echo server.
		io.WriteString(c, "ping")
		buf := make([]byte, 4)
		if _, err := io.ReadFull(br, buf); err != nil || string(buf) != "ping" {
			t.Errorf("%q: tunnel echo got %q, %v", req, buf, err)
		}
		return 200, ""
	}
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func echoServer(t testing.TB) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); io.Copy(c, c) }()
		}
	}()
	return l.Addr().String()
}

func smallServer(t testing.TB) string {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello from "+r.Host)
	}))
	t.Cleanup(s.Close)
	return s.Listener.Addr().String()
}

// A name, or an IP literal, that leads to the host or its networks is refused before any dial.
func TestPrivateRefused(t *testing.T) {
	bad := []string{"10.0.0.1", "127.0.0.1", "169.254.169.254", "::ffff:127.0.0.1", "100.64.0.1", "fd00::1", "::1"}
	fn := &fakeNet{t: t, answers: map[string][][]netip.Addr{}, lookups: map[string]int{}}
	var rules []Rule
	for i, a := range bad {
		name := fmt.Sprintf("h%d.test", i)
		fn.answers[name] = [][]netip.Addr{{netip.MustParseAddr(a)}}
		rules = append(rules, Rule{Host: name}, Rule{Host: a})
	}
	// One bad address among good ones is enough.
	fn.answers["mixed.test"] = [][]netip.Addr{{netip.MustParseAddr("203.0.113.7"), netip.MustParseAddr("10.1.2.3")}}
	rules = append(rules, Rule{Host: "mixed.test"})
	tp := serve(t, Config{Allow: rules}, fn, nil)

	n := 0
	check := func(req, host, addr string) {
		t.Helper()
		code, body := roundTrip(t, tp.addr, req)
		if code != 403 || !strings.Contains(body, "resolves to a private address") || host != addr && strings.Contains(body, addr) {
			t.Errorf("%q: got %d %q, want 403 without the address", req, code, body)
		}
		n++
		d := tp.decisions(t, n)[n-1]
		if d.Allowed || d.Reason != "resolves to a private address "+addr || d.Host != host {
			t.Errorf("%q: got decision %+v, want refused for %s", req, d, addr)
		}
	}
	for i, a := range bad {
		name := fmt.Sprintf("h%d.test", i)
		check("GET http://"+name+"/ HTTP/1.1\r\nHost: "+name+"\r\n\r\n", name, a)
		check("CONNECT "+name+":443 HTTP/1.1\r\n\r\n", name, a)
		lit := net.JoinHostPort(a, "80")
		check("GET http://"+lit+"/ HTTP/1.1\r\nHost: "+lit+"\r\n\r\n", a, a)
	}
	check("GET http://mixed.test/ HTTP/1.1\r\nHost: mixed.test\r\n\r\n", "mixed.test", "10.1.2.3")
	if len(fn.dialed) != 0 {
		t.Errorf("dialed %v", fn.dialed)
	}
}

// The proxy resolves a name once per request and dials what it checked: a second, different answer (DNS
// rebinding to loopback) is never asked for.
func TestDialsCheckedAddress(t *testing.T) {
	web, echo := smallServer(t), echoServer(t)
	fn := &fakeNet{t: t, lookups: map[string]int{},
		answers: map[string][][]netip.Addr{
			"mirror.test": {{netip.MustParseAddr("203.0.113.7")}, {netip.MustParseAddr("127.0.0.1")}},
			"tls.test":    {{netip.MustParseAddr("2001:db8::7"), netip.MustParseAddr("203.0.113.8")}, {netip.MustParseAddr("127.0.0.1")}},
		},
		routes: map[string]string{"203.0.113.7:80": web, "203.0.113.8:443": echo, "[2001:db8::7]:443": "127.0.0.1:1"},
	}
	tp := serve(t, Config{Allow: []Rule{{Host: "Mirror.TEST"}, {Host: "tls.test"}}}, fn, nil)

	code, body := roundTrip(t, tp.addr, "GET http://MIRROR.test/x HTTP/1.1\r\nHost: mirror.test\r\n\r\n")
	if code != 200 || body != "hello from MIRROR.test" {
		t.Fatalf("got %d %q", code, body)
	}
	// Nothing listens where 2001:db8::7 is routed: the dial fails over to the next checked address.
	if code, _ := roundTrip(t, tp.addr, "CONNECT tls.test:443 HTTP/1.1\r\n\r\n"); code != 200 {
		t.Fatalf("CONNECT: got %d", code)
	}
	ds := tp.decisions(t, 2)
	if ds[0].Method == "CONNECT" { // logged when the exchange ends, which may be in either order
		ds[0], ds[1] = ds[1], ds[0]
	}
	if ds[0].Host != "mirror.test" || !ds[0].Allowed || ds[0].Bytes != int64(len(body)) || !ds[1].Allowed || ds[1].Bytes != 4 {
		t.Errorf("got decisions %+v", ds)
	}
	fn.mu.Lock()
	defer fn.mu.Unlock()
	if fn.lookups["mirror.test"] != 1 || fn.lookups["tls.test"] != 1 {
		t.Errorf("lookups %v, want one per name", fn.lookups)
	}
	if want := []string{"203.0.113.7:80", "[2001:db8::7]:443", "203.0.113.8:443"}; fmt.Sprint(fn.dialed) != fmt.Sprint(want) {
		t.Errorf("dialed %v, want %v", fn.dialed, want)
	}
}

func TestDefaultPorts(t *testing.T) {
	web, echo := smallServer(t), echoServer(t)
	fn := &fakeNet{t: t, lookups: map[string]int{},
		answers: map[string][][]netip.Addr{"m.test": {{netip.MustParseAddr("203.0.113.7")}}, "p.test": {{netip.MustParseAddr("203.0.113.7")}}},
		routes:  map[string]string{"203.0.113.7:80": web, "203.0.113.7:443": echo, "203.0.113.7:8443": echo},
	}
	tp := serve(t, Config{Allow: []Rule{{Host: "m.test"}, {Host: "p.test", Port: 8443}}}, fn, nil)
	cases := []struct {
		req  string
		want int
	}{
		{"GET http://m.test/ HTTP/1.1\r\nHost: m.test\r\n\r\n", 200},
		{"GET http://m.test:80/ HTTP/1.1\r\nHost: m.test\r\n\r\n", 200},
		{"CONNECT m.test:443 HTTP/1.1\r\n\r\n", 200},
		{"CONNECT m.test:80 HTTP/1.1\r\n\r\n", 403},
		{"GET http://m.test:443/ HTTP/1.1\r\nHost: m.test\r\n\r\n", 403},
		{"GET http://m.test:8080/ HTTP/1.1\r\nHost: m.test\r\n\r\n", 403},
		{"CONNECT p.test:8443 HTTP/1.1\r\n\r\n", 200},
		{"CONNECT p.test:443 HTTP/1.1\r\n\r\n", 403},
		{"GET http://p.test/ HTTP/1.1\r\nHost: p.test\r\n\r\n", 403},
		{"CONNECT m.test.:443 HTTP/1.1\r\n\r\n", 403}, // exact names: no trailing-dot variant
		{"CONNECT sub.m.test:443 HTTP/1.1\r\n\r\n", 403},
		{"CONNECT test:443 HTTP/1.1\r\n\r\n", 403},
	}
	for _, tc := range cases {
		if code, body := roundTrip(t, tp.addr, tc.req); code != tc.want {
			t.Errorf("%q: got %d %q, want %d", tc.req, code, body, tc.want)
		}
	}
	tp.decisions(t, len(cases))
}

func TestLookupFailure(t *testing.T) {
	fn := &fakeNet{t: t, lookups: map[string]int{}, answers: map[string][][]netip.Addr{"empty.test": {{}}}}
	tp := serve(t, Config{Allow: []Rule{{Host: "gone.test"}, {Host: "empty.test"}}}, fn, nil)
	for i, h := range []string{"gone.test", "empty.test"} {
		code, body := roundTrip(t, tp.addr, "GET http://"+h+"/ HTTP/1.1\r\nHost: "+h+"\r\n\r\n")
		if code != 502 {
			t.Errorf("%s: got %d %q, want 502", h, code, body)
		}
		if d := tp.decisions(t, i+1)[i]; d.Allowed || !strings.HasPrefix(d.Reason, "upstream: ") {
			t.Errorf("%s: got decision %+v", h, d)
		}
	}
}

func TestTimeouts(t *testing.T) {
	echo := echoServer(t)
	fn := &fakeNet{t: t, lookups: map[string]int{}, answers: map[string][][]netip.Addr{"e.test": {{netip.MustParseAddr("203.0.113.7")}}},
		routes: map[string]string{"203.0.113.7:443": echo}}
	tp := serve(t, Config{Allow: []Rule{{Host: "e.test"}}}, fn, func(p *Proxy) {
		p.headerTimeout = 200 * time.Millisecond
		p.idleTimeout = 200 * time.Millisecond
		p.tunnelIdle = 400 * time.Millisecond
	})
	closedWithin := func(c net.Conn, d time.Duration) bool {
		c.SetReadDeadline(time.Now().Add(d))
		_, err := io.Copy(io.Discard, c)
		return err == nil
	}
	// Silent client, and one that stops in the middle of its request line.
	for _, first := range []string{"", "GET http://e.te"} {
		c, err := net.Dial("tcp", tp.addr)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(c, first)
		if !closedWithin(c, 3*time.Second) {
			t.Errorf("client that sent %q was not dropped", first)
		}
		c.Close()
	}
	// A tunnel with traffic stays open past the idle time; a silent one is closed.
	c, err := net.Dial("tcp", tp.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "CONNECT e.test:443 HTTP/1.1\r\n\r\n")
	br := bufio.NewReader(c)
	if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %v %v", resp, err)
	}
	buf := make([]byte, 1)
	for range 12 { // 1.2 s
		time.Sleep(100 * time.Millisecond)
		c.Write([]byte{'x'})
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := io.ReadFull(br, buf); err != nil {
			t.Fatalf("busy tunnel closed: %v", err)
		}
	}
	start := time.Now()
	c.SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, err := io.Copy(io.Discard, br); err != nil {
		t.Fatalf("idle tunnel not closed: %v", err)
	}
	if el := time.Since(start); el < 300*time.Millisecond {
		t.Errorf("idle tunnel closed after %v, before its idle timeout", el)
	}
	if d := tp.decisions(t, 1)[0]; d.Reason != "idle timeout" || d.Bytes != 12 {
		t.Errorf("got decision %+v, want idle timeout after 12 bytes", d)
	}
}

// Garbage on the socket closes the connection and never panics; the proxy keeps serving.
func TestGarbage(t *testing.T) {
	web := smallServer(t)
	fn := &fakeNet{t: t, lookups: map[string]int{}, answers: map[string][][]netip.Addr{"w.test": {{netip.MustParseAddr("203.0.113.7")}}},
		routes: map[string]string{"203.0.113.7:80": web}}
	tp := serve(t, Config{Allow: []Rule{{Host: "w.test"}}}, fn, nil)
	inputs := []string{
		"\x00\x01\x02\x03\r\n\r\n", "GET\r\n\r\n", "GET http://w.test HTTP/9.9\r\n\r\n", "CONNECT [::1 HTTP/1.1\r\n\r\n",
		"GET http://w.test/ HTTP/1.1\r\nHost: w.test\r\nX: " + strings.Repeat("a", 100<<10) + "\r\n\r\n",
		"GET http://w.test/ HTTP/1.1\r\nHost: w.test\r\nContent-Length: -1\r\n\r\n",
		"GET http://w.test/ HTTP/1.1\r\nHost: w.test\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
		"CONNECT w.test:80 HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
		"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 20 {
		b := make([]byte, r.IntN(2000))
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		inputs = append(inputs, string(b))
	}
	for _, in := range inputs {
		c, err := net.Dial("tcp", tp.addr)
		if err != nil {
			t.Fatal(err)
		}
		c.Write([]byte(in))
		c.(*net.TCPConn).CloseWrite()
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.Copy(io.Discard, c); err != nil && !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("%.40q: connection not closed: %v", in, err)
		}
		c.Close()
	}
	if code, body := roundTrip(t, tp.addr, "GET http://w.test/ HTTP/1.1\r\nHost: w.test\r\n\r\n"); code != 200 {
		t.Errorf("after garbage: got %d %q", code, body)
	}
}

// FuzzParseTarget checks the only request parsing the proxy does itself: a request's destination.
func FuzzParseTarget(f *testing.F) {
	for _, s := range []string{
		"GET http://deb.debian.org/debian/dists HTTP/1.1\r\nHost: x\r\n\r\n", "CONNECT pypi.org:443 HTTP/1.1\r\n\r\n",
		"CONNECT [::1]:443 HTTP/1.1\r\n\r\n", "GET http://[fe80::1%25eth0]:80/ HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET /x HTTP/1.1\r\nHost: x\r\n\r\n", "CONNECT :443 HTTP/1.1\r\n\r\n", "GET http://H:+80/ HTTP/1.1\r\n\r\n",
		"GET http://h:0080/ HTTP/1.1\r\n\r\n", "CONNECT h:65536 HTTP/1.1\r\n\r\n", "GET HTTP://EX%41MPLE.com/ HTTP/1.0\r\n\r\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := http.ReadRequest(bufio.NewReader(strings.NewReader(s)))
		if err != nil {
			return
		}
		tg, ok := parseTarget(r)
		if !ok {
			return
		}
		if tg.host == "" || tg.port < 1 || tg.port > 65535 || tg.host != canonicalHost(tg.host) || !validHost(tg.host) {
			t.Fatalf("parseTarget(%q) = %+v", s, tg)
		}
		if strings.ContainsAny(tg.host, "[]") {
			t.Fatalf("parseTarget(%q) kept brackets: %+v", s, tg)
		}
	})
}

// FuzzServe sends arbitrary bytes to a running proxy: no panic, no hang, and nothing is dialed but the
// allowlisted stand-in.
func FuzzServe(f *testing.F) {
	f.Add([]byte("GET http://w.test/ HTTP/1.1\r\nHost: w.test\r\n\r\n"))
	f.Add([]byte("CONNECT w.test:443 HTTP/1.1\r\n\r\nping"))
	f.Add([]byte("GET /x HTTP/1.1\r\nHost: w.test\r\n\r\nGET http://w.test HTTP/1.1\r\nHost: a\r\n\r\n"))
	f.Add([]byte("POST http://w.test/ HTTP/1.1\r\nHost: w.test\r\nContent-Length: 3\r\n\r\nabc"))
	web, echo := smallServer(f), echoServer(f)
	fn := &fakeNet{t: f, lookups: map[string]int{}, answers: map[string][][]netip.Addr{"w.test": {{netip.MustParseAddr("203.0.113.7")}}},
		routes: map[string]string{"203.0.113.7:80": web, "203.0.113.7:443": echo}}
	tp := serve(f, Config{Allow: []Rule{{Host: "w.test"}, {Host: "w.test", Port: 443}}}, fn, nil)
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := net.Dial("tcp", tp.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.Write(b)
		c.(*net.TCPConn).CloseWrite()
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.Copy(io.Discard, c); err != nil && !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("%q: %v", b, err)
		}
		tp.mu.Lock()
		defer tp.mu.Unlock()
		if s := tp.logs.String(); strings.Contains(s, "panic") {
			t.Fatalf("net/http recovered a panic:\n%s", s)
		}
	})
}
