package sockdiag

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// dialAs connects to addr with a socket made as uid (the thread's filesystem uid, which the kernel
// records as the socket's owner).
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

// TestTCPOwner: the server side of a loopback connection learns its client's uid, over IPv4 and
// IPv6; a socket that is gone is not found.
func TestTCPOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: to make a socket as another uid")
	}
	for _, network := range []string{"tcp4", "tcp6"} {
		addr := map[string]string{"tcp4": "127.0.0.1:0", "tcp6": "[::1]:0"}[network]
		ln, err := net.Listen(network, addr)
		if err != nil {
			t.Logf("%s: %v", network, err)
			continue
		}
		defer ln.Close()
		for _, uid := range []int{0, 65534, 4242} {
			dialAs(t, uid, ln.Addr().String())
			c, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			local := c.LocalAddr().(*net.TCPAddr).AddrPort()
			remote := c.RemoteAddr().(*net.TCPAddr).AddrPort()
			got, err := TCPOwner(remote, local)
			if err != nil || got != uint32(uid) {
				t.Errorf("%s: the client made as %d: %d, %v", network, uid, got, err)
			}
			// The server's own socket is the server's.
			if got, err := TCPOwner(local, remote); err != nil || got != 0 {
				t.Errorf("%s: the server's socket: %d, %v", network, got, err)
			}
			c.Close()
		}
		if _, err := TCPOwner(netip.MustParseAddrPort(ln.Addr().String()), netip.MustParseAddrPort(ln.Addr().String())); !errors.Is(err, ErrNotFound) {
			t.Errorf("%s: a connection that does not exist: %v", network, err)
		}
	}
}
