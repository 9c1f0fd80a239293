package bench

import (
	"context"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"toolshed.dev/shed/internal/fdbudget"
)

// listenPropose makes the propose socket, mode 0600. The mode is set after the bind, not by a umask
// around it: the umask is the process's, and the supervisor launches Benches concurrently. The
// Bench's directory is root's and 0700, so nobody else reaches the socket in between.
func listenPropose(path string) (*net.UnixListener, error) {
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, err
	}
	ln.SetUnlinkOnClose(true)
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// What a Bench's agent may hold of the supervisor through its propose socket. The Bench is the
// socket's only party: its connections past its share (fdbudget's ProposePerBench) wait in the
// kernel's queue, costing the supervisor no descriptor, and only that Bench waits. Over all Benches
// the process's share (ProposeConns) is never passed: a Bench finding it full waits for a slot.
// Variables so that tests can shorten them.
var (
	proposeHeaderTimeout = 5 * time.Second  // the request's line and headers
	proposeReadTimeout   = 10 * time.Second // the whole request, body included (it has none)
	proposeIdle          = 5 * time.Second  // a keep-alive connection with no request
	proposeWriteTimeout  = 30 * time.Second // writing the answer
)

// proposeSlots is the process's share of connections to propose sockets, over all Benches.
var proposeSlots = sync.OnceValue(func() chan struct{} { return make(chan struct{}, fdbudget.Process().ProposeConns) })

// serveProposals answers POST /propose, one at a time, and nothing else: this socket is all an agent
// in the Bench can reach of shed.
func serveProposals(ctx context.Context, ln *net.UnixListener, propose func(context.Context) (string, error)) {
	serveProposalsCapped(ctx, ln, propose, fdbudget.Process().ProposePerBench, proposeSlots())
}

func serveProposalsCapped(ctx context.Context, ln net.Listener, propose func(context.Context) (string, error), perBench int, all chan struct{}) {
	one := make(chan struct{}, 1)
	mux := http.NewServeMux()
	mux.HandleFunc("POST /propose", func(w http.ResponseWriter, r *http.Request) {
		select {
		case one <- struct{}{}:
			defer func() { <-one }()
		default:
			http.Error(w, "a proposal is being made; try again when it is done\n", http.StatusTooManyRequests)
			return
		}
		text, err := propose(r.Context())
		_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(proposeWriteTimeout))
		if err != nil {
			http.Error(w, "shed: error: "+err.Error()+"\n", http.StatusUnprocessableEntity)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Write([]byte(text))
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "shed: only POST /propose is served to a Bench\n", http.StatusForbidden)
	})
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: proposeHeaderTimeout,
		ReadTimeout:       proposeReadTimeout, // net/http lifts it when the body ends, while the proposal is made
		IdleTimeout:       proposeIdle,
		MaxHeaderBytes:    16 << 10,
	}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	_ = srv.Serve(&cappedListener{Listener: ln, own: make(chan struct{}, perBench), all: all, done: ctx.Done()}) // ends when the Bench does
}

// cappedListener accepts while its own share has room (the others wait in the kernel's queue), and
// while the shared one has.
type cappedListener struct {
	net.Listener
	own, all chan struct{}
	done     <-chan struct{}
}

func (l *cappedListener) Accept() (net.Conn, error) {
	select {
	case l.own <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.own
		return nil, err
	}
	// One connection of each Bench at most waits here for the shared share, holding its descriptor:
	// a Bench has a few of its own anyway.
	select {
	case l.all <- struct{}{}:
		return &slotConn{Conn: c, release: func() { <-l.all; <-l.own }}, nil
	case <-l.done:
		c.Close()
		<-l.own
		return nil, net.ErrClosed
	}
}

// slotConn gives its slots back when it closes.
type slotConn struct {
	net.Conn
	release func()
	once    sync.Once
}

func (c *slotConn) Close() error {
	c.once.Do(c.release)
	return c.Conn.Close()
}
