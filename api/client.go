package api

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"
	"golang.org/x/term"

	"toolshed.dev/shed/app"
)

// Client calls the supervisor at Socket, with this process's stdin, stdout, stderr and working
// directory.
type Client struct {
	Socket string
	// Progress and Verbose are passed on with each request (see Request).
	Progress, Verbose bool
	// Notice receives the operation's notices as they come.
	Notice func(app.Notice)
	// Stdio are the descriptors sent with each request (nil: this process's stdin, stdout, stderr).
	// An MCP server sends /dev/null for stdin and stdout: those are its protocol's.
	Stdio *[3]*os.File
	// Via is passed on with each request (see Request): "mcp" for `shed mcp`.
	Via string
}

// ErrNoAnswer is a connection the supervisor closed without a result.
var ErrNoAnswer = errors.New("the supervisor ended the request without an answer")

// Call runs op with req and decodes the result into resp. A failure of the operation is an
// *app.Error (its code and hint as the supervisor gave them); cancelling ctx cancels the operation.
func (cl *Client) Call(ctx context.Context, op string, req, resp any) error {
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	dir, _ := os.Getwd()
	frame, err := json.Marshal(Request{Protocol: Protocol, Op: op, Request: body, Dir: dir, Progress: cl.Progress, Verbose: cl.Verbose, Via: cl.Via})
	if err != nil {
		return err
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", cl.Socket)
	if err != nil {
		return err
	}
	c := nc.(*net.UnixConn)
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], uint32(len(frame)))
	stdio := [3]*os.File{os.Stdin, os.Stdout, os.Stderr}
	if cl.Stdio != nil {
		stdio = *cl.Stdio
	}
	rights := unix.UnixRights(int(stdio[0].Fd()), int(stdio[1].Fd()), int(stdio[2].Fd()))
	if _, _, err := c.WriteMsgUnix(hdr[:], rights, nil); err != nil {
		return err
	}
	runtime.KeepAlive(stdio)
	if _, err := c.Write(frame); err != nil {
		return err
	}
	// The kernel sends SIGWINCH to the terminal's foreground process, this one: pass it on.
	if term.IsTerminal(int(stdio[0].Fd())) {
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
	dec := json.NewDecoder(c)
	for {
		var m Message
		if err := dec.Decode(&m); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("%w: %v", ErrNoAnswer, err)
		}
		switch {
		case m.Notice != nil:
			if cl.Notice != nil {
				cl.Notice(*m.Notice)
			}
		case m.Error != nil:
			return &app.Error{Code: m.Error.Code, Err: errors.New(m.Error.Message), Hint: m.Error.Hint}
		case m.Result != nil:
			if resp == nil {
				return nil
			}
			return json.Unmarshal(*m.Result, resp)
		default:
			return fmt.Errorf("%w: an empty message", ErrNoAnswer)
		}
	}
}
