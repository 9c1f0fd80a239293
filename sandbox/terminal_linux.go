package sandbox

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"
)

// A sandbox's terminal is allocated by init from the sandbox's own devpts instance (mounted with
// newinstance), as runc does with its console socket: the command's /proc/self/fd/0 then names a
// device of its own /dev/pts, which a terminal from the host's devpts would not (tty(1) says "not a
// tty" and ttyname fails). Init keeps no copy: it hands the master side to the caller over a unix
// socket (SCM_RIGHTS), and the caller copies between it and its own stdio.

// openTerminal opens a new pseudo-terminal of the sandbox's /dev/pts (init, after mountSystem),
// unlocked and sized, with its slave side owned by uid. Both descriptors are close-on-exec.
func openTerminal(size *Winsize, uid uint32) (master, slave int, e *SetupError) {
	master, err := unix.Open("/dev/pts/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, -1, &SetupError{Op: "open terminal", Path: "/dev/pts/ptmx", Err: err}
	}
	fail := func(detail string, err error) (int, int, *SetupError) {
		unix.Close(master)
		return -1, -1, &SetupError{Op: "open terminal", Detail: detail, Err: err}
	}
	if err := unix.IoctlSetPointerInt(master, unix.TIOCSPTLCK, 0); err != nil {
		return fail("unlockpt", err)
	}
	if size != nil && size.Rows > 0 && size.Cols > 0 {
		if err := unix.IoctlSetWinsize(master, unix.TIOCSWINSZ, &unix.Winsize{Row: size.Rows, Col: size.Cols}); err != nil {
			return fail("set window size", err)
		}
	}
	// The slave is opened from the master itself, not by its path in /dev/pts.
	s, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(master), unix.TIOCGPTPEER, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC)
	if errno != 0 {
		return fail("open the slave side (TIOCGPTPEER)", errno)
	}
	slave = int(s)
	if err := unix.Fchown(slave, int(uid), -1); err != nil {
		unix.Close(slave)
		return fail("chown the slave side", err)
	}
	return master, slave, nil
}

// sendFD sends fd over the unix socket sock as one byte with SCM_RIGHTS.
func sendFD(sock, fd int) error {
	return unix.Sendmsg(sock, []byte{terminalByte}, unix.UnixRights(fd), nil, 0)
}

// sendTerminal sends a terminal's master side over an Exec connection.
func sendTerminal(c *net.UnixConn, master int) error {
	_, _, err := c.WriteMsgUnix([]byte{terminalByte}, unix.UnixRights(master), nil)
	return err
}

// terminalByte is the one byte that carries a terminal's master side; a JSON message never starts
// with it.
const terminalByte = 'T'

// recvFD receives one byte from sock and, if it is terminalByte, the descriptor it carries
// (close-on-exec). Otherwise it returns the byte and no file.
func recvFD(sock syscall.Conn) (byte, *os.File, error) {
	raw, err := sock.SyscallConn()
	if err != nil {
		return 0, nil, err
	}
	var (
		b    [1]byte
		oob  = make([]byte, unix.CmsgSpace(2*4))
		n    int
		oobn int
		rerr error
	)
	cerr := raw.Read(func(fd uintptr) bool {
		n, oobn, _, _, rerr = unix.Recvmsg(int(fd), b[:], oob, unix.MSG_CMSG_CLOEXEC)
		return rerr != unix.EAGAIN
	})
	if err := errors.Join(cerr, rerr); err != nil {
		return 0, nil, err
	}
	if n == 0 {
		return 0, nil, io.EOF
	}
	var fds []int
	if oobn > 0 {
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			return 0, nil, err
		}
		for _, m := range msgs {
			if got, err := unix.ParseUnixRights(&m); err == nil {
				fds = append(fds, got...)
			}
		}
	}
	if b[0] != terminalByte || len(fds) != 1 {
		for _, fd := range fds {
			unix.Close(fd)
		}
		if b[0] == terminalByte {
			return 0, nil, fmt.Errorf("terminal message with %d descriptors", len(fds))
		}
		return b[0], nil, nil
	}
	return b[0], os.NewFile(uintptr(fds[0]), "terminal"), nil
}

// attachTerminal copies stdio's Stdin to the terminal's master side and its output to Stdout, and
// applies Resize. The returned function waits until the output is copied (the master reads EIO once
// every process holding the slave side is gone, which the pid namespace's end guarantees), stops the
// resizing and closes master.
func attachTerminal(master *os.File, stdio Stdio) (wait func() error) {
	if stdio.Stdin != nil {
		// Not waited for, as the caller's reader may block forever (a terminal): it ends with the
		// next write after master is closed.
		go func() { _, _ = io.Copy(master, stdio.Stdin) }()
	}
	stop := make(chan struct{})
	resized := make(chan struct{})
	go func() {
		defer close(resized)
		for {
			select {
			case ws, ok := <-stdio.Terminal.Resize:
				if !ok {
					return
				}
				_ = unix.IoctlSetWinsize(int(master.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: ws.Rows, Col: ws.Cols})
				runtime.KeepAlive(master)
			case <-stop:
				return
			}
		}
	}()
	out := stdio.Stdout
	if out == nil {
		out = io.Discard
	}
	copied := make(chan error, 1)
	go func() {
		_, err := io.Copy(out, master)
		if errors.Is(err, unix.EIO) { // the slave side is closed everywhere: the end of the output
			err = nil
		}
		copied <- err
	}()
	return func() error {
		err := <-copied
		close(stop)
		<-resized
		master.Close()
		return err
	}
}
