package wire

import (
	"context"
	"encoding/binary"
	"net"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"
)

// Open connects to the supervisor at sock and sends one request, frame (a Request, encoded), with
// the descriptors stdio (the client's stdin, stdout and stderr) passed by SCM_RIGHTS: the first half
// of the protocol, whose answers the caller then reads (JSON Messages, one a line). Cancelling ctx
// closes the connection, which cancels the operation; done closes it too, and ends that.
func Open(ctx context.Context, sock string, frame []byte, stdio [3]int) (c *net.UnixConn, done func(), err error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		return nil, nil, err
	}
	c = nc.(*net.UnixConn)
	stop := context.AfterFunc(ctx, func() { c.Close() })
	done = func() { stop(); c.Close() }
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], uint32(len(frame)))
	if _, _, err := c.WriteMsgUnix(hdr[:], unix.UnixRights(stdio[0], stdio[1], stdio[2]), nil); err != nil {
		done()
		return nil, nil, err
	}
	if _, err := c.Write(frame); err != nil {
		done()
		return nil, nil, err
	}
	return c, done, nil
}

// RelayResizes sends MsgWinch on c each time this process's terminal is resized, if tty (the stdin it
// sent) is one: the kernel sends SIGWINCH to the terminal's foreground process, the client, not to the
// Bench's. stop ends it.
func RelayResizes(c *net.UnixConn, tty int) (stop func()) {
	if _, err := unix.IoctlGetTermios(tty, unix.TCGETS); err != nil {
		return func() {}
	}
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-winch:
				_, _ = c.Write([]byte{MsgWinch})
			case <-done:
				return
			}
		}
	}()
	return func() { signal.Stop(winch); close(done) }
}
