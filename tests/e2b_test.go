package tests

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestE2B: the unmodified `e2b` SDK (from npm), as nobody with an API key of nobody's, drives real
// Benches through `shed daemon --e2b`: create from a Workshop record, list, info, apt-get install
// through the recipe's network profile, write and run a script with the sandbox's and the command's
// variables, read files back (text, bytes, a relative path), list, make and remove directories,
// exit codes, streamed output, a background command killed, stdin, a proposal from inside the
// Bench, the timeout moved, kill, and the errors (a killed sandbox, an unknown template, a bad key,
// a sandbox past its timeout). While the Bench runs, the key and the sandbox's access token are
// looked for in every process's environment and arguments, the store's new paths, its state, the
// audit log and the daemon's log: they are in none. A removed key is refused from its next request.
func TestE2B(t *testing.T) {
	parallel(t) // see parallelTests in main_test.go
	requireRoot(t)
	root := sharedRoot(t)
	addr := freeLoopback(t)
	sock, logPath := daemonWith(t, root, "--e2b", addr)
	dir := npmPackage(t, "e2b", "e2b", "2.51.0")
	client := filepath.Join(dir, "e2b-client.mjs")
	writeFile(t, client, string(must(os.ReadFile("testdata/e2b-client.mjs"))))
	uid := nobodyUID(t)

	name := e2bRecord(t, sock) // the shared jq record (e2bShared)
	made := via(t, sock, 0, "", "--json", "agent", "key", "create", "nobody")
	var key struct{ Key, ID, User string }
	if err := json.Unmarshal([]byte(made.stdout), &key); err != nil || !strings.HasPrefix(key.Key, "e2b_") || key.User != "nobody" {
		t.Fatalf("agent key create: %v %q %s", err, made.stdout, made.stderr)
	}
	if r := via(t, sock, 0, "", "agent", "key", "ls"); !strings.Contains(r.stdout, key.ID) || strings.Contains(r.stdout, key.Key) {
		t.Errorf("agent key ls: %q", r.stdout)
	}
	if r := via(t, sock, uid, "", "agent", "key", "create", "nobody"); r.code == 0 || !strings.Contains(r.stderr, "agent.key_create is for operators") {
		t.Errorf("a user made a key: %d %s", r.code, r.stderr)
	}
	pathsBefore := storePaths(t, root)

	cmd := exec.Command("node", client, name, "hello", "hold")
	cmd.Env = append(os.Environ(), "HOME=/", "E2B_API_URL=http://"+addr, "E2B_SANDBOX_URL=http://"+addr, "E2B_API_KEY="+key.Key)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdin := must(cmd.StdinPipe())
	stdout := must(cmd.StdoutPipe())
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	var token string
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		out.Write(sc.Bytes())
		out.WriteByte('\n')
		if strings.HasPrefix(sc.Text(), `{"step":"create"`) {
			var s struct {
				Value struct {
					Value struct{ Token string } `json:"value"`
				} `json:"value"`
			}
			json.Unmarshal(sc.Bytes(), &s)
			token = s.Value.Value.Token
		}
		if strings.HasPrefix(sc.Text(), `{"step":"hold"`) {
			secrets := map[string]string{"API key": key.Key, "access token": token}
			if token == "" {
				t.Error("the create step gave no access token")
			}
			noSecrets(t, root, logPath, pathsBefore, cmd.Process.Pid, secrets)
			othersCannot(t, sock, addr, holdID(out.Bytes()))
			io.WriteString(stdin, "go\n")
			stdin.Close()
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the e2b client: %v\n%s\n%s", err, out.String(), stderr.String())
	}
	steps := clientSteps(out.Bytes())
	type step struct {
		OK    bool            `json:"ok"`
		Value json.RawMessage `json:"value"`
		Error string          `json:"error"`
	}
	get := func(n string) step {
		t.Helper()
		var s step
		if err := json.Unmarshal(steps[n], &s); err != nil {
			t.Fatalf("step %s: %v (%s)\nall output:\n%s\n%s", n, err, steps[n], out.String(), stderr.String())
		}
		return s
	}
	ok := func(n, want string) {
		t.Helper()
		if s := get(n); !s.OK || !strings.Contains(string(s.Value), want) {
			t.Errorf("%s: %+v (%s), want it to succeed with %s", n, s, s.Value, want)
		}
	}
	fails := func(n, want string) {
		t.Helper()
		if s := get(n); s.OK || !strings.Contains(s.Error, want) {
			t.Errorf("%s: %+v (%s), want an error with %q", n, s, s.Value, want)
		}
	}
	ok("create", `"id":"`+name)
	ok("list", `"template":"`+name+`","metadata":{"purpose":"test"}`)
	ok("info", `"state":"running"`)
	ok("install", `"exitCode":0,"stdout":"installed\n"`)
	ok("write", `"path":"/root/work/run.sh"`)
	ok("run", `"stdout":"ran in /root/work with hi and more\n"`)
	ok("read", `"Hello, world!\n"`)
	ok("relative", `"relative"`)
	ok("bytes", `true`)
	ok("many", `["A","B"]`)
	ok("fast", `true`)
	ok("ls", `[{"name":"out.txt","type":"file","path":"/root/work/out.txt","size":14},{"name":"run.sh","type":"file","path":"/root/work/run.sh"`)
	ok("mkdir", `[true,false]`)
	ok("exists", `[true,false]`)
	ok("remove", `false`)
	fails("missing-file", "FileNotFoundError")
	fails("exit-code", "CommandExitError: exit status 3")
	ok("streamed", `{"chunks":3,"stdout":"line 1\nline 2\nline 3\n"}`)
	ok("background-kill", `{"listed":true,"killed":true,"ended":"CommandExitError"}`)
	ok("reconnect-command", `"stdout":"late\n"`)
	ok("rename", `{"path":"/root/new/place.txt","content":"moved","old":false}`)
	ok("stat", `{"name":"run.sh","type":"file","size":72,"permissions":"-rw-r--r--","owner":"root"}`)
	ok("connect", `"again\n"`)
	ok("stdin", `"stdout":"got hello\n"`)
	ok("propose", `adds: apt hello=`)
	ok("timeout", ``)
	if s := get("info-after-timeout"); !s.OK {
		t.Errorf("info after setTimeout: %+v", s)
	} else if ms, _ := strconv.Atoi(string(s.Value)); ms < 100_000 || ms > 121_000 {
		t.Errorf("setTimeout(120 s): the sandbox ends in %d ms", ms)
	}
	ok("kill", `true`)
	ok("list-after", `false`) // the killed sandbox is not listed
	fails("run-after-kill", "AuthenticationError")
	fails("no-template", "404: template \"no-such-template\"")
	fails("bad-key", "AuthenticationError")
	ok("short", name)
	ok("short-after", "false")

	// What the harness did is in the audit log as nobody's, through the key (its id, never the key).
	audit := via(t, sock, 0, "", "--json", "audit", "--user", "nobody")
	var entries []struct{ Via, Event, Bench string }
	if err := json.Unmarshal([]byte(audit.stdout), &entries); err != nil {
		t.Fatalf("audit --json: %v\n%s", err, audit.stdout)
	}
	events := map[string]int{}
	for _, e := range entries {
		if e.Via == "e2b key "+key.ID {
			events[e.Event]++
		}
	}
	for _, ev := range []string{"bench.create", "bench.start", "bench.exec", "bench.write_files", "bench.make_dir", "bench.remove_file", "bench.set_lifetime", "bench.rm", "bench.end"} {
		if events[ev] == 0 {
			t.Errorf("the audit log has no %s through key %s: %v", ev, key.ID, events)
		}
	}
	if strings.Contains(audit.stdout, key.Key) {
		t.Error("the audit log holds the key")
	}
	// The record is as it was: the agent proposed; a human promotes.
	if r := via(t, sock, 0, "", "workshop", "log", name); strings.Contains(r.stdout, "version 2") {
		t.Errorf("the record changed:\n%s", r.stdout)
	}
	// A removed key is refused from its next request.
	if r := via(t, sock, 0, "", "agent", "key", "rm", key.ID); r.code != 0 {
		t.Fatalf("agent key rm: %s", r.stderr)
	}
	req := must(http.NewRequest("POST", "http://"+addr+"/v2/sandboxes", strings.NewReader(`{"templateID":"`+name+`"}`)))
	req.Header.Set("X-API-Key", key.Key)
	resp := must(http.DefaultClient.Do(req))
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("create with a removed key: %s, want 401", resp.Status)
	}
}

