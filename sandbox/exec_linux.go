package sandbox

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"runtime"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The control protocol (Spec.Control), one command per connection:
//
//	client -> init  4 bytes big-endian length n, with SCM_RIGHTS stdin, stdout, stderr attached
//	client -> init  n bytes: the ExecRequest as JSON
//	init -> client  with a terminal (execWire.Terminal), once the command started: one byte 'T' with
//	                SCM_RIGHTS the terminal's master side
//	init -> client  one execReply as JSON, once the command has exited (or could not start); then close
//	client -> init  after the request, any number of single bytes, each a signal number (1-64) for
//	                init to send to the command's process (Stdio.Signal)
//
// The client closing the connection early kills the command (SIGKILL).

// maxExecRequest bounds the JSON of one request (argv and env).
const maxExecRequest = 4 << 20

// execWire is the request as sent: the ExecRequest and whether the command gets a terminal.
type execWire struct {
	ExecRequest
	Terminal *Winsize `json:",omitempty"`
}

type execReply struct {
	Code  *int       `json:",omitempty"`
	Error *wireError `json:",omitempty"`
}

// Exec runs a command in the running sandbox whose Spec.Control is control, with stdio attached, and
// returns the command's exit code (128+signal if a signal killed it). The command gets the main
// command's restrictions (a user and mount namespace of its own with the same ids, no_new_privs, the
// seccomp filter, cgroups, the other namespaces), its own session (no controlling
// terminal), and exactly req.Env. Stdio is as for Start: an *os.File is passed as it is, anything else
// goes through a pipe; Exec returns once the command has exited and its output is copied.
// Cancelling ctx kills the command. Errors: *SpecError (invalid request), *SetupError (the command could
// not start, or init refused the connection), or an error wrapping ErrNotRunning when there is no
// sandbox behind control or it ended before the command did.
func Exec(ctx context.Context, control string, req ExecRequest, stdio Stdio) (int, error) {
	if err := req.Validate(); err != nil {
		return -1, err
	}
	wire := execWire{ExecRequest: req}
	if stdio.Terminal != nil {
		size := stdio.Terminal.Size
		wire.Terminal = &size
	}
	body, err := json.Marshal(&wire)
	if err != nil {
		return -1, fmt.Errorf("exec in sandbox %s: %w", control, err)
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", control)
	if err != nil {
		if ctx.Err() != nil {
			return -1, fmt.Errorf("exec in sandbox %s: %w", control, ctx.Err())
		}
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ECONNREFUSED) {
			return -1, fmt.Errorf("exec in sandbox %s: %w (%v)", control, ErrNotRunning, unwrapErrno(err))
		}
		return -1, fmt.Errorf("exec in sandbox %s: %w", control, err)
	}
	conn := nc.(*net.UnixConn)
	defer conn.Close()
	// The other end must be a sandbox's init, which runs with its creator's uid, as init admits only
	// that uid: not whoever bound the name since (an abstract name is anyone's once its sandbox has
	// ended), who would get the request and the descriptors of stdio.
	if err := checkServer(conn); err != nil {
		return -1, fmt.Errorf("exec in sandbox %s: %w", control, err)
	}

	sent := stdio
	if stdio.Terminal != nil {
		sent = Stdio{} // the command's stdio is its terminal: init gets /dev/null
	}
	x, err := newExecStdio(sent)
	if err != nil {
		return -1, fmt.Errorf("exec in sandbox %s: %w", control, err)
	}
	defer x.closeAll()
	// Cancellation closes the connection (init then kills the command) and our ends of the pipes.
	stop := context.AfterFunc(ctx, func() {
		conn.Close()
		x.closeAll()
	})
	defer stop()

	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], uint32(len(body)))
	rights := unix.UnixRights(int(x.send[0].Fd()), int(x.send[1].Fd()), int(x.send[2].Fd()))
	_, _, err = conn.WriteMsgUnix(hdr[:], rights, nil)
	runtime.KeepAlive(x.send)
	if err == nil {
		_, err = conn.Write(body)
	}
	x.sent()
	if err == nil && stdio.Signal != nil {
		// Ends with the command (the connection is closed when Exec returns).
		done := make(chan struct{})
		defer close(done)
		go forwardSignals(conn, stdio.Signal, done)
	}
	var reply io.Reader = conn
	if err == nil && stdio.Terminal != nil {
		var b byte
		var master *os.File
		if b, master, err = recvFD(conn); err == nil {
			if master != nil {
				wait := attachTerminal(master, stdio)
				x.copies = append(x.copies, terminalDone(wait))
			} else {
				reply = io.MultiReader(bytes.NewReader([]byte{b}), conn) // an error reply
			}
		}
	}
	var rep execReply
	if err == nil {
		err = json.NewDecoder(reply).Decode(&rep)
	}
	if ctx.Err() != nil {
		x.wait()
		return -1, fmt.Errorf("exec in sandbox %s: %w", control, ctx.Err())
	}
	if err != nil {
		x.closeAll()
		x.wait()
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, unix.ECONNRESET) || errors.Is(err, unix.EPIPE) {
			return -1, fmt.Errorf("exec in sandbox %s: %w: it ended before the command did", control, ErrNotRunning)
		}
		return -1, fmt.Errorf("exec in sandbox %s: %w", control, err)
	}
	if rep.Error != nil {
		x.closeAll()
		x.wait()
		return -1, rep.Error.setupError()
	}
	if rep.Code == nil {
		return -1, fmt.Errorf("exec in sandbox %s: reply without an exit code", control)
	}
	if err := x.wait(); err != nil && ctx.Err() == nil {
		return *rep.Code, &SetupError{Op: "copy stdio", Err: err}
	}
	if ctx.Err() != nil {
		return -1, fmt.Errorf("exec in sandbox %s: %w", control, ctx.Err())
	}
	return *rep.Code, nil
}

