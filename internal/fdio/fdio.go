// Package fdio reads and writes descriptors that belong to someone else (a client of the supervisor:
// its terminal, a pipe it holds) without ever blocking past the end of the request.
//
// A descriptor passed with SCM_RIGHTS is usually blocking, and setting O_NONBLOCK on it would change
// the client's own open file (its shell's terminal). So each read and write first polls, in slices,
// until the descriptor is ready or the context ends: a client that holds a pipe open and silent, or a
// terminal stopped with ^S, costs a sleeping goroutine for as long as its request lasts, not a thread
// forever.
package fdio

import (
	"context"
	"errors"
	"io"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// slice is how long one poll waits before the context is checked again.
const slice = 100 * time.Millisecond

// chunk bounds one write: after POLLOUT a pipe or socket takes a page without blocking, and a
// terminal whose buffer is nearly full takes a little (n_tty reports POLLOUT below 256 bytes queued).
const chunk = 256

// ErrDropped is what a Writer with a deadline says of bytes it dropped (it returns no error for them:
// see Writer).
var ErrDropped = errors.New("fdio: the descriptor was not writable in time")

// Reader reads f until ctx ends (then io.EOF).
func Reader(ctx context.Context, f *os.File) io.Reader { return &reader{ctx, f} }

type reader struct {
	ctx context.Context
	f   *os.File
}

func (r *reader) Read(p []byte) (int, error) {
	if err := wait(r.ctx, r.f, unix.POLLIN, 0); err != nil {
		return 0, io.EOF
	}
	n, err := r.f.Read(p)
	if n == 0 && err == nil {
		err = io.EOF
	}
	return n, err
}

// Writer writes to f until ctx ends (then ctx's error). With drop > 0, bytes that cannot be written
// within drop are dropped without an error: for output that is best effort (progress bars, the
// builds' own output, kept in the build log anyway), which must never hold up the work that draws it.
func Writer(ctx context.Context, f *os.File, drop time.Duration) io.Writer {
	return &writer{ctx, f, drop}
}

type writer struct {
	ctx  context.Context
	f    *os.File
	drop time.Duration
}

// Fd is the descriptor's number, for the callers that ask whether it is a terminal.
func (w *writer) Fd() uintptr { return w.f.Fd() }

func (w *writer) Write(p []byte) (int, error) {
	written := 0
	for len(p) > 0 {
		n := min(len(p), chunk)
		if err := wait(w.ctx, w.f, unix.POLLOUT, w.drop); errors.Is(err, ErrDropped) {
			return written + len(p), nil
		} else if err != nil {
			return written, err
		}
		m, err := w.f.Write(p[:n])
		written += m
		if err != nil {
			return written, err
		}
		p = p[m:]
	}
	return written, nil
}

// wait polls f for events until it is ready, ctx ends, or (with limit > 0) limit passes.
func wait(ctx context.Context, f *os.File, events int16, limit time.Duration) error {
	start := time.Now()
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		// Through SyscallConn, not Fd: Fd would set the descriptor blocking, the client's too.
		rc, err := f.SyscallConn()
		if err != nil {
			return err
		}
		var n int
		if cerr := rc.Control(func(fd uintptr) {
			n, err = unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: events}}, int(slice/time.Millisecond))
		}); cerr != nil {
			return cerr
		}
		if err != nil && !errors.Is(err, unix.EINTR) {
			return err
		}
		if n > 0 {
			// Ready, or hung up or in error: the read or write says which.
			return nil
		}
		if limit > 0 && time.Since(start) >= limit {
			return ErrDropped
		}
	}
}
