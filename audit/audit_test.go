package audit

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
)

func fill(t *testing.T, n int) *Log {
	t.Helper()
	l := Open(t.TempDir())
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := l.Append(Entry{User: "alice", Role: "user", Event: "bench.run", Bench: fmt.Sprintf("b%d", i%3)}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	return l
}

// TestChain: concurrent appends make one chain that verifies; filters select.
func TestChain(t *testing.T) {
	l := fill(t, 20)
	n, problems, err := l.Verify()
	if err != nil || n != 20 || len(problems) != 0 {
		t.Fatalf("verify: %d entries, %v, %v", n, problems, err)
	}
	if es, _ := l.Entries(Filter{Bench: "b1"}); len(es) != 7 {
		t.Errorf("entries of b1: %d, want 7", len(es))
	}
	if es, _ := l.Entries(Filter{User: "bob"}); len(es) != 0 {
		t.Errorf("entries of bob: %d", len(es))
	}
}

// TestTamper: a changed, removed or reordered entry, or a cut tail, is found.
func TestTamper(t *testing.T) {
	for _, c := range []struct {
		name string
		edit func([]string) []string
		want string
	}{
		{"changed", func(ls []string) []string {
			ls[3] = strings.Replace(ls[3], `"user":"alice"`, `"user":"mallory"`, 1)
			return ls
		}, "was changed"},
		{"removed", func(ls []string) []string { return append(ls[:4], ls[5:]...) }, "removed or moved"},
		{"reordered", func(ls []string) []string { ls[2], ls[6] = ls[6], ls[2]; return ls }, "removed or moved"},
		{"cut", func(ls []string) []string { return ls[:len(ls)-2] }, "cut from the end"},
		{"rehashed", func(ls []string) []string {
			// Changed with its own hash recomputed: the next entry's prev gives it away.
			var e Entry
			json.Unmarshal([]byte(ls[3]), &e)
			e.User = "mallory"
			e.Hash = hashOf(e)
			b, _ := json.Marshal(e)
			ls[3] = string(b)
			return ls
		}, "its prev is not the hash of the entry before it"},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := fill(t, 10)
			b, _ := os.ReadFile(l.file())
			lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
			os.WriteFile(l.file(), []byte(strings.Join(c.edit(lines), "\n")+"\n"), 0o600)
			_, problems, err := l.Verify()
			if err != nil || !strings.Contains(fmt.Sprint(problems), c.want) {
				t.Errorf("verify: %v %v, want a problem saying %q", problems, err, c.want)
			}
		})
	}
}

// TestNote: entries noted without an fsync chain on like the others; the head lags behind them until
// the next Append, and the log verifies throughout.
func TestNote(t *testing.T) {
	l := fill(t, 3)
	for range 4 {
		if err := l.Note(Entry{Event: "net.allowed", Bench: "b", Dest: "deb.debian.org:80"}); err != nil {
			t.Fatal(err)
		}
	}
	if n, problems, err := l.Verify(); err != nil || n != 7 || len(problems) != 0 {
		t.Errorf("after notes: %d %v %v", n, problems, err)
	}
	if seq, _, _ := l.last(); seq != 3 {
		t.Errorf("the head is at %d after notes, want 3", seq)
	}
	if err := l.Append(Entry{Event: "bench.rm", Bench: "b"}); err != nil {
		t.Fatal(err)
	}
	if seq, _, _ := l.last(); seq != 8 {
		t.Errorf("the head is at %d after an append, want 8", seq)
	}
	if n, problems, err := l.Verify(); err != nil || n != 8 || len(problems) != 0 {
		t.Errorf("after the append: %d %v %v", n, problems, err)
	}
}