// forwardSignals writes each signal from sigs to the connection as its one-byte number, until done.
func forwardSignals(conn *net.UnixConn, sigs <-chan syscall.Signal, done <-chan struct{}) {
	for {
		select {
		case sig := <-sigs:
			if sig < 1 || sig > 64 {
				continue
			}
			if _, err := conn.Write([]byte{byte(sig)}); err != nil {
				return
			}
		case <-done:
			return
		}
	}
}

// execStdio are the three descriptors sent to init for a command (Exec, or Start of an init given
// stdio late: SetStdio) and what copies between pipes and the caller.
type execStdio struct {
	send    [3]*os.File
	mine    []*os.File // opened here: closed once sent (the pipe ends the command gets, /dev/null)
	readers []*os.File // our ends of output pipes: closed on cancellation
	copies  []chan error
}

func newExecStdio(s Stdio) (*execStdio, error) {
	x := &execStdio{}
	if rootless() {
		s = s.withoutFiles() // as for Start
	}
	// stdin
	switch r := s.Stdin.(type) {
	case *os.File:
		x.send[0] = r
	case nil:
		f, err := os.Open(os.DevNull)
		if err != nil {
			return nil, err
		}
		x.send[0] = f
		x.mine = append(x.mine, f)
	default:
		pr, pw, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		x.send[0] = pr
		x.mine = append(x.mine, pr)
		// Not waited for, as the caller's reader may block forever; it ends when the command's side of
		// the pipe is gone (EPIPE) or r is exhausted.
		go func() {
			_, _ = io.Copy(pw, r)
			pw.Close()
		}()
	}
	outs := []io.Writer{s.Stdout, s.Stderr}
	for i, w := range outs {
		if i == 1 && sameWriter(outs[0], outs[1]) && outs[0] != nil {
			x.send[2] = x.send[1] // one pipe, so that the writer is not written from two goroutines
			continue
		}
		switch w := w.(type) {
		case *os.File:
			x.send[1+i] = w
		case nil:
			f, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
			if err != nil {
				x.closeAll()
				return nil, err
			}
			x.send[1+i] = f
			x.mine = append(x.mine, f)
		default:
			pr, pw, err := os.Pipe()
			if err != nil {
				x.closeAll()
				return nil, err
			}
			x.send[1+i] = pw
			x.mine = append(x.mine, pw)
			x.readers = append(x.readers, pr)
			done := make(chan error, 1)
			x.copies = append(x.copies, done)
			go func() {
				_, err := io.Copy(w, pr)
				if errors.Is(err, os.ErrClosed) {
					err = nil // closed on cancellation
				}
				done <- err
			}()
		}
	}
	return x, nil
}

