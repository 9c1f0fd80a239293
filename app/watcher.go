package app

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"

	"toolshed.dev/shed/bench"
)

// A watcher is a directory watch whose events a client polls (envd's CreateWatcher, GetWatcherEvents
// and RemoveWatcher; MCP's bench_watch_*), for a client that cannot hold a stream open: the watch
// runs in the process that holds the Bench (the supervisor; `shed mcp` working on a store directly),
// and its events wait for the next poll in a bounded queue.

func init() {
	op("bench.watcher_create", (*Service).CreateWatcher)
	op("bench.watcher_events", (*Service).WatcherEvents)
	op("bench.watcher_remove", (*Service).RemoveWatcher)
}

// Bounds on the watches, so that a client that starts watches and never reads them holds a bounded
// part of the supervisor: each holds an inotify watch of each directory it watches. A watch is a
// watcher or a stream of bench.watch_dir; both count, whichever face (E2B, MCP) started them.
const (
	MaxBenchWatchers  = 16 // watches of one Bench at once
	MaxCallerWatchers = 64 // watches of one caller (uid) at once, over all their Benches
	// Events a watcher holds until a poll takes them. One more ends the watcher (CodeBusy): as envd
	// ends a watcher whose inotify queue overflowed, a poller learns that it missed events rather
	// than get a silent gap.
	MaxWatcherEvents = 4096
)

// WatcherCreateRequest starts a watcher of a directory of a running Bench.
type WatcherCreateRequest struct {
	Bench     string `json:"bench"`               // the Bench, by name or id
	Path      string `json:"path"`                // an absolute directory, as the Bench sees it
	Recursive bool   `json:"recursive,omitempty"` // the directories below it too
	Entry     bool   `json:"entry,omitempty"`     // describe the file in each event (WatchDirRequest.Entry)
	// NetworkMounts allows a directory on a network filesystem (WatchDirRequest.NetworkMounts).
	NetworkMounts bool `json:"network_mounts,omitempty"`
}

// WatcherResult names a watcher.
type WatcherResult struct {
	Bench   string `json:"bench"`   // the Bench's name
	Watcher string `json:"watcher"` // its id, for bench.watcher_events and bench.watcher_remove
}

// WatcherRequest names a watcher of a Bench.
type WatcherRequest struct {
	Bench   string `json:"bench"`   // the Bench, by name or id
	Watcher string `json:"watcher"` // the watcher's id (bench.watcher_create's)
}

// WatcherEventsResult is what a watcher saw since the last poll.
type WatcherEventsResult struct {
	Events []FileEvent `json:"events"` // oldest first; each with its Entry when the watcher was created with entry
}

// watcher is one watch of bench.watcher_create, or (stream) a place that a bench.watch_dir holds
// among the bounds.
type watcher struct {
	id     string
	bench  string // the Bench's id
	uid    uint32 // who started it: the only caller who may poll or remove it
	stop   context.CancelFunc
	stream bool // bench.watch_dir's: counted, never polled

	mu     sync.Mutex
	events []FileEvent
	err    error // how the watch ended, if it did
}

// watcherSet is every watcher of this process. It is the process's, not a Service's: `shed mcp`
// working on a store directly makes a Service per request, and its watchers must outlive each.
type watcherSet struct {
	mu   sync.Mutex
	byID map[string]*watcher
}

var watchers watcherSet

// count returns how many watchers the Bench and the caller hold.
func (ws *watcherSet) count(benchID string, uid uint32) (bench, caller int) {
	for _, w := range ws.byID {
		if w.bench == benchID {
			bench++
		}
		if w.uid == uid {
			caller++
		}
	}
	return bench, caller
}

// add takes a place for w within the bounds, or says which bound is full.
func (ws *watcherSet) add(w *watcher, benchName string) error {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	nb, nc := ws.count(w.bench, w.uid)
	switch {
	case nb >= MaxBenchWatchers:
		return fail(CodeBusy, fmt.Errorf("bench %s has %d watchers already (polled and streamed)", benchName, nb), "stop one you are done with (bench.watcher_remove, or end its stream)")
	case nc >= MaxCallerWatchers:
		return fail(CodeBusy, fmt.Errorf("you have %d watchers already (polled and streamed)", nc), "stop one you are done with (bench.watcher_remove, or end its stream)")
	}
	if ws.byID == nil {
		ws.byID = map[string]*watcher{}
	}
	ws.byID[w.id] = w
	return nil
}

func (ws *watcherSet) drop(w *watcher) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.byID[w.id] == w {
		delete(ws.byID, w.id)
	}
	w.stop()
}

