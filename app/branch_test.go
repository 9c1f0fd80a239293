package app_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"toolshed.dev/shed/app"
	"toolshed.dev/shed/bench"
	"toolshed.dev/shed/upper"
)

// branching drives one user's Benches through the typed operations.
type branching struct {
	t   *testing.T
	s   *app.Service
	who *app.Call
}

func (b *branching) do(op string, req any) any {
	b.t.Helper()
	res, err := b.s.Do(context.Background(), b.who, op, req)
	if err != nil {
		b.t.Fatalf("%s: %v", op, err)
	}
	return res
}

func (b *branching) sh(bench, script string) string {
	b.t.Helper()
	res := b.do("bench.exec", &app.BenchExecRequest{Bench: bench, Shell: script, Capture: true}).(*app.ExecResult)
	if res.Exit != 0 {
		b.t.Fatalf("%s in %s: exit %d: %s", script, bench, res.Exit, res.Stderr)
	}
	return res.Stdout
}

func (b *branching) create(req *app.BenchCreateRequest) string {
	b.t.Helper()
	return b.do("bench.create", req).(*app.BenchCreateResult).Bench
}

// TestPauseResumeKeepsEveryChange: five pause/resume cycles, each after a write (E2B#884 as a test),
// with a process that counts across them: while paused it counts nothing and commands are refused;
// after each resume it goes on from where it was, and every file written is there.
func TestPauseResumeKeepsEveryChange(t *testing.T) {
	b := &branching{t: t, s: benchService(t), who: &app.Call{Caller: &app.Caller{UID: 1001, User: "nobody", Role: app.User, Dir: "/"}}}
	created := b.do("bench.create", &app.BenchCreateRequest{Workshop: "bb", Name: "pausing"}).(*app.BenchCreateResult)
	name := created.Bench
	// The counter's file as the host sees it, in the Bench's upper: read while it is paused.
	counted := func() string {
		out, err := os.ReadFile(filepath.Join(b.s.Root, "uppers", "benches", created.ID, "upper", "root", "count"))
		if err != nil {
			t.Fatal(err)
		}
		return string(out)
	}
	// The counter appends a number every 20 ms; its last line is its count.
	b.sh(name, "(i=0; while :; do i=$((i+1)); echo $i >> /root/count; usleep 20000; done) >/dev/null 2>&1 &")
	last := func() int {
		out := b.sh(name, "tail -n1 /root/count")
		n, err := strconv.Atoi(strings.TrimSpace(out))
		if err != nil {
			t.Fatalf("count %q: %v", out, err)
		}
		return n
	}
	time.Sleep(200 * time.Millisecond)
	for i := 1; i <= 5; i++ {
		b.sh(name, "echo cycle-"+strconv.Itoa(i)+" > /root/cycle-"+strconv.Itoa(i))
		before := last()
		res := b.do("bench.pause", &app.BenchPauseRequest{Bench: name}).(*app.BenchStateResult)
		if res.State != "paused" || !res.Changed {
			t.Fatalf("pause %d: %+v", i, res)
		}
		// Paused: commands are refused, saying so; the lifetime stopped.
		_, err := b.s.Do(context.Background(), b.who, "bench.exec", &app.BenchExecRequest{Bench: name, Shell: "true", Capture: true})
		if !errors.Is(err, bench.ErrPaused) {
			t.Fatalf("exec in a paused Bench: %v, want ErrPaused", err)
		}
		frozen := counted()
		time.Sleep(150 * time.Millisecond)
		if now := counted(); now != frozen {
			t.Fatalf("pause %d: the counter went on while paused (%d bytes, then %d)", i, len(frozen), len(now))
		}
		res = b.do("bench.resume", &app.BenchResumeRequest{Bench: name}).(*app.BenchStateResult)
		if res.State != "running" || !res.Changed || res.Relaunched {
			t.Fatalf("resume %d: %+v", i, res)
		}
		after := last()
		// The counter went on from where it stopped (the count the host read while it was frozen),
		// never back to 1: its process kept its memory.
		lines := strings.Fields(frozen)
		at, _ := strconv.Atoi(lines[len(lines)-1])
		if at < before || after < at {
			t.Errorf("cycle %d: count %d before the pause, %d while paused, %d after the resume", i, before, at, after)
		}
	}
	out := b.sh(name, "cat /root/cycle-*")
	if out != "cycle-1\ncycle-2\ncycle-3\ncycle-4\ncycle-5\n" {
		t.Errorf("after five pauses the files are %q", out)
	}
}