func sameWriter(a, b io.Writer) (same bool) {
	defer func() { _ = recover() }() // not comparable: not the same
	return a == b
}

// sent closes our copies of what the command now holds.
func (x *execStdio) sent() {
	for _, f := range x.mine {
		f.Close()
	}
}

func (x *execStdio) closeAll() {
	x.sent()
	for _, f := range x.readers {
		f.Close()
	}
}

// wait waits for the output to be copied: until every holder of the pipes (the command, and whatever
// it left in the background) has closed them, or they are closed here.
func (x *execStdio) wait() error {
	var first error
	for _, c := range x.copies {
		if err := <-c; err != nil && first == nil {
			first = err
		}
	}
	for _, f := range x.readers {
		f.Close()
	}
	return first
}

// terminalDone runs an attached terminal's wait as one of execStdio's copies.
func terminalDone(wait func() error) chan error {
	c := make(chan error, 1)
	go func() { c <- wait() }()
	return c
}

// execJob is one Exec'd command, between the connection's goroutine and init's main thread.
type execJob struct {
	req      ExecRequest
	terminal *Winsize // nil: stdio is the client's
	stdio    [3]uintptr
	master   int              // the terminal's master side, set by the main thread; the connection's goroutine sends and closes it
	pid      int              // set by the main thread
	started  chan *SetupError // nil: running
	exited   chan int
}

// serveControl is init's main loop when the sandbox has a control socket, in place of reap: on this
// locked thread it reaps every child, and forks each Exec'd command, so that it inherits this thread's
// no_new_privs, session keyring and seccomp filter and has this thread as its ptrace tracer (for the
// cgroups) exactly as the main command does; a wait4(-1) on another thread would also steal those
// ptrace stops. It returns the main command's exit code when it exits; init's exit then takes every
// Exec'd process with it.
func serveControl(cfg *initConfig, pid int) (int, error) {
	// SIGCHLD wakes the loop; a child that exited before this is found by the first pass below.
	chld := make(chan os.Signal, 1)
	signal.Notify(chld, unix.SIGCHLD)
	f := os.NewFile(uintptr(cfg.Control), "control")
	ln, err := net.FileListener(f)
	f.Close()
	if err != nil {
		return 0, fmt.Errorf("serve control socket: %w", err)
	}
	jobs, kills, sigs := make(chan *execJob), make(chan *execJob), make(chan execSignal)
	go acceptControl(ln.(*net.UnixListener), cfg.ControlUID, jobs, kills, sigs)
	running := make(map[int]*execJob)
	for {
		for {
			var ws unix.WaitStatus
			wpid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				return 0, err
			}
			if wpid <= 0 {
				break
			}
			if !ws.Exited() && !ws.Signaled() {
				continue
			}
			if wpid == pid {
				return exitCode(ws), nil
			}
			if j := running[wpid]; j != nil {
				delete(running, wpid)
				j.exited <- exitCode(ws)
			}
		}
		select {
		case <-chld:
		case j := <-jobs:
			cpid, e := startExec(cfg, j)
			if e == nil {
				j.pid = cpid
				running[cpid] = j
			}
			j.started <- e
		case j := <-kills:
			// Only a child not yet reaped: its pid cannot have been reused.
			if running[j.pid] == j {
				_ = unix.Kill(j.pid, unix.SIGKILL)
			}
		case s := <-sigs:
			if running[s.j.pid] == s.j {
				_ = unix.Kill(s.j.pid, s.sig)
			}
		}
	}
}

