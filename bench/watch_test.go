package bench

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// self is a "Bench" whose init is this process: its root is the host's, so paths are the host's.
func self() *Record { return &Record{Name: "self", Running: true, Pid: os.Getpid()} }

// collect runs w until want is seen (or 5 s pass) and returns what it saw.
func collect(t *testing.T, w *DirWatch, want func([]WatchEvent) bool) []WatchEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var got []WatchEvent
	_ = w.Run(ctx, func(e WatchEvent) {
		got = append(got, e)
		if want(got) {
			cancel()
		}
	})
	return got
}

func has(evs []WatchEvent, op, name string) bool {
	for _, e := range evs {
		if e.Op == op && e.Name == name {
			return true
		}
	}
	return false
}

func TestWatchRecursive(t *testing.T) {
	dir := t.TempDir()
	w, err := OpenWatch(self(), dir, WatchOptions{Recursive: true, Entry: true})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	// A second watch of the same directory shares its inotify watch; closing it leaves the first's.
	w2, err := OpenWatch(self(), dir, WatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w2.Close()
	os.Mkdir(filepath.Join(dir, "sub"), 0o755)
	wrote := false
	got := collect(t, w, func(evs []WatchEvent) bool {
		// Once the watch has seen the new directory (and so watches it), a file in it.
		if !wrote && has(evs, "create", "sub") {
			wrote = true
			os.WriteFile(filepath.Join(dir, "sub", "f"), []byte("x"), 0o644)
		}
		return has(evs, "write", "sub/f")
	})
	if !has(got, "create", "sub") || !has(got, "create", "sub/f") || !has(got, "write", "sub/f") {
		t.Fatalf("events: %+v", got)
	}
	for _, e := range got {
		if e.Name == "sub/f" && (e.Entry == nil || e.Entry.Type != "file" || e.Entry.Path != filepath.Join(dir, "sub/f")) {
			t.Errorf("entry of %s: %+v", e.Name, e.Entry)
		}
	}
}

func TestWatchBounds(t *testing.T) {
	dir := t.TempDir()
	for i := range 5 {
		os.Mkdir(filepath.Join(dir, "d"+strconv.Itoa(i)), 0o755)
	}
	if _, err := OpenWatch(self(), dir, WatchOptions{Recursive: true, MaxDirs: 3}); err == nil || !strings.Contains(err.Error(), "more than 3 directories") {
		t.Errorf("a tree over the bound: %v", err)
	}
	var we *WatchError
	if _, err := OpenWatch(self(), filepath.Join(dir, "missing"), WatchOptions{}); !errors.As(err, &we) || !we.Missing {
		t.Errorf("a missing directory: %v", err)
	}
	f := filepath.Join(dir, "file")
	os.WriteFile(f, nil, 0o644)
	if _, err := OpenWatch(self(), f, WatchOptions{}); !errors.As(err, &we) || !we.NotDir {
		t.Errorf("a file: %v", err)
	}
	// A watch whose events are not read falls behind and ends, rather than queue without bound.
	w, err := OpenWatch(self(), dir, WatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for i := range watchBacklog + 100 {
		os.WriteFile(filepath.Join(dir, "f"+strconv.Itoa(i)), nil, 0o644)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		select {
		case err := <-w.failed:
			if !errors.Is(err, ErrWatchBehind) {
				t.Errorf("fell behind: %v, want ErrWatchBehind", err)
			}
			return
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("a watch not read did not fall behind")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
