package supervisor

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"os/user"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"toolshed.dev/shed/records"

	"golang.org/x/sys/unix"
	"golang.org/x/term"
)

// The supervisor's socket. Its directory is root's (0755) and the socket is open to every local user
// (0666): who may do what is decided per request from the peer's kernel credentials (SO_PEERCRED),
// never from anything the client says.
const (
	DefaultSocket = "/run/toolshed/shed.sock"
	SocketEnv     = "SHED_SOCKET"
)

// The protocol, one command per connection:
//
//	client -> daemon  4 bytes big-endian length n, with SCM_RIGHTS the client's stdin, stdout, stderr
//	client -> daemon  n bytes: request (JSON)
//	client -> daemon  while the command runs, the byte 'W' each time the client's terminal is resized
//	daemon -> client  response (JSON), once the command has ended
//
// The daemon runs the command with the client's descriptors, so output, prompts and terminals reach
// the client directly. Only the terminal's SIGWINCH does not: the kernel sends it to the terminal's
// foreground process, the client, which passes it on. The client closing the connection cancels the
// command.
type request struct {
	Args []string `json:"args"`          // the command line, without the program name
	Dir  string   `json:"dir,omitempty"` // the client's working directory
}

type response struct {
	Code int `json:"code"`
}

const maxRequest = 1 << 20

// msgWinch is the client's "my terminal was resized".
const msgWinch = 'W'

type winchKey struct{}

type dirKey struct{}

// ClientDir returns, for the context of a command the daemon runs, the working directory the client
// said it has: relative paths on its command line are relative to it. It is what the client claims,
// so it may only resolve paths for a caller who may name any path anyway (an operator).
func ClientDir(ctx context.Context) string {
	dir, _ := ctx.Value(dirKey{}).(string)
	return dir
}

// WindowChanges returns, for the context of a command the daemon runs, a channel that receives when the
// client's terminal is resized; elsewhere nil (a nil channel never receives).
func WindowChanges(ctx context.Context) <-chan struct{} {
	ch, _ := ctx.Value(winchKey{}).(chan struct{})
	return ch
}

// Peer is who is at the other end of the socket, as the kernel says.
type Peer struct {
	UID, GID uint32
	PID      int32
	User     string   // the user's name, or the uid in decimal
	Groups   []string // the user's groups, by name
	Operator bool
}

// ErrDenied is a request the peer's role does not allow.
var ErrDenied = errors.New("not allowed")

// Serve answers connections on ln until ctx ends: identify the peer, receive its descriptors and its
// command line, and run it with handle. operators is the group whose members are operators (root
// always is).
func Serve(ctx context.Context, ln *net.UnixListener, operators string, handle func(ctx context.Context, p *Peer, args []string, stdio [3]*os.File) int) error {
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			continue
		}
		go serveConn(ctx, c, operators, handle)
	}
}

func serveConn(ctx context.Context, c *net.UnixConn, operators string, handle func(ctx context.Context, p *Peer, args []string, stdio [3]*os.File) int) {
	defer c.Close()
	peer, err := peerOf(c, operators)
	if err != nil {
		return
	}
	req, stdio, err := readRequest(c)
	if err != nil {
		if stdio[2] != nil {
			fmt.Fprintf(stdio[2], "shed: error: supervisor: %v\n", err)
		}
		closeAll(stdio)
		_ = json.NewEncoder(c).Encode(response{Code: 2})
		return
	}
	defer closeAll(stdio)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	winch := make(chan struct{}, 1)
	ctx = context.WithValue(ctx, winchKey{}, winch)
	if filepath.IsAbs(req.Dir) {
		ctx = context.WithValue(ctx, dirKey{}, filepath.Clean(req.Dir))
	}
	// The client going away cancels the command.
	go func() {
		buf := make([]byte, 64)
		for {
			n, err := c.Read(buf)
			if slices.Contains(buf[:n], msgWinch) {
				select {
				case winch <- struct{}{}:
				default: // one pending is enough: the command reads the size when it takes it
				}
			}
			if err != nil {
				cancel()
				return
			}
		}
	}()
	code := handle(ctx, peer, req.Args, stdio)
	_ = json.NewEncoder(c).Encode(response{Code: code})
}

func closeAll(fs [3]*os.File) {
	for _, f := range fs {
		if f != nil {
			f.Close()
		}
	}
}

func peerOf(c *net.UnixConn, operators string) (*Peer, error) {
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
	p := &Peer{UID: cred.Uid, GID: cred.Gid, PID: cred.Pid, User: strconv.Itoa(int(cred.Uid))}
	if u, err := user.LookupId(strconv.Itoa(int(cred.Uid))); err == nil {
		p.User = u.Username
		if gids, err := u.GroupIds(); err == nil {
			for _, gid := range gids {
				if g, err := user.LookupGroupId(gid); err == nil {
					p.Groups = append(p.Groups, g.Name)
				}
			}
		}
	}
	p.Operator = p.UID == 0 || (operators != "" && slices.Contains(p.Groups, operators))
	return p, nil
}

