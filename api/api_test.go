package api

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"toolshed.dev/shed/app"
	"toolshed.dev/shed/policy"
	"toolshed.dev/shed/store"
	"toolshed.dev/shed/trust"
)

// startServer serves a real store on a socket of its own; the returned policy hook runs before the
// real policy, so that a test can make a handler panic.
func startServer(t testing.TB, hook func(op string)) (string, *Server) {
	t.Helper()
	return startServerWith(t, hook, nil)
}

// startServerWith is startServer with the server's fields set by adjust before it serves.
func startServerWith(t testing.TB, hook func(op string), adjust func(*Server)) (string, *Server) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the store is root-only (CI runs as root)")
	}
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	st, err := store.Init(root)
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	if _, _, err := trust.OpenKeys(root).Ensure("test-1"); err != nil {
		t.Fatal(err)
	}
	svc := &app.Service{Root: root, Version: "test", Policy: func(s *app.Service, c *app.Caller, op string, req any) error {
		if hook != nil {
			hook(op)
		}
		return policy.Check(s, c, op, req)
	}}
	sock := filepath.Join(dir, "run", "shed.sock")
	ln, err := Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &Server{Service: svc, ReadTimeout: 300 * time.Millisecond, MaxConns: 8, MaxPerUser: 8}
	if adjust != nil {
		adjust(srv)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	// An answer says Serve runs, with what it holds (its reserve descriptor) open: tests count them.
	if err := (&Client{Socket: sock, Stdio: &[3]*os.File{os.Stdin, os.Stdout, os.Stderr}}).Call(ctx, "no.such", struct{}{}, nil); err == nil {
		t.Fatal("an unknown operation succeeded")
	}
	return sock, srv
}

// raw sends header, rights and body as given, then reads the daemon's messages until it closes.
func raw(t *testing.T, sock string, hdr []byte, fds []int, body []byte) []Message {
	t.Helper()
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	// A refusal may come, and the daemon close, before the client is done writing (busy): what it
	// answered is read all the same.
	_, _, _ = c.WriteMsgUnix(hdr, oob, nil)
	if body != nil {
		c.Write(body)
	}
	// No half-close: the daemon takes the end of the client's side for the client gone, and cancels.
	// A truncated request is answered when the read timeout ends.
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var out []Message
	dec := json.NewDecoder(c)
	for {
		var m Message
		if err := dec.Decode(&m); err != nil {
			return out
		}
		out = append(out, m)
	}
}

func frame(body []byte) []byte {
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], uint32(len(body)))
	return hdr[:]
}

func devnull(t *testing.T) []int {
	f, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	fd := int(f.Fd())
	return []int{fd, fd, fd}
}

func errorCode(ms []Message) app.Code {
	if len(ms) == 0 || ms[len(ms)-1].Error == nil {
		return ""
	}
	return ms[len(ms)-1].Error.Code
}

func openFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestServerSurvives: no request, however malformed, huge, truncated or abandoned, and no panic in a
// handler, takes the daemon down or leaves a descriptor open; each gets one answer that says what.
func TestServerSurvives(t *testing.T) {
	sock, _ := startServer(t, func(op string) {
		if op == "gc" {
			panic("a handler's bug")
		}
	})
	io := devnull(t)
	good := func() {
		t.Helper()
		body, _ := json.Marshal(Request{Protocol: Protocol, Op: "workshop.ls"})
		ms := raw(t, sock, frame(body), io, body)
		if len(ms) != 1 || ms[0].Result == nil {
			t.Fatalf("a good request after the bad ones: %+v", ms)
		}
	}
	good()
	baseline := openFDs(t)
	req := func(s string) []byte { return []byte(s) }
	for _, c := range []struct {
		name string
		hdr  []byte
		fds  []int
		body []byte
		want app.Code // "" = any (the client may see nothing)
	}{
		{"no descriptors", frame(req(`{"protocol":1,"op":"gc"}`)), nil, req(`{"protocol":1,"op":"gc"}`), app.CodeBadRequest},
		{"one descriptor", frame(req(`{}`)), io[:1], req(`{}`), app.CodeBadRequest},
		{"five descriptors", frame(req(`{}`)), append(io, io[:2]...), req(`{}`), app.CodeBadRequest},
		{"a huge frame", []byte{0x7f, 0xff, 0xff, 0xff}, io, req(`{`), app.CodeBadRequest},
		{"a truncated body", frame(make([]byte, 100)), io, req(`{"protocol":1`), app.CodeBadRequest},
		{"a truncated header", []byte{0, 0}, io, nil, app.CodeBadRequest},
		{"not JSON", frame(req("GET / HTTP/1.1\r\n\r\n")), io, req("GET / HTTP/1.1\r\n\r\n"), app.CodeBadRequest},
		{"null", frame(req(`null`)), io, req(`null`), app.CodeBadRequest},
		{"an unknown operation", frame(req(`{"protocol":1,"op":"rm -rf"}`)), io, req(`{"protocol":1,"op":"rm -rf"}`), app.CodeUnknownOperation},
		{"an unknown envelope field", frame(req(`{"protocol":1,"op":"gc","root":"/tmp"}`)), io, req(`{"protocol":1,"op":"gc","root":"/tmp"}`), app.CodeBadRequest},
		{"an unknown request field", frame(req(`{"protocol":1,"op":"realize","request":{"workshop":"x","root":"/tmp"}}`)), io,
			req(`{"protocol":1,"op":"realize","request":{"workshop":"x","root":"/tmp"}}`), app.CodeBadRequest},
		{"a wrong type", frame(req(`{"protocol":1,"op":"bench.run","request":{"argv":"sh"}}`)), io, req(`{"protocol":1,"op":"bench.run","request":{"argv":"sh"}}`), app.CodeBadRequest},
		{"another protocol", frame(req(`{"protocol":2,"op":"gc"}`)), io, req(`{"protocol":2,"op":"gc"}`), app.CodeBadRequest},
		{"two requests in one", frame(req(`{"protocol":1,"op":"workshop.ls"}{"protocol":1,"op":"gc"}`)), io,
			req(`{"protocol":1,"op":"workshop.ls"}{"protocol":1,"op":"gc"}`), app.CodeBadRequest},
		{"a duplicate key (the last is what is authorized and run: gc, which panics here)", frame(req(`{"protocol":1,"op":"workshop.ls","op":"gc"}`)), io, req(`{"protocol":1,"op":"workshop.ls","op":"gc"}`), app.CodeInternal},
		{"a panicking handler", frame(req(`{"protocol":1,"op":"gc"}`)), io, req(`{"protocol":1,"op":"gc"}`), app.CodeInternal},
	} {
		ms := raw(t, sock, c.hdr, c.fds, c.body)
		if got := errorCode(ms); got != c.want {
			t.Errorf("%s: answered %q (%+v), want %q", c.name, got, ms, c.want)
		}
		good()
	}
	// A client that says nothing is dropped after the read timeout.
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(c); err != nil {
		t.Errorf("a silent client: %v, want the daemon to answer and close", err)
	}
	c.Close()
	if !strings.Contains(buf.String(), `"bad_request"`) {
		t.Errorf("a silent client got %q", buf.String())
	}
	// Clients killed mid-request: the connection just closes under the daemon.
	for range 20 {
		c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: sock, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		body, _ := json.Marshal(Request{Protocol: Protocol, Op: "store.verify"})
		c.WriteMsgUnix(frame(body), unix.UnixRights(io...), nil)
		c.Write(body[:len(body)/2])
		c.Close()
	}
	good()
	waitFDs(t, baseline)
}

// waitFDs waits for the process's descriptors to come back to n (the daemon's goroutines close
// theirs as they notice their clients are gone).
func waitFDs(t *testing.T, n int) {
	t.Helper()
	var now int
	for range 100 {
		if now = openFDs(t); now <= n {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Errorf("%d descriptors open, %d before", now, n)
}

// TestServerManyConnections: a hundred clients at once (root's: operators are not capped) each get
// their answer; nothing hangs and every descriptor is closed after.
func TestServerManyConnections(t *testing.T) {
	sock, srv := startServer(t, nil)
	io := devnull(t)
	baseline := openFDs(t)
	body, _ := json.Marshal(Request{Protocol: Protocol, Op: "store.verify"})
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[app.Code]int{}
	for range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ms := raw(t, sock, frame(body), io, body)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case len(ms) == 1 && ms[0].Result != nil:
				codes["ok"]++
			default:
				codes[errorCode(ms)]++
				if errorCode(ms) != app.CodeBusy && len(ms) > 0 && ms[len(ms)-1].Error != nil {
					t.Logf("%+v", *ms[len(ms)-1].Error)
				}
			}
		}()
	}
	wg.Wait()
	if codes["ok"] != 100 {
		t.Errorf("100 clients at once: %v", codes)
	}
	_ = srv
	waitFDs(t, baseline)
}

// TestAdmit: users' requests in flight are bounded per uid and in all, and refused past that;
// operators' never are (users holding every slot cannot lock them out).
func TestAdmit(t *testing.T) {
	srv := &Server{MaxConns: 5, MaxPerUser: 3, byUID: map[uint32]int{}}
	alice, bob := &app.Caller{UID: 1001, Role: app.User}, &app.Caller{UID: 1002, Role: app.User}
	root := &app.Caller{UID: 0, Role: app.Operator}
	var release []func()
	for i := range 3 {
		r, ok := srv.admit(alice)
		if !ok {
			t.Fatalf("alice's request %d refused", i)
		}
		release = append(release, r)
	}
	if _, ok := srv.admit(alice); ok {
		t.Error("alice's fourth request admitted (3 per user)")
	}
	for i := range 2 {
		r, ok := srv.admit(bob)
		if !ok {
			t.Fatalf("bob's request %d refused", i)
		}
		release = append(release, r)
	}
	if _, ok := srv.admit(bob); ok {
		t.Error("a sixth request admitted (5 in all)")
	}
	for range 10 {
		if _, ok := srv.admit(root); !ok {
			t.Error("an operator's request refused")
		}
	}
	release[0]()
	if _, ok := srv.admit(bob); !ok {
		t.Error("a request refused after one ended")
	}
}

