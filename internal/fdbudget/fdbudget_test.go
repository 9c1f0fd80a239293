package fdbudget

import "testing"

// TestFor: at every limit, the faces together take at most half of it, and no one party's cap is
// more than a quarter of its face's: one party at its cap leaves the others served.
func TestFor(t *testing.T) {
	for _, limit := range []int{1024, 4096, 20000, 65536, 524288, 1 << 20} {
		b := For(limit)
		if b.Faces() > limit/2 {
			t.Errorf("limit %d: the faces take %d descriptors, more than half", limit, b.Faces())
		}
		for _, c := range []struct {
			name        string
			party, face int
		}{
			{"socket uid", b.SocketPerUser, b.SocketRequests},
			{"e2b peer before authentication", b.E2BPerPeer, b.E2BPreAuth},
			{"e2b key's user", b.E2BPerUser, b.E2BConns},
			{"propose Bench", b.ProposePerBench, b.ProposeConns},
			{"proxy Bench", b.ProxyPerBench, b.ProxyConns},
		} {
			if c.party <= 0 || 4*c.party > c.face {
				t.Errorf("limit %d: %s: %d of %d", limit, c.name, c.party, c.face)
			}
		}
		if b.E2BPreAuth > b.E2BConns/2 || b.E2BInFlight > b.E2BPerUser {
			t.Errorf("limit %d: %+v", limit, b)
		}
	}
	if b := For(20000); b.SocketRequests != 64 || b.SocketPerUser != 16 || b.E2BConns != 2048 || b.E2BPerPeer != 128 || b.ProxyPerBench != 32 {
		t.Errorf("at 20000: %+v", b)
	}
}

// TestBurst: at a limit of 20000 (docs/supervisor.md's figures), a harness's burst of 100
// sandboxes at once, each create on a connection of its own before any authenticates, fits one local
// user's share (it was 32: the rest were answered 503, and the SDK failed them).
func TestBurst(t *testing.T) {
	if b := For(20000); b.E2BPerPeer < 100 || b.E2BPerUser < 2*100 || b.E2BInFlight < 100 {
		t.Errorf("at 20000: %+v", b)
	}
}

func TestProcess(t *testing.T) {
	if b := Process(); b.Limit < 1024 {
		t.Errorf("the process's budget: %+v", b)
	}
}
