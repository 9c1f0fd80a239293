package app_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"toolshed.dev/shed/app"
)

// TestWatcherBoundsAndOverflow: a Bench's streams (bench.watch_dir, the E2B API's WatchDir) and
// watchers share one bound, whichever face started them; a watcher gives the entry of each file when
// asked (envd's include_entry); one whose events are not taken ends with why, once the events it
// held are given, as envd ends a watcher that lost events, never a silent gap.
func TestWatcherBoundsAndOverflow(t *testing.T) {
	s := benchService(t)
	ctx := context.Background()
	alice := &app.Call{Caller: &app.Caller{UID: 1001, User: "nobody", Role: app.User, Dir: "/"}}
	res, err := s.Do(ctx, alice, "bench.create", &app.BenchCreateRequest{Workshop: "bb", Name: "w"})
	if err != nil {
		t.Fatal(err)
	}
	name := res.(*app.BenchCreateResult).Bench
	if _, err := s.Do(ctx, alice, "bench.exec", &app.BenchExecRequest{Bench: name, Shell: "mkdir -p /root/d", Capture: true}); err != nil {
		t.Fatal(err)
	}

	// One stream, then watchers up to the bound.
	sctx, stopStream := context.WithCancel(ctx)
	started, ended := make(chan struct{}), make(chan error, 1)
	go func() {
		_, err := s.Do(sctx, &app.Call{Caller: alice.Caller, IO: &app.IO{Watch: &app.WatchIO{Started: func() { close(started) }, Event: func(app.FileEvent) {}}}},
			"bench.watch_dir", &app.WatchDirRequest{Bench: name, Path: "/root/d"})
		ended <- err
	}()
	select {
	case <-started:
	case err := <-ended:
		t.Fatalf("bench.watch_dir: %v", err)
	}
	var ids []string
	for range app.MaxBenchWatchers - 1 {
		res, err := s.Do(ctx, alice, "bench.watcher_create", &app.WatcherCreateRequest{Bench: name, Path: "/root/d"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, res.(*app.WatcherResult).Watcher)
	}
	_, err = s.Do(ctx, alice, "bench.watcher_create", &app.WatcherCreateRequest{Bench: name, Path: "/root/d"})
	var ae *app.Error
	if !errors.As(err, &ae) || ae.Code != app.CodeBusy || !strings.Contains(err.Error(), "16 watchers already") {
		t.Fatalf("a watcher past the bound, a stream counted: %v", err)
	}
	stopStream()
	<-ended
	for _, id := range ids {
		if _, err := s.Do(ctx, alice, "bench.watcher_remove", &app.WatcherRequest{Bench: name, Watcher: id}); err != nil {
			t.Fatal(err)
		}
	}

	// A watcher with entries, its events never taken while far more than it holds happen.
	res, err = s.Do(ctx, alice, "bench.watcher_create", &app.WatcherCreateRequest{Bench: name, Path: "/root/d", Entry: true})
	if err != nil {
		t.Fatal(err)
	}
	id := res.(*app.WatcherResult).Watcher
	if _, err := s.Do(ctx, alice, "bench.exec", &app.BenchExecRequest{Bench: name, Capture: true,
		Shell: "cd /root/d && i=0; while [ $i -lt 6000 ]; do : > f$i; i=$((i+1)); done"}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // the last events reach the watcher
	var got []app.FileEvent
	for {
		res, err := s.Do(ctx, alice, "bench.watcher_events", &app.WatcherRequest{Bench: name, Watcher: id})
		if err != nil {
			if !errors.As(err, &ae) || ae.Code != app.CodeBusy || !strings.Contains(err.Error(), "4096 events were not taken") {
				t.Fatalf("the end of a watcher not polled: %v", err)
			}
			break
		}
		evs := res.(*app.WatcherEventsResult).Events
		if len(evs) == 0 {
			t.Fatalf("a watcher past %d events not taken did not end (%d events taken)", app.MaxWatcherEvents, len(got))
		}
		got = append(got, evs...)
	}
	if len(got) != app.MaxWatcherEvents {
		t.Errorf("events given before the end: %d, want %d", len(got), app.MaxWatcherEvents)
	}
	if e := got[0]; e.Name != "f0" || e.Type != "create" || e.Entry == nil || e.Entry.Path != "/root/d/f0" {
		t.Errorf("first event, with entry: %+v", e)
	}
	// As envd's, it answers its end until removed, and its removal succeeds.
	if _, err := s.Do(ctx, alice, "bench.watcher_events", &app.WatcherRequest{Bench: name, Watcher: id}); !errors.As(err, &ae) || ae.Code != app.CodeBusy {
		t.Errorf("a watcher that ended, polled again: %v", err)
	}
	if _, err := s.Do(ctx, alice, "bench.watcher_remove", &app.WatcherRequest{Bench: name, Watcher: id}); err != nil {
		t.Errorf("the removal of a watcher that ended: %v", err)
	}
	if _, err := s.Do(ctx, alice, "bench.watcher_events", &app.WatcherRequest{Bench: name, Watcher: id}); !errors.As(err, &ae) || ae.Code != app.CodeNotFound {
		t.Errorf("a watcher removed is gone: %v", err)
	}
}