// holdID is the sandbox the client named when it stopped to be looked at.
func holdID(out []byte) string {
	var s struct{ Value string }
	json.Unmarshal(clientSteps(out)["hold"], &s.Value)
	return s.Value
}

// othersCannot: a key of another user (daemon) neither sees, reads, nor kills nobody's sandbox, and
// the sandbox still runs after.
func othersCannot(t *testing.T, sock, addr, id string) {
	t.Helper()
	made := via(t, sock, 0, "", "--json", "agent", "key", "create", "daemon")
	var other struct{ Key string }
	if err := json.Unmarshal([]byte(made.stdout), &other); err != nil {
		t.Fatalf("agent key create daemon: %v %s", err, made.stderr)
	}
	call := func(method, path, body string) (int, string) {
		req := must(http.NewRequest(method, "http://"+addr+path, strings.NewReader(body)))
		req.Header.Set("X-API-Key", other.Key)
		resp := must(http.DefaultClient.Do(req))
		defer resp.Body.Close()
		return resp.StatusCode, string(must(io.ReadAll(resp.Body)))
	}
	if code, body := call("GET", "/v2/sandboxes", ""); code != 200 || strings.Contains(body, id) {
		t.Errorf("another user's list: %d %s", code, body)
	}
	for _, c := range [][2]string{{"GET", "/sandboxes/" + id}, {"DELETE", "/sandboxes/" + id}, {"POST", "/sandboxes/" + id + "/timeout"}} {
		if code, body := call(c[0], c[1], `{"timeout":1}`); code != 404 {
			t.Errorf("another user's %s %s: %d %s, want 404", c[0], c[1], code, body)
		}
	}
	if r := via(t, sock, 0, "", "bench", "ls"); !strings.Contains(r.stdout, id) {
		t.Errorf("nobody's sandbox %s is gone after another user's requests:\n%s", id, r.stdout)
	}
}

