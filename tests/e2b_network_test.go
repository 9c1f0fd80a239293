package tests

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestE2BNetwork: per-sandbox network rules through the unmodified `e2b` SDK, always within the
// Workshop's network profile. The test host (a network namespace at 198.51.100.2, with a second
// address, 198.51.100.6) serves a fast and a 120-second slow answer on port 8000; the profile allows
// both addresses there. A rule outside the profile is refused at create and at update; a sandbox
// created with denyOut reaches one and not the other; bad updates (a malformed CIDR, a rule outside
// the profile, 10,000 rules, a header transform) are refused and change nothing, the connections open
// stay open; an update cuts a slow response and a CONNECT tunnel in flight within seconds and applies
// to the next connection; an empty update restores the profile, allowInternetAccess false denies all.
// The refusals and the cuts are in the Bench's network log and the audit log, with each update.
func TestE2BNetwork(t *testing.T) {
	requireRoot(t)
	root := sharedRoot(t)
	www := t.TempDir()
	startTestHost(t, www)
	const a, b = "198.51.100.2", "198.51.100.6"
	slowServer(t, b)

	addr := freeLoopback(t)
	sock, _ := daemonWith(t, root, "--e2b", addr)
	dir := npmPackage(t, "e2b", "e2b", "2.51.0")
	client := filepath.Join(dir, "e2b-network.mjs")
	writeFile(t, client, string(must(os.ReadFile("testdata/e2b-network.mjs"))))
	uid := nobodyUID(t)

	name := "e2bnet-" + strconv.Itoa(os.Getpid())
	f := writeFile(t, filepath.Join(t.TempDir(), "workshop.toml"), fmt.Sprintf(`name = %q
seed = "debian/bookworm"
[apt]
packages = ["curl"]
[network]
allow = ["%s:8000", "%s:8000"]
`, name, a, b))
	if r := via(t, sock, 0, "", "workshop", "add", "--allow", "nobody", f); r.code != 0 {
		t.Fatalf("workshop add: %s", r.stderr)
	}
	made := via(t, sock, 0, "", "--json", "agent", "key", "create", "nobody")
	var key struct{ Key string }
	if err := json.Unmarshal([]byte(made.stdout), &key); err != nil {
		t.Fatalf("agent key create: %v %s", err, made.stderr)
	}

	cmd := exec.Command("node", client, name, a, b, "203.0.113.9")
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
	var out []byte
	var logs, audit result
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		out = append(append(out, sc.Bytes()...), '\n')
		if bench, ok := strings.CutPrefix(sc.Text(), `{"step":"hold","value":"`); ok {
			// The Bench's network log and audit entries, while it runs (a created Bench is not kept).
			bench = strings.TrimSuffix(bench, `"}`)
			logs = via(t, sock, 0, "", "bench", "logs", bench)
			audit = via(t, sock, 0, "", "--json", "audit", "--bench", bench)
			io.WriteString(stdin, "go\n")
			stdin.Close()
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the e2b client: %v\n%s\n%s", err, out, stderr.String())
	}
	steps := clientSteps(out)
	type step struct {
		OK    bool            `json:"ok"`
		Value json.RawMessage `json:"value"`
		Error string          `json:"error"`
	}
	get := func(n string) step {
		t.Helper()
		var s step
		if err := json.Unmarshal(steps[n], &s); err != nil {
			t.Fatalf("step %s: %v (%s)\nall output:\n%s\n%s", n, err, steps[n], out, stderr.String())
		}
		return s
	}
	ok := func(n, want string) {
		t.Helper()
		if s := get(n); !s.OK || !strings.Contains(string(s.Value), want) {
			t.Errorf("%s: %+v (%s), want it to succeed with %s", n, s, s.Value, want)
		}
	}
	fails := func(n string, want ...string) {
		t.Helper()
		s := get(n)
		for _, w := range want {
			if s.OK || !strings.Contains(s.Error, w) {
				t.Errorf("%s: %+v (%s), want an error with %q", n, s, s.Value, w)
			}
		}
	}
	// What the reach commands print, JSON-encoded: the body and the status, for A then B.
	reach := func(aOK, bOK bool) string {
		line := func(host string, ok bool) string {
			if ok {
				return `fast 200\n`
			}
			return `shed proxy: ` + host + `:8000 is denied by this sandbox's network rules\n 403\n`
		}
		return line(a, aOK) + line(b, bOK)
	}
	profile := fmt.Sprintf("outside the recipe's network profile, which allows %s:8000, %s:8000", a, b)
	fails("refused-create", `allow entry 0 ("203.0.113.9")`, profile)
	ok("create", name)
	ok("create-rules", reach(true, false))
	ok("info", `{"allowOut":[],"denyOut":["`+b+`"]}`)
	ok("open", "open")
	fails("bad-cidr", `deny entry 0 ("8.8.8.8/33"): malformed CIDR block`)
	fails("bad-profile", `allow entry 1 ("203.0.113.9")`, profile)
	fails("bad-many", "10000 deny entries, at most 1024")
	fails("bad-transform", "body.rules: header transforms are not supported")
	ok("still", `{"rcFiles":"0","reach":"`+reach(true, false)+`"}`)
	ok("update", `"cutWithin5s":true`)
	if s := get("update"); s.OK && strings.Contains(string(s.Value), `"0"`) {
		t.Errorf("update: a cut connection ended with exit 0 (%s): a cut must not look complete", s.Value)
	}
	ok("after-update", reach(false, true))
	ok("info-after", `{"allowOut":["`+b+`"],"denyOut":["0.0.0.0/0"]}`)
	ok("clear", reach(true, true))
	ok("internet-off", reach(false, false))
	ok("kill", "")

	// The Bench's network log: the refusals, and the two connections cut.
	if logs.code != 0 {
		t.Fatalf("bench logs: %s", logs.stderr)
	}
	var refused, cut int
	for _, l := range strings.Split(strings.TrimSpace(logs.stdout), "\n") {
		var d struct {
			Method, Host, Reason string
			Allowed, Cut         bool
		}
		json.Unmarshal([]byte(l), &d)
		if !d.Allowed && d.Reason == "denied by network rules" {
			refused++
		}
		if d.Cut && d.Allowed && d.Host == a && strings.HasPrefix(d.Reason, "cut:") {
			cut++
		}
	}
	// B at create and still; A after the update; both with internet off.
	if refused != 5 || cut != 2 {
		t.Errorf("network log: %d refused by the rules (want 5), %d cut (want 2):\n%s", refused, cut, logs.stdout)
	}
	// The audit log: each update (the refused ones with their error) and what the proxy refused and cut.
	var entries []struct{ Event, Dest, Detail, Error string }
	if err := json.Unmarshal([]byte(audit.stdout), &entries); err != nil {
		t.Fatalf("audit --json: %v\n%s", err, audit.stdout)
	}
	count := map[string]int{}
	var failedUpdates []string
	for _, e := range entries {
		count[e.Event]++
		if e.Event == "bench.set_network" && e.Error != "" {
			failedUpdates = append(failedUpdates, e.Error)
		}
	}
	if count["bench.set_network"] != 6 || len(failedUpdates) != 3 || count["net.cut"] != 2 || count["net.refused"] != 5 {
		t.Errorf("audit: %v, failed updates %q:\n%s", count, failedUpdates, audit.stdout)
	}
}