// startExec forks and executes an Exec'd command from the main thread, as startCommand does the main
// one (whose restrictions this thread already carries).
func startExec(cfg *initConfig, j *execJob) (int, *SetupError) {
	r, stdio := &j.req, j.stdio
	path, e := lookPath(r.Argv[0], r.Env)
	if e != nil {
		return 0, e
	}
	dir := r.Dir
	if dir == "" {
		dir = "/"
	}
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return 0, &SetupError{Op: "chdir", Path: dir, Err: err}
	}
	sys := commandAttr(cfg, r.UID, r.GID)
	// No controlling terminal: a terminal passed as stdio cannot be pushed input (TIOCSTI) without
	// CAP_SYS_ADMIN. A terminal of the sandbox's own is the command's controlling terminal.
	sys.Setsid, sys.Setctty = true, j.terminal != nil
	j.master = -1
	if j.terminal != nil {
		master, slave, e := openTerminal(j.terminal, cfg.IDBase+r.UID)
		if e != nil {
			return 0, e
		}
		defer unix.Close(slave)
		j.master, stdio = master, [3]uintptr{uintptr(slave), uintptr(slave), uintptr(slave)}
	}
	pid, err := syscall.ForkExec(path, r.Argv, &syscall.ProcAttr{Dir: dir, Env: r.Env, Files: stdio[:], Sys: sys})
	if err != nil {
		if j.master >= 0 {
			unix.Close(j.master)
			j.master = -1
		}
		return 0, &SetupError{Op: "exec", Path: path, Err: err}
	}
	if sys.Ptrace {
		if e := enterCgroups(pid, cfg.CgroupProcs); e != nil {
			_ = unix.Kill(pid, unix.SIGKILL) // reaped by the main loop
			return 0, e
		}
	}
	return pid, nil
}

// execSignal is a signal a client asked for its command.
type execSignal struct {
	j   *execJob
	sig unix.Signal
}

func acceptControl(ln *net.UnixListener, uid uint32, jobs, kills chan<- *execJob, sigs chan<- execSignal) {
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond) // EMFILE and the like: let it pass
			continue
		}
		go serveExec(c, uid, jobs, kills, sigs)
	}
}

