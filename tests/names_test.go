package tests

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestAgentFacesOneName: a Bench has one name everywhere an agent or a user looks. An E2B sandbox
// made by a real `shed daemon --e2b`, whose data plane writes a file, has every audit entry found
// by `shed audit --bench` with its name and with its id; the official MCP client's bench_list shows
// it by its Workshop record's name, not a file of the store; and the errors of both faces (a record
// that cannot be launched, an operator's agent naming a recipe file) name no host path: not the
// store's, not the socket's, nothing under /tmp, /home, /root or /run.
func TestAgentFacesOneName(t *testing.T) {
	parallel(t) // see parallelTests in main_test.go
	requireRoot(t)
	root := sharedRoot(t)
	addr := freeLoopback(t)
	sock, _ := daemonWith(t, root, "--e2b", addr, "--user-benches", "64") // the shared store holds other tests' Benches of nobody's
	uid := nobodyUID(t)
	name := "names-" + strconv.Itoa(os.Getpid())
	addAgentRecord(t, sock, name)
	// A record that cannot be launched: its lock is gone (a record's lock changes by promotion only).
	broken := "names-broken-" + strconv.Itoa(os.Getpid())
	addAgentRecord(t, sock, broken)
	if err := os.Remove(filepath.Join(root, "workshops", broken, "1", "workshop.lock")); err != nil {
		t.Fatal(err)
	}
	made := via(t, sock, 0, "", "--json", "agent", "key", "create", "nobody")
	var key struct{ Key string }
	if err := json.Unmarshal([]byte(made.stdout), &key); err != nil {
		t.Fatalf("agent key create: %v %q %s", err, made.stdout, made.stderr)
	}
	hostPath := hostPathIn(root, sock)

	e2b := func(method, path, body string, h map[string]string) (int, string) {
		t.Helper()
		req := must(http.NewRequest(method, "http://"+addr+path, strings.NewReader(body)))
		req.Header.Set("X-API-Key", key.Key)
		for k, v := range h {
			req.Header.Set(k, v)
		}
		resp := must(http.DefaultClient.Do(req))
		defer resp.Body.Close()
		return resp.StatusCode, string(must(io.ReadAll(resp.Body)))
	}
	code, body := e2b("POST", "/sandboxes", `{"templateID":"`+name+`","timeout":600}`, map[string]string{"Content-Type": "application/json"})
	var sb struct {
		SandboxID, EnvdAccessToken string
	}
	if err := json.Unmarshal([]byte(body), &sb); code != http.StatusCreated || err != nil || sb.SandboxID == "" {
		t.Fatalf("create: %d %s", code, body)
	}
	t.Cleanup(func() { e2b("DELETE", "/sandboxes/"+sb.SandboxID, "", nil) })
	// The data plane: a file written in the sandbox, by its access token.
	if code, body := e2b("POST", "/files?path=/root/hello.txt", "hello\n", map[string]string{
		"Content-Type": "application/octet-stream", "E2b-Sandbox-Id": sb.SandboxID, "X-Access-Token": sb.EnvdAccessToken,
	}); code != http.StatusOK {
		t.Fatalf("write a file: %d %s", code, body)
	}
	// An error of the control plane.
	code, body = e2b("POST", "/sandboxes", `{"templateID":"`+broken+`"}`, map[string]string{"Content-Type": "application/json"})
	if code < 400 {
		t.Errorf("create of a record without its lock: %d %s", code, body)
	}
	if p := hostPath(body); p != "" {
		t.Errorf("an E2B error names the host path %q: %s", p, body)
	}

	// The audit log, by the sandbox's name (its id in the E2B API) and by its Bench's id.
	var benches []struct{ ID, Name string }
	if err := json.Unmarshal([]byte(via(t, sock, 0, "", "--json", "bench", "ls").stdout), &benches); err != nil {
		t.Fatal(err)
	}
	id := ""
	for _, b := range benches {
		if b.Name == sb.SandboxID {
			id = b.ID
		}
	}
	if id == "" || id == sb.SandboxID {
		t.Fatalf("no Bench named %s with an id of its own: %+v", sb.SandboxID, benches)
	}
	for _, by := range []string{sb.SandboxID, id} {
		r := via(t, sock, 0, "", "--json", "audit", "--bench", by)
		var es []struct{ Event, Bench string }
		if err := json.Unmarshal([]byte(r.stdout), &es); err != nil {
			t.Fatalf("audit --bench %s: %v %s %s", by, err, r.stdout, r.stderr)
		}
		events := map[string]bool{}
		for _, e := range es {
			events[e.Event] = true
			if e.Bench != sb.SandboxID {
				t.Errorf("audit --bench %s: an entry under %q, not the Bench's name %s", by, e.Bench, sb.SandboxID)
			}
		}
		for _, want := range []string{"bench.create", "bench.start", "bench.write_files"} {
			if !events[want] {
				t.Errorf("audit --bench %s: no %s entry (the entries: %+v)", by, want, es)
			}
		}
	}

	// MCP, as nobody (a user) and as root (an operator whose agent names a recipe file).
	dir := npmPackage(t, "mcp", "@modelcontextprotocol/sdk", "1.32.2")
	client := filepath.Join(dir, "mcp-calls.mjs")
	writeFile(t, client, string(must(os.ReadFile("testdata/mcp-calls.mjs"))))
	file := writeFile(t, filepath.Join(t.TempDir(), "workshop.toml"), "name = \"from-a-file\"\nseed = \"debian/bookworm\"\n")
	type result struct {
		Error bool           `json:"error"`
		Data  map[string]any `json:"data"`
		Text  string         `json:"text"`
	}
	mcpCalls := func(uid int, calls ...[]any) map[string]result {
		t.Helper()
		cmd := exec.Command("node", client, shedBin, string(must(json.Marshal(calls))))
		cmd.Env = append(os.Environ(), "SHED_SOCKET="+sock, "SHED_ROOT=/nonexistent", "HOME=/")
		cmd.Dir = "/"
		if uid != 0 {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
		}
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("the MCP client: %v\n%s\n%s", err, out, stderr.String())
		}
		res := map[string]result{}
		for step, raw := range clientSteps(out) {
			var r result
			if err := json.Unmarshal(raw, &r); err != nil {
				t.Fatalf("step %s: %v (%s)", step, err, raw)
			}
			res[step] = r
		}
		return res
	}
	user := mcpCalls(uid,
		[]any{"list", "bench_list", map[string]any{}},
		[]any{"broken", "bench_create", map[string]any{"workshop": broken}},
	)
	listed := false
	for _, b := range user["list"].Data["benches"].([]any) {
		b := b.(map[string]any)
		if ws, _ := b["workshop"].(string); strings.Contains(ws, "/") {
			t.Errorf("bench_list shows a path for a Bench's Workshop: %v", b)
		}
		if b["name"] == sb.SandboxID {
			listed = true
			if b["workshop"] != name || b["version"] != 1.0 {
				t.Errorf("bench_list: the sandbox's Workshop is %v version %v, want the record %s version 1", b["workshop"], b["version"], name)
			}
		}
	}
	if !listed {
		t.Errorf("bench_list does not list the sandbox %s: %+v", sb.SandboxID, user["list"])
	}
	op := mcpCalls(0, []any{"file", "bench_create", map[string]any{"workshop": file}})
	for what, r := range map[string]result{"bench_create of a record without its lock": user["broken"], "an operator's bench_create of a recipe file": op["file"]} {
		if !r.Error {
			t.Errorf("%s: %+v, want an error", what, r)
		}
		if p := hostPath(r.Text); p != "" {
			t.Errorf("%s: the MCP error names the host path %q: %s", what, p, r.Text)
		}
	}
}

// hostPathIn returns what finds a host path in an agent's answer: the store's root (as given and as
// resolved), the supervisor's socket or its directory, or any path under /tmp, /home, /root or /run
// (a quoted, spaced or parenthesized absolute path).
func hostPathIn(root, sock string) func(string) string {
	fixed := []string{root, filepath.Dir(sock)}
	if r, err := filepath.EvalSymlinks(root); err == nil {
		fixed = append(fixed, r)
	}
	under := regexp.MustCompile(`(?:^|[\s"'(=:])(/(?:tmp|home|root|run)/[^\s"')]*)`)
	return func(s string) string {
		for _, p := range fixed {
			if strings.Contains(s, p) {
				return p
			}
		}
		if m := under.FindStringSubmatch(s); m != nil {
			return m[1]
		}
		return ""
	}
}