// TestSnapshotForkReset: a snapshot sees the files as they were; Benches of it start with them and
// diverge; a fork's children see a file written just before the call (vercel/sandbox#340); a reset
// gives back a fresh Bench's tree, or the snapshot's; removing a snapshot keeps its Benches' files.
func TestSnapshotForkReset(t *testing.T) {
	b := &branching{t: t, s: benchService(t), who: &app.Call{Caller: &app.Caller{UID: 1001, User: "nobody", Role: app.User, Dir: "/"}}}
	parent := b.create(&app.BenchCreateRequest{Workshop: "bb", Name: "parent"})
	// A tree's every name, type, mode, owner and size, and every file's bytes (the root's own mount:
	// /proc, /dev, /tmp and /run are mounts of their own).
	const tree = "find / -xdev | sort | xargs stat -c '%n %F %a %u %g %s' | md5sum; find / -xdev -type f | sort | xargs md5sum | md5sum"
	fresh := b.sh(parent, tree)
	b.sh(parent, "echo sealed > /root/state")
	snap := b.do("snapshot.create", &app.SnapshotCreateRequest{Bench: parent, Name: "first"}).(*app.SnapshotInfo)
	b.sh(parent, "echo later > /root/state")

	child := b.create(&app.BenchCreateRequest{Snapshot: "first"})
	if out := b.sh(child, "cat /root/state"); out != "sealed\n" {
		t.Errorf("a Bench of the snapshot reads %q, want the sealed state", out)
	}
	b.sh(child, "echo child > /root/state")
	if out := b.sh(parent, "cat /root/state"); out != "later\n" {
		t.Errorf("the parent reads %q after its snapshot's Bench wrote", out)
	}

	// The fork instant: a file written by a running process just before the call.
	b.sh(parent, "(echo just-before > /root/fork-mark) &")
	time.Sleep(50 * time.Millisecond)
	fork := b.do("bench.fork", &app.BenchForkRequest{Bench: parent, Count: 3}).(*app.BenchForkResult)
	if len(fork.Children) != 3 {
		t.Fatalf("fork of 3: %+v", fork)
	}
	for i, c := range fork.Children {
		if c.Error != "" || c.Bench == "" {
			t.Fatalf("child %d: %+v", i, c)
		}
		if out := b.sh(c.Bench, "cat /root/fork-mark /root/state"); out != "just-before\nlater\n" {
			t.Errorf("child %d reads %q", i, out)
		}
		b.sh(c.Bench, "echo "+strconv.Itoa(i)+" > /root/state")
	}
	// Children and a snapshot's Bench name their parent's Workshop, not the recipe copy they run from.
	for _, r := range b.do("bench.ls", &app.BenchListRequest{}).(*app.BenchListResult).Benches {
		if strings.HasPrefix(r.Workshop, filepath.Join(b.s.Root, "benches")) || strings.HasPrefix(r.Workshop, filepath.Join(b.s.Root, "snapshots")) {
			t.Errorf("bench %s names its Workshop %s, a copy in the store", r.Name, r.Workshop)
		}
	}
	for i, c := range fork.Children {
		if out := b.sh(c.Bench, "cat /root/state"); out != strconv.Itoa(i)+"\n" {
			t.Errorf("child %d diverged to %q", i, out)
		}
	}
	if out := b.sh(parent, "cat /root/state"); out != "later\n" {
		t.Errorf("the parent after its children wrote: %q", out)
	}

	// Reset: a fresh Bench's tree, byte for byte; then the snapshot's. Its network rules stay.
	b.do("bench.set_network", &app.SetNetworkRequest{Bench: parent, Deny: []string{"198.51.100.0/24"}})
	res := b.do("bench.reset", &app.BenchResetRequest{Bench: parent}).(*app.BenchStateResult)
	if res.State != "running" || res.Bench != parent {
		t.Fatalf("reset: %+v", res)
	}
	if n := b.do("bench.network", &app.BenchRequest{Bench: parent}).(*app.NetworkResult); len(n.Deny) != 1 || n.Deny[0] != "198.51.100.0/24" {
		t.Errorf("the network rules after a reset: %+v", n)
	}
	if got := b.sh(parent, tree); got != fresh {
		t.Errorf("after a reset the tree differs from a fresh Bench's")
	}
	b.do("bench.reset", &app.BenchResetRequest{Bench: parent, Snapshot: snap.ID})
	if out := b.sh(parent, "cat /root/state"); out != "sealed\n" {
		t.Errorf("after a reset to the snapshot: %q", out)
	}

	// Removing the snapshot: its Benches keep their files; a second removal is no error.
	if r := b.do("snapshot.rm", &app.SnapshotRemoveRequest{Snapshot: snap.ID}).(*app.SnapshotRemoveResult); !r.Removed {
		t.Errorf("snapshot.rm: %+v", r)
	}
	if r := b.do("snapshot.rm", &app.SnapshotRemoveRequest{Snapshot: snap.ID}).(*app.SnapshotRemoveResult); r.Removed {
		t.Errorf("snapshot.rm again: %+v", r)
	}
	if out := b.sh(child, "cat /root/state"); out != "child\n" {
		t.Errorf("the snapshot's Bench after its removal: %q", out)
	}
}

