package e2b

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// serveOn serves h (nil: s's API) with s's limits on a new loopback port, and returns its address.
func serveOn(t *testing.T, s *Server, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if h == nil {
		h = s.Handler()
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.serve(ctx, ln, h) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return ln.Addr().String()
}

// dialAs connects to addr with a socket made as uid, as a local user's client would be.
func dialAs(t *testing.T, uid int, addr string) net.Conn {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if uid != 0 {
		unix.Setfsuid(uid)
		defer unix.Setfsuid(0)
	}
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// answer reads one answer on c within d: its status and body, or status 0 and why not.
func answer(c net.Conn, d time.Duration) (int, string) {
	c.SetReadDeadline(time.Now().Add(d))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// closed says whether c's far end closed it within d (or reset it).
func closed(c net.Conn, d time.Duration) bool {
	c.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, c)
	return err == nil || !isTimeout(err)
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// get asks for path on a new connection made as uid, with key if any.
func get(t *testing.T, uid int, addr, path, key string) (int, string) {
	t.Helper()
	c := dialAs(t, uid, addr)
	defer c.Close()
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: e2b\r\nX-API-Key: %s\r\n\r\n", path, key)
	return answer(c, 10*time.Second)
}

func shorten(t *testing.T, v *time.Duration, d time.Duration) {
	old := *v
	*v = d
	t.Cleanup(func() { *v = old })
}

// TestUnauthenticatedBodyNotRead: a request with no valid token or key is answered from its headers
// alone, its body never read, and its connection closed: on the Connect services (unary and
// streaming), on /files and on the control plane.
func TestUnauthenticatedBodyNotRead(t *testing.T) {
	s, _, _ := newServer(t)
	addr := serveOn(t, s, nil)
	for _, c := range []struct {
		name, head string
		status     int
		want       string
	}{
		{"connect unary", "POST /filesystem.Filesystem/Stat HTTP/1.1\r\nContent-Type: application/json\r\nE2b-Sandbox-Id: x\r\nX-Access-Token: wrong\r\n", 401, `"code":"unauthenticated"`},
		{"connect stream", "POST /process.Process/Start HTTP/1.1\r\nContent-Type: application/connect+json\r\nE2b-Sandbox-Id: x\r\n", 200, `"code":"unauthenticated"`},
		{"files", "POST /files?path=/x HTTP/1.1\r\nContent-Type: application/octet-stream\r\n", 401, "no running sandbox"},
		{"control", "POST /v2/sandboxes HTTP/1.1\r\nContent-Type: application/json\r\nX-API-Key: e2b_nope\r\n", 401, "no valid API key"},
	} {
		conn := dialAs(t, 65534, addr)
		// The headers promise a body of a megabyte; not one byte of it is sent.
		fmt.Fprintf(conn, "%sHost: e2b\r\nContent-Length: 1048576\r\n\r\n", c.head)
		status, body := answer(conn, 10*time.Second)
		if status != c.status || !strings.Contains(body, c.want) {
			t.Errorf("%s: %d %q, want %d with %s", c.name, status, body, c.status, c.want)
		}
		if !closed(conn, 10*time.Second) {
			t.Errorf("%s: the connection stays open after the refusal", c.name)
		}
	}
}

// TestSlowBodyFlood is the reported attack: hundreds of connections of one local user send a
// Connect call's headers with no key, then a byte of body now and then. Each is refused from its
// headers (or at once, over its peer's share) and closed; meanwhile /health and a keyed client
// are answered.
func TestSlowBodyFlood(t *testing.T) {
	s, key, _ := newServer(t)
	s.MaxPerPeer = 8
	addr := serveOn(t, s, nil)
	const n = 300
	var wg sync.WaitGroup
	var mu sync.Mutex
	got := map[int]int{}
	conns := make([]net.Conn, n)
	for i := range conns {
		conns[i] = dialAs(t, 65534, addr)
	}
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fmt.Fprintf(c, "POST /process.Process/List HTTP/1.1\r\nHost: e2b\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
			status, _ := answer(c, 30*time.Second)
			mu.Lock()
			got[status]++
			mu.Unlock()
		}()
	}
	if status, _ := get(t, 0, addr, "/health", ""); status != http.StatusNoContent {
		t.Errorf("/health during the flood: %d", status)
	}
	if status, body := get(t, 0, addr, "/v2/sandboxes", key); status != http.StatusOK {
		t.Errorf("a keyed list during the flood: %d %s", status, body)
	}
	wg.Wait()
	if got[401]+got[503] != n {
		t.Errorf("the flood's answers: %v, want each 401 (refused from its headers) or 503 (over its peer's share)", got)
	}
	t.Logf("answers: %v", got)
}

// TestPeerShare: connections that send no complete request hold their peer's share for the header
// timeout at most; past its share a peer's connections are refused at once, while another local
// user, and a keyed client, are served.
func TestPeerShare(t *testing.T) {
	shorten(t, &headerTimeout, time.Second)
	s, key, _ := newServer(t)
	s.MaxPerPeer = 4
	addr := serveOn(t, s, nil)
	var held []net.Conn
	for range 4 {
		c := dialAs(t, 65534, addr)
		fmt.Fprintf(c, "GET /health HTTP/1.1\r\nHost: e2b\r\n") // and never the end of the headers
		held = append(held, c)
	}
	time.Sleep(200 * time.Millisecond) // accepted
	if status, body := get(t, 65534, addr, "/health", ""); status != http.StatusServiceUnavailable || !strings.Contains(body, "too many connections") {
		t.Errorf("nobody's fifth connection: %d %q, want 503", status, body)
	}
	if status, _ := get(t, 4242, addr, "/health", ""); status != http.StatusNoContent {
		t.Errorf("another local user's /health: %d", status)
	}
	if status, _ := get(t, 0, addr, "/v2/sandboxes", key); status != http.StatusOK {
		t.Errorf("a keyed list: %d", status)
	}
	for i, c := range held {
		if !closed(c, 10*time.Second) {
			t.Errorf("held connection %d outlived the header timeout", i)
		}
	}
	if status, _ := get(t, 65534, addr, "/health", ""); status != http.StatusNoContent {
		t.Errorf("nobody, its connections cut: %d", status)
	}
}

// TestUserShare: a key's user past its requests in flight, or its connections, is refused at once
// (429, the body unread); another key's user is served.
func TestUserShare(t *testing.T) {
	s, key, _ := newServer(t)
	other, _, err := s.Keys.Create("daemon")
	if err != nil {
		t.Fatal(err)
	}
	s.MaxInFlight, s.MaxPerUser = 2, 3
	addr := serveOn(t, s, nil)
	// Two creates whose bodies do not come hold nobody's two requests in flight.
	var slow []net.Conn
	for range 2 {
		c := dialAs(t, 0, addr)
		fmt.Fprintf(c, "POST /v2/sandboxes HTTP/1.1\r\nHost: e2b\r\nX-API-Key: %s\r\nContent-Length: 100\r\n\r\n", key)
		slow = append(slow, c)
	}
	waitFor(t, func() bool { l := s.limits(); l.mu.Lock(); defer l.mu.Unlock(); return l.busy["nobody"] == 2 })
	c := dialAs(t, 0, addr)
	fmt.Fprintf(c, "POST /v2/sandboxes HTTP/1.1\r\nHost: e2b\r\nX-API-Key: %s\r\nContent-Length: 100\r\n\r\n", key)
	if status, body := answer(c, 10*time.Second); status != http.StatusTooManyRequests || !strings.Contains(body, "in flight") {
		t.Errorf("nobody's third request in flight: %d %q", status, body)
	}
	if status, body := get(t, 0, addr, "/v2/sandboxes", other); status != http.StatusOK {
		t.Errorf("daemon's list: %d %s", status, body)
	}
	for _, c := range slow {
		c.Close()
	}
	waitFor(t, func() bool { l := s.limits(); l.mu.Lock(); defer l.mu.Unlock(); return l.busy["nobody"] == 0 })

	// Three idle keep-alive connections that authenticated are nobody's share of connections.
	for range 3 {
		c := dialAs(t, 0, addr)
		fmt.Fprintf(c, "GET /v2/sandboxes HTTP/1.1\r\nHost: e2b\r\nX-API-Key: %s\r\n\r\n", key)
		if status, _ := answer(c, 10*time.Second); status != http.StatusOK {
			t.Fatalf("nobody's list: %d", status)
		}
	}
	if status, body := get(t, 0, addr, "/v2/sandboxes", key); status != http.StatusTooManyRequests || !strings.Contains(body, "connections") {
		t.Errorf("nobody's fourth connection: %d %q", status, body)
	}
	if status, _ := get(t, 0, addr, "/v2/sandboxes", other); status != http.StatusOK {
		t.Errorf("daemon's list: %d", status)
	}
	// They no longer count against their peer: it connects as before.
	if status, _ := get(t, 0, addr, "/health", ""); status != http.StatusNoContent {
		t.Errorf("/health: %d", status)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for i := 0; !cond(); i++ {
		if i == 1000 {
			t.Fatal("timed out")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestDeadlines: an authenticated request's body has bodyTimeout, cleared at its end (a handler that
// runs longer is not cancelled, nor is one of a request with no body); a client stream's messages
// extend it; a client that stops reading an answer is dropped after writeTimeout.
func TestDeadlines(t *testing.T) {
	shorten(t, &bodyTimeout, 300*time.Millisecond)
	shorten(t, &streamIdle, time.Second)
	shorten(t, &writeTimeout, 300*time.Millisecond)
	s, key, _ := newServer(t)
	wrote := make(chan error, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/long": // reads its body, then outlasts bodyTimeout
			if _, err := io.ReadAll(r.Body); err != nil {
				http.Error(w, err.Error(), 400)
				return
			}
			select {
			case <-time.After(time.Second):
				io.WriteString(w, "done")
			case <-r.Context().Done():
				http.Error(w, "cancelled", 500)
			}
		case "/read":
			b, err := io.ReadAll(r.Body)
			if err != nil {
				http.Error(w, "body: "+err.Error(), 400)
				return
			}
			fmt.Fprintf(w, "%s", b)
		case "/stream": // a client stream: each message extends the deadline
			br := bufio.NewReader(r.Body)
			var got []string
			for {
				line, err := br.ReadString('\n')
				if err != nil {
					fmt.Fprintf(w, "%v after %q", err, got)
					return
				}
				got = append(got, strings.TrimSpace(line))
				extendBody(r.Context())
			}
		case "/big":
			for {
				if _, err := w.Write(make([]byte, 64<<10)); err != nil {
					wrote <- err
					return
				}
			}
		}
	})
	addr := serveOn(t, s, s.guard(s.logged(h)))
	send := func(method, path, extra string) net.Conn {
		c := dialAs(t, 0, addr)
		fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: e2b\r\nX-API-Key: %s\r\n%s\r\n", method, path, key, extra)
		return c
	}
	if status, body := answer(send("POST", "/long", "Content-Length: 2\r\n\r\nhi"), 10*time.Second); status != 200 || body != "done" {
		t.Errorf("a handler outlasting its body's deadline: %d %q", status, body)
	}
	if status, body := answer(send("GET", "/long", ""), 10*time.Second); status != 200 || body != "done" {
		t.Errorf("a handler of a request with no body: %d %q", status, body)
	}
	if status, body := answer(send("POST", "/read", "Content-Length: 100\r\n\r\nsome"), 10*time.Second); status != 400 || !strings.Contains(body, "timeout") {
		t.Errorf("a body that stops: %d %q", status, body)
	}
	c := send("POST", "/stream", "Transfer-Encoding: chunked\r\n")
	for i, m := range []string{"one", "two", "three"} {
		if i > 0 {
			time.Sleep(600 * time.Millisecond) // past bodyTimeout, within streamIdle
		}
		fmt.Fprintf(c, "%x\r\n%s\n\r\n", len(m)+1, m)
	}
	// Then nothing: the stream's deadline ends it.
	if status, body := answer(c, 10*time.Second); status != 200 || !strings.Contains(body, `["one" "two" "three"]`) || !strings.Contains(body, "timeout") {
		t.Errorf("a client stream: %d %q", status, body)
	}
	send("GET", "/big", "") // and never read
	select {
	case err := <-wrote:
		if !isTimeout(err) && !strings.Contains(err.Error(), "timeout") {
			t.Errorf("writing to a client that does not read: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Error("a client that does not read holds its answer's writes")
	}
}