// CreateWatcher starts a watcher of a directory of a running Bench (as bench.watch_dir watches it)
// and returns its id once the watch is in place. It lasts until bench.watcher_remove, or the Bench's
// end (then it is dropped), or the end of the process that holds it.
func (s *Service) CreateWatcher(ctx context.Context, c *Call, req *WatcherCreateRequest) (*WatcherResult, error) {
	p, err := benchFile(req.Path)
	if err != nil {
		return nil, err
	}
	st, rec, err := s.runningBench(c, req.Bench)
	if err != nil {
		return nil, err
	}
	st.Close()
	parent := context.Background() // `shed mcp` on a store directly: the watcher lasts as its process does
	if s.Detached != nil {
		parent = s.Detached.Ctx // the supervisor's: it ends with it
	}
	wctx, stop := context.WithCancel(parent)
	w := &watcher{id: "w" + rand.Text()[:16], bench: rec.ID, uid: c.Caller.UID, stop: stop}
	// Its place is taken before it starts, so that watchers created at once stay within the bounds.
	if err := watchers.add(w, rec.Name); err != nil {
		stop()
		return nil, err
	}
	started := make(chan struct{})
	done := make(chan error, 1)
	wc := &Call{Caller: c.Caller, IO: &IO{Watch: &WatchIO{
		Started: func() { close(started) },
		Event: func(e FileEvent) {
			w.mu.Lock()
			defer w.mu.Unlock()
			if w.err != nil {
				return
			}
			if len(w.events) >= MaxWatcherEvents {
				w.err = fail(CodeBusy, fmt.Errorf("more than %d events were not taken", MaxWatcherEvents), "")
				stop()
				return
			}
			w.events = append(w.events, e)
		},
	}}}
	go func() {
		_, err := s.watchDir(wctx, wc, &WatchDirRequest{Bench: rec.ID, Path: p, Recursive: req.Recursive, Entry: req.Entry, NetworkMounts: req.NetworkMounts}, false)
		select {
		case <-started:
		default:
			watchers.drop(w)
			done <- err // it never started: the caller hears why
			return
		}
		if wctx.Err() != nil {
			return // removed, ended for events not taken, or the supervisor is ending
		}
		if errors.Is(err, bench.ErrBenchEnded) {
			watchers.drop(w)
			return
		}
		if err == nil {
			err = errors.New("the watch ended")
		}
		w.mu.Lock()
		if w.err == nil {
			w.err = err
		}
		w.mu.Unlock()
	}()
	select {
	case <-started:
	case err := <-done:
		if err == nil {
			err = ctx.Err()
		}
		return nil, err
	}
	return &WatcherResult{Bench: rec.Name, Watcher: w.id}, nil
}

// watcherOf finds the caller's watcher of a running Bench.
func (s *Service) watcherOf(c *Call, req *WatcherRequest) (*watcher, string, error) {
	st, rec, err := s.runningBench(c, req.Bench)
	if err != nil {
		return nil, "", err
	}
	st.Close()
	watchers.mu.Lock()
	w := watchers.byID[req.Watcher]
	watchers.mu.Unlock()
	if w == nil || w.stream || w.bench != rec.ID || w.uid != c.Caller.UID {
		return nil, "", fail(CodeNotFound, fmt.Errorf("bench %s has no watcher %.40q of yours", rec.Name, req.Watcher),
			"bench.watcher_create starts one and returns its id; a watcher ends with its Bench")
	}
	return w, rec.Name, nil
}

// WatcherEvents takes a watcher's events since the last poll. A watch that ended on its own (its
// directory removed, events lost, more than MaxWatcherEvents not taken) gives its last events, then
// its error at each poll until bench.watcher_remove, as envd's does (a client's stop after the error
// succeeds); it holds its place among the bounds until then.
func (s *Service) WatcherEvents(ctx context.Context, c *Call, req *WatcherRequest) (*WatcherEventsResult, error) {
	w, name, err := s.watcherOf(c, req)
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	res := &WatcherEventsResult{Events: w.events}
	w.events = nil
	end := w.err
	w.mu.Unlock()
	if res.Events == nil {
		res.Events = []FileEvent{}
	}
	if len(res.Events) == 0 && end != nil {
		ce := Classify(end)
		return nil, &Error{Code: ce.Code, Err: fmt.Errorf("watcher %s of bench %s ended: %w", w.id, name, end), Hint: "remove it (bench.watcher_remove) and start another"}
	}
	return res, nil
}

// RemoveWatcher stops a watcher; its events not taken are gone.
func (s *Service) RemoveWatcher(ctx context.Context, c *Call, req *WatcherRequest) (*WatcherResult, error) {
	w, name, err := s.watcherOf(c, req)
	if err != nil {
		return nil, err
	}
	watchers.drop(w)
	return &WatcherResult{Bench: name, Watcher: w.id}, nil
}
