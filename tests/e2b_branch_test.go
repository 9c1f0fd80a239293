package tests

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestE2BBranch: branching sandboxes as an agent harness does them, through the unmodified `e2b`
// SDK as nobody. A paused sandbox's counting process stops (its count moves by at most a tick across
// a 1.5 s pause) and goes on after connect, its pid still listed and its files kept; while paused it
// reads as stopped (isRunning, getInfo's and list's state), a second pause is E2B's "already" (false)
// and a command is refused with why. A fork of 2 sees a file written just before, each child its
// own; counts outside 1..100 are 400s. A named snapshot is listed by sandbox and by name, a sandbox
// made from it has its files (not the later ones) and, made with onTimeout pause and a 4 s timeout,
// is paused at its end and woken by connect; the snapshot deletes once (then false). A sandbox made
// with a filesystem-only auto-pause (keepMemory false) is paused at its end with its processes gone,
// and connect boots it again over its files with a new boot id (a pause that keeps memory keeps the
// id, an explicit cold pause changes it); asking it to auto-resume is a 400. A paused sandbox is
// killed as a running one.
func TestE2BBranch(t *testing.T) {
	parallel(t) // see parallelTests in main_test.go
	requireRoot(t)
	root := sharedRoot(t)
	addr := freeLoopback(t)
	sock, _ := daemonWith(t, root, "--e2b", addr, "--user-benches", "64") // the shared store holds other tests' Benches of nobody's
	dir := npmPackage(t, "e2b", "e2b", "2.51.0")
	client := filepath.Join(dir, "e2b-branch.mjs")
	writeFile(t, client, string(must(os.ReadFile("testdata/e2b-branch.mjs"))))
	uid := nobodyUID(t)
	name := e2bRecord(t, sock) // the shared jq record (e2bShared)
	made := via(t, sock, 0, "", "--json", "agent", "key", "create", "nobody")
	var key struct{ Key string }
	if err := json.Unmarshal([]byte(made.stdout), &key); err != nil {
		t.Fatalf("agent key create: %v %q %s", err, made.stdout, made.stderr)
	}

	cmd := exec.Command("node", client, name)
	cmd.Env = append(os.Environ(), "HOME=/", "E2B_API_URL=http://"+addr, "E2B_SANDBOX_URL=http://"+addr, "E2B_API_KEY="+key.Key)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	outb, err := cmd.Output()
	if err != nil {
		t.Fatalf("the e2b client: %v\n%s\n%s", err, outb, stderr.String())
	}
	steps := clientSteps(outb)
	get := func(n string, v any) {
		t.Helper()
		var s struct {
			OK    bool            `json:"ok"`
			Value json.RawMessage `json:"value"`
			Error string          `json:"error"`
		}
		if err := json.Unmarshal(steps[n], &s); err != nil || !s.OK || json.Unmarshal(s.Value, v) != nil {
			t.Fatalf("step %s: %v %s\nall output:\n%s\n%s", n, err, steps[n], outb, stderr.String())
		}
	}

	var pause struct {
		Before                 int
		Paused, Again, Running bool
		State                  string
		InPaused, InRunning    bool
		Run                    string
		EndIn                  int // seconds: a paused sandbox ends as task state (24 h), not at its timeout
		Lifecycle              struct {
			OnTimeout  string
			AutoResume bool
		}
	}
	get("pause", &pause)
	if !pause.Paused || pause.Again || pause.Running || pause.State != "paused" || !pause.InPaused || pause.InRunning ||
		!strings.Contains(pause.Run, "paused") || pause.EndIn < 23*3600 || pause.EndIn > 24*3600 ||
		pause.Lifecycle.OnTimeout != "kill" || pause.Lifecycle.AutoResume {
		t.Errorf("paused: %+v", pause)
	}
	var conn struct {
		Running, Listed bool
		At, Later       int
		State, Kept     string
		AgainStatus     int
	}
	get("connect", &conn)
	// 1.5 s paused at 10 ticks a second: at most a tick or two more than before the pause.
	if !conn.Running || conn.State != "running" || conn.At > pause.Before+3 || conn.Later <= conn.At || !conn.Listed ||
		conn.Kept != "kept across a pause" || conn.AgainStatus != 200 {
		t.Errorf("connected (counted %d before the pause): %+v", pause.Before, conn)
	}
	var fork struct {
		N             int
		IDs           []string
		Seen, Running []any
		Parent, Other string
		ParentRunning bool
	}
	get("fork", &fork)
	if fork.N != 2 || len(fork.IDs) != 2 || fork.IDs[0] == fork.IDs[1] ||
		!slices.Equal(fork.Seen, []any{"written just before the fork", "written just before the fork"}) ||
		fork.Parent != "written just before the fork" || fork.Other != "written just before the fork" ||
		!slices.Equal(fork.Running, []any{true, true}) || !fork.ParentRunning {
		t.Errorf("fork: %+v", fork)
	}
	var bad struct {
		Zero, Many struct {
			Status int
			Body   string
		}
	}
	get("fork-bad", &bad)
	if bad.Zero.Status != 400 || bad.Many.Status != 400 || !strings.Contains(bad.Many.Body, "from 1 to 100") {
		t.Errorf("forks out of range: %+v", bad)
	}
	var snap struct {
		SnapshotID string
		Names      []string
	}
	get("snapshot", &snap)
	snapName := "snap-" + strconv.Itoa(cmd.Process.Pid)
	if snap.SnapshotID == "" || !slices.Equal(snap.Names, []string{"nobody/" + snapName + ":default"}) {
		t.Errorf("snapshot: %+v", snap)
	}
	var list struct {
		BySandbox, ByName []string
		None              int
	}
	get("snapshot-list", &list)
	if !slices.Contains(list.BySandbox, snap.SnapshotID) || !slices.Equal(list.ByName, []string{snap.SnapshotID}) || list.None != 0 {
		t.Errorf("snapshots listed: %+v (made %s)", list, snap.SnapshotID)
	}
	var from struct {
		Read, Template, StateAfter, ReadAgain string
		Lifecycle                             struct {
			OnTimeout  string
			AutoResume bool
		}
		RunningAfter, Woke bool
	}
	get("from-snapshot", &from)
	if from.Read != "as the snapshot sealed it" || from.Template != snap.SnapshotID || from.Lifecycle.OnTimeout != "pause" ||
		from.StateAfter != "paused" || from.RunningAfter || !from.Woke || from.ReadAgain != from.Read {
		t.Errorf("a sandbox of the snapshot: %+v", from)
	}
	var del struct {
		First, Second bool
		Listed        int
	}
	get("snapshot-delete", &del)
	if !del.First || del.Second || del.Listed != 0 {
		t.Errorf("snapshot deleted: %+v", del)
	}
	var cold struct {
		State, OnTimeout, Read, Sleepers string
		NewBoot, WarmKeeps, ColdAgain    bool
		Refused                          int
	}
	get("cold-pause", &cold)
	if cold.State != "paused" || cold.OnTimeout != "pause" || cold.Read != "on disk" || cold.Sleepers != "0" ||
		!cold.NewBoot || !cold.WarmKeeps || !cold.ColdAgain || cold.Refused != 400 {
		t.Errorf("a filesystem-only pause at the timeout and by a call (want paused, pause, the file, no process of before, a new boot id, kept by a warm pause, new after a cold one, autoResume refused): %+v", cold)
	}
	var kill struct {
		Killed bool
		After  string
	}
	get("kill-paused", &kill)
	if !kill.Killed || kill.After != "SandboxNotFoundError" {
		t.Errorf("a paused sandbox killed: %+v", kill)
	}
	if _, ok := steps["done"]; !ok {
		t.Errorf("the client did not finish:\n%s\n%s", outb, stderr.String())
	}
}
