package e2b

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"toolshed.dev/shed/app"
	"toolshed.dev/shed/bench"
	"toolshed.dev/shed/e2b/envd/process"
	"toolshed.dev/shed/e2b/envd/process/processconnect"
	sbox "toolshed.dev/shed/sandbox"
)

// A command of a sandbox runs as one bench.exec, for as long as it runs: its Start stream, and any
// Connect stream after, only watch it. As with envd, a stream that ends (the client's timeout, a
// dropped connection) leaves the command running; it ends when it exits, is sent a signal, or its
// Bench ends.
type proc struct {
	pid    uint32 // the sandbox's number for it (the SDK's handle), not a kernel pid
	tag    string
	config *process.ProcessConfig
	cancel context.CancelFunc
	stdin  *os.File // the write end of its stdin, if it has one open (of its terminal's, with a pty)
	// With a pseudo-terminal (pty != nil): the sizes for it, the latest only.
	pty    *process.PTY
	resize chan sbox.Winsize
	// signals for its process (SendSignal's SIGTERM; SIGKILL cancels it).
	signals chan syscall.Signal

	mu   sync.Mutex
	subs map[*sub]struct{}
	end  *process.ProcessEvent // set when it ended
	gone bool                  // set when it ended because its sandbox did: no end event, a broken stream
	done chan struct{}
}

// sub is one stream watching a command: it gets every event from when it subscribed, in a bounded
// queue. A stream that does not keep up is dropped (its stream ends with resource_exhausted): a
// client that stops reading must not stop the command, nor hold the supervisor's memory.
type sub struct {
	events  chan *process.ProcessEvent
	dropped chan struct{} // closed when it fell behind
}

// Bounds on what one sandbox's clients hold in the supervisor.
const (
	subQueue      = 256 // events queued for a stream (each at most one read of the command's output)
	maxSubs       = 8   // streams watching one command
	maxProcs      = 128 // commands running in one sandbox
	maxKeepaliveS = 3600
	maxStdinChunk = 1 << 20
	maxRPCMessage = 4 << 20
)

// errSandboxGone ends a stream whose command ended with its sandbox (killed, past its timeout):
// the stream breaks, as envd's does when its VM goes, and the SDK, finding /health 502, reports
// "the sandbox was killed or reached its end of life" (a TimeoutError) rather than an exit.
var errSandboxGone = errors.New("the sandbox ended")

// abortIfGone breaks the stream's connection (net/http's way: the response ends without its last
// chunk, an HTTP/2 stream is reset) if err says the sandbox ended; otherwise it returns err.
func abortIfGone(err error) error {
	if errors.Is(err, errSandboxGone) {
		panic(http.ErrAbortHandler)
	}
	return err
}

var errBehind = connect.NewError(connect.CodeResourceExhausted, errors.New("this stream fell behind the command's output and was dropped; the command goes on (commands.connect to watch it again)"))

func (p *proc) subscribe() (*sub, error) {
	sb := &sub{events: make(chan *process.ProcessEvent, subQueue), dropped: make(chan struct{})}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.end == nil {
		if len(p.subs) >= maxSubs {
			return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("%d streams watch this command already", maxSubs))
		}
		p.subs[sb] = struct{}{}
	}
	return sb, nil
}

func (p *proc) unsubscribe(sb *sub) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.subs, sb)
}

// publish queues ev for every watcher; one whose queue is full is dropped, never waited for.
func (p *proc) publish(ev *process.ProcessEvent) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for sb := range p.subs {
		select {
		case sb.events <- ev:
		default:
			delete(p.subs, sb)
			close(sb.dropped)
		}
	}
}

// output is a command's stdout or stderr, as data events.
type output struct {
	p      *proc
	stderr bool
}

func (o output) Write(b []byte) (int, error) {
	data := &process.ProcessEvent_DataEvent{}
	if o.stderr {
		data.Output = &process.ProcessEvent_DataEvent_Stderr{Stderr: append([]byte(nil), b...)}
	} else {
		data.Output = &process.ProcessEvent_DataEvent_Stdout{Stdout: append([]byte(nil), b...)}
	}
	o.p.publish(&process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: data}})
	return len(b), nil
}

type processService struct{ s *Server }

var _ processconnect.ProcessHandler = (*processService)(nil)

// authorize checks a data-plane request: the sandbox's access token, and (if named) the user.
func (ps *processService) authorize(h http.Header) (*sandbox, *app.Caller, error) {
	sb, c, err := ps.s.byToken(h)
	if err != nil {
		return nil, nil, connect.NewError(connect.CodeUnauthenticated, errNoSandbox)
	}
	if err := checkUser(sb, h); err != nil {
		return nil, nil, err
	}
	return sb, c, nil
}

