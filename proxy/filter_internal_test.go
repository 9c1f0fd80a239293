package proxy

import (
	"bufio"
	"errors"
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

func TestParseFilter(t *testing.T) {
	bad := map[string]string{
		"":                   "empty",
		"8.8.8.8/33":         "malformed CIDR",
		"8.8.8/24":           "malformed CIDR",
		"::ffff:1.2.3.0/120": "IPv4-mapped",
		"fe80::1%eth0":       "zoned",
		"a.*.example.com":    "wildcard goes only at the start",
		"*.":                 "malformed wildcard",
		"*.*.example.com":    "malformed wildcard",
		"example.com:443":    "names no port",
		"exa mple.com":       "invalid character",
		"127.1":              "numeric top-level label",
	}
	for entry, want := range bad {
		_, err := ParseFilter([]string{"1.1.1.1", entry}, nil)
		var re *RuleError
		if !errors.As(err, &re) || re.List != "allow" || re.Index != 1 || re.Entry != entry || !strings.Contains(err.Error(), want) {
			t.Errorf("allow %q: got %v, want a RuleError for entry 1 saying %q", entry, err, want)
		}
		if _, err := ParseFilter(nil, []string{entry}); err == nil {
			t.Errorf("deny %q: accepted", entry)
		}
	}
	for _, ok := range []string{"1.1.1.1", "[2001:db8::1]", "2001:db8::/32", "8.8.8.8/24", "Example.COM", "*.example.com", "0.0.0.0/0", "::/0", "::ffff:1.2.3.4"} {
		if _, err := ParseFilter([]string{ok}, []string{ok}); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	many := make([]string, 10000)
	for i := range many {
		many[i] = fmt.Sprintf("10.%d.%d.1", i/256, i%256)
	}
	if _, err := ParseFilter(nil, many); !errors.Is(err, ErrTooManyRules) || !strings.Contains(err.Error(), "10000 deny entries, at most 1024") {
		t.Errorf("10,000 rules: got %v", err)
	}
	if _, err := ParseFilter(many[:MaxFilterEntries], many[:MaxFilterEntries]); err != nil {
		t.Errorf("%d rules: %v", MaxFilterEntries, err)
	}
}

func TestFilterPass(t *testing.T) {
	a := netip.MustParseAddr
	one, eight, six := a("1.1.1.1"), a("8.8.8.8"), a("2001:db8::8")
	cases := []struct {
		allow, deny []string
		host        string
		addrs       []netip.Addr
		want        []netip.Addr
	}{
		{nil, nil, "x.test", []netip.Addr{one, eight}, []netip.Addr{one, eight}},                            // no rules: the allowlist decides
		{nil, []string{"8.8.8.8"}, "x.test", []netip.Addr{one, eight}, []netip.Addr{one}},                   // a denied address is never dialed
		{nil, []string{"8.8.8.0/24"}, "8.8.8.8", []netip.Addr{eight}, nil},                                  // a block
		{nil, []string{"0.0.0.0/0"}, "x.test", []netip.Addr{one, six}, nil},                                 // all traffic, both families
		{[]string{"1.1.1.1"}, []string{"0.0.0.0/0"}, "x.test", []netip.Addr{one, eight}, []netip.Addr{one}}, // allow over deny
		{[]string{"1.1.1.1", "8.8.8.8"}, []string{"0.0.0.0/0"}, "8.8.8.8", []netip.Addr{eight}, []netip.Addr{eight}},
		{[]string{"x.test"}, []string{"0.0.0.0/0"}, "x.test", []netip.Addr{one, eight}, []netip.Addr{one, eight}}, // a name: all its addresses
		{[]string{"*.test"}, []string{"0.0.0.0/0"}, "a.b.test", []netip.Addr{one}, []netip.Addr{one}},
		{[]string{"*.test"}, []string{"0.0.0.0/0"}, "test", []netip.Addr{one}, nil}, // a wildcard is not the name itself
		{[]string{"x.test"}, []string{"0.0.0.0/0"}, "y.test", []netip.Addr{one}, nil},
		{nil, []string{"x.test"}, "x.test", []netip.Addr{one}, nil},                    // a denied name
		{nil, []string{"x.test"}, "y.test", []netip.Addr{one}, []netip.Addr{one}},      // only that one
		{[]string{"1.1.1.1"}, nil, "x.test", []netip.Addr{eight}, []netip.Addr{eight}}, // allow alone narrows nothing (E2B's default allows)
		{nil, []string{"8.8.8.8"}, "x.test", []netip.Addr{a("::ffff:8.8.8.8")}, nil},   // the mapped form is the address
		{nil, []string{"2001:db8::/32"}, "x.test", []netip.Addr{one, six}, []netip.Addr{one}},
	}
	for _, c := range cases {
		f, err := ParseFilter(c.allow, c.deny)
		if err != nil {
			t.Fatal(err)
		}
		if got := f.pass(c.host, c.addrs); fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("allow %v deny %v: %s %v: got %v, want %v", c.allow, c.deny, c.host, c.addrs, got, c.want)
		}
	}
}

func TestFilterWithin(t *testing.T) {
	profile := []Rule{{Host: "deb.debian.org"}, {Host: "198.51.100.2", Port: 8000}, {Host: "2001:db8::1"}}
	for _, ok := range []string{"deb.debian.org", "DEB.debian.org", "*.debian.org", "198.51.100.2", "198.51.100.0/24", "0.0.0.0/0", "2001:db8::/32"} {
		f, err := ParseFilter([]string{ok}, []string{"8.8.8.8", "evil.test"})
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Within(profile); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, out := range []string{"1.1.1.1", "debian.org", "*.example.com", "198.51.101.0/24", "security.debian.org"} {
		f, err := ParseFilter([]string{"deb.debian.org", out}, nil)
		if err != nil {
			t.Fatal(err)
		}
		err = f.Within(profile)
		var re *RuleError
		if !errors.As(err, &re) || re.Index != 1 || !strings.Contains(err.Error(), "outside the recipe's network profile, which allows deb.debian.org, 198.51.100.2:8000, [2001:db8::1]") {
			t.Errorf("%q: got %v", out, err)
		}
	}
	f, _ := ParseFilter([]string{"1.1.1.1"}, nil)
	if err := f.Within(nil); err == nil || !strings.Contains(err.Error(), "which allows nothing") {
		t.Errorf("empty profile: got %v", err)
	}
}

// The rules decide before any lookup when they can, and after it per address; a refusal is logged.
func TestFilterRefuses(t *testing.T) {
	web, echo := smallServer(t), echoServer(t)
	fn := &fakeNet{t: t, lookups: map[string]int{},
		answers: map[string][][]netip.Addr{
			"ok.test":  {{netip.MustParseAddr("203.0.113.7")}},
			"two.test": {{netip.MustParseAddr("203.0.113.9"), netip.MustParseAddr("203.0.113.7")}},
			"no.test":  {{netip.MustParseAddr("203.0.113.9")}},
		},
		routes: map[string]string{"203.0.113.7:80": web, "203.0.113.7:443": echo},
	}
	f, err := ParseFilter([]string{"203.0.113.7", "ok.test"}, []string{"0.0.0.0/0"})
	if err != nil {
		t.Fatal(err)
	}
	tp := serve(t, Config{Allow: []Rule{{Host: "ok.test"}, {Host: "two.test"}, {Host: "no.test"}, {Host: "203.0.113.8"}}, Filter: f}, fn, nil)
	if code, body := roundTrip(t, tp.addr, "GET http://ok.test/ HTTP/1.1\r\nHost: ok.test\r\n\r\n"); code != 200 {
		t.Fatalf("allowed name: %d %s", code, body)
	}
	// two.test's first address is denied: only the allowed one is dialed.
	if code, _ := roundTrip(t, tp.addr, "CONNECT two.test:443 HTTP/1.1\r\n\r\n"); code != 200 {
		t.Fatalf("two.test: %d", code)
	}
	code, body := roundTrip(t, tp.addr, "GET http://no.test/ HTTP/1.1\r\nHost: no.test\r\n\r\n")
	if code != 403 || !strings.Contains(body, "denied by this sandbox's network rules") {
		t.Errorf("denied name: %d %q", code, body)
	}
	if code, _ := roundTrip(t, tp.addr, "CONNECT 203.0.113.8:443 HTTP/1.1\r\n\r\n"); code != 403 {
		t.Errorf("denied address: %d", code)
	}
	ds := tp.decisions(t, 4)
	refused := 0
	for _, d := range ds {
		if !d.Allowed {
			refused++
			if d.Reason != "denied by network rules" {
				t.Errorf("decision %+v", d)
			}
		}
	}
	if refused != 2 {
		t.Errorf("decisions %+v", ds)
	}
	fn.mu.Lock()
	if fmt.Sprint(fn.dialed) != "[203.0.113.7:80 203.0.113.7:443]" {
		t.Errorf("dialed %v", fn.dialed)
	}
	fn.mu.Unlock()

	// Without an address to allow, a name the rules deny is refused before any lookup.
	f, err = ParseFilter([]string{"ok.test"}, []string{"0.0.0.0/0"})
	if err != nil {
		t.Fatal(err)
	}
	tp = serve(t, Config{Allow: []Rule{{Host: "ok.test"}, {Host: "no.test"}}, Filter: f}, fn, nil)
	if code, _ := roundTrip(t, tp.addr, "GET http://no.test/ HTTP/1.1\r\nHost: no.test\r\n\r\n"); code != 403 {
		t.Errorf("denied name: %d", code)
	}
	fn.mu.Lock()
	defer fn.mu.Unlock()
	if fn.lookups["no.test"] != 1 {
		t.Errorf("lookups %v: a name the rules refuse was looked up", fn.lookups)
	}
}

// SetFilter applies to the next connection and cuts the tunnels and responses in flight it no longer
// allows; the others go on.
func TestSetFilterCuts(t *testing.T) {
	echo := echoServer(t)
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for i := 0; i < 600; i++ {
			if _, err := io.WriteString(w, "x"); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}))
	t.Cleanup(slow.Close)
	fn := &fakeNet{t: t, lookups: map[string]int{},
		answers: map[string][][]netip.Addr{"keep.test": {{netip.MustParseAddr("203.0.113.1")}}},
		routes: map[string]string{
			"203.0.113.7:443": echo, "203.0.113.1:443": echo, "203.0.113.7:80": slow.Listener.Addr().String(),
		},
	}
	tp := serve(t, Config{Allow: []Rule{{Host: "203.0.113.7"}, {Host: "keep.test"}}}, fn, nil)

	cut := connectRawTo(t, tp.addr, "203.0.113.7:443")
	kept := connectRawTo(t, tp.addr, "keep.test:443")
	// A slow response in flight.
	c, err := net.Dial("tcp", tp.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "GET http://203.0.113.7/slow HTTP/1.1\r\nHost: 203.0.113.7\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("slow: %v %v", resp, err)
	}
	if _, err := io.ReadFull(resp.Body, make([]byte, 2)); err != nil {
		t.Fatal(err)
	}

	f, err := ParseFilter([]string{"keep.test"}, []string{"0.0.0.0/0"})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if n := tp.SetFilter(f); n != 2 {
		t.Errorf("SetFilter cut %d, want 2", n)
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.Copy(io.Discard, resp.Body); err == nil {
		t.Error("the slow response ended cleanly: want a broken body")
	}
	cut.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := cut.Read(make([]byte, 1)); err == nil {
		t.Error("the denied tunnel is still open")
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("cutting took %v", d)
	}
	// The allowed tunnel goes on.
	kept.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(kept, "ping")
	if b := make([]byte, 4); func() error { _, err := io.ReadFull(kept, b); return err }() != nil || string(b) != "ping" {
		t.Error("the allowed tunnel was cut")
	}
	// The next connection sees the new rules.
	if code, _ := roundTrip(t, tp.addr, "CONNECT 203.0.113.7:443 HTTP/1.1\r\n\r\n"); code != 403 {
		t.Errorf("after the update: %d", code)
	}
	kept.Close()
	ds := tp.decisions(t, 4)
	cuts := 0
	for _, d := range ds {
		if d.Cut {
			cuts++
			if !d.Allowed || d.Host != "203.0.113.7" || !strings.HasPrefix(d.Reason, "cut:") {
				t.Errorf("cut decision %+v", d)
			}
		}
	}
	if cuts != 2 {
		t.Errorf("decisions %+v", ds)
	}
	// An empty Filter restores the allowlist alone.
	tp.SetFilter(nil)
	if code, _ := roundTrip(t, tp.addr, "CONNECT 203.0.113.7:443 HTTP/1.1\r\n\r\n"); code != 200 {
		t.Errorf("after clearing: %d", code)
	}
}

func connectRawTo(t *testing.T, addr, target string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, "CONNECT "+target+" HTTP/1.1\r\n\r\n")
	b := make([]byte, len("HTTP/1.1 200 Connection established\r\n\r\n"))
	if _, err := io.ReadFull(c, b); err != nil || !strings.HasPrefix(string(b), "HTTP/1.1 200") {
		t.Fatalf("CONNECT %s: %q %v", target, b, err)
	}
	io.WriteString(c, "ping")
	if _, err := io.ReadFull(c, b[:4]); err != nil || string(b[:4]) != "ping" {
		t.Fatalf("CONNECT %s: echo %q %v", target, b[:4], err)
	}
	c.SetDeadline(time.Time{})
	return c
}