// TestPausedOutlivesItsSupervisor: the supervisor stops while a Bench is paused (its Detached ends),
// and the uppers' filesystem is unmounted as a reboot would: its processes go, none stays frozen,
// and its record and upper stay; a new supervisor lists it paused, and a resume mounts the uppers
// again and launches it over the same upper with every file (relaunched).
func TestPausedOutlivesItsSupervisor(t *testing.T) {
	first, stopFirst := benchServiceStop(t, 512<<20)
	who := &app.Call{Caller: &app.Caller{UID: 1001, User: "nobody", Role: app.User, Dir: "/"}}
	b := &branching{t: t, s: first, who: who}
	created := b.do("bench.create", &app.BenchCreateRequest{Workshop: "bb", Name: "sleeper"}).(*app.BenchCreateResult)
	b.sh("sleeper", "echo kept > /root/file; : > /root/ticks; (while :; do echo . >> /root/ticks; usleep 20000; done) >/dev/null 2>&1 &")
	rec, err := bench.FindIn(filepath.Join(first.Root, "benches"), "sleeper")
	if err != nil {
		t.Fatal(err)
	}
	b.do("bench.pause", &app.BenchPauseRequest{Bench: "sleeper"})

	// The supervisor stops: its Benches' context ends and it waits for them.
	stopFirst()
	// Its runner gone, its layers are a gc root of their own.
	if _, err := os.Stat(filepath.Join(first.Root, "roots", bench.RootName(created.ID))); err != nil {
		t.Errorf("the paused Bench's layers have no gc root after its runner ended: %v", err)
	}
	if err := upper.Unmount(first.Root); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", rec.Pid)); err == nil {
		// Its pid namespace ends in moments once thawed; a frozen one never would.
		deadline := time.Now().Add(5 * time.Second)
		for err == nil && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
			_, err = os.Stat(fmt.Sprintf("/proc/%d", rec.Pid))
		}
		if err == nil {
			t.Fatalf("the paused Bench's init %d outlived its supervisor (frozen for ever?)", rec.Pid)
		}
	}

	// A new supervisor of the same store.
	ctx, cancel := context.WithCancel(context.Background())
	d := &app.Detached{Ctx: ctx}
	second := &app.Service{Root: first.Root, Version: "test", Policy: first.Policy, Detached: d}
	t.Cleanup(func() { cancel(); d.Wait() })
	b.s = second
	ls := b.do("bench.ls", &app.BenchListRequest{}).(*app.BenchListResult)
	if len(ls.Benches) != 1 || ls.Benches[0].Paused == nil || ls.Benches[0].Running {
		t.Fatalf("after a restart, bench ls: %+v", ls.Benches)
	}
	res := b.do("bench.resume", &app.BenchResumeRequest{Bench: "sleeper"}).(*app.BenchStateResult)
	if !res.Relaunched || res.State != "running" || res.ID != created.ID {
		t.Fatalf("resume after a restart: %+v", res)
	}
	if out := b.sh("sleeper", "cat /root/file"); out != "kept\n" {
		t.Errorf("after the relaunch the file reads %q", out)
	}
	// Its processes did not come back: the ticks stopped at the pause.
	ticks := b.sh("sleeper", "wc -c < /root/ticks")
	time.Sleep(100 * time.Millisecond)
	if again := b.sh("sleeper", "wc -c < /root/ticks"); again != ticks {
		t.Errorf("a process of before the restart runs again (%s then %s bytes)", ticks, again)
	}
}