// serveExec serves one connection: check the peer, read the request and its descriptors, have the main
// thread start the command, and report its exit code, or kill it if the client goes away first.
func serveExec(c *net.UnixConn, uid uint32, jobs, kills chan<- *execJob, sigs chan<- execSignal) {
	defer c.Close()
	reply := func(r execReply) { _ = json.NewEncoder(c).Encode(r) }
	fail := func(e *SetupError) { reply(execReply{Error: toWire(e)}) }
	if e := checkPeer(c, uid); e != nil {
		fail(e)
		return
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	req, fds, e := readExecRequest(c)
	if e != nil {
		fail(e)
		return
	}
	j := &execJob{req: req.ExecRequest, terminal: req.Terminal, started: make(chan *SetupError, 1), exited: make(chan int, 1)}
	for i, fd := range fds {
		j.stdio[i] = uintptr(fd)
	}
	jobs <- j
	e = <-j.started
	for _, fd := range fds {
		unix.Close(fd) // the command has its own copies: the client must see EOF when it is done
	}
	if e != nil {
		fail(e)
		return
	}
	if j.master >= 0 {
		werr := sendTerminal(c, j.master)
		unix.Close(j.master)
		if werr != nil { // the client is gone: the read below ends at once and kills the command
			c.Close()
		}
	}
	_ = c.SetReadDeadline(time.Time{})
	gone := make(chan struct{})
	exited := make(chan struct{}) // the signals of a command that ended go nowhere
	go func() {
		// Returns when the client closes, or when c is closed here.
		var b [64]byte
		for {
			n, err := c.Read(b[:])
			for _, sig := range b[:n] {
				if sig >= 1 && sig <= 64 {
					select {
					case sigs <- execSignal{j: j, sig: unix.Signal(sig)}:
					case <-exited:
					}
				}
			}
			if err != nil {
				break
			}
		}
		close(gone)
	}()
	select {
	case code := <-j.exited:
		close(exited)
		reply(execReply{Code: &code})
	case <-gone:
		kills <- j
		<-j.exited
		close(exited)
	}
}

// checkPeer admits only a process of the creator's effective uid outside the sandbox: SO_PEERCRED gives
// the peer's pid as seen from init's pid namespace, which is 0 for a process outside it. A process
// inside could reach the socket only if a bind exposed it; it is refused all the same.
func checkPeer(c *net.UnixConn, uid uint32) *SetupError {
	raw, err := c.SyscallConn()
	if err != nil {
		return &SetupError{Op: "exec", Detail: "peer credentials", Err: err}
	}
	var cred *unix.Ucred
	cerr := raw.Control(func(fd uintptr) {
		cred, err = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	})
	if cerr != nil || err != nil {
		return &SetupError{Op: "exec", Detail: "peer credentials", Err: errors.Join(cerr, err)}
	}
	if cred.Uid != uid {
		return &SetupError{Op: "exec", Detail: fmt.Sprintf("refused: peer uid %d is not the sandbox creator's %d", cred.Uid, uid), Err: unix.EPERM}
	}
	if cred.Pid != 0 {
		return &SetupError{Op: "exec", Detail: "refused: the peer is inside the sandbox", Err: unix.EPERM}
	}
	return nil
}

// checkServer refuses a control socket whose listener's uid (SO_PEERCRED, as of its listen) is not
// this process's effective uid.
func checkServer(c *net.UnixConn) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	cerr := raw.Control(func(fd uintptr) {
		cred, err = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	})
	if err = errors.Join(cerr, err); err != nil {
		return fmt.Errorf("peer credentials: %w", err)
	}
	if uid := uint32(os.Geteuid()); cred.Uid != uid {
		return &SetupError{Op: "exec", Detail: fmt.Sprintf("refused: the control socket is uid %d's, not %d's: not a sandbox of this user", cred.Uid, uid), Err: unix.EPERM}
	}
	return nil
}

// readExecRequest reads the length, the three descriptors that come with it, and the request. On an
// error every received descriptor is closed.
func readExecRequest(c *net.UnixConn) (_ *execWire, fds []int, _ *SetupError) {
	bad := func(detail string, err error) (*execWire, []int, *SetupError) {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, nil, &SetupError{Op: "exec", Detail: detail, Err: err}
	}
	var hdr [4]byte
	oob := make([]byte, unix.CmsgSpace(4*4)) // room for one descriptor too many, to notice it
	n, oobn, flags, _, err := c.ReadMsgUnix(hdr[:], oob)
	if oobn > 0 {
		msgs, perr := unix.ParseSocketControlMessage(oob[:oobn])
		for _, m := range msgs {
			if got, err := unix.ParseUnixRights(&m); err == nil {
				fds = append(fds, got...) // received close-on-exec (net uses MSG_CMSG_CLOEXEC)
			}
		}
		if perr != nil {
			return bad("read request: control message", perr)
		}
	}
	if err != nil {
		return bad("read request", err)
	}
	if flags&unix.MSG_CTRUNC != 0 || len(fds) != 3 {
		return bad(fmt.Sprintf("request must carry 3 descriptors (stdin, stdout, stderr), got %d", len(fds)), unix.EINVAL)
	}
	if _, err := io.ReadFull(c, hdr[n:]); err != nil {
		return bad("read request", err)
	}
	size := binary.BigEndian.Uint32(hdr[:])
	if size > maxExecRequest {
		return bad(fmt.Sprintf("request of %d bytes, at most %d", size, maxExecRequest), unix.E2BIG)
	}
	body := make([]byte, size)
	if _, err := io.ReadFull(c, body); err != nil {
		return bad("read request", err)
	}
	var req execWire
	if err := json.Unmarshal(body, &req); err != nil {
		return bad("decode request", err)
	}
	if err := req.ExecRequest.Validate(); err != nil {
		return bad("invalid request", err)
	}
	return &req, fds, nil
}