// freeLoopback is a loopback address with a port free now.
func freeLoopback(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// storePaths lists the store's paths.
func storePaths(t *testing.T, root string) map[string]bool {
	t.Helper()
	es, err := os.ReadDir(filepath.Join(root, "store"))
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]bool{}
	for _, e := range es {
		m[e.Name()] = true
	}
	return m
}

// noSecrets looks for each secret in every process's environment and command line but the client's,
// in the store (its paths made since before, and all of its state outside store/: records, Benches
// and their upper layers, logs, the audit log, the keys) and in the daemon's log.
func noSecrets(t *testing.T, root, daemonLog string, pathsBefore map[string]bool, clientPid int, secrets map[string]string) {
	t.Helper()
	check := func(where string, b []byte) {
		for what, s := range secrets {
			if s != "" && bytes.Contains(b, []byte(s)) {
				t.Errorf("the %s is in %s", what, where)
			}
		}
	}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		if p == "/proc/"+strconv.Itoa(clientPid) || p == "/proc/self" {
			continue
		}
		for _, f := range []string{"environ", "cmdline"} {
			if b, err := os.ReadFile(filepath.Join(p, f)); err == nil {
				check(p+"/"+f, b)
			}
		}
	}
	check(daemonLog, must(os.ReadFile(daemonLog)))
	files := 0
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		parts := strings.Split(rel, string(filepath.Separator))
		if len(parts) >= 2 && parts[0] == "store" && pathsBefore[parts[1]] {
			return filepath.SkipDir // a path made before the key was
		}
		if d.Type().IsRegular() {
			if b, err := os.ReadFile(p); err == nil {
				files++
				check(p, b)
			}
		}
		return nil
	})
	if files < 10 {
		t.Errorf("looked for secrets in only %d files of %s", files, root)
	}
}
