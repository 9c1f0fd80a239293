package tests

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestE2BSupervisorKilledWhilePaused: the crash case of branching. A sandbox made and paused through the
// unmodified `e2b` SDK (its processes frozen), then the supervisor is killed with SIGKILL: nothing of
// the Bench stays frozen or alive (its init and command gone within seconds, no task of its left in
// D state), its upper is still on the uppers filesystem with the file in it, and the store verifies.
// A new supervisor of the same store, on the same address, lists it paused; the client connects to
// it by the id and key it had, which resumes it over the same upper: the file is there, the counting
// process is not (its processes died with the first supervisor), and commands run.
func TestE2BSupervisorKilledWhilePaused(t *testing.T) {
	parallel(t) // see parallelTests in main_test.go
	requireRoot(t)
	root := sharedRoot(t)
	addr := freeLoopback(t)
	flags := []string{"--e2b", addr, "--user-benches", "64"} // the shared store holds other tests' Benches of nobody's
	sock, _ := daemonWith(t, root, flags...)
	dir := npmPackage(t, "e2b", "e2b", "2.51.0")
	client := filepath.Join(dir, "e2b-restart.mjs")
	writeFile(t, client, string(must(os.ReadFile("testdata/e2b-restart.mjs"))))
	uid := nobodyUID(t)
	name := e2bRecord(t, sock) // the shared jq record (e2bShared)
	made := via(t, sock, 0, "", "--json", "agent", "key", "create", "nobody")
	var key struct{ Key string }
	if err := json.Unmarshal([]byte(made.stdout), &key); err != nil {
		t.Fatalf("agent key create: %v %q %s", err, made.stdout, made.stderr)
	}
	node := func(args ...string) map[string]json.RawMessage {
		t.Helper()
		cmd := exec.Command("node", append([]string{client}, args...)...)
		cmd.Env = append(os.Environ(), "HOME=/", "E2B_API_URL=http://"+addr, "E2B_SANDBOX_URL=http://"+addr, "E2B_API_KEY="+key.Key)
		cmd.Dir = "/"
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("the e2b client %v: %v\n%s\n%s", args, err, out, stderr.String())
		}
		return clientSteps(out)
	}
	step := func(steps map[string]json.RawMessage, n string, v any) {
		t.Helper()
		var s struct {
			OK    bool            `json:"ok"`
			Value json.RawMessage `json:"value"`
			Error string          `json:"error"`
		}
		if err := json.Unmarshal(steps[n], &s); err != nil || !s.OK || json.Unmarshal(s.Value, v) != nil {
			t.Fatalf("step %s: %v %s", n, err, steps[n])
		}
	}
	var before struct {
		ID     string
		Paused bool
	}
	step(node("before", name), "before", &before)
	if !before.Paused {
		t.Fatalf("pause: %+v", before)
	}
	var recs []struct {
		ID     string
		Name   string
		Pid    int
		Paused *time.Time
	}
	if err := json.Unmarshal([]byte(via(t, sock, 0, "", "--json", "bench", "ls").stdout), &recs); err != nil {
		t.Fatal(err)
	}
	var initPid int
	var benchID string
	for _, r := range recs {
		if r.Name == before.ID {
			initPid, benchID = r.Pid, r.ID
		}
	}
	if initPid == 0 || benchID == "" {
		t.Fatalf("bench ls does not list %s running: %+v", before.ID, recs)
	}
	kids := strings.Fields(string(must(os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", initPid, initPid)))))

	// The crash: the supervisor is killed while its sandbox is frozen.
	pid, _ := daemonPids.Load(sock)
	syscall.Kill(pid.(int), syscall.SIGKILL)
	gone := func(p string) bool {
		b, err := os.ReadFile("/proc/" + p + "/stat")
		// A zombie waits for its reaper (the host's init), and is dead.
		return err != nil || strings.Contains(string(b), ") Z ")
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, p := range append(kids, strconv.Itoa(initPid)) {
		for !gone(p) && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if !gone(p) {
			st, _ := os.ReadFile("/proc/" + p + "/stat")
			t.Errorf("process %s of the paused Bench outlived its supervisor's SIGKILL by 10 s: %s", p, st)
		}
	}
	// Its upper is still there, with the file, and the store verifies.
	if b, err := os.ReadFile(filepath.Join(root, "uppers", "benches", benchID, "upper", "opt", "kept.txt")); err != nil || string(b) != "written before the crash" {
		t.Errorf("the paused Bench's upper after the crash: %q %v", b, err)
	}
	if r := shed(t, root, nil, "store", "verify"); r.code != 0 {
		t.Errorf("store verify after the crash: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	// A new supervisor, the same store and address.
	sock2, _ := daemonWith(t, root, flags...)
	ls := via(t, sock2, 0, "", "bench", "ls")
	if !strings.Contains(ls.stdout, before.ID) || !strings.Contains(ls.stdout, "paused") {
		t.Errorf("after the restart, bench ls:\n%s%s", ls.stdout, ls.stderr)
	}
	var after struct {
		Kept    string
		Counted bool
		Run     string
		Running bool
	}
	step(node("after", before.ID), "after", &after)
	if after.Kept != "written before the crash" || after.Counted || after.Run != "alive\n" || !after.Running {
		t.Errorf("connect after the restart: %+v (want the file, no counter, commands running)", after)
	}
}