// TestBranchingUnderAttack: a fork storm past the user's --user-benches is refused whole (no child
// made, no slot held after); gc running during forks and snapshots collects nothing they use (the
// children run, the store verifies); a fork of a paused parent works (E2B answers 409) and leaves it
// paused.
func TestBranchingUnderAttack(t *testing.T) {
	s := benchService(t)
	s.UserBenches = 4
	b := &branching{t: t, s: s, who: &app.Call{Caller: &app.Caller{UID: 1001, User: "nobody", Role: app.User, Dir: "/"}}}
	parent := b.create(&app.BenchCreateRequest{Workshop: "bb", Name: "storm"})
	b.sh(parent, "echo x > /root/x")
	_, err := s.Do(context.Background(), b.who, "bench.fork", &app.BenchForkRequest{Bench: parent, Count: 4})
	if app.Classify(err).Code != app.CodeDenied {
		t.Fatalf("a fork of 4 with 1 of 4 Benches: %v, want denied", err)
	}
	ls := b.do("bench.ls", &app.BenchListRequest{}).(*app.BenchListResult)
	if len(ls.Benches) != 1 {
		t.Fatalf("after the refused fork: %d Benches", len(ls.Benches))
	}
	// Three fit; the slots of the refusal were not kept.
	operator := &app.Call{Caller: &app.Caller{User: "root", Role: app.Operator, Dir: "/"}}
	stop := make(chan struct{})
	gcDone := make(chan error, 1)
	go func() {
		for {
			select {
			case <-stop:
				gcDone <- nil
				return
			default:
			}
			if _, err := s.Do(context.Background(), operator, "gc", &app.GCRequest{}); err != nil {
				gcDone <- err
				return
			}
		}
	}()
	fork := b.do("bench.fork", &app.BenchForkRequest{Bench: parent, Count: 3}).(*app.BenchForkResult)
	snap := b.do("snapshot.create", &app.SnapshotCreateRequest{Bench: parent}).(*app.SnapshotInfo)
	close(stop)
	if err := <-gcDone; err != nil {
		t.Fatalf("gc during the fork: %v", err)
	}
	for _, c := range fork.Children {
		if c.Error != "" {
			t.Fatalf("a child: %s", c.Error)
		}
		if out := b.sh(c.Bench, "cat /root/x"); out != "x\n" {
			t.Errorf("child %s reads %q", c.Bench, out)
		}
	}
	if _, err := s.Do(context.Background(), operator, "store.verify", &app.VerifyRequest{}); err != nil {
		t.Errorf("store verify after gc during forks: %v", err)
	}
	// gc keeps what the snapshot needs, with no Bench of it running.
	for _, c := range fork.Children {
		b.do("bench.rm", &app.BenchRemoveRequest{Benches: []string{c.Bench}})
	}
	b.do("bench.rm", &app.BenchRemoveRequest{Benches: []string{parent}})
	if _, err := s.Do(context.Background(), operator, "gc", &app.GCRequest{}); err != nil {
		t.Fatal(err)
	}
	again := b.create(&app.BenchCreateRequest{Snapshot: snap.ID})
	if out := b.sh(again, "cat /root/x"); out != "x\n" {
		t.Errorf("a Bench of the snapshot after gc reads %q", out)
	}

	// A pause that keeps its processes keeps its boot id; a cold pause ends its processes and keeps
	// its files, and the resume launches it again: a new boot, with a new boot id.
	boot := b.sh(again, "cat /proc/sys/kernel/random/boot_id")
	b.do("bench.pause", &app.BenchPauseRequest{Bench: again})
	b.do("bench.resume", &app.BenchResumeRequest{Bench: again})
	if out := b.sh(again, "cat /proc/sys/kernel/random/boot_id"); out != boot {
		t.Errorf("boot id after a pause and a resume: %q, was %q", out, boot)
	}
	b.sh(again, "echo cold > /root/cold; (sleep 1000 >/dev/null 2>&1 &)")
	b.do("bench.pause", &app.BenchPauseRequest{Bench: again, Cold: true})
	if res := b.do("bench.resume", &app.BenchResumeRequest{Bench: again}).(*app.BenchStateResult); !res.Relaunched {
		t.Fatalf("resume after a cold pause: %+v", res)
	}
	if out := b.sh(again, "cat /root/cold; ps | grep -c '[s]leep 1000' || true"); out != "cold\n0\n" {
		t.Errorf("after a cold pause and a resume: %q, want the file and no process of before", out)
	}
	if out := b.sh(again, "cat /proc/sys/kernel/random/boot_id"); out == boot || len(out) != 37 {
		t.Errorf("boot id after a cold pause and a resume: %q, want a new one (was %q)", out, boot)
	}

	// A paused parent forks, and stays paused.
	b.do("bench.pause", &app.BenchPauseRequest{Bench: again})
	kid := b.do("bench.fork", &app.BenchForkRequest{Bench: again}).(*app.BenchForkResult)
	if len(kid.Children) != 1 || kid.Children[0].Error != "" {
		t.Fatalf("fork of a paused parent: %+v", kid)
	}
	if out := b.sh(kid.Children[0].Bench, "cat /root/x"); out != "x\n" {
		t.Errorf("the paused parent's child reads %q", out)
	}
	if _, err := s.Do(context.Background(), b.who, "bench.exec", &app.BenchExecRequest{Bench: again, Shell: "true", Capture: true}); !errors.Is(err, bench.ErrPaused) {
		t.Errorf("the parent after the fork: %v, want still paused", err)
	}
}

