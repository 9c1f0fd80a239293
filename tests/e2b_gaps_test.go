package tests

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
)

// TestE2BGaps: what the E2B SDK shows of shed's E2B API beyond TestE2B, through the real `e2b`
// package as nobody, on one daemon, one record and two sandboxes: list's pages (limit, the
// x-next-token header), order and startedAfter; connect (the path with and without /v2) never
// shortens a timeout and extends it; a directory's mode is its permission bits and a symlink's
// target its resolved path; removing a missing path succeeds; refusals are E2B's {code, message};
// a command of a sandbox killed while it runs ends in the SDK's "sandbox was killed" error, and
// the killed sandbox is not running, cannot be connected to or forked (SandboxNotFoundError); a
// timeout set shorter ends the sandbox.
func TestE2BGaps(t *testing.T) {
	parallel(t) // see parallelTests in main_test.go
	requireRoot(t)
	root := sharedRoot(t)
	addr := freeLoopback(t)
	sock, _ := daemonWith(t, root, "--e2b", addr)
	dir := npmPackage(t, "e2b", "e2b", "2.51.0")
	client := filepath.Join(dir, "e2b-gaps.mjs")
	writeFile(t, client, string(must(os.ReadFile("testdata/e2b-gaps.mjs"))))
	uid := nobodyUID(t)
	name := e2bRecord(t, sock) // the shared jq record (e2bShared)
	made := via(t, sock, 0, "", "--json", "agent", "key", "create", "nobody")
	var key struct{ Key string }
	if err := json.Unmarshal([]byte(made.stdout), &key); err != nil || key.Key == "" {
		t.Fatalf("agent key create: %v %q %s", err, made.stdout, made.stderr)
	}

	cmd := exec.Command("node", client, name)
	cmd.Env = append(os.Environ(), "HOME=/", "E2B_API_URL=http://"+addr, "E2B_SANDBOX_URL=http://"+addr, "E2B_API_KEY="+key.Key)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the e2b client: %v\n%s\n%s", err, out, stderr.String())
	}
	steps := clientSteps(out)
	// get decodes a step's value into v; false (with the error) if the step threw.
	get := func(step string, v any) bool {
		t.Helper()
		var s struct {
			OK    bool            `json:"ok"`
			Value json.RawMessage `json:"value"`
			Error string          `json:"error"`
		}
		if err := json.Unmarshal(steps[step], &s); err != nil || !s.OK {
			t.Errorf("step %s: %v %s %s", step, err, s.Error, steps[step])
			return false
		}
		if err := json.Unmarshal(s.Value, v); err != nil {
			t.Errorf("step %s: %v in %s", step, err, s.Value)
			return false
		}
		return true
	}
	var ids []string
	if !get("create", &ids) || len(ids) != 2 {
		t.Fatalf("create: %s\n%s", out, stderr.String())
	}
	a, b := ids[0], ids[1]

	var pages [][]string
	if get("pages", &pages) && !reflect.DeepEqual(pages, [][]string{{b}, {a}}) {
		t.Errorf("pages of limit 1: %v, want [[%s] [%s]] (newest first, x-next-token between)", pages, b, a)
	}
	var order struct{ Asc, Desc []string }
	if get("order", &order) && (!reflect.DeepEqual(order.Asc, []string{a, b}) || !reflect.DeepEqual(order.Desc, []string{b, a})) {
		t.Errorf("order: %+v", order)
	}
	var after []string
	if get("started-after", &after) && !reflect.DeepEqual(after, []string{b}) {
		t.Errorf("startedAfter the second's start: %v, want [%s]", after, b)
	}
	var conn struct {
		Kept, PlainEnd, Extended bool
		Plain                    int
	}
	if get("connect-keeps", &conn) && (!conn.Kept || !conn.PlainEnd || conn.Plain != 200 || !conn.Extended) {
		t.Errorf("connect: %+v, want a shorter timeout kept, the path without /v2 served (200) and a longer one extending", conn)
	}

	type entry struct {
		Type        string
		Mode        int
		Permissions string
		Target      string
	}
	var entries struct {
		Dir, Link, Dangling entry
		Listed              map[string]entry
	}
	if get("entries", &entries) {
		if entries.Dir != (entry{Type: "dir", Mode: 0o755, Permissions: "drwxr-xr-x"}) {
			t.Errorf("a directory's info: %+v, want mode 493 (its permission bits)", entries.Dir)
		}
		if entries.Link != (entry{Type: "file", Mode: 0o644, Permissions: "Lrwxrwxrwx", Target: "/root/gaps/f.txt"}) {
			t.Errorf("a symlink's info: %+v, want its resolved target and that target's type and mode, as envd", entries.Link)
		}
		if entries.Dangling.Target != "/root/gaps/dangling" {
			t.Errorf("a dangling symlink's target: %q, want its own path, as envd", entries.Dangling.Target)
		}
		if l := entries.Listed; l["link"].Target != "/root/gaps/f.txt" || l["up"].Target != "/root/gaps" || l["up"].Type != "dir" || l["f.txt"].Mode != 0o644 {
			t.Errorf("a listing's entries: %+v", l)
		}
	}
	var exists bool
	if get("remove-missing", &exists) && exists {
		t.Error("remove after removing a missing path: the file is still there")
	}
	type apiErr struct {
		Status int
		Body   struct {
			Code    int
			Message string
		}
	}
	var refusals map[string]apiErr
	if get("refusals", &refusals) {
		if r := refusals["volumes"]; r.Status != 501 || r.Body.Code != 501 || !strings.Contains(r.Body.Message, "volumes are not supported") {
			t.Errorf("GET /volumes: %+v, want 501 in E2B's shape with its reason", r)
		}
		if r := refusals["unknown"]; r.Status != 404 || r.Body.Code != 404 || !strings.Contains(r.Body.Message, "/no/such/route") {
			t.Errorf("an unknown route: %+v, want 404 in E2B's shape naming it", r)
		}
	}

	var killed string
	if get("killed-during-run", &killed) && (!strings.HasPrefix(killed, "TimeoutError: ") || !strings.Contains(killed, "sandbox was killed or reached its end of life")) {
		t.Errorf("a command of a sandbox killed while it ran: %q, want the SDK's TimeoutError that says the sandbox was killed", killed)
	}
	var running bool
	if get("killed-is-running", &running) && running {
		t.Error("isRunning() of a killed sandbox: true")
	}
	for _, step := range []string{"connect-killed", "fork-killed"} {
		var e string
		if get(step, &e) && e != "SandboxNotFoundError" {
			t.Errorf("%s: %q, want SandboxNotFoundError", step, e)
		}
	}
	var status int
	if get("pause-killed", &status) && status != 404 {
		t.Errorf("a refused route of a killed sandbox: %d, want 404 before any refusal", status)
	}
	var shorten struct{ Before, After bool }
	if get("shorten", &shorten) && (!shorten.Before || shorten.After) {
		t.Errorf("setTimeout(2 s): running before %v, 4 s after %v", shorten.Before, shorten.After)
	}
	if t.Failed() {
		t.Logf("client output:\n%s\n%s", out, stderr.String())
	}
}
