package api

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"toolshed.dev/shed/api/wire"
	"toolshed.dev/shed/app"
	"toolshed.dev/shed/builder"
	"toolshed.dev/shed/internal/fdbudget"
	"toolshed.dev/shed/internal/fdio"
	"toolshed.dev/shed/sandbox"
)

// The supervisor's socket. Its directory is root's (0755) and the socket is open to every local user
// (0666): who may do what is decided per request from the peer's kernel credentials.
const (
	DefaultSocket = wire.DefaultSocket
	SocketEnv     = wire.SocketEnv
)

// msgWinch is the client's "my terminal was resized".
const msgWinch = wire.MsgWinch

// Server answers requests on the supervisor's socket.
type Server struct {
	Service *app.Service
	// Operators is the group whose members are operators (root always is).
	Operators string
	Log       *slog.Logger
	// MaxConns bounds the users' requests in flight, MaxPerUser those of one uid; more are refused as
	// busy at once (0: the process's descriptor budget, package fdbudget).
	MaxConns, MaxPerUser int
	// ReadTimeout bounds how long a client may take to send its request.
	ReadTimeout time.Duration

	mu     sync.Mutex
	active int
	byUID  map[uint32]int
}

// Serve answers connections on ln until ctx ends, then waits for the requests in flight.
func (srv *Server) Serve(ctx context.Context, ln *net.UnixListener) error {
	if srv.MaxConns == 0 {
		srv.MaxConns = fdbudget.Process().SocketRequests
	}
	if srv.MaxPerUser == 0 {
		srv.MaxPerUser = fdbudget.Process().SocketPerUser
	}
	if srv.ReadTimeout == 0 {
		srv.ReadTimeout = 10 * time.Second
	}
	if srv.Log == nil {
		srv.Log = slog.New(slog.DiscardHandler)
	}
	srv.byUID = map[uint32]int{}
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	var wg sync.WaitGroup
	defer wg.Wait()
	// A descriptor kept for the day accept fails for want of descriptors: closed then, it lets the
	// waiting client in to be told so at once, rather than wait in the kernel's queue for as long as
	// the shortage lasts.
	reserve, _ := os.Open(os.DevNull)
	defer func() { reserve.Close() }()
	short := 0
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			// accept4 fails for want of a descriptor whether a client waits or not: the reserve
			// answers one that waits; with none waiting, or no reserve, back off rather than spin.
			if (errors.Is(err, unix.EMFILE) || errors.Is(err, unix.ENFILE)) && reserve != nil {
				reserve.Close()
				told := tellShort(ln)
				reserve, _ = os.Open(os.DevNull)
				if told {
					if short++; short%100 == 1 {
						srv.Log.Warn("accept: out of descriptors: clients are told so", "err", err, "told", short)
					}
					continue
				}
			} else {
				srv.Log.Warn("accept", "err", err)
			}
			time.Sleep(20 * time.Millisecond)
			if reserve == nil {
				reserve, _ = os.Open(os.DevNull)
			}
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			srv.serveConn(ctx, c)
		}()
	}
}