// selected is the command a data-plane request selects, once the request is authorized.
func (ps *processService) selected(h http.Header, sel *process.ProcessSelector) (*proc, error) {
	sb, _, err := ps.authorize(h)
	if err != nil {
		return nil, err
	}
	return sb.find(sel)
}

// checkUser refuses a request for a user the sandbox's Bench does not have: root and the accounts
// its Workshop declares are its users.
func checkUser(sb *sandbox, h http.Header) error {
	if _, err := sb.account(basicUser(h)); err != nil {
		return userError(err)
	}
	return nil
}

func (ps *processService) Start(ctx context.Context, req *connect.Request[process.StartRequest], stream *connect.ServerStream[process.StartResponse]) error {
	sb, c, err := ps.authorize(req.Header())
	if err != nil {
		return err
	}
	m := req.Msg
	cfg := m.GetProcess()
	if cfg.GetCmd() == "" {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("process.cmd is empty"))
	}
	env := make([]string, 0, len(sb.envs)+len(cfg.GetEnvs()))
	for _, vars := range []map[string]string{sb.envs, cfg.GetEnvs()} {
		names := make([]string, 0, len(vars))
		for k := range vars {
			names = append(names, k)
		}
		sort.Strings(names)
		for _, k := range names {
			env = append(env, k+"="+vars[k])
		}
	}
	p, w, err := ps.s.start(sb, c, m.GetTag(), cfg, env, m.GetStdin(), m.Pty, basicUser(req.Header()))
	if err != nil {
		return err
	}
	defer p.unsubscribe(w)
	if err := stream.Send(&process.StartResponse{Event: &process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: p.pid}}}}); err != nil {
		return err
	}
	return abortIfGone(watch(ctx, req.Header(), p, w, func(ev *process.ProcessEvent) error {
		return stream.Send(&process.StartResponse{Event: ev})
	}))
}

