package tests

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// npmCache is where the tests install the real JavaScript clients from npm: outside the clone, so
// reruns are quick; a fresh machine installs them (the npm registry is reachable).
const npmCache = "/var/cache/toolshed-ci/npm"

// npmPackage installs pkg at version (once per run: npmInstall) in the project dir npmCache/name and
// returns the directory, readable by everyone (the clients run as an unprivileged user).
func npmPackage(t testing.TB, name, pkg, version string) string {
	t.Helper()
	dir, err := npmInstall(name, pkg, version)
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// npmInstalled says whether dir's node_modules holds pkg at version.
func npmInstalled(dir, pkg, version string) bool {
	b, _ := os.ReadFile(filepath.Join(dir, "node_modules", filepath.FromSlash(pkg), "package.json"))
	var meta struct{ Version string }
	json.Unmarshal(b, &meta)
	return meta.Version == version
}

// TestMCP: the official MCP TypeScript SDK's client drives `shed mcp` through a real supervisor, as an
// unprivileged user: it lists the Workshops it may use, creates a Bench, installs a package with
// apt through the recipe's network profile, writes and runs a script, reads a file back, lists its
// directory and describes a file (and one that is not there), writes a file with metadata and sees it
// in stat and ls, watches a directory (polled) and sees a command's changes, shows and replaces the
// Bench's network rules (everything denied: apt-get update fails), proposes, removes the Bench; a
// Bench created with network rules has them, and is removed by the supervisor once bench_set_lifetime
// shortens its lifetime. Each new tool's bad input (a rule outside the profile, a missing directory, an
// id that is no watcher, a lifetime past the bound, a metadata key) is refused and changes nothing.
func TestMCP(t *testing.T) {
	parallel(t) // see parallelTests in main_test.go
	requireRoot(t)
	root := sharedRoot(t)
	sock := daemon(t, root)
	dir := npmPackage(t, "mcp", "@modelcontextprotocol/sdk", "1.32.2")
	client := filepath.Join(dir, "mcp-client.mjs")
	writeFile(t, client, string(must(os.ReadFile("testdata/mcp-client.mjs"))))
	uid := nobodyUID(t)
	name := "mcp-" + strconv.Itoa(os.Getpid())
	addAgentRecord(t, sock, name, "[[account]]\nname = \"agent\"\n")
	cmd := exec.Command("node", client, shedBin, name, "hello")
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
	if got := string(steps["tools"]); got != `["bench_create","bench_exec","bench_fork","bench_list","bench_list_files","bench_metrics","bench_network","bench_pause","bench_propose","bench_read_file","bench_remove","bench_reset","bench_resume","bench_set_lifetime","bench_stat_file","bench_watch_events","bench_watch_start","bench_watch_stop","bench_write_file","snapshot_create","snapshot_list","snapshot_remove","workshop_list"]` {
		t.Errorf("tools: %s", got)
	}
	if r := step("workshops"); r.Error || !strings.Contains(fmt.Sprint(r.Data), name) {
		t.Errorf("workshop_list: %+v", r)
	}
	created := step("create")
	bench, _ := created.Data["bench"].(string)
	if created.Error || bench == "" {
		t.Fatalf("bench_create: %+v\n%s", created, stderr.String())
	}
	if r := step("install"); r.Error || r.Data["exit_code"] != 0.0 || !strings.Contains(r.Data["stdout"].(string), "installed") {
		t.Errorf("apt-get install through the network profile: %+v", r)
	}
	if r := step("write"); r.Error {
		t.Errorf("bench_write_file: %+v", r)
	}
	if r := step("run"); r.Error || r.Data["stdout"] != "ran in /root/work with hi\n" {
		t.Errorf("run the script: %+v", r)
	}
	if r := step("read"); r.Error || r.Data["content"] != "Hello, world!\n" {
		t.Errorf("bench_read_file: %+v", r)
	}
	if r := step("ls"); r.Error || !strings.Contains(fmt.Sprint(r.Data), "path:/root/work/run.sh") || !strings.Contains(fmt.Sprint(r.Data), "path:/root/work/out.txt") {
		t.Errorf("bench_list_files: %+v", r)
	}
	if r := step("stat"); r.Error || r.Data["type"] != "file" || r.Data["size"] != 14.0 || r.Data["owner"] != "root" || r.Data["mode"] != 420.0 {
		t.Errorf("bench_stat_file: %+v", r)
	}
	if r := step("stat-missing"); !r.Error || !strings.Contains(r.Text, "/root/nothing") {
		t.Errorf("bench_stat_file of no file: %+v", r)
	}
	if r := step("timeout"); r.Error || r.Data["timed_out"] != true || r.Data["exit_code"] != 124.0 {
		t.Errorf("a command past its timeout: %+v", r)
	}
	mcpUserSteps(t, step)
	mcpMetadataSteps(t, step)
	mcpWatchSteps(t, step, steps)
	mcpNetworkSteps(t, step)
	if r := step("list"); r.Error || !strings.Contains(fmt.Sprint(r.Data), bench) {
		t.Errorf("bench_list: %+v", r)
	}
	p := step("propose")
	if p.Error || !strings.Contains(fmt.Sprint(p.Data["diff"]), `"hello=`) {
		t.Errorf("bench_propose: %+v", p)
	} else if id, _ := p.Data["proposal"].(string); id == "" || !exists(filepath.Join(root, "proposals", id, "proposal.json")) {
		t.Errorf("the proposal %q is not in the store's proposals", id)
	}
	if r := step("remove"); r.Error {
		t.Errorf("bench_remove: %+v", r)
	}
	if r := step("list-after"); r.Error || strings.Contains(fmt.Sprint(r.Data), bench) {
		t.Errorf("bench_list after remove: %+v", r)
	}
	if r := step("missing"); !r.Error || !strings.Contains(r.Text, "hint:") {
		t.Errorf("exec in a removed Bench: %+v, want a tool error with a hint", r)
	}
	if r := step("not-allowed"); !r.Error || !strings.Contains(r.Text, "not a Workshop record") {
		t.Errorf("bench_create of no record: %+v", r)
	}
	if r := step("create-net-bad"); !r.Error || !strings.Contains(r.Text, "example.com") || !strings.Contains(r.Text, "profile") {
		t.Errorf("bench_create with a rule outside the profile: %+v", r)
	}
	short := step("short")
	if b, _ := short.Data["bench"].(string); short.Error || b == "" {
		t.Errorf("bench_create with network rules: %+v", short)
	} else {
		if r := step("short-net"); r.Error || fmt.Sprint(r.Data["deny_out"]) != "[0.0.0.0/0]" || fmt.Sprint(r.Data["allow_out"]) != "[]" {
			t.Errorf("the rules of a Bench created with deny_out: %+v", r)
		}
		if r := step("lifetime-bad"); !r.Error || !strings.Contains(r.Text, "86400") {
			t.Errorf("bench_set_lifetime past the bound: %+v", r)
		}
		if r := step("lifetime"); r.Error || r.Data["bench"] != b {
			t.Errorf("bench_set_lifetime: %+v", r)
		} else if exp, err := time.Parse(time.RFC3339, r.Data["expires"].(string)); err != nil || time.Until(exp) > 10*time.Second {
			t.Errorf("bench_set_lifetime 2 s: expires %v (%v)", r.Data["expires"], err)
		}
		// Created with a 600 s lifetime: gone now only because bench_set_lifetime moved its end.
		if r := step("short-after"); strings.Contains(fmt.Sprint(r.Data), b) || strings.Contains(fmt.Sprint(r.Data), "mcp-net-bad") {
			t.Errorf("a Bench past its new lifetime, or the one refused, is listed: %+v", r)
		}
	}
	// The record is as it was: an agent proposes, it never changes a Workshop.
	if r := via(t, sock, 0, "", "workshop", "log", name); !strings.Contains(r.stdout, "version 1") || strings.Contains(r.stdout, "version 2") {
		t.Errorf("the record changed:\n%s", r.stdout)
	}
}

// mcpUserSteps checks the client's steps as the Workshop's declared account: a command runs as it
// in its home, a file written for it (and the directory made for it) is its, an account the
// Workshop does not declare is refused, naming the ones it does.
func mcpUserSteps(t *testing.T, step func(string) mcpResult) {
	t.Helper()
	if r := step("exec-agent"); r.Error || r.Data["stdout"] != "agent\n/home/agent\n/home/agent\n" {
		t.Errorf("bench_exec as agent: %+v", r)
	}
	if r := step("write-agent"); r.Error {
		t.Errorf("bench_write_file as agent: %+v", r)
	}
	for _, s := range []string{"stat-agent", "stat-agent-dir"} {
		if r := step(s); r.Error || r.Data["owner"] != "agent" || r.Data["group"] != "agent" {
			t.Errorf("%s: want agent's: %+v", s, r)
		}
	}
	if r := step("exec-unknown-user"); !r.Error || !strings.Contains(r.Text, "mallory") || !strings.Contains(r.Text, "agent") {
		t.Errorf("bench_exec as an account the Workshop does not declare: %+v", r)
	}
}

// mcpMetadataSteps checks the client's file metadata steps: kept with a write, shown by stat and ls;
// a key that could not be kept is refused and writes nothing.
func mcpMetadataSteps(t *testing.T, step func(string) mcpResult) {
	t.Helper()
	if r := step("write-meta"); r.Error || r.Data["path"] != "/root/work/meta.txt" {
		t.Errorf("bench_write_file with metadata: %+v", r)
	}
	if r := step("stat-meta"); r.Error || fmt.Sprint(r.Data["metadata"]) != "map[author:agent run-id:42]" {
		t.Errorf("bench_stat_file's metadata: %+v", r)
	}
	if r := step("ls-meta"); r.Error || !strings.Contains(fmt.Sprint(r.Data), "metadata:map[author:agent run-id:42]") {
		t.Errorf("bench_list_files' metadata: %+v", r)
	}
	if r := step("write-meta-bad"); !r.Error || !strings.Contains(r.Text, "metadata key") || !strings.Contains(r.Text, "a key") {
		t.Errorf("bench_write_file with a bad metadata key: %+v", r)
	}
	if r := step("stat-meta-bad"); !r.Error {
		t.Errorf("a write refused for its metadata wrote the file: %+v", r)
	}
}

// mcpWatchSteps checks the client's watch steps: a watcher sees a command's changes, recursively,
// polled; a missing directory, an id that is no watcher and a 17th watcher of a Bench are refused; a
// stopped watcher is gone.
func mcpWatchSteps(t *testing.T, step func(string) mcpResult, steps map[string]json.RawMessage) {
	t.Helper()
	if r := step("watch-missing"); !r.Error || !strings.Contains(r.Text, "/root/nothere") || !strings.Contains(r.Text, "no such directory") {
		t.Errorf("bench_watch_start of a missing directory: %+v", r)
	}
	if r := step("watch-start"); r.Error || !strings.HasPrefix(fmt.Sprint(r.Data["watcher"]), "w") {
		t.Errorf("bench_watch_start: %+v", r)
	}
	var seen struct {
		Error  any `json:"error"`
		Events []struct{ Name, Type string }
	}
	json.Unmarshal(steps["watch-events"], &seen)
	got := fmt.Sprint(seen.Events)
	for _, want := range []string{"{new.txt create}", "{sub create}", "{meta.txt remove}"} {
		if !strings.Contains(got, want) {
			t.Errorf("bench_watch_events: %s not among %s (%v)", want, got, seen.Error)
		}
	}
	if r := step("watch-events-bad"); !r.Error || !strings.Contains(r.Text, "wnotawatcher") || !strings.Contains(r.Text, "not_found") {
		t.Errorf("bench_watch_events of no watcher: %+v", r)
	}
	if r := step("watch-stop-bad"); !r.Error || !strings.Contains(r.Text, "wnotawatcher") {
		t.Errorf("bench_watch_stop of no watcher: %+v", r)
	}
	if r := step("watch-stop"); r.Error {
		t.Errorf("bench_watch_stop: %+v", r)
	}
	if r := step("watch-events-stopped"); !r.Error || !strings.Contains(r.Text, "no watcher") {
		t.Errorf("bench_watch_events of a stopped watcher: %+v", r)
	}
	if r := step("watch-left"); r.Error {
		t.Errorf("bench_watch_start of a watcher left to the Bench's end: %+v", r)
	}
	var bound struct {
		Errors []string
		After  mcpResult
	}
	json.Unmarshal(steps["watch-bound"], &bound)
	if len(bound.Errors) != 1 || !strings.Contains(bound.Errors[0], "16 watchers already") || !strings.Contains(bound.Errors[0], "hint:") || bound.After.Error {
		t.Errorf("the 17th watcher of a Bench: %+v", bound)
	}
}

// mcpNetworkSteps checks the client's network steps: the rules shown and replaced, a rule outside the
// profile refused with the rules in force unchanged, the new rules in effect in the Bench.
func mcpNetworkSteps(t *testing.T, step func(string) mcpResult) {
	t.Helper()
	if r := step("net-show"); r.Error || fmt.Sprint(r.Data["allow_out"], r.Data["deny_out"]) != "[] []" {
		t.Errorf("bench_network of a Bench with no rules: %+v", r)
	}
	if r := step("net-deny"); r.Error || fmt.Sprint(r.Data["deny_out"]) != "[0.0.0.0/0]" {
		t.Errorf("bench_network allow_internet_access false: %+v", r)
	}
	if r := step("net-bad"); !r.Error || !strings.Contains(r.Text, "example.com") || !strings.Contains(r.Text, "profile") {
		t.Errorf("bench_network with a rule outside the profile: %+v", r)
	}
	if r := step("net-after-bad"); r.Error || fmt.Sprint(r.Data["deny_out"]) != "[0.0.0.0/0]" {
		t.Errorf("the rules after a refused update: %+v", r)
	}
	if r := step("net-denied"); r.Error || !strings.Contains(fmt.Sprint(r.Data["stdout"]), "update-failed") {
		t.Errorf("apt-get update with everything denied: %+v", r)
	}
	if r := step("net-clear"); r.Error || fmt.Sprint(r.Data["allow_out"], r.Data["deny_out"]) != "[] []" {
		t.Errorf("bench_network clear: %+v", r)
	}
}

// mcpResult is a tool call's result as the client prints it.
type mcpResult struct {
	Error bool           `json:"error"`
	Data  map[string]any `json:"data"`
	Text  string         `json:"text"`
}

// addAgentRecord records name, a jq Workshop whose network profile is Debian's (apt works in its
// Benches), that nobody (the agent clients' user) may launch.
func addAgentRecord(t *testing.T, sock, name string, more ...string) {
	t.Helper()
	f := writeFile(t, filepath.Join(t.TempDir(), "workshop.toml"), agentRecipe(name)+strings.Join(more, ""))
	if r := via(t, sock, 0, "", "workshop", "add", "--allow", "nobody", f); r.code != 0 {
		t.Fatalf("workshop add: %s", r.stderr)
	}
}

// agentRecipe is addAgentRecord's recipe.
func agentRecipe(name string) string {
	return fmt.Sprintf(`name = %q
seed = "debian/bookworm"
[apt]
packages = ["jq"]
[network]
profile = "debian"
`, name)
}

// nobodyUID is the uid the agent clients run as: nobody, a user with no rights on the store, who can
// reach shed's binary (its directories are opened for search).
func nobodyUID(t testing.TB) int {
	t.Helper()
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.Atoi(nobody.Uid)
	for d := filepath.Dir(shedBin); d != "/"; d = filepath.Dir(d) {
		if fi, err := os.Stat(d); err == nil && fi.Mode().Perm()&0o001 == 0 {
			os.Chmod(d, fi.Mode().Perm()|0o011)
		}
	}
	return uid
}

// clientSteps parses a client's output: one {"step", "value"} object a line.
func clientSteps(out []byte) map[string]json.RawMessage {
	steps := map[string]json.RawMessage{}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var s struct {
			Step  string          `json:"step"`
			Value json.RawMessage `json:"value"`
		}
		if json.Unmarshal(sc.Bytes(), &s) == nil {
			steps[s.Step] = s.Value
		}
	}
	return steps
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
