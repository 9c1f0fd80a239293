package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// ErrPortClosed is DialPort's error for a port nothing in the sandbox listens on.
var ErrPortClosed = errors.New("nothing listens on that port in the sandbox")

// dialTimeout bounds a connect inside a sandbox: on its loopback one ends at once, unless the
// listener's queue is full.
const dialTimeout = 10 * time.Second

// DialPort connects to 127.0.0.1:port (or [::1]:port) inside the network namespace of the sandbox whose init is pid,
// as a process of the sandbox would: a server there is reached whatever address of the sandbox it
// binds, and nothing outside it is. The socket is made in that namespace (on a thread of its own,
// which goes back to the caller's namespace or ends) and connected from here. A namespace that is
// the caller's own (pid ended, and its number went to a host process) is refused.
func DialPort(ctx context.Context, pid, port int) (net.Conn, error) {
	if pid <= 0 || port < 1 || port > 65535 {
		return nil, fmt.Errorf("dial port %d of sandbox %d: a port from 1 to 65535 of a running sandbox", port, pid)
	}
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, fmt.Errorf("sandbox %d: %w", pid, err)
	}
	defer unix.Close(pidfd)
	if err := notOwnNetns(pid); err != nil {
		return nil, err
	}
	// 127.0.0.1, then ::1: a server bound to "localhost" may have taken only the IPv6 one (node's
	// resolve order puts ::1 first, so dev servers do).
	var fd int
	for _, sa := range []unix.Sockaddr{
		&unix.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}},
		&unix.SockaddrInet6{Port: port, Addr: [16]byte{15: 1}},
	} {
		family := unix.AF_INET
		if _, v6 := sa.(*unix.SockaddrInet6); v6 {
			family = unix.AF_INET6
		}
		if fd, err = socketIn(pidfd, family); err != nil {
			return nil, fmt.Errorf("socket in sandbox %d: %w", pid, err)
		}
		if err = connectTo(ctx, fd, sa); err == nil {
			break
		}
		unix.Close(fd)
		if !errors.Is(err, unix.ECONNREFUSED) && !errors.Is(err, unix.EADDRNOTAVAIL) && !errors.Is(err, unix.ENETUNREACH) {
			return nil, fmt.Errorf("port %d in sandbox %d: %w", port, pid, err)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("port %d: %w", port, ErrPortClosed)
	}
	f := os.NewFile(uintptr(fd), "sandbox-port")
	defer f.Close()
	return net.FileConn(f)
}

// notOwnNetns refuses pid's network namespace when it is this process's: a pid that is no longer a
// sandbox's must not open the host's loopback to a caller.
func notOwnNetns(pid int) error {
	var mine, theirs unix.Stat_t
	if err := unix.Stat("/proc/self/ns/net", &mine); err != nil {
		return err
	}
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &theirs); err != nil {
		return fmt.Errorf("sandbox %d: %w", pid, err)
	}
	if mine.Dev == theirs.Dev && mine.Ino == theirs.Ino {
		return fmt.Errorf("process %d is in the host's network namespace: not a running sandbox", pid)
	}
	return nil
}

// socketIn makes a TCP socket in the network namespace of the process pidfd names. setns changes
// only the calling thread: the work runs on a goroutine locked to its thread, which returns to this
// process's namespace before anything else runs on it, or ends with the goroutine (a thread left
// locked is not reused).
func socketIn(pidfd, family int) (int, error) {
	type result struct {
		fd  int
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		own, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{-1, err}
			return
		}
		defer unix.Close(own)
		if err := unix.Setns(pidfd, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- result{-1, err}
			return
		}
		fd, serr := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		if err := unix.Setns(own, unix.CLONE_NEWNET); err != nil {
			if serr == nil {
				unix.Close(fd)
			}
			ch <- result{-1, fmt.Errorf("back to the supervisor's network namespace: %w", err)}
			return // still locked: the thread ends with this goroutine
		}
		runtime.UnlockOSThread()
		ch <- result{fd, serr}
	}()
	r := <-ch
	return r.fd, r.err
}

// connectTo connects the non-blocking socket fd to sa, within ctx and dialTimeout.
func connectTo(ctx context.Context, fd int, sa unix.Sockaddr) error {
	err := unix.Connect(fd, sa)
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EINPROGRESS) {
		return err
	}
	deadline := time.Now().Add(dialTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	for {
		wait := time.Until(deadline)
		if wait <= 0 || ctx.Err() != nil {
			return cmpErr(ctx.Err(), unix.ETIMEDOUT)
		}
		// Short polls, so that a cancelled request does not hold the thread for long.
		ms := min(int(wait/time.Millisecond)+1, 100)
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}, ms)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		if n > 0 {
			break
		}
	}
	soErr, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
	if err != nil {
		return err
	}
	if soErr != 0 {
		return unix.Errno(soErr)
	}
	return nil
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}