// watch sends a command's events to a stream until it ends (or the stream does), with keepalives at
// the interval the client asked (Keepalive-Ping-Interval, seconds).
func watch(ctx context.Context, h http.Header, p *proc, w *sub, send func(*process.ProcessEvent) error) error {
	var tick <-chan time.Time
	if n, err := strconv.Atoi(h.Get("Keepalive-Ping-Interval")); err == nil && n > 0 && n <= maxKeepaliveS {
		t := time.NewTicker(time.Duration(n) * time.Second)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case ev := <-w.events:
			if err := send(ev); err != nil {
				return err
			}
		case <-p.done:
			// Everything it wrote was published before done closed: send what is queued, then the end.
		drain:
			for {
				select {
				case ev := <-w.events:
					if err := send(ev); err != nil {
						return err
					}
				default:
					break drain
				}
			}
			p.mu.Lock()
			end, gone := p.end, p.gone
			p.mu.Unlock()
			if gone {
				return errSandboxGone
			}
			return send(end)
		case <-w.dropped:
			return errBehind
		case <-tick:
			if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Keepalive{Keepalive: &process.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// start runs a command in the sandbox's Bench, as one bench.exec of the sandbox's user.
// The stream that starts it is subscribed before it runs, so that it misses none of its output.
func (s *Server) start(sb *sandbox, c *app.Caller, tag string, cfg *process.ProcessConfig, env []string, withStdin bool, pty *process.PTY, user string) (*proc, *sub, error) {
	req := &app.BenchExecRequest{Bench: sb.bench, Argv: append([]string{cfg.GetCmd()}, cfg.GetArgs()...), Cwd: cfg.GetCwd(), Env: env, User: user}
	if pty != nil {
		if err := ptyRequest(req, pty); err != nil {
			return nil, nil, err
		}
		withStdin = true // its terminal's input
	}
	sb.mu.Lock()
	n := len(sb.procs)
	sb.mu.Unlock()
	if n >= maxProcs {
		return nil, nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("%d commands run in this sandbox already: wait for one, or kill one", maxProcs))
	}
	// The command belongs to the sandbox, not to the stream that started it; the supervisor's
	// shutdown and the Bench's end stop it.
	ctx, cancel := context.WithCancel(s.Service.Detached.Ctx)
	p := &proc{tag: tag, config: cfg, cancel: cancel, subs: map[*sub]struct{}{}, done: make(chan struct{}),
		pty: pty, signals: make(chan syscall.Signal, 4)}
	first, _ := p.subscribe() // a new command has no watcher yet
	io := &app.IO{Stdout: output{p: p}, Stderr: output{p: p, stderr: true}, Signal: p.signals}
	if pty != nil {
		p.resize = make(chan sbox.Winsize, 1)
		io.Stdout, io.Stderr, io.Winsize = ptyOutput{p: p}, nil, p.resize
	}
	var stdinRead *os.File
	if withStdin {
		r, w, err := os.Pipe()
		if err != nil {
			cancel()
			return nil, nil, connect.NewError(connect.CodeInternal, err)
		}
		stdinRead, p.stdin, io.Stdin = r, w, r
	}
	sb.mu.Lock()
	if len(sb.procs) >= maxProcs { // counted again where the place is taken: starts at once race past the check above
		sb.mu.Unlock()
		cancel()
		if stdinRead != nil {
			stdinRead.Close()
			p.stdin.Close()
		}
		return nil, nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("%d commands run in this sandbox already: wait for one, or kill one", maxProcs))
	}
	sb.nextPid++
	p.pid = 1000 + sb.nextPid
	sb.procs[p.pid] = p
	sb.mu.Unlock()
	go func() {
		defer cancel()
		res, err := s.Service.Do(ctx, &app.Call{Caller: c, IO: io}, "bench.exec", req)
		if stdinRead != nil {
			stdinRead.Close()
		}
		end := &process.ProcessEvent_EndEvent{}
		switch {
		case err == nil:
			er := res.(*app.ExecResult)
			code := er.Exit
			end.ExitCode, end.Exited, end.Status = int32(code), true, "exit status "+strconv.Itoa(code)
			if code != 0 {
				end.Error = &end.Status // as envd says it: the SDK's CommandExitError shows it
			}
			if er.OOMKilled {
				msg := fmt.Sprintf("%s: killed: out of memory (the sandbox's memory limit, %d MiB)", end.Status, er.MemoryBytes>>20)
				end.Error = &msg
			}
		case ctx.Err() != nil:
			end.ExitCode, end.Status = -1, "signal: killed"
			end.Error = &end.Status // as envd says it (its Wait's error)
		default:
			e := app.Classify(err)
			msg := e.Error()
			if e.Hint != "" {
				msg += " (hint: " + e.Hint + ")"
			}
			end.ExitCode, end.Status, end.Error = -1, "error", &msg
		}
		// A command that did not exit by itself may have ended with its sandbox: asked only then, so
		// that a command's end costs nothing more.
		// A command refused because the sandbox is paused ends with that error: it is no killed sandbox.
		gone := sb.killed.Load() || ((err != nil || !end.Exited || end.ExitCode >= 128) && !errors.Is(err, bench.ErrPaused) &&
			!s.benchRunning(s.Service.Detached.Ctx, c, sb.bench))
		p.mu.Lock()
		p.end = &process.ProcessEvent{Event: &process.ProcessEvent_End{End: end}}
		p.gone = gone
		p.subs = map[*sub]struct{}{}
		if p.stdin != nil {
			p.stdin.Close()
			p.stdin = nil
		}
		p.mu.Unlock()
		// Out of the list before its end is sent: a client that saw the end and signals the command
		// again finds no command (envd's answer), never the one that ended (CI under load caught a
		// second kill of an ended pty succeed).
		sb.mu.Lock()
		delete(sb.procs, p.pid)
		sb.mu.Unlock()
		close(p.done)
	}()
	return p, first, nil
}

// killAll stops every command and watch of a sandbox (it is being killed): their streams break.
func (sb *sandbox) killAll() {
	sb.killed.Store(true)
	sb.stopWatches()
	sb.mu.Lock()
	defer sb.mu.Unlock()
	for _, p := range sb.procs {
		p.cancel()
	}
}

// find is the sandbox's running command that sel selects.
func (sb *sandbox) find(sel *process.ProcessSelector) (*proc, error) {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	switch v := sel.GetSelector().(type) {
	case *process.ProcessSelector_Pid:
		if p := sb.procs[v.Pid]; p != nil {
			return p, nil
		}
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with pid %d not found", v.Pid))
	case *process.ProcessSelector_Tag:
		for _, p := range sb.procs {
			if p.tag == v.Tag {
				return p, nil
			}
		}
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with tag %q not found", v.Tag))
	}
	return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("select a process by pid or tag"))
}

func (ps *processService) Connect(ctx context.Context, req *connect.Request[process.ConnectRequest], stream *connect.ServerStream[process.ConnectResponse]) error {
	p, err := ps.selected(req.Header(), req.Msg.GetProcess())
	if err != nil {
		return err
	}
	w, err := p.subscribe()
	if err != nil {
		return err
	}
	defer p.unsubscribe(w)
	if err := stream.Send(&process.ConnectResponse{Event: &process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: p.pid}}}}); err != nil {
		return err
	}
	return abortIfGone(watch(ctx, req.Header(), p, w, func(ev *process.ProcessEvent) error {
		return stream.Send(&process.ConnectResponse{Event: ev})
	}))
}