// TestUserDisk: a user's Bench writing past the supervisor's UserDisk gets "Disk quota exceeded"
// inside, the uppers hold no more than the bound, and a snapshot or fork is refused while the user
// is at it; removing the file lets them snapshot again. Another user's Bench writes on.
func TestUserDisk(t *testing.T) {
	s := benchService(t)
	const bound = 48 << 20
	s.UserDisk = bound
	b := &branching{t: t, s: s, who: &app.Call{Caller: &app.Caller{UID: 1001, User: "nobody", Role: app.User, Dir: "/"}}}
	parent := b.create(&app.BenchCreateRequest{Workshop: "bb", Name: "parent"})
	b.sh(parent, "dd if=/dev/urandom of=/root/some bs=1M count=16 2>/dev/null")
	// Its metrics are its own upper's, within its owner's bound, not the whole uppers filesystem's.
	if _, _, err := s.DiskUsage(1001, true); err != nil { // a commit: quota figures are as of the last one
		t.Fatal(err)
	}
	m := b.do("bench.metrics", &app.BenchMetricsRequest{Benches: []string{parent}, Latest: true}).(*app.BenchMetricsResult)
	if len(m.Benches) != 1 || len(m.Benches[0].Samples) != 1 {
		t.Fatalf("metrics: %+v", m)
	}
	if x := m.Benches[0].Samples[0]; x.DiskTotal != bound || x.DiskUsed < 16<<20 || x.DiskUsed > 20<<20 {
		t.Fatalf("metrics of a Bench that wrote 16 MiB, its owner bound to %d: disk used %d of %d", bound, x.DiskUsed, x.DiskTotal)
	}
	// A fork's child counts with its parent: the bound is the user's, not each upper's.
	fork := b.do("bench.fork", &app.BenchForkRequest{Bench: parent}).(*app.BenchForkResult)
	if len(fork.Children) != 1 || fork.Children[0].Error != "" {
		t.Fatalf("fork: %+v", fork)
	}
	name := fork.Children[0].Bench
	// The child's figure is what it wrote itself: nothing yet, the 16 MiB it shares are its parent's.
	if _, _, err := s.DiskUsage(1001, true); err != nil {
		t.Fatal(err)
	}
	m = b.do("bench.metrics", &app.BenchMetricsRequest{Benches: []string{name}, Latest: true}).(*app.BenchMetricsResult)
	if x := m.Benches[0].Samples; len(x) != 1 || x[0].DiskUsed > 4<<20 {
		t.Fatalf("metrics of a fork's child that wrote nothing, of a parent that wrote 16 MiB: %+v", x)
	}
	// Writes without end (dd until the disk refuses): random bytes, so nothing is a hole.
	res := b.do("bench.exec", &app.BenchExecRequest{Bench: name, Shell: "dd if=/dev/urandom of=/root/big bs=1M count=1024 conv=fsync", Capture: true}).(*app.ExecResult)
	if res.Exit == 0 || !strings.Contains(res.Stderr, "quota") {
		t.Fatalf("1 GiB written past a bound of 48 MiB: exit %d, %s", res.Exit, res.Stderr)
	}
	used, ok, err := s.DiskUsage(1001, true)
	if err != nil || !ok {
		t.Fatalf("DiskUsage: %v, %v", ok, err)
	}
	if used > bound+(4<<20) || used < bound/2 {
		t.Fatalf("the user's uppers hold %d bytes, bound %d", used, bound)
	}
	// The Bench still runs commands (what it has is kept); its parent cannot write either.
	if out := b.sh(name, "ls -s /root/big /root/some >/dev/null && echo ok"); out != "ok\n" {
		t.Fatalf("after the quota: %q", out)
	}
	res = b.do("bench.exec", &app.BenchExecRequest{Bench: parent, Shell: "dd if=/dev/urandom of=/root/more bs=1M count=8 conv=fsync", Capture: true}).(*app.ExecResult)
	if res.Exit == 0 || !strings.Contains(res.Stderr, "quota") {
		t.Fatalf("the parent writing once the user is at the bound: exit %d, %s", res.Exit, res.Stderr)
	}
	for op, req := range map[string]any{
		"snapshot.create": &app.SnapshotCreateRequest{Bench: parent},
		"bench.fork":      &app.BenchForkRequest{Bench: name, Count: 2},
	} {
		_, err := s.Do(context.Background(), b.who, op, req)
		if err == nil {
			t.Fatalf("%s at the bound (%d of %d bytes used): done, want a refusal", op, used, bound)
		}
		if app.Classify(err).Code != app.CodeDenied || !strings.Contains(err.Error(), "disk") || !strings.Contains(app.Classify(err).Hint, "--user-disk") {
			t.Fatalf("%s at the bound (%d of %d bytes used): %v (%+v), want a refusal naming the disk bound", op, used, bound, err, app.Classify(err))
		}
		t.Logf("%s: %v (%s)", op, err, app.Classify(err).Hint)
	}
	// Another user (an operator: no bound) writes past it.
	op := &branching{t: t, s: s, who: &app.Call{Caller: &app.Caller{User: "root", Role: app.Operator, Dir: "/"}}}
	other := op.create(&app.BenchCreateRequest{Workshop: "bb", Name: "other"})
	op.sh(other, "dd if=/dev/urandom of=/root/big bs=1M count=64 conv=fsync 2>/dev/null")
	// Freed space is the user's again.
	b.sh(name, "rm /root/big")
	b.do("snapshot.create", &app.SnapshotCreateRequest{Bench: name, Name: "after"})
}