// slowServer serves the test host's port 8000 on every address of its namespace (with second, added):
// /fast answers "fast", /slow a line every 100 ms for 120 s.
func slowServer(t *testing.T, second string) {
	t.Helper()
	n := int(hosts.Load())
	ns := fmt.Sprintf("shedtest-%d-%d", os.Getpid(), n)
	veth := fmt.Sprintf("shv%d", (os.Getpid()*10+n)%100000)
	peer := fmt.Sprintf("shp%d", (os.Getpid()*10+n)%100000)
	script := fmt.Sprintf("ip -n %s addr add %s/32 dev %s && ip route add %s/32 dev %s", ns, second, peer, second, veth)
	if out, err := exec.Command("sh", "-ec", script).CombinedOutput(); err != nil {
		t.Fatalf("second address: %v\n%s", err, out)
	}
	py := `
import http.server, time
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        if self.path == "/fast":
            self.send_response(200); self.send_header("Content-Length", "4"); self.end_headers()
            self.wfile.write(b"fast"); return
        self.send_response(200); self.send_header("Content-Length", str(2 * 1200)); self.end_headers()
        for _ in range(1200):
            self.wfile.write(b"x\n"); self.wfile.flush(); time.sleep(0.1)
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("0.0.0.0", 8000), H).serve_forever()
`
	server := exec.Command("ip", "netns", "exec", ns, "python3", "-c", py)
	server.SysProcAttr = dieWithTests()
	if err := server.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Process.Kill(); server.Wait() })
	for i := 0; i < 100; i++ {
		if out, err := exec.Command("curl", "-s", "--noproxy", "*", "http://"+second+":8000/fast").Output(); err == nil && string(out) == "fast" {
			return
		}
		exec.Command("sleep", "0.05").Run()
	}
	t.Fatal("the slow server does not answer")
}