func (ps *processService) List(ctx context.Context, req *connect.Request[process.ListRequest]) (*connect.Response[process.ListResponse], error) {
	sb, _, err := ps.authorize(req.Header())
	if err != nil {
		return nil, err
	}
	res := &process.ListResponse{}
	sb.mu.Lock()
	for _, p := range sb.procs {
		info := &process.ProcessInfo{Config: p.config, Pid: p.pid}
		if p.tag != "" {
			info.Tag = &p.tag
		}
		res.Processes = append(res.Processes, info)
	}
	sb.mu.Unlock()
	sort.Slice(res.Processes, func(i, j int) bool { return res.Processes[i].Pid < res.Processes[j].Pid })
	return connect.NewResponse(res), nil
}

func (ps *processService) SendSignal(ctx context.Context, req *connect.Request[process.SendSignalRequest]) (*connect.Response[process.SendSignalResponse], error) {
	p, err := ps.selected(req.Header(), req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	// As envd: the signal goes to the command's process (not its group); SIGTERM it may catch.
	switch req.Msg.GetSignal() {
	case process.Signal_SIGNAL_SIGKILL:
		p.cancel() // the exec's end: init kills the process
	case process.Signal_SIGNAL_SIGTERM:
		select {
		case p.signals <- syscall.SIGTERM:
		case <-p.done:
		default:
			// A few signals are still on their way: one more SIGTERM adds nothing.
		}
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("signal %v: send SIGKILL or SIGTERM", req.Msg.GetSignal()))
	}
	return connect.NewResponse(&process.SendSignalResponse{}), nil
}

func (ps *processService) SendInput(ctx context.Context, req *connect.Request[process.SendInputRequest]) (*connect.Response[process.SendInputResponse], error) {
	p, err := ps.selected(req.Header(), req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := p.write(req.Msg.GetInput()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.SendInputResponse{}), nil
}

func (p *proc) write(in *process.ProcessInput) error {
	data := in.GetStdin()
	switch {
	case in.GetPty() != nil && p.pty == nil:
		return connect.NewError(connect.CodeFailedPrecondition, errors.New("the process has no pseudo-terminal: send its input as stdin"))
	case in.GetPty() == nil && p.pty != nil:
		return connect.NewError(connect.CodeFailedPrecondition, errors.New("the process has a pseudo-terminal: send its input as pty input (sandbox.pty.sendInput)"))
	case in.GetPty() != nil:
		data = in.GetPty()
	}
	if len(data) > maxStdinChunk {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("input of %d bytes: at most %d bytes a message; send it in parts", len(data), maxStdinChunk))
	}
	p.mu.Lock()
	w := p.stdin
	p.mu.Unlock()
	if w == nil {
		return connect.NewError(connect.CodeFailedPrecondition, errors.New("the command has no stdin open: start it with stdin: true"))
	}
	// A command that does not read its stdin must not hold the request forever.
	_ = w.SetWriteDeadline(time.Now().Add(30 * time.Second))
	if _, err := w.Write(data); err != nil {
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("write stdin: %w", err))
	}
	return nil
}

func (ps *processService) StreamInput(ctx context.Context, stream *connect.ClientStream[process.StreamInputRequest]) (*connect.Response[process.StreamInputResponse], error) {
	sb, _, err := ps.authorize(stream.RequestHeader())
	if err != nil {
		return nil, err
	}
	var p *proc
	for stream.Receive() {
		// A command's stdin may be quiet for long: each message gives the next one streamIdle.
		extendBody(ctx)
		switch ev := stream.Msg().GetEvent().(type) {
		case *process.StreamInputRequest_Start:
			if p, err = sb.find(ev.Start.GetProcess()); err != nil {
				return nil, err
			}
		case *process.StreamInputRequest_Data:
			if p == nil {
				return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("a start event first"))
			}
			if err := p.write(ev.Data.GetInput()); err != nil {
				return nil, err
			}
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.StreamInputResponse{}), nil
}

func (ps *processService) CloseStdin(ctx context.Context, req *connect.Request[process.CloseStdinRequest]) (*connect.Response[process.CloseStdinResponse], error) {
	p, err := ps.selected(req.Header(), req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if p.pty != nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("cannot close the stdin of a process with a pseudo-terminal: send Ctrl+D (0x04) instead"))
	}
	p.mu.Lock()
	if p.stdin != nil {
		p.stdin.Close()
		p.stdin = nil
	}
	p.mu.Unlock()
	return connect.NewResponse(&process.CloseStdinResponse{}), nil
}
