package proxy

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// tunnel serves an allowed CONNECT: dial, answer 200, then relay both ways until both sides are done.
func (s *server) tunnel(w http.ResponseWriter, r *http.Request, t target, addrs []netip.Addr, d *Decision) {
	up, dialed, err := s.p.dialChecked(r.Context(), addrs, t.port)
	if err != nil {
		d.Reason = "upstream: " + err.Error()
		refuse(w, http.StatusBadGateway, true, "shed proxy: cannot reach "+t.String())
		return
	}
	var tn *tunnelConns
	var cut atomic.Bool
	ready := make(chan struct{})
	// Connected to exactly the address dialed: an update checks the rules for it.
	ex := &exchange{host: t.host, addrs: []netip.Addr{dialed}, cut: func() {
		cut.Store(true)
		go func() { // tn is set before ready closes, or never
			<-ready
			if tn != nil {
				tn.abort(errCut)
			}
		}()
	}}
	if !s.p.begin(ex) {
		up.Close()
		s.denied(w, true, t, d)
		return
	}
	defer s.p.end(ex)
	defer func() {
		select {
		case <-ready:
		default:
			close(ready)
		}
	}()
	client, rw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		up.Close()
		d.Reason = "hijack: " + err.Error()
		refuse(w, http.StatusInternalServerError, true, "shed proxy: cannot open a tunnel")
		return
	}
	d.Allowed = true
	tn = &tunnelConns{client: client, up: up, idle: s.p.tunnelIdle}
	close(ready)
	if cut.Load() {
		tn.abort(errCut)
	}
	// The request's context ends when Serve stops: tear the tunnel down then.
	stop := context.AfterFunc(r.Context(), func() { tn.abort(nil) })
	defer stop()
	defer client.Close()
	defer up.Close()

	tn.touch()
	if _, err := io.WriteString(client, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		d.Reason = "client: " + err.Error()
		return
	}
	// Bytes the client sent right after its CONNECT head (a TLS ClientHello, say) were read into
	// net/http's buffer already: they go first.
	if n := rw.Reader.Buffered(); n > 0 {
		b, _ := rw.Reader.Peek(n)
		if _, err := up.Write(b); err != nil {
			d.Reason = "upstream: " + err.Error()
			return
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		tn.copy(up, client)
	}()
	d.Bytes = tn.copy(client, up)
	<-done
	stopped := !stop() // the tunnel ended because Serve stopped, not by itself
	switch err := tn.firstErr(); {
	case stopped:
		d.Reason = "proxy stopped"
	case cut.Load():
		d.Reason, d.Cut = errCut.Error(), true
	case err == nil:
	case errors.Is(err, os.ErrDeadlineExceeded):
		d.Reason = "idle timeout"
	default:
		d.Reason = "relay: " + err.Error()
	}
}

// tunnelConns are the two ends of a tunnel.
type tunnelConns struct {
	client, up net.Conn
	idle       time.Duration
	last       atomic.Int64 // UnixNano of the last deadline extension

	mu      sync.Mutex
	aborted bool
	err     error // the first error of either direction, or nil if the first abort had none
}

// touch pushes both connections' deadlines idle into the future. A tunnel is idle only when neither
// direction moves, so traffic either way extends both (a download sends nothing upstream for minutes).
// Deadlines are moved at most every idle/8 to keep the cost off the byte path.
func (t *tunnelConns) touch() {
	now := time.Now()
	if now.UnixNano()-t.last.Load() < int64(t.idle/8) {
		return
	}
	t.last.Store(now.UnixNano())
	dl := now.Add(t.idle)
	t.client.SetDeadline(dl)
	t.up.SetDeadline(dl)
}

// abort records err, if it is the first, and closes both ends so that the other direction stops too.
func (t *tunnelConns) abort(err error) {
	t.mu.Lock()
	if !t.aborted {
		t.aborted, t.err = true, err
	}
	t.mu.Unlock()
	t.client.Close()
	t.up.Close()
}

func (t *tunnelConns) firstErr() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.err
}

// copy relays src to dst until src ends, then half-closes dst so that the far side sees the end of the
// stream while the other direction goes on. It returns the bytes written to dst.
func (t *tunnelConns) copy(dst, src net.Conn) int64 {
	buf := make([]byte, relayBufSize)
	var n int64
	for {
		nr, rerr := src.Read(buf)
		if nr > 0 {
			t.touch()
			nw, werr := dst.Write(buf[:nr])
			n += int64(nw)
			if werr != nil {
				if dst == t.client && clientHungUp(werr) {
					werr = nil
				}
				t.abort(werr)
				return n
			}
		}
		if rerr == io.EOF {
			if cw, ok := dst.(interface{ CloseWrite() error }); ok {
				cw.CloseWrite()
			} else {
				// Without half-close the far side never sees the end: end both directions.
				t.abort(nil)
			}
			return n
		}
		if rerr != nil {
			if src == t.client && clientHungUp(rerr) {
				rerr = nil
			}
			t.abort(rerr)
			return n
		}
	}
}

// clientHungUp reports whether err is the client's end of the tunnel rather than a failure of the relay.
// A client that hangs up with bytes unread (a TLS session ticket, say) resets rather than closes, and the
// reset surfaces on whichever direction touches the client next: ECONNRESET on a read or a write, EPIPE
// on a write after it.
func clientHungUp(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}
