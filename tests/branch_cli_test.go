package tests

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestBranchCLI: branching through shed's faces, as an unprivileged user (nobody) of one supervisor
// and one Workshop record. The CLI: bench create, a file written, pause (bench ls says paused, its
// --json the time; exec refused with the hint to resume), resume, snapshot create and ls (table and
// --json), a Bench created from the snapshot sees the file, fork --count 2 (each child sees it), reset
// (the file gone) and reset to the snapshot (back), snapshot rm (then again: an error, nothing
// else removed). The MCP tools the same way, through the official MCP TypeScript SDK's client.
func TestBranchCLI(t *testing.T) {
	parallel(t)
	requireRoot(t)
	root := sharedRoot(t)
	sock, _ := daemonWith(t, root, "--user-benches", "64") // the shared store holds other tests' Benches of nobody's (the E2B tests' daemons allow as many)
	uid := nobodyUID(t)
	name := "branch-" + strconv.Itoa(os.Getpid())
	addAgentRecord(t, sock, name)
	shed := func(args ...string) result {
		t.Helper()
		return via(t, sock, uid, "", args...)
	}
	ok := func(what string, r result) result {
		t.Helper()
		if r.code != 0 {
			t.Fatalf("%s: exit %d\n%s%s", what, r.code, r.stdout, r.stderr)
		}
		return r
	}
	decode := func(what string, r result, v any) {
		t.Helper()
		ok(what, r)
		if err := json.Unmarshal([]byte(r.stdout), v); err != nil {
			t.Fatalf("%s: %v\n%s", what, err, r.stdout)
		}
	}
	cat := func(bench string) result {
		t.Helper()
		return shed("bench", "exec", bench, "--", "cat", "/root/mark")
	}
	var benches []string
	t.Cleanup(func() {
		for _, b := range benches {
			via(t, sock, uid, "", "bench", "rm", b)
		}
	})

	var created struct{ Bench, ID, Expires string }
	decode("bench create --json", shed("--json", "bench", "create", "--workshop", name, "--lifetime", "10m"), &created)
	b := created.Bench
	benches = append(benches, b)
	if b == "" || created.ID == "" || created.Expires == "" {
		t.Fatalf("bench create --json: %+v", created)
	}
	ok("write", shed("bench", "exec", b, "--", "sh", "-c", "echo one > /root/mark"))

	if r := ok("pause", shed("bench", "pause", b)); !strings.Contains(r.stdout, b+" paused") {
		t.Errorf("bench pause: %q", r.stdout)
	}
	if r := ok("pause again", shed("bench", "pause", b)); !strings.Contains(r.stdout, "paused (already)") {
		t.Errorf("bench pause of a paused Bench: %q", r.stdout)
	}
	if r := ok("ls", shed("bench", "ls")); !lineHas(r.stdout, b, "paused") {
		t.Errorf("bench ls does not show %s paused:\n%s", b, r.stdout)
	}
	var listed []struct {
		Name   string
		Paused string
	}
	decode("bench ls --json", shed("--json", "bench", "ls"), &listed)
	for _, l := range listed {
		if l.Name == b && l.Paused == "" {
			t.Errorf("bench ls --json: %s has no paused time: %+v", b, listed)
		}
	}
	if r := cat(b); r.code == 0 || !strings.Contains(r.stderr, "shed: error:") || !strings.Contains(r.stderr, "paused") ||
		!strings.Contains(r.stderr, "shed: hint:") || !strings.Contains(r.stderr, "shed bench resume "+b) {
		t.Errorf("exec in a paused Bench: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	var state struct {
		Bench, State string
		Changed      bool
	}
	decode("resume --json", shed("--json", "bench", "resume", "--lifetime", "10m", b), &state)
	if state.Bench != b || state.State != "running" || !state.Changed {
		t.Errorf("bench resume --json: %+v", state)
	}
	if r := cat(b); r.code != 0 || r.stdout != "one\n" {
		t.Errorf("after resume: exit %d %q %s", r.code, r.stdout, r.stderr)
	}

	var snap struct{ ID, Name, Bench, Created, Expires string }
	decode("snapshot create --json", shed("--json", "snapshot", "create", "--name", "first", b), &snap)
	if snap.ID == "" || snap.Name != "first" || snap.Bench != b || snap.Expires == "" {
		t.Errorf("snapshot create --json: %+v", snap)
	}
	if r := ok("snapshot ls", shed("snapshot", "ls")); !strings.HasPrefix(r.stdout, "ID") || !lineHas(r.stdout, snap.ID, "first", b) {
		t.Errorf("snapshot ls:\n%s", r.stdout)
	}
	var snaps []struct{ ID, Bench string }
	decode("snapshot ls --json", shed("--json", "snapshot", "ls", "--bench", b), &snaps)
	if len(snaps) != 1 || snaps[0].ID != snap.ID {
		t.Errorf("snapshot ls --bench --json: %+v", snaps)
	}
	decode("snapshot ls --json of no Bench", shed("--json", "snapshot", "ls", "--bench", "nothing-"+name), &snaps)
	if len(snaps) != 0 {
		t.Errorf("snapshot ls --bench of another Bench: %+v", snaps)
	}
	ok("write after the snapshot", shed("bench", "exec", b, "--", "sh", "-c", "echo two > /root/mark"))

	of := strings.TrimSpace(ok("create --snapshot", shed("bench", "create", "--snapshot", "first", "--lifetime", "10m")).stdout)
	benches = append(benches, of)
	if r := cat(of); r.code != 0 || r.stdout != "one\n" {
		t.Errorf("a Bench of the snapshot: exit %d %q %s", r.code, r.stdout, r.stderr)
	}
	if r := shed("bench", "create", "--snapshot", "first", "--workshop", name); r.code != 2 || !strings.Contains(r.stderr, "--snapshot") {
		t.Errorf("create with --snapshot and --workshop: exit %d %s", r.code, r.stderr)
	}

	var fork struct {
		Children []struct{ Bench, Error string }
	}
	decode("fork --json", shed("--json", "bench", "fork", "--count", "2", "--lifetime", "10m", b), &fork)
	if len(fork.Children) != 2 {
		t.Fatalf("bench fork --count 2: %+v", fork)
	}
	for _, ch := range fork.Children {
		benches = append(benches, ch.Bench)
		if ch.Error != "" || ch.Bench == "" {
			t.Errorf("fork child: %+v", ch)
		} else if r := cat(ch.Bench); r.code != 0 || r.stdout != "two\n" {
			t.Errorf("fork child %s: exit %d %q %s", ch.Bench, r.code, r.stdout, r.stderr)
		}
	}
	if r := shed("bench", "fork", "--count", "101", b); r.code != 2 || !strings.Contains(r.stderr, "--count") {
		t.Errorf("fork --count 101: exit %d %s", r.code, r.stderr)
	}

	if r := ok("reset", shed("bench", "reset", b)); !strings.Contains(r.stdout, b+" running") {
		t.Errorf("bench reset: %q", r.stdout)
	}
	if r := cat(b); r.code == 0 {
		t.Errorf("after reset the file is still there: %q", r.stdout)
	}
	ok("reset --snapshot", shed("bench", "reset", "--snapshot", snap.ID, b))
	if r := cat(b); r.code != 0 || r.stdout != "one\n" {
		t.Errorf("after reset --snapshot: exit %d %q %s", r.code, r.stdout, r.stderr)
	}

	// Task state is never exported, copied, proposed or promoted: naming a snapshot (or a Bench, a
	// paused one too) where a Workshop or a proposal goes says so, and nothing is written.
	ok("pause for export", shed("bench", "pause", of))
	out := t.TempDir()
	for _, c := range []struct {
		uid  int
		args []string
	}{
		{0, []string{"export", "--oci", filepath.Join(out, "by-name"), "first"}},
		{0, []string{"copy", "--to", "oci-layout:" + filepath.Join(out, "by-id"), snap.ID}},
		{0, []string{"export", "--oci", filepath.Join(out, "paused"), of}},
		{0, []string{"workshop", "promote", snap.ID}},
		{uid, []string{"bench", "propose", "first"}},
	} {
		r := via(t, sock, c.uid, "", c.args...)
		if r.code == 0 || !strings.Contains(r.stderr, "task state") || !strings.Contains(r.stderr, "never") || !strings.Contains(r.stderr, "shed: hint:") {
			t.Errorf("%q: exit %d, want the task-state refusal:\n%s%s", c.args, r.code, r.stdout, r.stderr)
		}
	}
	if entries, _ := os.ReadDir(out); len(entries) != 0 {
		t.Errorf("a refused export wrote %v", entries)
	}
	ok("resume after export", shed("bench", "resume", of))

	if r := ok("snapshot rm", shed("snapshot", "rm", snap.ID)); r.stdout != "removed "+snap.ID+"\n" {
		t.Errorf("snapshot rm: %q", r.stdout)
	}
	if r := shed("snapshot", "rm", snap.ID); r.code == 0 || !strings.Contains(r.stderr, "no snapshot "+snap.ID) {
		t.Errorf("snapshot rm again: exit %d %s", r.code, r.stderr)
	}
	// The Bench made of it keeps its files.
	if r := cat(of); r.code != 0 || r.stdout != "one\n" {
		t.Errorf("a Bench of a removed snapshot: exit %d %q %s", r.code, r.stdout, r.stderr)
	}

	mcpBranchSteps(t, sock, uid, name)
}

// lineHas: some line of out has every word.
func lineHas(out string, words ...string) bool {
	for _, line := range strings.Split(out, "\n") {
		all := true
		for _, w := range words {
			all = all && strings.Contains(line, w)
		}
		if all {
			return true
		}
	}
	return false
}

// mcpBranchSteps runs testdata/mcp-branch.mjs as uid against the supervisor at sock and checks it.
func mcpBranchSteps(t *testing.T, sock string, uid int, workshop string) {
	t.Helper()
	dir := npmPackage(t, "mcp", "@modelcontextprotocol/sdk", "1.32.2")
	client := filepath.Join(dir, "mcp-branch.mjs")
	writeFile(t, client, string(must(os.ReadFile("testdata/mcp-branch.mjs"))))
	cmd := exec.Command("node", client, shedBin, workshop)
	cmd.Env = append(os.Environ(), "SHED_SOCKET="+sock, "SHED_ROOT=/nonexistent", "HOME=/")
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the MCP client: %v\n%s\n%s", err, out, stderr.String())
	}
	steps := clientSteps(out)
	step := func(n string) mcpResult {
		t.Helper()
		var r mcpResult
		if err := json.Unmarshal(steps[n], &r); err != nil {
			t.Fatalf("step %s: %v (%s)\nall output:\n%s\n%s", n, err, steps[n], out, stderr.String())
		}
		return r
	}
	var tools []string
	json.Unmarshal(steps["tools"], &tools)
	for _, want := range []string{"bench_pause", "bench_resume", "bench_fork", "bench_reset", "snapshot_create", "snapshot_list", "snapshot_remove"} {
		if !strings.Contains(" "+strings.Join(tools, " ")+" ", " "+want+" ") {
			t.Errorf("no tool %s: %v", want, tools)
		}
	}
	created := step("create")
	bench, _ := created.Data["bench"].(string)
	if created.Error || bench == "" {
		t.Fatalf("bench_create: %+v\n%s", created, stderr.String())
	}
	if r := step("pause"); r.Error || r.Data["state"] != "paused" || r.Data["changed"] != true {
		t.Errorf("bench_pause: %+v", r)
	}
	if r := step("exec-paused"); !r.Error || !strings.Contains(r.Text, "paused") || !strings.Contains(r.Text, "hint:") {
		t.Errorf("bench_exec in a paused Bench: %+v", r)
	}
	if r := step("list-paused"); r.Error || !strings.Contains(string(steps["list-paused"]), `"paused":"`) {
		t.Errorf("bench_list of a paused Bench: %s", steps["list-paused"])
	}
	if r := step("resume"); r.Error || r.Data["state"] != "running" || r.Data["changed"] != true {
		t.Errorf("bench_resume: %+v", r)
	}
	if r := step("resume-again"); r.Error || r.Data["state"] != "running" || r.Data["changed"] != false {
		t.Errorf("bench_resume of a running Bench: %+v", r)
	}
	snap := step("snapshot")
	id, _ := snap.Data["id"].(string)
	if snap.Error || id == "" || snap.Data["name"] != "mcp-snap" || snap.Data["bench"] != bench {
		t.Errorf("snapshot_create: %+v", snap)
	}
	if r := step("snapshots"); r.Error || !strings.Contains(string(steps["snapshots"]), `"id":"`+id+`"`) {
		t.Errorf("snapshot_list: %s", steps["snapshots"])
	}
	if r := step("create-both"); !r.Error || !strings.Contains(r.Text, "not both") {
		t.Errorf("bench_create with workshop and snapshot: %+v", r)
	}
	if r := step("create-snap"); r.Error {
		t.Errorf("bench_create of a snapshot: %+v", r)
	}
	if r := step("cat-snap"); r.Error || r.Data["stdout"] != "mcp\n" {
		t.Errorf("a Bench of the snapshot: %+v", r)
	}
	if r := step("fork"); r.Error || !strings.Contains(string(steps["fork"]), `"bench":"`) || strings.Contains(string(steps["fork"]), `"error":"`) {
		t.Errorf("bench_fork: %s", steps["fork"])
	}
	if r := step("cat-fork"); r.Error || r.Data["stdout"] != "mcp\n" {
		t.Errorf("the fork's child: %+v", r)
	}
	if r := step("fork-bad"); !r.Error || !strings.Contains(r.Text, "100") {
		t.Errorf("bench_fork of 101: %+v", r)
	}
	if r := step("reset"); r.Error || r.Data["state"] != "running" {
		t.Errorf("bench_reset: %+v", r)
	}
	if r := step("cat-reset"); r.Error || r.Data["exit_code"] == 0.0 {
		t.Errorf("after bench_reset the file is there: %+v", r)
	}
	if r := step("reset-snap"); r.Error {
		t.Errorf("bench_reset to the snapshot: %+v", r)
	}
	if r := step("cat-reset-snap"); r.Error || r.Data["stdout"] != "mcp\n" {
		t.Errorf("after bench_reset to the snapshot: %+v", r)
	}
	if r := step("rm-snap"); r.Error || r.Data["removed"] != true {
		t.Errorf("snapshot_remove: %+v", r)
	}
	if r := step("rm-snap-again"); r.Error || r.Data["removed"] != false {
		t.Errorf("snapshot_remove again: %+v", r)
	}
}