// admit counts a user's request in flight, or says it is one too many. Operators are not counted:
// users holding every slot with long Bench sessions must not lock them out (of `bench rm` above all),
// and an operator's own load is theirs to decide.
func (srv *Server) admit(c *app.Caller) (func(), bool) {
	if c.Role == app.Operator {
		return func() {}, true
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if srv.active >= srv.MaxConns || srv.byUID[c.UID] >= srv.MaxPerUser {
		return nil, false
	}
	srv.active++
	srv.byUID[c.UID]++
	return func() {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		srv.active--
		if srv.byUID[c.UID]--; srv.byUID[c.UID] == 0 {
			delete(srv.byUID, c.UID)
		}
	}, true
}

// shortAnswer is what a client is told when the supervisor is out of descriptors.
var shortAnswer = func() []byte {
	b, _ := json.Marshal(Message{Error: &Error{Code: app.CodeBusy, Message: "the supervisor is out of file descriptors", Hint: "try again shortly; an operator finds why in the supervisor's log"}})
	return append(b, '\n')
}()

// tellShort takes one waiting client, if there is one, tells it that the supervisor is out of
// descriptors, and closes it: with the one descriptor free, and no more (no net.Conn, no poller).
func tellShort(ln *net.UnixListener) (told bool) {
	rc, err := ln.SyscallConn()
	if err != nil {
		return false
	}
	// One try, never a wait: the listener is non-blocking (a listener's RawConn has Control only).
	_ = rc.Control(func(fd uintptr) {
		nfd, _, err := unix.Accept4(int(fd), unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK)
		if err == nil {
			_, _ = unix.Write(nfd, shortAnswer) // a new socket's buffer is empty: it does not block
			unix.Close(nfd)
			told = true
		}
	})
	return told
}

// conn is one client's connection: writes of messages are serialized.
type conn struct {
	c  *net.UnixConn
	mu sync.Mutex
}

func (cn *conn) send(m Message) {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	// A client gone mid-stream is not an error of ours: the operation is cancelled when its read
	// side sees the close.
	_ = cn.c.SetWriteDeadline(time.Now().Add(2 * time.Second))
	_ = json.NewEncoder(cn.c).Encode(m)
}

func (cn *conn) fail(err error) {
	e := app.Classify(err)
	cn.send(Message{Error: &Error{Code: e.Code, Message: e.Error(), Hint: e.Hint}})
}

func (srv *Server) serveConn(ctx context.Context, c *net.UnixConn) {
	cn := &conn{c: c}
	defer c.Close()
	var stdio [3]*os.File
	defer func() {
		for _, f := range stdio {
			if f != nil {
				f.Close()
			}
		}
	}()
	// Nothing a client sends may take the daemon down: a panic here is logged and answered.
	defer func() {
		if p := recover(); p != nil {
			srv.Log.Error("request panicked", "panic", p, "stack", string(debug.Stack()))
			cn.fail(&app.Error{Code: app.CodeInternal, Err: errors.New("the supervisor failed on this request (a bug: it logged it)")})
		}
	}()
	caller, err := srv.callerOf(c)
	if err != nil {
		srv.Log.Warn("peer credentials", "err", err)
		return
	}
	release, ok := srv.admit(caller)
	if !ok {
		cn.fail(&app.Error{Code: app.CodeBusy, Err: errors.New("the supervisor has too many requests in flight"), Hint: "try again when some have ended"})
		return
	}
	defer release()
	_ = c.SetReadDeadline(time.Now().Add(srv.ReadTimeout))
	body, err := readFrame(c, &stdio)
	if err != nil {
		cn.fail(&app.Error{Code: app.CodeBadRequest, Err: err, Hint: "docs/api.md describes the protocol"})
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	req, o, v, err := Decode(body)
	if err != nil {
		srv.Log.Info("refused", "user", caller.User, "uid", caller.UID, "err", err)
		cn.fail(err)
		return
	}
	// Relative paths are the client's; with no directory of its own they are relative to /, never to
	// the daemon's.
	switch {
	case req.Dir == "":
		caller.Dir = "/"
	case filepath.IsAbs(req.Dir):
		caller.Dir = filepath.Clean(req.Dir)
	default:
		cn.fail(&app.Error{Code: app.CodeBadRequest, Err: fmt.Errorf("dir %q is not absolute", req.Dir), Hint: "docs/api.md describes the protocol"})
		return
	}
	switch req.Via {
	case "":
	case "mcp":
		caller.Via = "mcp"
	default:
		cn.fail(&app.Error{Code: app.CodeBadRequest, Err: fmt.Errorf("via %q: want mcp, or none", req.Via), Hint: "docs/api.md describes the protocol"})
		return
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	resize := make(chan struct{}, 1)
	// The client going away cancels the operation; its 'W' bytes are resizes.
	go func() {
		buf := make([]byte, 64)
		for {
			n, err := c.Read(buf)
			if slices.Contains(buf[:n], msgWinch) {
				select {
				case resize <- struct{}{}:
				default: // one pending is enough: the size is read when it is taken
				}
			}
			if err != nil {
				cancel()
				return
			}
		}
	}()
	io := &app.IO{Stdin: stdio[0], Stdout: stdio[1], Stderr: stdio[2], Resize: resize,
		Notice: func(n app.Notice) { cn.send(Message{Notice: &n}) }}
	// Progress and the builds' own output are drawn on the client's stderr by work others may wait
	// for (a build holds its path's lock): a client that does not read its stderr loses them, and
	// holds up nothing.
	drawn := fdio.Writer(ctx, stdio[2], 100*time.Millisecond)
	if req.Progress {
		tp := builder.NewTerminalProgress(drawn, req.Verbose)
		io.Progress = tp
		if !req.Verbose { // the builds' own output instead
			io.Status = tp
		}
	}
	if req.Verbose {
		io.BuildOutput = drawn
	}
	start := time.Now()
	res, err := srv.Service.Do(ctx, &app.Call{Caller: caller, IO: io}, o.Name, v)
	if io.Status != nil {
		io.Status.End() // whatever the operation left drawn is erased before the client prints its result
	}
	code := app.Code("")
	if err != nil {
		code = app.Classify(err).Code
		cn.fail(err)
	} else if b, merr := json.Marshal(res); merr != nil {
		code = app.CodeInternal
		cn.fail(&app.Error{Code: app.CodeInternal, Err: fmt.Errorf("encode result: %v", merr)})
	} else {
		raw := json.RawMessage(b)
		cn.send(Message{Result: &raw})
	}
	srv.Log.Info("request", "user", caller.User, "uid", caller.UID, "pid", caller.PID, "role", caller.Role, "op", o.Name,
		"error", string(code), "elapsed", time.Since(start).Round(time.Millisecond))
}

// readFrame reads the length and the three descriptors, then the body. Descriptors beyond three are
// closed; a frame with fewer, or truncated, is refused.
func readFrame(c *net.UnixConn, stdio *[3]*os.File) ([]byte, error) {
	var hdr [4]byte
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, flags, _, err := c.ReadMsgUnix(hdr[:], oob)
	var fds []int
	if oobn > 0 {
		msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
		for _, m := range msgs {
			if got, err := unix.ParseUnixRights(&m); err == nil {
				fds = append(fds, got...)
			}
		}
	}
	for i, fd := range fds {
		if i < 3 {
			stdio[i] = os.NewFile(uintptr(fd), "client")
		} else {
			unix.Close(fd)
		}
	}
	if err != nil {
		return nil, err
	}
	if flags&unix.MSG_CTRUNC != 0 || len(fds) != 3 {
		return nil, fmt.Errorf("a request carries 3 descriptors (stdin, stdout, stderr), got %d", len(fds))
	}
	if _, err := io.ReadFull(c, hdr[n:]); err != nil {
		return nil, fmt.Errorf("truncated request: %w", err)
	}
	size := binary.BigEndian.Uint32(hdr[:])
	if size > MaxRequest {
		return nil, fmt.Errorf("a request of %d bytes (at most %d)", size, MaxRequest)
	}
	body := make([]byte, size)
	if _, err := io.ReadFull(c, body); err != nil {
		return nil, fmt.Errorf("truncated request: %w", err)
	}
	return body, nil
}

// callerOf says who is at the other end of c, as the kernel says, and what role that gives.
func (srv *Server) callerOf(c *net.UnixConn) (*app.Caller, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return nil, err
	}
	if cerr != nil {
		return nil, cerr
	}
	caller := CallerOf(cred.Uid, cred.Gid, srv.Operators)
	caller.PID = cred.Pid
	return caller, nil
}

// CallerOf is the caller with uid and gid: its name and groups from the host's user database, and
// its role: root and members of operators are operators, a sandbox's id is an agent, anyone else a
// user.
func CallerOf(uid, gid uint32, operators string) *app.Caller {
	p := &app.Caller{UID: uid, GID: gid, User: strconv.Itoa(int(uid)), Role: app.User}
	if sandbox.IsSandboxID(uid) {
		p.Role, p.User = app.Agent, "sandbox-"+p.User
		return p
	}
	if u, err := user.LookupId(strconv.Itoa(int(uid))); err == nil {
		p.User = u.Username
		if gids, err := u.GroupIds(); err == nil {
			for _, g := range gids {
				if gr, err := user.LookupGroupId(g); err == nil {
					p.Groups = append(p.Groups, gr.Name)
				}
			}
		}
	}
	if uid == 0 || (operators != "" && slices.Contains(p.Groups, operators)) {
		p.Role = app.Operator
	}
	return p
}

// ErrListening is a socket a live supervisor already listens on.
var ErrListening = errors.New("a supervisor already listens")

// Listen makes the supervisor's socket at path: its directory root's and 0755, the socket 0666.
func Listen(path string) (*net.UnixListener, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	// A socket left by a dead daemon is replaced; a live one is refused.
	if c, err := net.Dial("unix", path); err == nil {
		c.Close()
		return nil, fmt.Errorf("%w on %s", ErrListening, path)
	}
	os.Remove(path)
	// Open to every local user (0666): each caller is checked per request. Set after the bind, since a
	// umask is the whole process's.
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, err
	}
	ln.SetUnlinkOnClose(true)
	if err := os.Chmod(path, 0o666); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}