// TestUserSnapshotsAtOnce asks for many snapshots at once with room for three: three are taken, the
// rest refused by the bound (counted and held at once, not counted and let go), and a removed one
// makes room again.
func TestUserSnapshotsAtOnce(t *testing.T) {
	s := benchService(t)
	s.UserSnapshots = 3
	b := &branching{t: t, s: s, who: &app.Call{Caller: &app.Caller{UID: 1001, User: "nobody", Role: app.User, Dir: "/"}}}
	name := b.create(&app.BenchCreateRequest{Workshop: "bb", Name: "snappy"})
	const asked = 12
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		taken   []string
		refused int
	)
	for range asked {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := s.Do(context.Background(), b.who, "snapshot.create", &app.SnapshotCreateRequest{Bench: name})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				taken = append(taken, res.(*app.SnapshotInfo).ID)
			case app.Classify(err).Code == app.CodeDenied && strings.Contains(app.Classify(err).Hint, "--user-snapshots"):
				refused++
			default:
				t.Errorf("snapshot.create: %v", err)
			}
		}()
	}
	wg.Wait()
	if len(taken) != 3 || refused != asked-3 {
		t.Fatalf("%d snapshots asked at once with room for 3: %d taken, %d refused", asked, len(taken), refused)
	}
	ls := b.do("snapshot.ls", &app.SnapshotListRequest{}).(*app.SnapshotListResult)
	if len(ls.Snapshots) != 3 {
		t.Fatalf("snapshot ls after: %+v", ls.Snapshots)
	}
	if _, err := s.Do(context.Background(), b.who, "snapshot.create", &app.SnapshotCreateRequest{Bench: name}); err == nil {
		t.Fatal("a fourth snapshot: taken")
	}
	b.do("snapshot.rm", &app.SnapshotRemoveRequest{Snapshot: taken[0]})
	// A snapshot the policy let through that then fails (of a kept Bench whose command ended: the
	// caller's, but nothing to branch) gives its hold back: failures leave the room there was.
	b.do("bench.run", &app.BenchRunRequest{Workshop: "bb", Argv: []string{"true"}, Keep: true, Name: "ended"})
	for range 4 {
		if _, err := s.Do(context.Background(), b.who, "snapshot.create", &app.SnapshotCreateRequest{Bench: "ended"}); err == nil || app.Classify(err).Code == app.CodeDenied {
			t.Fatalf("a snapshot of an ended Bench: %v, want it not found", err)
		}
	}
	b.do("snapshot.create", &app.SnapshotCreateRequest{Bench: name, Name: "again"})
}