func readRequest(c *net.UnixConn) (*request, [3]*os.File, error) {
	var stdio [3]*os.File
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
		return nil, stdio, err
	}
	if flags&unix.MSG_CTRUNC != 0 || len(fds) != 3 {
		return nil, stdio, fmt.Errorf("a request carries 3 descriptors, got %d", len(fds))
	}
	if _, err := io.ReadFull(c, hdr[n:]); err != nil {
		return nil, stdio, err
	}
	size := binary.BigEndian.Uint32(hdr[:])
	if size > maxRequest {
		return nil, stdio, fmt.Errorf("request of %d bytes", size)
	}
	body := make([]byte, size)
	if _, err := io.ReadFull(c, body); err != nil {
		return nil, stdio, err
	}
	var req request
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, stdio, err
	}
	return &req, stdio, nil
}

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
		return nil, fmt.Errorf("a supervisor already listens on %s", path)
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

// Call runs args by the supervisor at socket, with this process's stdin, stdout, stderr and working
// directory, and returns the command's exit code. Cancelling ctx cancels the command.
func Call(ctx context.Context, socket string, args []string) (int, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return 0, err
	}
	c := nc.(*net.UnixConn)
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	dir, _ := os.Getwd()
	body, err := json.Marshal(request{Args: args, Dir: dir})
	if err != nil {
		return 0, err
	}
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], uint32(len(body)))
	rights := unix.UnixRights(int(os.Stdin.Fd()), int(os.Stdout.Fd()), int(os.Stderr.Fd()))
	if _, _, err := c.WriteMsgUnix(hdr[:], rights, nil); err != nil {
		return 0, err
	}
	runtime.KeepAlive(os.Stdin)
	if _, err := c.Write(body); err != nil {
		return 0, err
	}
	if term.IsTerminal(int(os.Stdin.Fd())) {
		winch := make(chan os.Signal, 1)
		signal.Notify(winch, syscall.SIGWINCH)
		defer signal.Stop(winch)
		done := make(chan struct{})
		defer close(done)
		go func() {
			for {
				select {
				case <-winch:
					_, _ = c.Write([]byte{msgWinch})
				case <-done:
					return
				}
			}
		}()
	}
	var resp response
	if err := json.NewDecoder(c).Decode(&resp); err != nil {
		if ctx.Err() != nil {
			return 130, nil
		}
		return 0, fmt.Errorf("the supervisor ended the command without an answer: %w", err)
	}
	return resp.Code, nil
}

// Authorize decides whether p may run args (the command line after the global flags): operators may
// run everything; other users may read records, run the Workshops a record allows them, without
// grants, and list, exec into, read the logs of, propose from and remove the Benches they launched;
// nothing else.
func Authorize(rs *records.Workshops, p *Peer, args []string) error {
	if p.Operator {
		return nil
	}
	deny := func(what string) error {
		return fmt.Errorf("%w: %s is for operators (root, or the supervisor's operators group); you are %s", ErrDenied, what, p.User)
	}
	cmd := strings.Join(commandPath(args), " ")
	switch cmd {
	case "", "help", "workshop ls", "workshop show", "workshop log", "workshop diff", "key show", "key export", "version":
		return nil
	case "bench ls", "bench exec", "bench logs", "bench rm", "bench propose":
		// On their own Benches only: the command checks the Bench's owner when it finds it.
		return nil
	case "realize", "bench run", "bench shell":
		name := ""
		for i := 0; i < len(args); i++ {
			a := args[i]
			switch {
			case a == "--":
				i = len(args)
			case a == "--grant" || strings.HasPrefix(a, "--grant="):
				return fmt.Errorf("%w: --grant is for operators: the supervisor would open the path as root", ErrDenied)
			case a == "--substituter" || strings.HasPrefix(a, "--substituter="):
				// The supervisor would contact any host a user names; the store's substituters apply.
				return fmt.Errorf("%w: --substituter is for operators: the store's own substituters apply", ErrDenied)
			case a == "-f" || a == "--file":
				if i+1 < len(args) {
					name = args[i+1]
					i++
				}
			case strings.HasPrefix(a, "-f=") || strings.HasPrefix(a, "--file="):
				name = a[strings.IndexByte(a, '=')+1:]
			case cmd == "realize" && !strings.HasPrefix(a, "-") && a != "realize":
				name = a
			}
		}
		if name == "" {
			return fmt.Errorf("%w: name the Workshop record to use (`shed workshop ls`)", ErrDenied)
		}
		v, err := rs.Current(name)
		if err != nil {
			return fmt.Errorf("%w: %s is not a Workshop record: users run records only", ErrDenied, name)
		}
		if !allowed(p, v.Users) {
			return fmt.Errorf("%w: %s may not use Workshop %s (an operator allows you: shed workshop allow %s %s)", ErrDenied, p.User, name, name, p.User)
		}
		return nil
	}
	return deny("`shed " + cmd + "`")
}

func allowed(p *Peer, users []string) bool {
	for _, u := range users {
		if g, ok := strings.CutPrefix(u, "@"); ok && slices.Contains(p.Groups, g) || u == p.User {
			return true
		}
	}
	return false
}

// commandPath returns the command and subcommand names of args (flags and their values skipped as
// far as the global flags go).
func commandPath(args []string) []string {
	var path []string
	for i := 0; i < len(args) && len(path) < 2; i++ {
		a := args[i]
		switch {
		case a == "--":
			return path
		case a == "--root":
			i++
		case strings.HasPrefix(a, "-"):
			if a == "--version" || a == "-v" {
				return []string{"version"}
			}
		default:
			if len(path) == 1 && !slices.Contains([]string{"workshop", "bench", "key", "store", "root"}, path[0]) {
				return path
			}
			path = append(path, a)
		}
	}
	return path
}
