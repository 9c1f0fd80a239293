package bench

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// proposeOn serves a propose socket for bench at a new path, with its share and the shared one.
func proposeOn(t *testing.T, bench string, perBench int, all chan struct{}) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "propose.sock")
	ln, err := listenPropose(sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		serveProposalsCapped(ctx, ln, func(context.Context) (string, error) { return "proposal of " + bench, nil }, perBench, all)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return sock
}

// proposeVia asks for a proposal on sock, giving up after d.
func proposeVia(sock string, d time.Duration) (string, error) {
	c := &http.Client{Timeout: d, Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	resp, err := c.Post("http://bench/propose", "", nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func openFDs(t *testing.T) int {
	t.Helper()
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}

// TestProposeShare is the reported attack: an agent opens a thousand connections to its Bench's
// propose socket and sends nothing. The supervisor accepts its share of them (the rest wait in the
// kernel's queue, costing it no descriptor), and cuts those after the header timeout; another
// Bench's agent proposes meanwhile. Over all Benches the shared share is never passed: a Bench that
// finds it full waits, and is served when a slot frees.
func TestProposeShare(t *testing.T) {
	old := proposeHeaderTimeout
	proposeHeaderTimeout = time.Second
	t.Cleanup(func() { proposeHeaderTimeout = old })
	all := make(chan struct{}, 6)
	a, b, c := proposeOn(t, "a", 4, all), proposeOn(t, "b", 4, all), proposeOn(t, "c", 4, all)

	before := openFDs(t)
	const n = 1000
	var attack []net.Conn
	for range n {
		conn, err := net.Dial("unix", a)
		if err != nil {
			t.Fatalf("connection %d: %v", len(attack), err)
		}
		attack = append(attack, conn)
	}
	time.Sleep(100 * time.Millisecond)
	if got := len(all); got != 4 {
		t.Errorf("the Bench's agent holds %d connections, want its share, 4", got)
	}
	// The supervisor's side: the attacker's own n, and its share.
	if extra := openFDs(t) - before - n; extra > 4+4 {
		t.Errorf("%d connections of one Bench cost the supervisor %d descriptors", n, extra)
	}
	if text, err := proposeVia(b, 10*time.Second); err != nil || text != "proposal of b" {
		t.Errorf("another Bench's proposal during the attack: %q %v", text, err)
	}

	// Two idle connections of b fill the shared share: c's agent waits, and is served once the
	// header timeout cuts them.
	for range 2 {
		conn, err := net.Dial("unix", b)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
	}
	time.Sleep(100 * time.Millisecond)
	if got := len(all); got != 6 {
		t.Errorf("the shared share holds %d, want 6", got)
	}
	start := time.Now()
	if text, err := proposeVia(c, 30*time.Second); err != nil || text != "proposal of c" {
		t.Errorf("a Bench past the shared share: %q %v, want served once a slot frees", text, err)
	}
	t.Logf("c waited %v for a slot", time.Since(start).Round(time.Millisecond))

	for _, conn := range attack {
		conn.Close()
	}
	if text, err := proposeVia(a, 30*time.Second); err != nil || text != "proposal of a" {
		t.Errorf("the attacker's Bench, its connections closed: %q %v", text, err)
	}
}
