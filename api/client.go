package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"runtime"

	"toolshed.dev/shed/api/wire"
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
	stdio := [3]*os.File{os.Stdin, os.Stdout, os.Stderr}
	if cl.Stdio != nil {
		stdio = *cl.Stdio
	}
	c, done, err := wire.Open(ctx, cl.Socket, frame, [3]int{int(stdio[0].Fd()), int(stdio[1].Fd()), int(stdio[2].Fd())})
	runtime.KeepAlive(stdio)
	if err != nil {
		return err
	}
	defer done()
	defer wire.RelayResizes(c, int(stdio[0].Fd()))()
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
