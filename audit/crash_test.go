package audit

import (
	"bufio"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// crashWriter is the environment variable that makes the test binary a writer for TestCrash: it
// appends to the log of the store it names until it is killed.
const crashWriter = "AUDIT_CRASH_WRITER"

func TestMain(m *testing.M) {
	if root := os.Getenv(crashWriter); root != "" {
		writeUntilKilled(root)
		return
	}
	os.Exit(m.Run())
}

// writeUntilKilled appends from 4 goroutines, a third durably (Append) and the rest noted (Note, as
// a launch's and a command's entries are, synced by the flusher as the supervisor's are), and reports
// each entry once its call returned: "D DETAIL SEQ" for an Append, "N DETAIL" for a Note.
func writeUntilKilled(root string) {
	l := Open(root)
	l.FlushWithin(FlushDelay) // as the supervisor's
	var out sync.Mutex
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				detail := fmt.Sprintf("%d-%d-%d", os.Getpid(), g, i)
				e := Entry{User: "alice", Event: "bench.exec", Detail: detail}
				var line string
				if i%3 == 0 {
					w, err := l.Append(e)
					if err != nil {
						fmt.Fprintln(os.Stderr, err)
						os.Exit(1)
					}
					line = fmt.Sprintf("D %s %d\n", detail, w.Seq)
				} else {
					if err := l.Note(e); err != nil {
						fmt.Fprintln(os.Stderr, err)
						os.Exit(1)
					}
					line = "N " + detail + "\n"
				}
				out.Lock()
				os.Stdout.WriteString(line) // one write: a pipe's writes this small are whole
				out.Unlock()
			}
		}()
	}
	wg.Wait()
}

// TestCrash: processes appending at once through the package, durably and noted, killed (SIGKILL)
// at random points, round after round on the same log: after each crash the log verifies (a line a
// kill cut short is the only problem allowed: kept as evidence, reported, ended by the next append),
// every entry whose call returned is there, noted ones too (a process's crash loses nothing it
// wrote), and the head names at least every entry an Append returned (never one the log lacks:
// Verify finds a head ahead of the log). The next round's appends chain on from what is left.
func TestCrash(t *testing.T) {
	const rounds = 16
	root := t.TempDir()
	l := Open(root)
	acked := map[string]bool{}
	var maxDurable int64
	for round := range rounds {
		var wg sync.WaitGroup
		var mu sync.Mutex
		var cmds []*exec.Cmd
		// Both writers are killed at once, at a random point of the load (after that many reports):
		// what one leaves is not repaired by the other's appends before the check.
		killAt, n := 1+rand.IntN(400), 0
		var kill sync.Once
		var outs []io.Reader
		for range 2 {
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), crashWriter+"="+root)
			cmd.Stderr = os.Stderr
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			cmds, outs = append(cmds, cmd), append(outs, stdout)
		}
		for i, cmd := range cmds {
			stdout := outs[i]
			wg.Add(1)
			go func() {
				defer wg.Done()
				sc := bufio.NewScanner(stdout)
				for sc.Scan() {
					f := strings.Fields(sc.Text())
					mu.Lock()
					acked[f[1]] = true
					if f[0] == "D" {
						seq, _ := strconv.ParseInt(f[2], 10, 64)
						maxDurable = max(maxDurable, seq)
					}
					n++
					now := n == killAt
					mu.Unlock()
					if now {
						kill.Do(func() {
							for _, c := range cmds {
								c.Process.Signal(syscall.SIGKILL)
							}
						})
					}
				}
				cmd.Wait()
				if st, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || st.Signal() != syscall.SIGKILL {
					t.Errorf("round %d: the writer ended without being killed: %v", round, cmd.ProcessState)
				}
			}()
		}
		wg.Wait()
		// Before any recovery: an Append killed between its write and its head leaves a durable
		// entry after the head (a lag), never a head ahead of the log nor a broken chain.
		checkAfterCrash(t, l, round, acked, maxDurable, true)
		// Recovery is the next append: it syncs what the crashed writers wrote and moves the head
		// to the end.
		w, err := l.Append(Entry{Event: "bench.rm", Detail: fmt.Sprintf("recovery %d", round)})
		if err != nil {
			t.Fatal(err)
		}
		acked[w.Detail], maxDurable = true, w.Seq
		checkAfterCrash(t, l, round, acked, maxDurable, false)
		if h, err := l.readHead(); err != nil || h.seq != w.Seq {
			t.Errorf("round %d: head %+v %v after the recovery's append, want %d", round, h, err, w.Seq)
		}
	}
	t.Logf("%d entries acknowledged over %d rounds of 2 writers killed", len(acked), rounds)
}

func checkAfterCrash(t *testing.T, l *Log, round int, acked map[string]bool, maxDurable int64, lagOK bool) {
	t.Helper()
	n, problems, err := l.Verify()
	if err != nil {
		t.Fatalf("round %d: verify: %v", round, err)
	}
	for _, p := range problems {
		// A kill during a write can cut its line short: that line, and only such, is reported.
		if strings.Contains(p.What, "a write was cut short") || strings.HasPrefix(p.What, "not an entry") {
			continue
		}
		if lagOK && strings.HasPrefix(p.What, "the head lags") {
			continue
		}
		t.Errorf("round %d (recovered %v): line %d: %s", round, !lagOK, p.Line, p.What)
	}
	es, err := l.Entries(Filter{})
	if err != nil || len(es) != n {
		t.Fatalf("round %d: %d entries, %v; verify counted %d", round, len(es), err, n)
	}
	have := map[string]bool{}
	for _, e := range es {
		have[e.Detail] = true
	}
	lost := 0
	for d := range acked {
		if !have[d] {
			lost++
		}
	}
	if lost > 0 {
		t.Errorf("round %d: %d of %d entries whose call returned are not in the log", round, lost, len(acked))
	}
	if h, err := l.readHead(); err != nil || h.seq < maxDurable {
		t.Errorf("round %d: head %+v %v: behind an entry an Append returned (%d)", round, h, err, maxDurable)
	}
}
