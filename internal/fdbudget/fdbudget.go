// Package fdbudget divides the supervisor's file descriptors among the faces through which others
// reach it, so that no face, and no party on one, can take the descriptors the others and the
// supervisor's own work (builds, Benches, the store) need.
//
// The budget is computed from RLIMIT_NOFILE as the process runs (Go raises the soft limit to the
// hard one at start). Each face gets a share of it and a cap per party (a uid, a peer, a key's user,
// a Bench) well below that share, so that one party at its cap leaves the others served. The faces
// take together at most about half of the limit; docs/supervisor.md has the numbers at 20000 and at
// 1024.
package fdbudget

import (
	"sync"

	"golang.org/x/sys/unix"
)

// Budget is what each face may hold at once.
type Budget struct {
	// Limit is the RLIMIT_NOFILE the budget was made from.
	Limit int

	// SocketRequests bounds the users' requests in flight on the supervisor's socket, SocketPerUser
	// those of one uid (operators are not counted). Each holds the connection and the client's three
	// descriptors.
	SocketRequests, SocketPerUser int

	// E2BConns bounds the E2B port's connections. Of those, E2BPerPeer may belong to one peer (a
	// remote address, or a local uid) before a request on them authenticates, and E2BPreAuth to all
	// peers together; E2BPerUser to one key's user after. E2BInFlight bounds one key's user's
	// requests in flight.
	E2BConns, E2BPreAuth, E2BPerPeer, E2BPerUser, E2BInFlight int

	// ProposeConns bounds the connections to all Benches' propose sockets, ProposePerBench those to
	// one.
	ProposeConns, ProposePerBench int

	// ProxyConns bounds the client connections of all Benches' proxies (each may hold an upstream
	// one too), ProxyPerBench those of one Bench's.
	ProxyConns, ProxyPerBench int
}

// For is the budget of a process whose RLIMIT_NOFILE is limit.
func For(limit int) Budget {
	b := Budget{Limit: limit}
	b.SocketRequests = clamp(limit/64, 8, 64) // each holds 4 descriptors: at most limit/16
	b.SocketPerUser = max(b.SocketRequests/4, 2)
	b.E2BConns = clamp(limit/8, 32, 2048)
	b.E2BPreAuth = b.E2BConns / 2
	// A harness starts its sandboxes at once (ComputeSDK's burst: 100 creates from one client, each
	// on a connection of its own): a local user's share holds that, within a quarter of all.
	b.E2BPerPeer = clamp(b.E2BConns/16, 4, 128)
	b.E2BPerUser = clamp(b.E2BConns/8, 8, 256)
	b.E2BInFlight = max(b.E2BPerUser/2, 4)
	b.ProposeConns = clamp(limit/32, 16, 1024)
	b.ProposePerBench = 4
	b.ProxyConns = clamp(limit/16, 32, 2048) // each may hold 2 descriptors: at most limit/8
	b.ProxyPerBench = clamp(b.ProxyConns/16, 4, 32)
	return b
}

// Faces is the most descriptors the faces' caps let them hold together, beside the per-Bench idle
// upstream connections of the proxies (proxy.MaxIdle each).
func (b Budget) Faces() int {
	return 4*b.SocketRequests + b.E2BConns + b.ProposeConns + 2*b.ProxyConns
}

func clamp(v, lo, hi int) int { return min(max(v, lo), hi) }

// Process is the budget of this process, computed once from its RLIMIT_NOFILE (1024 if it cannot
// be read).
var Process = sync.OnceValue(func() Budget {
	var rl unix.Rlimit
	limit := 1024
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err == nil {
		limit = int(min(rl.Cur, 1<<20)) // unlimited: the caps are at their most long before
	}
	return For(limit)
})
