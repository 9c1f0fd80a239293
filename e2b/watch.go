package e2b

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"sync"
	"time"

	"connectrpc.com/connect"

	"toolshed.dev/shed/app"
	"toolshed.dev/shed/e2b/envd/filesystem"
)

// A WatchDir stream is one bench.watch_dir, for as long as it lasts; a watcher (CreateWatcher,
// GetWatcherEvents, RemoveWatcher) is app's bench.watcher_*, the same as MCP's bench_watch_*. app
// bounds both (16 of a sandbox, 64 of a user: app.MaxBenchWatchers). A stream's events wait in a
// bounded queue, as a command's output does: a client that does not read them ends its watch
// (resource_exhausted) rather than hold the supervisor's memory; a watcher's, past
// app.MaxWatcherEvents not taken, end it the same way.

const watchSubQueue = 1024 // events queued for a WatchDir stream

var errWatchBehind = errors.New("events came faster than this client read them, and the watch was ended: watch again")

// watches are a sandbox's WatchDir streams in progress, ended when it is killed.
type watches struct {
	mu      sync.Mutex
	stopped bool
	cancels map[*context.CancelFunc]struct{}
}

// beginWatch returns a stream's context and release (which cancels it), so that the sandbox's kill
// ends the stream.
func (sb *sandbox) beginWatch(parent context.Context) (context.Context, func(), error) {
	w := &sb.watch
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return nil, nil, connect.NewError(connect.CodeUnauthenticated, errNoSandbox)
	}
	if w.cancels == nil {
		w.cancels = map[*context.CancelFunc]struct{}{}
	}
	ctx, cancel := context.WithCancel(parent)
	w.cancels[&cancel] = struct{}{}
	return ctx, func() {
		cancel()
		w.mu.Lock()
		delete(w.cancels, &cancel)
		w.mu.Unlock()
	}, nil
}

// stopWatches ends every watch stream of a sandbox (it is being killed); its watchers end with its
// Bench.
func (sb *sandbox) stopWatches() {
	w := &sb.watch
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopped = true
	for c := range w.cancels {
		(*c)()
	}
}

// watchRequest is bench.watch_dir's request for a sandbox's path (absolute: rpcPath).
func watchRequest(sb *sandbox, p string, recursive, entry, network bool) *app.WatchDirRequest {
	return &app.WatchDirRequest{Bench: sb.bench, Path: p, Recursive: recursive, Entry: entry, NetworkMounts: network}
}

// runWatch starts a bench.watch_dir in the background and returns once it is in place (nil) or has
// failed. Each event goes to event; end gets how the watch ended.
func (s *Server) runWatch(ctx context.Context, c *app.Caller, req *app.WatchDirRequest, event func(*filesystem.FilesystemEvent), end func(error)) error {
	started := make(chan struct{})
	failed := make(chan error, 1)
	io := &app.IO{Watch: &app.WatchIO{
		Started: func() { close(started) },
		Event:   func(e app.FileEvent) { event(fsEvent(e)) },
	}}
	go func() {
		_, err := s.Service.Do(ctx, &app.Call{Caller: c, IO: io}, "bench.watch_dir", req)
		select {
		case <-started:
			end(err)
		default:
			failed <- err
		}
	}()
	select {
	case <-started:
		return nil
	case err := <-failed:
		if err == nil {
			err = ctx.Err()
		}
		return connectError(err)
	}
}

func fsEvent(e app.FileEvent) *filesystem.FilesystemEvent {
	ev := &filesystem.FilesystemEvent{Name: e.Name}
	switch e.Type {
	case "create":
		ev.Type = filesystem.EventType_EVENT_TYPE_CREATE
	case "write":
		ev.Type = filesystem.EventType_EVENT_TYPE_WRITE
	case "remove":
		ev.Type = filesystem.EventType_EVENT_TYPE_REMOVE
	case "rename":
		ev.Type = filesystem.EventType_EVENT_TYPE_RENAME
	case "chmod":
		ev.Type = filesystem.EventType_EVENT_TYPE_CHMOD
	}
	if e.Entry != nil {
		ev.Entry = entryInfo(e.Entry)
	}
	return ev
}

func (fs *filesystemService) watchAuth(h http.Header) (*sandbox, *app.Caller, error) {
	sb, c, err := fs.s.byToken(h)
	if err != nil {
		return nil, nil, connect.NewError(connect.CodeUnauthenticated, errNoSandbox)
	}
	if err := checkUser(sb, h); err != nil {
		return nil, nil, err
	}
	return sb, c, nil
}

