package app

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"path"

	"toolshed.dev/shed/bench"
)

func init() {
	op("bench.watch_dir", (*Service).WatchDir)
}

// WatchDirRequest asks for the changes in a directory of a running Bench, as they happen.
type WatchDirRequest struct {
	Bench     string `json:"bench"`               // the Bench, by name or id
	Path      string `json:"path"`                // an absolute directory, as the Bench sees it
	Recursive bool   `json:"recursive,omitempty"` // the directories below it too (at most bench.MaxWatchDirs in all)
	Entry     bool   `json:"entry,omitempty"`     // describe the file in each event, when it still exists
	// NetworkMounts allows a directory on a network filesystem, where changes made elsewhere are
	// not seen.
	NetworkMounts bool `json:"network_mounts,omitempty"`
}

// FileEvent is one change in a watched directory.
type FileEvent struct {
	Name  string     `json:"name"`            // the file's path relative to the watched directory
	Type  string     `json:"type"`            // "create", "write", "remove", "rename" or "chmod"
	Entry *FileEntry `json:"entry,omitempty"` // with entry, the file after the change (none if gone)
}

// WatchIO is where a watch's events go (IO.Watch).
type WatchIO struct {
	Started func()          // called once the watch is in place, before any event
	Event   func(FileEvent) // must not block for long: the watch's queue is bounded
}

// WatchDir watches a directory of a running Bench until ctx ends, calling the caller's IO.Watch for
// each change (inotify, from the supervisor, on the Bench's own view of its files: package bench). It
// ends with an error when the directory is removed or events were lost. It holds a place among the
// Bench's and the caller's watchers (MaxBenchWatchers, MaxCallerWatchers) while it lasts.
func (s *Service) WatchDir(ctx context.Context, c *Call, req *WatchDirRequest) (*Empty, error) {
	return s.watchDir(ctx, c, req, true)
}

// watchDir is bench.watch_dir; stream takes the watch's place among the bounds (a watcher has its own).
func (s *Service) watchDir(ctx context.Context, c *Call, req *WatchDirRequest, stream bool) (*Empty, error) {
	p, err := benchFile(req.Path)
	if err != nil {
		return nil, err
	}
	st, rec, err := s.runningBench(c, req.Bench)
	if err != nil {
		return nil, err
	}
	st.Close() // the watch reads the running Bench's root, not the store
	if c.IO == nil || c.IO.Watch == nil {
		return nil, usage("watch from a client that streams events (the E2B API)", "bench.watch_dir has nowhere to send events")
	}
	if stream {
		slot := &watcher{id: "s" + rand.Text()[:16], bench: rec.ID, uid: c.Caller.UID, stop: func() {}, stream: true}
		if err := watchers.add(slot, rec.Name); err != nil {
			return nil, err
		}
		defer watchers.drop(slot)
	}
	w, err := bench.OpenWatch(rec, p, bench.WatchOptions{Recursive: req.Recursive, Entry: req.Entry, NetworkMounts: req.NetworkMounts})
	if err != nil {
		var we *bench.WatchError
		switch {
		case errors.As(err, &we) && we.Missing:
			return nil, fail(CodeNotFound, fmt.Errorf("watch %s in bench %s: no such directory", p, rec.Name), "make it first (files.makeDir)")
		case errors.As(err, &we):
			return nil, fail(CodeInvalid, fmt.Errorf("watch in bench %s: %w", rec.Name, err), "")
		}
		return nil, err
	}
	defer w.Close()
	if c.IO.Watch.Started != nil {
		c.IO.Watch.Started()
	}
	err = w.Run(ctx, func(e bench.WatchEvent) {
		fe := FileEvent{Name: e.Name, Type: e.Op}
		if f := e.Entry; f != nil {
			fe.Entry = &FileEntry{Name: path.Base(f.Path), Path: f.Path, Type: f.Type, Size: f.Size, Mode: f.Mode,
				Owner: f.Owner, Group: f.Group, Modified: f.Modified, Target: f.Target}
		}
		c.IO.Watch.Event(fe)
	})
	if errors.Is(err, bench.ErrWatchBehind) {
		return nil, fail(CodeBusy, fmt.Errorf("watch %s in bench %s: %w", p, rec.Name, err), "")
	}
	if err != nil {
		return nil, fail(CodeFailed, fmt.Errorf("watch in bench %s: %w", rec.Name, err), "")
	}
	return &Empty{}, nil
}
