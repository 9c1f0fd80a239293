package e2b

import (
	"context"
	"net"
	"net/http"
	"testing"
)

// TestInsecureSandbox: a sandbox made with secure false is answered without its token for a client
// on loopback that is its owner or root (this test runs as root), and a secure one is not.
func TestInsecureSandbox(t *testing.T) {
	s, key, _ := newServer(t)
	// Served as the daemon serves it: the connection's client is known.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-done })
	url := "http://" + ln.Addr().String()
	k, _ := s.Keys.Lookup(key)
	s.add(&sandbox{id: "tools-open", bench: "no-such-bench", user: "nobody", keyID: k.ID, token: "t1", files: make(chan struct{}, 1)})
	s.add(&sandbox{id: "tools-shut", bench: "no-such-bench", user: "nobody", keyID: k.ID, token: "t2", secure: true, files: make(chan struct{}, 1)})
	for id, want := range map[string]int{"tools-open": http.StatusForbidden, "tools-shut": http.StatusUnauthorized} {
		req, _ := http.NewRequest("GET", url+"/files?path=/etc/hostname", nil)
		req.Header.Set("E2b-Sandbox-Id", id)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		// The open one gets past the token's check, to the policy (no Bench of that name is nobody's: 403).
		if resp.StatusCode != want {
			t.Errorf("%s without a token: %s, want %d", id, resp.Status, want)
		}
	}
}
