package proxy

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// TestConnectionShare: a Bench's proxy serves its share of connections at once (the rest wait in
// the kernel's queue) and all the proxies together the shared share. A client that opens hundreds
// of silent connections holds its own share, for the header timeout each; another proxy's client is
// served meanwhile; a proxy that finds the shared share full waits for a slot and is served.
func TestConnectionShare(t *testing.T) {
	web := smallServer(t)
	share := NewShare(6)
	proxyFor := func() *testProxy {
		fn := &fakeNet{t: t, lookups: map[string]int{}, answers: map[string][][]netip.Addr{"e.test": {{netip.MustParseAddr("203.0.113.7")}}},
			routes: map[string]string{"203.0.113.7:80": web}}
		return serve(t, Config{Allow: []Rule{{Host: "e.test"}}, MaxConns: 4, Shared: share}, fn, func(p *Proxy) {
			p.headerTimeout = time.Second
		})
	}
	a, b, c := proxyFor(), proxyFor(), proxyFor()
	get := "GET http://e.test/ HTTP/1.1\r\nHost: e.test\r\n\r\n"

	var attack []net.Conn
	for range 500 {
		conn, err := net.Dial("tcp", a.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		attack = append(attack, conn)
	}
	time.Sleep(100 * time.Millisecond)
	if n := share.InUse(); n != 4 {
		t.Errorf("500 connections to one proxy: %d served at once, want its 4", n)
	}
	if code, body := roundTrip(t, b.addr, get); code != 200 || body != "hello from e.test" {
		t.Errorf("another proxy's client: %d %q", code, body)
	}
	for range 2 {
		conn, err := net.Dial("tcp", b.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
	}
	time.Sleep(100 * time.Millisecond)
	if n := share.InUse(); n != 6 {
		t.Errorf("the shared share: %d in use, want 6", n)
	}
	if code, body := roundTrip(t, c.addr, get); code != 200 || body != "hello from e.test" {
		t.Errorf("a proxy past the shared share: %d %q, want served once a slot frees", code, body)
	}
	for _, conn := range attack {
		conn.Close()
	}
	if code, _ := roundTrip(t, a.addr, get); code != 200 {
		t.Errorf("the attacker's proxy, its connections closed: %d", code)
	}
}

// TestStalls: a request body that stalls, and a client that stops reading an answer, are dropped
// after the idle timeout; the proxy serves on.
func TestStalls(t *testing.T) {
	big := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/small" {
			io.WriteString(w, "small")
			return
		}
		for range 1024 {
			if _, err := w.Write(make([]byte, 64<<10)); err != nil {
				return
			}
		}
	}))
	t.Cleanup(big.Close)
	fn := &fakeNet{t: t, lookups: map[string]int{}, answers: map[string][][]netip.Addr{"e.test": {{netip.MustParseAddr("203.0.113.7")}}},
		routes: map[string]string{"203.0.113.7:80": strings.TrimPrefix(big.URL, "http://")}}
	tp := serve(t, Config{Allow: []Rule{{Host: "e.test"}}}, fn, func(p *Proxy) { p.idleTimeout = 300 * time.Millisecond })

	// A body that stops after its first bytes.
	conn, err := net.Dial("tcp", tp.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST http://e.test/ HTTP/1.1\r\nHost: e.test\r\nContent-Length: 100\r\n\r\nsome")
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.Copy(io.Discard, conn); err != nil {
		t.Errorf("a stalled body still holds its connection: %v", err)
	}
	// A client that reads nothing of 64 MiB.
	conn2, err := net.Dial("tcp", tp.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn2.Close()
	fmt.Fprintf(conn2, "GET http://e.test/ HTTP/1.1\r\nHost: e.test\r\n\r\n")
	ds := tp.decisions(t, 2)
	var reasons []string
	for _, d := range ds {
		reasons = append(reasons, d.Reason)
	}
	if !strings.Contains(strings.Join(reasons, " "), "client: ") || !strings.Contains(strings.Join(reasons, " "), "timeout") {
		t.Errorf("decisions %+v, want the reader that stopped dropped (client: ... timeout)", ds)
	}
	t.Logf("decisions: %+v", ds)
	if code, body := roundTrip(t, tp.addr, "GET http://e.test/small HTTP/1.1\r\nHost: e.test\r\n\r\n"); code != 200 || body != "small" {
		t.Errorf("after: %d %q", code, body)
	}
}