// WatchDir streams a directory's changes until the client ends the stream.
func (fs *filesystemService) WatchDir(ctx context.Context, req *connect.Request[filesystem.WatchDirRequest], stream *connect.ServerStream[filesystem.WatchDirResponse]) error {
	sb, c, err := fs.watchAuth(req.Header())
	if err != nil {
		return err
	}
	m := req.Msg
	p, err := sb.rpcPath(req.Header(), m.GetPath())
	if err != nil {
		return err
	}
	wctx, done, err := sb.beginWatch(ctx)
	if err != nil {
		return err
	}
	defer done()
	events := make(chan *filesystem.FilesystemEvent, watchSubQueue)
	behind := make(chan struct{})
	var behindOnce sync.Once
	ended := make(chan error, 1)
	err = fs.s.runWatch(wctx, c, watchRequest(sb, p, m.GetRecursive(), m.GetIncludeEntry(), m.GetAllowNetworkMounts()),
		func(ev *filesystem.FilesystemEvent) {
			select {
			case events <- ev:
			default:
				behindOnce.Do(func() { close(behind) })
			}
		},
		func(err error) { ended <- err })
	if err != nil {
		return err
	}
	if err := stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Start{Start: &filesystem.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	var tick <-chan time.Time
	if n, err := strconv.Atoi(req.Header().Get("Keepalive-Ping-Interval")); err == nil && n > 0 && n <= maxKeepaliveS {
		t := time.NewTicker(time.Duration(n) * time.Second)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case ev := <-events:
			if err := stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Filesystem{Filesystem: ev}}); err != nil {
				return err
			}
		case <-behind:
			return connect.NewError(connect.CodeResourceExhausted, errWatchBehind)
		case err := <-ended:
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if err == nil { // the sandbox was killed
				return connect.NewError(connect.CodeUnavailable, errors.New("the sandbox was killed"))
			}
			return connectError(err)
		case <-tick:
			if err := stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Keepalive{Keepalive: &filesystem.WatchDirResponse_KeepAlive{}}}); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// CreateWatcher starts a watch whose events GetWatcherEvents takes (app's bench.watcher_create); it
// lasts until RemoveWatcher or the sandbox's end.
func (fs *filesystemService) CreateWatcher(ctx context.Context, req *connect.Request[filesystem.CreateWatcherRequest]) (*connect.Response[filesystem.CreateWatcherResponse], error) {
	sb, c, err := fs.watchAuth(req.Header())
	if err != nil {
		return nil, err
	}
	m := req.Msg
	p, err := sb.rpcPath(req.Header(), m.GetPath())
	if err != nil {
		return nil, err
	}
	out, err := fs.s.Service.Do(ctx, &app.Call{Caller: c}, "bench.watcher_create", &app.WatcherCreateRequest{Bench: sb.bench, Path: p,
		Recursive: m.GetRecursive(), Entry: m.GetIncludeEntry(), NetworkMounts: m.GetAllowNetworkMounts()})
	if err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(&filesystem.CreateWatcherResponse{WatcherId: out.(*app.WatcherResult).Watcher}), nil
}

// GetWatcherEvents takes a watcher's events since the last call; a watcher that ended gives the
// events it held, then why it ended.
func (fs *filesystemService) GetWatcherEvents(ctx context.Context, req *connect.Request[filesystem.GetWatcherEventsRequest]) (*connect.Response[filesystem.GetWatcherEventsResponse], error) {
	sb, c, err := fs.watchAuth(req.Header())
	if err != nil {
		return nil, err
	}
	out, err := fs.s.Service.Do(ctx, &app.Call{Caller: c}, "bench.watcher_events", &app.WatcherRequest{Bench: sb.bench, Watcher: req.Msg.GetWatcherId()})
	if err != nil {
		return nil, connectError(err)
	}
	res := &filesystem.GetWatcherEventsResponse{}
	for _, e := range out.(*app.WatcherEventsResult).Events {
		res.Events = append(res.Events, fsEvent(e))
	}
	return connect.NewResponse(res), nil
}

// RemoveWatcher ends a watcher; the events it held are gone.
func (fs *filesystemService) RemoveWatcher(ctx context.Context, req *connect.Request[filesystem.RemoveWatcherRequest]) (*connect.Response[filesystem.RemoveWatcherResponse], error) {
	sb, c, err := fs.watchAuth(req.Header())
	if err != nil {
		return nil, err
	}
	if _, err := fs.s.Service.Do(ctx, &app.Call{Caller: c}, "bench.watcher_remove", &app.WatcherRequest{Bench: sb.bench, Watcher: req.Msg.GetWatcherId()}); err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(&filesystem.RemoveWatcherResponse{}), nil
}
