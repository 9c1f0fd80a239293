package e2b

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"connectrpc.com/connect"

	"toolshed.dev/shed/app"
	"toolshed.dev/shed/e2b/envd/process"
	sbox "toolshed.dev/shed/sandbox"
)

// A command started with a pty (the SDK's sandbox.pty) is a bench.exec with a terminal of the Bench's
// own /dev/pts (as `shed bench exec -t`): its input is the terminal's (SendInput's pty bytes), its
// output one stream (pty data events), its size what Start and Update say.

// maxPtySide bounds a terminal's rows and columns (a winsize holds 16 bits).
const maxPtySide = 1<<16 - 1

// ptyRequest makes req a command with a terminal of the size pty names. The terminal's TERM is the
// command's (the SDK sets one), not added after it: a program reads the first TERM of its
// environment.
func ptyRequest(req *app.BenchExecRequest, pty *process.PTY) error {
	size := pty.GetSize()
	if size.GetCols() > maxPtySide || size.GetRows() > maxPtySide {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("pty size %dx%d: columns and rows are at most %d", size.GetCols(), size.GetRows(), maxPtySide))
	}
	req.TTY, req.Cols, req.Rows = true, uint16(size.GetCols()), uint16(size.GetRows())
	env := req.Env[:0:0]
	for _, e := range req.Env {
		if v, ok := strings.CutPrefix(e, "TERM="); ok {
			req.Term = v
			continue
		}
		env = append(env, e)
	}
	req.Env = env
	return nil
}

// ptyOutput is a terminal's output, as pty data events.
type ptyOutput struct{ p *proc }

func (o ptyOutput) Write(b []byte) (int, error) {
	o.p.publish(&process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: &process.ProcessEvent_DataEvent{
		Output: &process.ProcessEvent_DataEvent_Pty{Pty: append([]byte(nil), b...)}}}})
	return len(b), nil
}

// Update resizes a command's terminal (the SDK's pty.resize).
func (ps *processService) Update(ctx context.Context, req *connect.Request[process.UpdateRequest]) (*connect.Response[process.UpdateResponse], error) {
	p, err := ps.selected(req.Header(), req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if req.Msg.GetPty() == nil {
		return connect.NewResponse(&process.UpdateResponse{}), nil // nothing to change
	}
	if p.pty == nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("the process has no pseudo-terminal to resize (start it with a pty)"))
	}
	size := req.Msg.GetPty().GetSize()
	if size.GetCols() == 0 || size.GetRows() == 0 || size.GetCols() > maxPtySide || size.GetRows() > maxPtySide {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("pty size %dx%d: columns and rows from 1 to %d", size.GetCols(), size.GetRows(), maxPtySide))
	}
	ws := sbox.Winsize{Rows: uint16(size.GetRows()), Cols: uint16(size.GetCols())}
	// Only the latest size matters: it replaces one not yet applied.
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.resize:
	default:
	}
	p.resize <- ws
	return connect.NewResponse(&process.UpdateResponse{}), nil
}
