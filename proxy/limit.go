package proxy

import (
	"net"
	"sync"
)

// DefaultMaxConns is a Proxy's bound on client connections served at once when Config names none.
const DefaultMaxConns = 32

// MaxIdle bounds a Serve's idle upstream connections (4 per destination): what a Proxy holds beyond
// two descriptors for each client connection.
const MaxIdle = 8

// Share is a number of client connections several Proxies draw from together: a process's
// descriptor budget for them.
type Share struct{ slots chan struct{} }

// NewShare is a share of n connections.
func NewShare(n int) *Share { return &Share{slots: make(chan struct{}, n)} }

// InUse is the number of its connections open now.
func (s *Share) InUse() int { return len(s.slots) }

// limitListener accepts while the Proxy's own bound has room (its client's further connections wait
// in the kernel's queue, costing no descriptor), then waits, holding that one connection, for a slot
// of the shared bound if there is one.
type limitListener struct {
	net.Listener
	own    chan struct{}
	shared *Share
	done   <-chan struct{}
}

func (l *limitListener) Accept() (net.Conn, error) {
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
	release := func() { <-l.own }
	if l.shared != nil {
		select {
		case l.shared.slots <- struct{}{}:
			release = func() { <-l.shared.slots; <-l.own }
		case <-l.done:
			c.Close()
			<-l.own
			return nil, net.ErrClosed
		}
	}
	return &slotConn{Conn: c, release: release}, nil
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

// CloseWrite half-closes the connection where it can (a tunnel passes the end of one direction
// on); elsewhere it closes it.
func (c *slotConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Close()
}
