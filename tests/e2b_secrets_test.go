package tests

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestE2BSecrets: E2B's secrets through the unmodified `e2b` SDK (tests/testdata/e2b-secrets.mjs), as
// nobody with a key of nobody's, against `shed daemon --e2b` whose proxies trust the test's API CA.
// The client makes a secret whose value is the test API's token (read from its stdin), lists it a
// page at a time, reads it by name and id, updates it, and is refused a name taken, a missing
// secret, a bare * rule and a rule naming a secret it has none of. A sandbox made with a header
// transform (network.rules: Authorization "Bearer " + Secret.fill(NAME)) on a Workshop of its own
// (curl, ca-certificates, both hosts allowed) then calls the API with no header of its own and is
// welcomed (the proxy set it), gets an echo of the header masked, reaches the attacker host over
// HTTPS and HTTP (nothing set: it gets no token), dumps its environment and every process's (no
// token), is refused an update that sets rules or clears them (they are the create's) and keeps
// them through one that leaves them out. Meanwhile, a key of another user (daemon) neither lists,
// reads, updates nor removes nobody's secret, nor takes its name, nor names it (by name or id) in a
// create's rules (404 naming it). Once the secret is destroyed, the next request is refused (403,
// revoked). The token and its base64 and hex forms are then looked for in all the client printed,
// all the attacker host got, the daemon's log, every process's environment and command line, and
// every file under the store's root but the secrets' own directory: none; the API got it.
func TestE2BSecrets(t *testing.T) {
	parallel(t)
	requireRoot(t)
	root := sharedRoot(t)
	var rb [12]byte
	rand.Read(rb[:])
	token := "tok-" + hex.EncodeToString(rb[:])
	h := startSecretHosts(t, token)
	addr := freeLoopback(t)
	sock, logPath := daemonEnv(t, root, []string{"SSL_CERT_FILE=" + h.CAFile}, "--e2b", addr)
	dir := npmPackage(t, "e2b", "e2b", "2.51.0")
	client := filepath.Join(dir, "e2b-secrets.mjs")
	writeFile(t, client, string(must(os.ReadFile("testdata/e2b-secrets.mjs"))))
	uid := nobodyUID(t)

	suffix := strconv.Itoa(os.Getpid())
	name := "e2bsec-" + suffix
	secretName := "e2b-api-token-" + suffix
	f := writeFile(t, filepath.Join(t.TempDir(), "workshop.toml"), fmt.Sprintf(`name = %q
seed = "debian/bookworm"
[apt]
packages = ["curl", "ca-certificates"]
[network]
allow = [%q, %q]
`, name, h.API, h.Attacker))
	if r := via(t, sock, 0, "", "workshop", "add", "--allow", "nobody", "--allow", "daemon", f); r.code != 0 {
		t.Fatalf("workshop add: %s", r.stderr)
	}
	keyOf := func(user string) string {
		t.Helper()
		made := via(t, sock, 0, "", "--json", "agent", "key", "create", user)
		var key struct{ Key string }
		if err := json.Unmarshal([]byte(made.stdout), &key); err != nil || key.Key == "" {
			t.Fatalf("agent key create %s: %v %s", user, err, made.stderr)
		}
		return key.Key
	}
	key, other := keyOf("nobody"), keyOf("daemon")
	t.Cleanup(func() { // if the client did not get to destroy them
		via(t, sock, 0, "", "secret", "rm", secretName)
		via(t, sock, 0, "", "secret", "rm", secretName+"-second")
	})
	call := func(key, method, path, body string) (int, string) {
		t.Helper()
		req := must(http.NewRequest(method, "http://"+addr+path, strings.NewReader(body)))
		req.Header.Set("X-API-Key", key)
		resp := must(http.DefaultClient.Do(req))
		defer resp.Body.Close()
		return resp.StatusCode, string(must(io.ReadAll(resp.Body)))
	}
	forms := secretForms(token)
	var leaks []string
	check := func(where string, b []byte) {
		for what, v := range forms {
			if bytes.Contains(b, []byte(v)) {
				leaks = append(leaks, fmt.Sprintf("the token's %s is in %s", what, where))
			}
		}
	}

	cmd := exec.Command("node", client, name, h.API, h.Attacker, secretName)
	cmd.Env = append(os.Environ(), "HOME=/", "E2B_API_URL=http://"+addr, "E2B_SANDBOX_URL=http://"+addr, "E2B_API_KEY="+key)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdin := must(cmd.StdinPipe())
	stdout := must(cmd.StdoutPipe())
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	io.WriteString(stdin, token+"\n") // never an argument or a variable: /proc shows those
	var out bytes.Buffer
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	held := false
	for sc.Scan() {
		out.Write(sc.Bytes())
		out.WriteByte('\n')
		if !strings.HasPrefix(sc.Text(), `{"step":"hold"`) {
			continue
		}
		held = true
		var made struct {
			Value struct{ SecretID string } `json:"value"`
		}
		json.Unmarshal(clientSteps(out.Bytes())["create-secret"], &made)
		othersCannotUse(t, call, other, name, h.API, secretName, made.Value.SecretID)
		// While the sandbox runs: every process (the Bench's too) and every file of the root (its
		// upper, its record, the network logs, the audit log), but the secrets' own.
		secretsNowhere(t, root, check)
		io.WriteString(stdin, "go\n")
		stdin.Close()
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the e2b client: %v\n%s\n%s", err, out.String(), stderr.String())
	}
	if !held {
		t.Errorf("the client did not get to its sandbox:\n%s\n%s", out.String(), stderr.String())
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
	// ok: the step succeeded with each of want in its value (a command's output: as JSON writes it).
	ok := func(n string, want ...string) {
		t.Helper()
		s := get(n)
		var text string
		if json.Unmarshal(s.Value, &text) != nil {
			text = string(s.Value)
		}
		for _, w := range want {
			if !s.OK || !strings.Contains(text, w) {
				t.Errorf("%s: %+v (%s), want it to succeed with %q", n, s, s.Value, w)
			}
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
	ok("create-secret", `"name":"`+secretName+`","version":1,"metadata":{"purpose":"test"},"dates":true`)
	ok("create-second", `"name":"`+secretName+`-second"`)
	ok("list", `"mine":true`, `"sorted":true`)
	if s := get("list"); !strings.Contains(string(s.Value), `"pages":`) || strings.Contains(string(s.Value), `"pages":1,`) {
		t.Errorf("list with limit 1 of two secrets or more: %s, want two pages or more", s.Value)
	}
	ok("info", `"name":"`+secretName+`","version":1`)
	if s := get("info"); strings.Count(string(s.Value), `"secretId":"sec_`) != 2 {
		t.Errorf("info by name and by id: %s", s.Value)
	}
	ok("exists", `[true,false]`)
	fails("info-missing", "SecretNotFoundError")
	fails("taken", "409", "exists already")
	ok("update", `"version":2,"metadata":{"purpose":"test","rotated":"yes"}`)
	fails("update-missing", "SecretNotFoundError")
	fails("bad-rule", `network.rules["*"]: a bare * would send the headers`)
	fails("unknown-secret", "404", "secret no-such-secret")
	ok("create", name)
	ok("api", "welcome to the API", " rc=0")
	stars := strings.Repeat("*", len(token))
	ok("echo", "Authorization: Bearer "+stars, "X-Echo-Authorization: Bearer "+stars)
	ok("attacker-https", "thanks", " rc=0")
	ok("attacker-http", "thanks", " rc=0")
	ok("attacker-claims-api", "thanks", " rc=0")
	ok("env", "PATH=")
	fails("update-rules", "body.rules: header transforms are not supported in an update: here they are set at create")
	fails("clear-rules", "body.rules: {} would clear the sandbox's header transforms")
	ok("update-network", "welcome to the API", " rc=0")
	ok("destroy", `[true,false,true]`)
	ok("exists-after", `false`)
	ok("revoked", "secret "+secretName+": revoked", " 403")
	ok("kill", "")

	if !strings.Contains(h.apiSaw(), "Authorization: Bearer "+token) {
		t.Errorf("the API never got the token: the proxy did not inject it:\n%s", h.apiSaw())
	}
	if n := strings.Count(h.attackerSaw(), "/steal"); n != 3 {
		t.Errorf("the attacker host got %d requests, want 3 (https, http, https with the API's Host):\n%s", n, h.attackerSaw())
	}
	check("what the client printed", out.Bytes())
	check("what the client wrote to stderr", []byte(stderr.String()))
	check("what the attacker host got", []byte(h.attackerSaw()))
	check("the daemon's log", must(os.ReadFile(logPath)))
	secretsNowhere(t, root, check)
	for _, l := range leaks {
		t.Error(l)
	}
}

// othersCannotUse: a key of another user (daemon) does not see nobody's secret in its list, cannot
// read, update or remove it (404, by name and by id), cannot take its name (409: names are one
// namespace), and cannot name it in a create's rules (404, naming it); the secret is still there.
func othersCannotUse(t *testing.T, call func(key, method, path, body string) (int, string), other, template, api, name, id string) {
	t.Helper()
	if id == "" {
		t.Fatal("the client's create-secret step gave no secret id")
	}
	if code, body := call(other, "GET", "/secrets", ""); code != 200 || strings.Contains(body, name) || strings.Contains(body, id) {
		t.Errorf("another user's list: %d %s", code, body)
	}
	for _, ref := range []string{name, id} {
		for _, c := range [][3]string{{"GET", "/secrets/" + ref, ""}, {"POST", "/secrets/" + ref, `{"value":"stolen"}`}, {"DELETE", "/secrets/" + ref, ""}} {
			if code, body := call(other, c[0], c[1], c[2]); code != 404 {
				t.Errorf("another user's %s %s: %d %s, want 404", c[0], c[1], code, body)
			}
		}
		rules := fmt.Sprintf(`{"templateID":%q,"network":{"allowOut":[%q],"rules":{%q:[{"transform":{"headers":{"Authorization":"Bearer ${e2b.secrets.%s}"}}}]}}}`, template, api, api, ref)
		if code, body := call(other, "POST", "/sandboxes", rules); code != 404 || !strings.Contains(body, "secret "+ref) {
			t.Errorf("another user's create naming %s: %d %s, want 404 naming it", ref, code, body)
		}
	}
	if code, body := call(other, "POST", "/secrets", `{"name":"`+name+`","value":"mine"}`); code != 409 {
		t.Errorf("another user's create of the same name: %d %s, want 409", code, body)
	}
	if code, body := call(other, "GET", "/v2/sandboxes", ""); code != 200 || strings.TrimSpace(body) != "[]" {
		t.Errorf("another user's sandboxes after: %d %s, want none made", code, body)
	}
}
