package audit

import (
	"sync"
	"testing"
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
