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

// Bounds on the watchers, so that a client that starts watchers and never polls them holds a bounded
// part of the supervisor: each watcher holds an inotify watch of each directory it watches.
const (
	MaxBenchWatchers  = 16   // watchers of one Bench at once
	MaxCallerWatchers = 64   // watchers of one caller (uid) at once, over all their Benches
	MaxWatcherEvents  = 4096 // events a watcher holds until a poll takes them; later ones are counted as dropped
)

// WatcherCreateRequest starts a watcher of a directory of a running Bench.
type WatcherCreateRequest struct {
	Bench     string `json:"bench"`               // the Bench, by name or id
	Path      string `json:"path"`                // an absolute directory, as the Bench sees it
	Recursive bool   `json:"recursive,omitempty"` // the directories below it too
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
	Events  []FileEvent `json:"events"`            // oldest first
	Dropped int         `json:"dropped,omitempty"` // events not kept: more than 4096 (MaxWatcherEvents) waited for a poll
}

// watcher is one watch of bench.watcher_create.
type watcher struct {
	id    string
	bench string // the Bench's id
	uid   uint32 // who started it: the only caller who may poll or remove it
	stop  context.CancelFunc

	mu      sync.Mutex
	events  []FileEvent
	dropped int
	err     error // how the watch ended, if it did
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
	watchers.mu.Lock()
	nb, nc := watchers.count(rec.ID, c.Caller.UID)
	if nb < MaxBenchWatchers && nc < MaxCallerWatchers {
		if watchers.byID == nil {
			watchers.byID = map[string]*watcher{}
		}
		watchers.byID[w.id] = w
	}
	watchers.mu.Unlock()
	switch {
	case nb >= MaxBenchWatchers:
		stop()
		return nil, fail(CodeBusy, fmt.Errorf("bench %s has %d watchers already", rec.Name, nb), "stop one you are done with (bench.watcher_remove)")
	case nc >= MaxCallerWatchers:
		stop()
		return nil, fail(CodeBusy, fmt.Errorf("you have %d watchers already", nc), "stop one you are done with (bench.watcher_remove)")
	}
	started := make(chan struct{})
	done := make(chan error, 1)
	wc := &Call{Caller: c.Caller, IO: &IO{Watch: &WatchIO{
		Started: func() { close(started) },
		Event: func(e FileEvent) {
			w.mu.Lock()
			defer w.mu.Unlock()
			if len(w.events) >= MaxWatcherEvents {
				w.dropped++
				return
			}
			w.events = append(w.events, e)
		},
	}}}
	go func() {
		_, err := s.WatchDir(wctx, wc, &WatchDirRequest{Bench: rec.ID, Path: p, Recursive: req.Recursive})
		select {
		case <-started:
		default:
			watchers.drop(w)
			done <- err // it never started: the caller hears why
			return
		}
		if wctx.Err() != nil {
			return // removed, or the supervisor is ending
		}
		if errors.Is(err, bench.ErrBenchEnded) {
			watchers.drop(w)
			return
		}
		if err == nil {
			err = errors.New("the watch ended")
		}
		w.mu.Lock()
		w.err = err
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
	if w == nil || w.bench != rec.ID || w.uid != c.Caller.UID {
		return nil, "", fail(CodeNotFound, fmt.Errorf("bench %s has no watcher %.40q of yours", rec.Name, req.Watcher),
			"bench.watcher_create starts one and returns its id; a watcher ends with its Bench")
	}
	return w, rec.Name, nil
}

// WatcherEvents takes a watcher's events since the last poll. A watch that ended on its own (its
// directory removed, events lost) gives its last events, then its error, and is removed.
func (s *Service) WatcherEvents(ctx context.Context, c *Call, req *WatcherRequest) (*WatcherEventsResult, error) {
	w, name, err := s.watcherOf(c, req)
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	res := &WatcherEventsResult{Events: w.events, Dropped: w.dropped}
	w.events, w.dropped = nil, 0
	end := w.err
	w.mu.Unlock()
	if res.Events == nil {
		res.Events = []FileEvent{}
	}
	if len(res.Events) == 0 && res.Dropped == 0 && end != nil {
		watchers.drop(w)
		ce := Classify(end)
		return nil, &Error{Code: ce.Code, Err: fmt.Errorf("watcher %s of bench %s ended: %w", w.id, name, end), Hint: "start another (bench.watcher_create)"}
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
