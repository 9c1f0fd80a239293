package audit

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestGroupCommit: appends waiting at once share their fsyncs (each supervisor request wrote its
// entry with an fsync of its own, one after another: a global queue for every command of every
// sandbox), and the log stays one clean chain whose head names its last entry, with a second
// writer (another process's Log) appending and noting at the same time.
func TestGroupCommit(t *testing.T) {
	root := t.TempDir()
	l, other := Open(root), Open(root)
	const n = 64
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := l
			if i%8 == 0 {
				w = other
			}
			if _, err := w.Append(Entry{User: "alice", Event: "bench.exec"}); err != nil {
				t.Error(err)
			}
			if i%4 == 0 {
				if err := w.Note(Entry{Event: "net.allowed"}); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	// A last append, alone, after the noted entries: the head names it.
	last, err := l.Append(Entry{Event: "bench.rm"})
	if err != nil {
		t.Fatal(err)
	}
	verifyClean(t, l, n+n/4+1)
	if h, err := l.readHead(); err != nil || h.seq != last.Seq || h.hash != last.Hash {
		t.Errorf("head %+v %v, want the last entry %d", h, err, last.Seq)
	}
	if got := l.commits + other.commits; got >= n {
		t.Errorf("%d appends at once made %d fsyncs: none was shared", n+1, got)
	}
	t.Logf("%d appends, %d fsyncs", n+1, l.commits+other.commits)
}

// TestFlush: noted entries (a launch's, a command's) cost no fsync when written; Flush (a stopping
// supervisor) makes them all durable with one, and moves the head to the last; a second Flush has
// nothing to do. Without Flush, the flusher does it while the process runs.
func TestFlush(t *testing.T) {
	l := Open(t.TempDir()) // no flusher: Flush alone
	var last Entry
	for i := range 10 {
		w, err := l.append(Entry{Event: "bench.exec", Detail: fmt.Sprint(i)}, false)
		if err != nil {
			t.Fatal(err)
		}
		last = w
	}
	if l.commits != 0 {
		t.Fatalf("%d fsyncs for noted entries", l.commits)
	}
	for range 2 {
		if err := l.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	if l.commits != 1 {
		t.Errorf("two flushes of 10 noted entries made %d fsyncs, want 1", l.commits)
	}
	if h, err := l.readHead(); err != nil || h.seq != last.Seq || h.hash != last.Hash {
		t.Errorf("head %+v %v after Flush, want the last noted entry %d", h, err, last.Seq)
	}
	verifyClean(t, l, 10)

	// The flusher: a Note is followed by a commit that names it, with no Append or Flush.
	f := Open(t.TempDir())
	f.FlushWithin(FlushDelay)
	defer f.Close() // before the directory goes
	for i := range 10 {
		if err := f.Note(Entry{Event: "bench.exec", Detail: fmt.Sprint(i)}); err != nil {
			t.Fatal(err)
		}
	}
	for {
		if h, err := f.readHead(); err == nil && h.seq == 10 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	f.syncMu.Lock()
	commits := f.commits
	f.syncMu.Unlock()
	if commits >= 10 {
		t.Errorf("10 notes at once made %d fsyncs: the flusher shared none", commits)
	}
	verifyClean(t, f, 10)
}

// BenchmarkLaunchEntries: a launch's entries (the Bench's start and end, the launch's outcome), one
// launch after another, with the outcome appended durably (as before issue 27) and noted (as now:
// the flusher syncs within FlushDelay). Compare the two in one run: a ratio, not a figure.
func BenchmarkLaunchEntries(b *testing.B) {
	for _, durable := range []bool{true, false} {
		name := "noted"
		if durable {
			name = "durable"
		}
		b.Run(name, func(b *testing.B) {
			l := Open(b.TempDir())
			l.FlushWithin(FlushDelay) // as the supervisor's
			for b.Loop() {
				l.Note(Entry{Event: "bench.start", Bench: "b"})
				l.Note(Entry{Event: "bench.end", Bench: "b", Detail: "exit 0"})
				if durable {
					l.Append(Entry{Event: "bench.run", Workshop: "w"})
				} else {
					l.Note(Entry{Event: "bench.run", Workshop: "w"})
				}
			}
			b.StopTimer()
			if err := l.Close(); err != nil {
				b.Fatal(err)
			}
		})
	}
}

// BenchmarkNoteWhileCommitting: a note (a launch's, a command's) while another goroutine's durable
// appends commit one after another, as the flusher and other operations do: what a commit's fsyncs
// cost the writers that do not wait for them.
func BenchmarkNoteWhileCommitting(b *testing.B) {
	l := Open(b.TempDir())
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := l.Append(Entry{Event: "bench.create"}); err != nil {
				b.Error(err)
				return
			}
		}
	}()
	for b.Loop() {
		if err := l.Note(Entry{Event: "bench.exec", Bench: "b"}); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	close(stop)
	<-done
}

// TestFsyncFailureSticks: once an fsync of the log failed, no later commit says an entry is durable,
// even when fsyncs succeed again (the kernel may have dropped what the failed one held), and the head
// stays where the last good fsync left it.
func TestFsyncFailureSticks(t *testing.T) {
	l := Open(t.TempDir())
	good, err := l.Append(Entry{Event: "workshop.add"})
	if err != nil {
		t.Fatal(err)
	}
	syncFile = func(*os.File) error { return syscall.EIO }
	_, err = l.Append(Entry{Event: "workshop.add"})
	syncFile = (*os.File).Sync
	if err == nil {
		t.Fatal("an append whose fsync failed: no error")
	}
	for _, op := range []func() error{
		func() error { _, err := l.Append(Entry{Event: "promote"}); return err },
		func() error {
			if err := l.Note(Entry{Event: "bench.exec"}); err != nil {
				return err
			}
			return l.Flush()
		},
	} {
		if err := op(); err == nil || !strings.Contains(err.Error(), "earlier fsync") {
			t.Fatalf("after a failed fsync, with fsyncs working again: %v, want the earlier failure", err)
		}
	}
	if h, err := l.readHead(); err != nil || h.seq != good.Seq {
		t.Errorf("head %+v %v, want it at the last entry synced, %d", h, err, good.Seq)
	}
}

// BenchmarkFirstNote: a process's first entry (a CLI launch's) over a log whose head is 10,000 noted
// entries behind its end (a supervisor's Benches note theirs without moving it): the tail read from
// the end, against the forward read from the head that it replaced, in one run.
func BenchmarkFirstNote(b *testing.B) {
	l := Open(b.TempDir())
	if _, err := l.Append(Entry{Event: "gc"}); err != nil {
		b.Fatal(err)
	}
	for range 10_000 {
		l.Note(Entry{Event: "bench.exec", Bench: "b", User: "alice"})
	}
	f, err := os.Open(l.file())
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	b.Run("from-the-end", func(b *testing.B) {
		for b.Loop() {
			if _, err := Open(filepath.Dir(l.dir)).tail(f); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("forward", func(b *testing.B) {
		fresh := Open(filepath.Dir(l.dir))
		h, _ := fresh.readHead()
		st, _ := f.Stat()
		for b.Loop() {
			if _, err := scanTail(f, h.end, tail{size: st.Size(), seq: h.seq, hash: h.hash}); err != nil {
				b.Fatal(err)
			}
		}
	})
}