// TestSnapshotOwnerName: OWNER/NAME names that owner's snapshot only, whoever else has the name.
func TestSnapshotOwnerName(t *testing.T) {
	s := benchService(t)
	user := &branching{t: t, s: s, who: &app.Call{Caller: &app.Caller{UID: 65534, User: "nobody", Role: app.User, Dir: "/"}}}
	op := &branching{t: t, s: s, who: &app.Call{Caller: &app.Caller{User: "root", Role: app.Operator, Dir: "/"}}}
	mine := user.do("snapshot.create", &app.SnapshotCreateRequest{Bench: user.create(&app.BenchCreateRequest{Workshop: "bb", Name: "u"}), Name: "base"}).(*app.SnapshotInfo)
	roots := op.do("snapshot.create", &app.SnapshotCreateRequest{Bench: op.create(&app.BenchCreateRequest{Workshop: "bb", Name: "o"}), Name: "base"}).(*app.SnapshotInfo)
	if rm := user.do("snapshot.rm", &app.SnapshotRemoveRequest{Snapshot: "root/base"}).(*app.SnapshotRemoveResult); rm.Removed {
		t.Fatal("a user removed root/base")
	}
	if rm := op.do("snapshot.rm", &app.SnapshotRemoveRequest{Snapshot: "nobody/base"}).(*app.SnapshotRemoveResult); !rm.Removed {
		t.Fatal("an operator's rm of nobody/base removed nothing")
	}
	ls := op.do("snapshot.ls", &app.SnapshotListRequest{}).(*app.SnapshotListResult)
	if len(ls.Snapshots) != 1 || ls.Snapshots[0].ID != roots.ID {
		t.Fatalf("after removing nobody/base (%s): %+v, want only root's %s", mine.ID, ls.Snapshots, roots.ID)
	}
}
