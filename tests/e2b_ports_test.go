package tests

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestE2BPorts: through the unmodified `e2b` SDK (as nobody, with nobody's key), a server in a Bench
// is reached at sandbox.getHost(port) on the daemon's E2B address: HTTP and a WebSocket; a port
// nothing listens on is E2B's 502 body, and bad port hosts a 400; a sandbox made with
// allowPublicTraffic false refuses requests without its traffic token (403) and takes them with it,
// the token never reaching the server and the Host the server sees being maskRequestHost's; signed
// file URLs (downloadUrl, uploadUrl) work without the token, and an expired, altered or misused one is
// envd's 401. Another local user is refused the sandbox's port, which serves its owner after; a
// killed sandbox's host is E2B's 502 "not found".
func TestE2BPorts(t *testing.T) {
	parallel(t) // see parallelTests in main_test.go
	requireRoot(t)
	root := sharedRoot(t)
	addr := freeLoopback(t)
	sock, _ := daemonWith(t, root, "--e2b", addr)
	dir := npmPackage(t, "e2b-ports", "e2b", "2.51.0")
	npmPackage(t, "e2b-ports", "ws", "8.23.1")
	client := filepath.Join(dir, "e2b-ports.mjs")
	writeFile(t, client, string(must(os.ReadFile("testdata/e2b-ports.mjs"))))
	// The server the Bench runs (its Workshop has no python): static, so that any Bench runs it.
	server := filepath.Join(dir, "portserver")
	build := exec.Command("go", "build", "-ldflags=-s -w", "-o", server, ".")
	build.Dir, build.Env = "testdata/portserver", append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the port server: %v\n%s", err, out)
	}
	uid := nobodyUID(t)
	name := e2bRecord(t, sock) // the shared jq record (e2bShared)
	made := via(t, sock, 0, "", "--json", "agent", "key", "create", "nobody")
	var key struct{ Key string }
	if err := json.Unmarshal([]byte(made.stdout), &key); err != nil {
		t.Fatalf("agent key create: %v %s", err, made.stderr)
	}

	cmd := exec.Command("node", client, name, server)
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
	var other string
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		out.Write(sc.Bytes())
		out.WriteByte('\n')
		if strings.HasPrefix(sc.Text(), `{"step":"hold"`) {
			var s struct{ Value struct{ Host string } }
			json.Unmarshal(sc.Bytes(), &s)
			other = otherUserGets(t, addr, s.Value.Host)
			io.WriteString(stdin, "go\n")
			stdin.Close()
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the e2b client: %v\n%s\n%s", err, out.String(), stderr.String())
	}
	steps := clientSteps(out.Bytes())
	ok := func(n string, want ...string) {
		t.Helper()
		var s struct {
			OK    bool            `json:"ok"`
			Value json.RawMessage `json:"value"`
			Error string          `json:"error"`
		}
		json.Unmarshal(steps[n], &s)
		for _, w := range want {
			if !s.OK || !strings.Contains(string(s.Value), w) {
				t.Errorf("%s: %s, want it to succeed with %s\nall output:\n%s\n%s", n, steps[n], w, out.String(), stderr.String())
				return
			}
		}
	}
	ok("create", `"aSecure":true`, `"bTraffic":true`, `"host":"8000-`+name)
	ok("start", `true`)
	ok("http", `GET /some/path?q=1 host=8000-`, `token=false port=8000`)
	ok("ws", `"echo: hello over ws"`)
	ok("closed", `"status":502`, `"type":"application/json; charset=utf-8"`, `\"message\":\"The sandbox is running but port is not open\"`, `\"port\":8001`, `\"code\":502`)
	ok("bad-ports", `[400,400,400]`)
	ok("private-none", `403`)
	ok("private-wrong", `403`)
	ok("private-token", `"GET / host=8000-masked.example token=false port=8000\n"`)
	ok("signed", `{"status":200,"body":"signed content"}`)
	ok("signed-forever", `200`)
	ok("signed-expired", `{"status":401,"body":{"code":401,"message":"signature is already expired"}}`)
	ok("signed-wrong", `{"status":401,"body":{"code":401,"message":"invalid signature"}}`)
	ok("signed-upload", `"status":200`, `"path":"/root/up.txt"`, `"back":"uploaded content"`)
	ok("signed-read-as-write", `{"status":401,"back":"signed content"}`)
	if !strings.Contains(other, `"status":403`) || !strings.Contains(other, "another user's") {
		t.Errorf("another local user reached nobody's port: %s", other)
	}
	ok("after-others", `GET /again`)
	ok("killed", `"status":502`, `"message":"The sandbox was not found"`, `"code":502`)
}

// otherUserGets fetches http://HOST/ on addr as a uid that is nobody's and no account's, and returns
// the status and body it got.
func otherUserGets(t *testing.T, addr, host string) string {
	t.Helper()
	script := `const http = require("node:http");
http.get({ host: "127.0.0.1", port: process.argv[1], path: "/", headers: { host: process.argv[2] } }, (res) => {
  let b = ""; res.on("data", (d) => (b += d)); res.on("end", () => console.log(JSON.stringify({ status: res.statusCode, body: b })));
}).on("error", (e) => console.log(JSON.stringify({ error: e.message })));`
	_, port, _ := strings.Cut(addr, ":")
	cmd := exec.Command("node", "-e", script, port, host)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 54321, Gid: 54321}}
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Errorf("another user's request: %v %s", err, b)
	}
	return string(b)
}
