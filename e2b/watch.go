package e2b

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"connectrpc.com/connect"

	"toolshed.dev/shed/app"
	"toolshed.dev/shed/e2b/envd/filesystem"
)

// A watch (WatchDir's stream, or a watcher of CreateWatcher) is one bench.watch_dir, for as long as it
// lasts. Its events wait in a bounded queue, as a command's output does: a client that does not read
// them ends its watch (resource_exhausted) rather than hold the supervisor's memory.

// Bounds on a sandbox's watches.
const (
	maxWatches     = 16   // watches of one sandbox at once (streams and watchers)
	watchSubQueue  = 1024 // events queued for a WatchDir stream
	maxWatcherHeld = 4096 // events a watcher holds until GetWatcherEvents takes them
)

var errWatchBehind = errors.New("events came faster than this client read them, and the watch was ended: watch again")

// watches are a sandbox's watches in progress.
type watches struct {
	mu       sync.Mutex
	n        int                 // streams and watchers
	watchers map[string]*watcher // CreateWatcher's, by id
	stopped  bool
	cancels  map[*context.CancelFunc]struct{}
}

// watcher is a watch of CreateWatcher: its events are held until GetWatcherEvents takes them.
type watcher struct {
	cancel context.CancelFunc
	mu     sync.Mutex
	events []*filesystem.FilesystemEvent
	err    error // set when it ended on its own
}

// beginWatch counts a new watch of the sandbox and returns its context, the context's cancel, and
// release (which cancels it too and gives its place back), or refuses it past the bound.
func (sb *sandbox) beginWatch(parent context.Context) (context.Context, context.CancelFunc, func(), error) {
	w := &sb.watch
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return nil, nil, nil, connect.NewError(connect.CodeUnauthenticated, errNoSandbox)
	}
	if w.n >= maxWatches {
		return nil, nil, nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("%d watches of this sandbox are open already: stop one (handle.stop, removeWatcher)", maxWatches))
	}
	if w.cancels == nil {
		w.cancels = map[*context.CancelFunc]struct{}{}
	}
	ctx, cancel := context.WithCancel(parent)
	w.n++
	w.cancels[&cancel] = struct{}{}
	var once sync.Once
	return ctx, cancel, func() {
		once.Do(func() {
			cancel()
			w.mu.Lock()
			w.n--
			delete(w.cancels, &cancel)
			w.mu.Unlock()
		})
	}, nil
}

// stopWatches ends every watch of a sandbox (it is being killed).
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
	wctx, _, done, err := sb.beginWatch(ctx)
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

// CreateWatcher starts a watch whose events GetWatcherEvents takes; it lasts until RemoveWatcher or
// the sandbox's end.
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
	// The watch belongs to the sandbox, not to this request.
	// It holds its place among the sandbox's watches until RemoveWatcher, ended or not.
	wctx, stop, done, err := sb.beginWatch(fs.s.Service.Detached.Ctx)
	if err != nil {
		return nil, err
	}
	w := &watcher{cancel: done}
	err = fs.s.runWatch(wctx, c, watchRequest(sb, p, m.GetRecursive(), m.GetIncludeEntry(), m.GetAllowNetworkMounts()),
		func(ev *filesystem.FilesystemEvent) {
			w.mu.Lock()
			defer w.mu.Unlock()
			if w.err != nil {
				return
			}
			if len(w.events) >= maxWatcherHeld {
				w.err = connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("more than %d events were not taken (getWatcherEvents), and the watcher was ended: create it again", maxWatcherHeld))
				stop()
				return
			}
			w.events = append(w.events, ev)
		},
		func(err error) {
			w.mu.Lock()
			defer w.mu.Unlock()
			if w.err == nil {
				if err == nil {
					err = errors.New("the watch ended")
				}
				w.err = connectError(err)
			}
		})
	if err != nil {
		done()
		return nil, err
	}
	id := "w" + newToken()[:16]
	sb.watch.mu.Lock()
	if sb.watch.watchers == nil {
		sb.watch.watchers = map[string]*watcher{}
	}
	sb.watch.watchers[id] = w
	sb.watch.mu.Unlock()
	return connect.NewResponse(&filesystem.CreateWatcherResponse{WatcherId: id}), nil
}

func (sb *sandbox) watcher(id string) (*watcher, error) {
	sb.watch.mu.Lock()
	defer sb.watch.mu.Unlock()
	w := sb.watch.watchers[id]
	if w == nil {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("watcher with id %s not found", id))
	}
	return w, nil
}

// GetWatcherEvents takes a watcher's events since the last call.
func (fs *filesystemService) GetWatcherEvents(ctx context.Context, req *connect.Request[filesystem.GetWatcherEventsRequest]) (*connect.Response[filesystem.GetWatcherEventsResponse], error) {
	sb, _, err := fs.watchAuth(req.Header())
	if err != nil {
		return nil, err
	}
	w, err := sb.watcher(req.Msg.GetWatcherId())
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	// Events taken before the watch ended are given first; its error after.
	if len(w.events) == 0 && w.err != nil {
		return nil, w.err
	}
	events := w.events
	w.events = nil
	return connect.NewResponse(&filesystem.GetWatcherEventsResponse{Events: events}), nil
}

// RemoveWatcher ends a watcher.
func (fs *filesystemService) RemoveWatcher(ctx context.Context, req *connect.Request[filesystem.RemoveWatcherRequest]) (*connect.Response[filesystem.RemoveWatcherResponse], error) {
	sb, _, err := fs.watchAuth(req.Header())
	if err != nil {
		return nil, err
	}
	id := req.Msg.GetWatcherId()
	w, err := sb.watcher(id)
	if err != nil {
		return nil, err
	}
	w.cancel()
	sb.watch.mu.Lock()
	delete(sb.watch.watchers, id)
	sb.watch.mu.Unlock()
	return connect.NewResponse(&filesystem.RemoveWatcherResponse{}), nil
}