// TestClient: the client the CLI uses, against the real server: results decode into the typed
// result; a refusal is an *app.Error with its code and hint.
func TestClient(t *testing.T) {
	sock, _ := startServer(t, nil)
	cl := &Client{Socket: sock}
	var keys app.KeysResult
	if err := cl.Call(context.Background(), "key.show", &app.KeyShowRequest{}, &keys); err != nil || !strings.HasPrefix(keys.PublicKey, "test-1:") {
		t.Errorf("key.show: %+v %v", keys, err)
	}
	err := cl.Call(context.Background(), "no.such", struct{}{}, nil)
	var ae *app.Error
	if !errors.As(err, &ae) || ae.Code != app.CodeUnknownOperation {
		t.Errorf("an unknown operation: %v", err)
	}
	err = cl.Call(context.Background(), "realize", map[string]any{"workshop": "x", "root": "/tmp"}, nil)
	if !errors.As(err, &ae) || ae.Code != app.CodeBadRequest || !strings.Contains(ae.Error(), `unknown field "root"`) {
		t.Errorf("an unknown field: %v", err)
	}
}

// TestCallerOf: the role comes from the kernel's uid alone.
func TestCallerOf(t *testing.T) {
	if c := CallerOf(0, 0, "shed-ops"); c.Role != app.Operator || c.User != "root" {
		t.Errorf("uid 0: %+v", c)
	}
	if c := CallerOf(65534, 65534, "shed-ops"); c.Role != app.User {
		t.Errorf("nobody: %+v", c)
	}
	if c := CallerOf(0x70000000+5, 0x70000000+5, "shed-ops"); c.Role != app.Agent {
		t.Errorf("a sandbox's root: %+v", c)
	}
	if c := CallerOf(0x70000000+512*65536, 0, "shed-ops"); c.Role == app.Agent {
		t.Errorf("past the sandboxes' ids: %+v", c)
	}
}

// TestListenModes: the supervisor's socket is open to every local user (each request is checked),
// in a directory only root writes; the process's umask is left as it was (the supervisor serves
// requests concurrently, and a umask is the whole process's).
func TestListenModes(t *testing.T) {
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	path := filepath.Join(t.TempDir(), "run", "shed.sock")
	ln, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if fi, err := os.Stat(path); err != nil || fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o666 {
		t.Errorf("socket: %v %v, want a socket of mode 0666", fi.Mode(), err)
	}
	if fi, err := os.Stat(filepath.Dir(path)); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("its directory: %v %v, want 0755", fi.Mode(), err)
	}
	if now := syscall.Umask(0o077); now != 0o077 {
		t.Errorf("Listen left the umask at %#o", now)
	}
	if _, err := Listen(path); err == nil || !strings.Contains(err.Error(), "already listens") {
		t.Errorf("a second supervisor on a live socket: %v, want refused", err)
	}
}

// FuzzDecode: the request decoder never panics, and what it accepts names a real operation with a
// request of that operation's type.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`{"protocol":1,"op":"realize","request":{"workshop":"tools","offline":true}}`,
		`{"protocol":1,"op":"bench.run","request":{"workshop":"tools","argv":["sh","-c","id"],"grants":["/srv:/w:rw"]}}`,
		`{"protocol":1,"op":"workshop.diff","request":{"name":"tools","a":1}}`,
		`{"protocol":1,"op":"gc","dir":"/root","progress":true}`,
		`{"protocol":1,"op":"gc","request":null}`,
		`{"protocol":1,"op":"key.trust","request":{"key":"a:b"}} `,
		`{"protocol":2}`, `null`, `[]`, `{"op":"x"`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, o, v, err := Decode(body)
		if err != nil {
			var ae *app.Error
			if !errors.As(err, &ae) || (ae.Code != app.CodeBadRequest && ae.Code != app.CodeUnknownOperation) {
				t.Fatalf("an error that is not bad_request or unknown_operation: %#v", err)
			}
			return
		}
		if req.Protocol != Protocol || o == nil || v == nil {
			t.Fatalf("accepted %q as %+v %v %v", body, req, o, v)
		}
		if o2, ok := app.Lookup(req.Op); !ok || o2 != o {
			t.Fatalf("accepted op %q", req.Op)
		}
	})
}

// BenchmarkCall is one request through the daemon's socket (connect, descriptors, decode, policy,
// operation, result) against the same operation called in process: what the typed API costs a
// command. key.show reads the key and the config, as a cache-hit command reads its records.
func BenchmarkCall(b *testing.B) {
	sock, srv := startServer(b, nil)
	b.Run("in-process", func(b *testing.B) {
		call := &app.Call{Caller: &app.Caller{User: "root", Role: app.Operator}}
		for b.Loop() {
			if _, err := srv.Service.Do(context.Background(), call, "key.show", &app.KeyShowRequest{}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("socket", func(b *testing.B) {
		cl := &Client{Socket: sock}
		for b.Loop() {
			var res app.KeysResult
			if err := cl.Call(context.Background(), "key.show", &app.KeyShowRequest{}, &res); err != nil {
				b.Fatal(err)
			}
		}
	})
}
