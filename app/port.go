package app

import (
	"context"
	"errors"
	"fmt"
	"net"

	"toolshed.dev/shed/sandbox"
)

// ErrPortClosed is DialPort's error for a port nothing in the Bench listens on.
var ErrPortClosed = sandbox.ErrPortClosed

// ErrNotRunning is in DialPort's error when the Bench is not there to dial (ended, removed, not the
// caller's).
var ErrNotRunning = errors.New("no running Bench to connect to")

// DialPort connects to a port on the loopback of a running Bench that the caller may use, as a
// process in the Bench would (E2B's PORT-ID.DOMAIN hosts). It is not an operation of the table: its
// result is a connection, which a socket or MCP caller could not hold; the E2B face calls it for a
// request it authorized (the sandbox's owner, or its traffic token), as that owner.
func (s *Service) DialPort(ctx context.Context, c *Call, nameOrID string, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, usage("a port from 1 to 65535", "port %d", port)
	}
	st, rec, err := s.runningBench(c, nameOrID)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNotRunning, err)
	}
	st.Close()
	conn, err := sandbox.DialPort(ctx, rec.Pid, port)
	switch {
	case errors.Is(err, sandbox.ErrPortClosed):
		return nil, fail(CodeNotFound, fmt.Errorf("bench %s: %w", rec.Name, err), "start the server first, on any address of the Bench (0.0.0.0 or 127.0.0.1)")
	case err != nil:
		return nil, fail(CodeFailed, fmt.Errorf("bench %s, port %d: %w", rec.Name, port, err), "")
	}
	return conn, nil
}
