package app_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"toolshed.dev/shed/app"
	"toolshed.dev/shed/bench"
)

// BenchmarkBranching: the branching operations of a created Bench whose upper holds 1 GiB, each as a
// whole operation through Service.Do (what a caller waits for), beside the baseline the issue names:
// a copy of that upper (cp -a, no reflink, on the store's filesystem), measured in the same run.
// fork10 is 10 children made and running; the metric x-copy is how many times faster than the copy.
// depth-N launches a Bench from a snapshot of a Bench of a snapshot ... N deep, and stats a missing
// file in it with cold caches: lowers never stack, so neither grows with N.
func BenchmarkBranching(b *testing.B) {
	s := benchServiceSized(b, 4<<30) // the 1 GiB upper, its copies-on-write, 50 snapshots
	who := &app.Call{Caller: &app.Caller{User: "root", Role: app.Operator, Dir: "/"}}
	do := func(op string, req any) any {
		b.Helper()
		res, err := s.Do(context.Background(), who, op, req)
		if err != nil {
			b.Fatalf("%s: %v", op, err)
		}
		return res
	}
	sh := func(bench, script string) string {
		b.Helper()
		res := do("bench.exec", &app.BenchExecRequest{Bench: bench, Shell: script, Capture: true}).(*app.ExecResult)
		if res.Exit != 0 {
			b.Fatalf("%s: exit %d %s", script, res.Exit, res.Stderr)
		}
		return res.Stdout
	}
	created := do("bench.create", &app.BenchCreateRequest{Workshop: "bb", Name: "big", LifetimeS: 3600}).(*app.BenchCreateResult)
	sh("big", "dd if=/dev/zero of=/root/big bs=1M count=1024 2>/dev/null && sync")
	upperDir := filepath.Join(s.Root, "uppers", "benches", created.ID)

	// The baseline: the same upper copied, as a copy-based fork would, onto the store's filesystem.
	copyDir := filepath.Join(s.Root, "copy-baseline")
	start := time.Now()
	if out, err := exec.Command("cp", "-a", "--reflink=never", upperDir, copyDir).CombinedOutput(); err != nil {
		b.Fatalf("cp: %v %s", err, out)
	}
	unix.Sync()
	copyTime := time.Since(start)
	os.RemoveAll(copyDir)
	b.Logf("baseline: cp -a of the 1 GiB upper (and sync): %v", copyTime)

	report := func(b *testing.B, name string) {
		per := b.Elapsed() / time.Duration(b.N)
		b.ReportMetric(float64(per.Microseconds())/1000, "ms/"+name)
		b.ReportMetric(float64(copyTime)/float64(per), "x-copy")
	}
	b.Run("pause", func(b *testing.B) {
		for b.Loop() {
			do("bench.pause", &app.BenchPauseRequest{Bench: "big"})
			b.StopTimer()
			do("bench.resume", &app.BenchResumeRequest{Bench: "big", LifetimeS: 3600})
			b.StartTimer()
		}
		report(b, "pause")
	})
	b.Run("resume", func(b *testing.B) {
		for b.Loop() {
			b.StopTimer()
			do("bench.pause", &app.BenchPauseRequest{Bench: "big"})
			b.StartTimer()
			do("bench.resume", &app.BenchResumeRequest{Bench: "big", LifetimeS: 3600})
		}
		report(b, "resume")
	})
	b.Run("snapshot", func(b *testing.B) {
		for b.Loop() {
			snap := do("snapshot.create", &app.SnapshotCreateRequest{Bench: "big"}).(*app.SnapshotInfo)
			b.StopTimer()
			do("snapshot.rm", &app.SnapshotRemoveRequest{Snapshot: snap.ID})
			b.StartTimer()
		}
		report(b, "snapshot")
	})
	b.Run("fork10", func(b *testing.B) {
		for b.Loop() {
			res := do("bench.fork", &app.BenchForkRequest{Bench: "big", Count: 10}).(*app.BenchForkResult)
			b.StopTimer()
			var names []string
			for _, c := range res.Children {
				if c.Error != "" {
					b.Fatalf("a child: %s", c.Error)
				}
				names = append(names, c.Bench)
			}
			do("bench.rm", &app.BenchRemoveRequest{Benches: names})
			b.StartTimer()
		}
		report(b, "fork10")
	})
	// 100 children at once (E2B's most), each one running: none may fail.
	b.Run("fork100", func(b *testing.B) {
		for b.Loop() {
			res := do("bench.fork", &app.BenchForkRequest{Bench: "big", Count: 100}).(*app.BenchForkResult)
			b.StopTimer()
			var names []string
			for i, c := range res.Children {
				if c.Error != "" {
					b.Fatalf("child %d of 100: %s", i, c.Error)
				}
				names = append(names, c.Bench)
			}
			do("bench.rm", &app.BenchRemoveRequest{Benches: names})
			b.StartTimer()
		}
		report(b, "fork100")
	})
	// A snapshot of a Bench whose upper holds a million files (make bench-scale): the flush of what it
	// wrote is done while it runs; it is frozen only for the snapshot itself.
	b.Run("snapshot-1M-files", func(b *testing.B) {
		if os.Getenv("SHED_BENCH_SCALE") == "" {
			b.Skip("make bench-scale runs it (SHED_BENCH_SCALE=1): a million files take minutes to make")
		}
		many := do("bench.create", &app.BenchCreateRequest{Workshop: "bb", LifetimeS: 3600}).(*app.BenchCreateResult).Bench
		sh(many, "mkdir /root/m && cd /root/m && seq 1 1000000 | xargs touch && ls | wc -l")
		for b.Loop() {
			snap := do("snapshot.create", &app.SnapshotCreateRequest{Bench: many}).(*app.SnapshotInfo)
			b.StopTimer()
			do("snapshot.rm", &app.SnapshotRemoveRequest{Snapshot: snap.ID})
			sh(many, "touch /root/m/1") // a write since, as a working Bench has
			b.StartTimer()
		}
		report(b, "snapshot-1M")
	})
	b.Run("reset", func(b *testing.B) {
		small := do("bench.create", &app.BenchCreateRequest{Workshop: "bb", LifetimeS: 3600}).(*app.BenchCreateResult).Bench
		for b.Loop() {
			b.StopTimer()
			sh(small, "echo x > /root/debris")
			b.StartTimer()
			do("bench.reset", &app.BenchResetRequest{Bench: small})
		}
		report(b, "reset")
	})
	// Depth: a chain of snapshots of Benches of snapshots; each level's launch and a cold miss.
	chain := []string{"big"}
	for depth := 1; depth <= 50; depth++ {
		snap := do("snapshot.create", &app.SnapshotCreateRequest{Bench: chain[len(chain)-1]}).(*app.SnapshotInfo)
		if depth == 1 || depth == 10 || depth == 50 {
			b.Run("depth-"+strconv.Itoa(depth), func(b *testing.B) {
				var miss time.Duration
				for b.Loop() {
					res := do("bench.create", &app.BenchCreateRequest{Snapshot: snap.ID, LifetimeS: 3600}).(*app.BenchCreateResult)
					b.StopTimer()
					// A cold miss: the kernel's caches dropped, then one stat of a name no layer has.
					if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0); err != nil {
						b.Fatal(err)
					}
					rec, err := bench.FindIn(filepath.Join(s.Root, "benches"), res.Bench)
					if err != nil {
						b.Fatal(err)
					}
					// Through the Bench's own root: its init's, the overlay.
					t0 := time.Now()
					if _, err := os.Stat(fmt.Sprintf("/proc/%d/root/usr/no-such-file", rec.Pid)); !os.IsNotExist(err) {
						b.Fatalf("stat of a missing file: %v", err)
					}
					miss += time.Since(t0)
					do("bench.rm", &app.BenchRemoveRequest{Benches: []string{res.Bench}})
					b.StartTimer()
				}
				b.ReportMetric(float64((b.Elapsed()/time.Duration(b.N)).Microseconds())/1000, "ms/launch")
				b.ReportMetric(float64((miss/time.Duration(b.N)).Microseconds())/1000, "ms/cold-miss")
			})
		}
		next := do("bench.create", &app.BenchCreateRequest{Snapshot: snap.ID, Name: fmt.Sprintf("level-%d", depth), LifetimeS: 3600}).(*app.BenchCreateResult)
		if depth > 1 {
			do("bench.rm", &app.BenchRemoveRequest{Benches: []string{chain[len(chain)-1]}})
		}
		chain = append(chain, next.Bench)
	}
}
