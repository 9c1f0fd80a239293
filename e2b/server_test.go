package e2b

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"toolshed.dev/shed/apikey"
	"toolshed.dev/shed/app"
	"toolshed.dev/shed/bench"
	"toolshed.dev/shed/e2b/envd/filesystem"
	"toolshed.dev/shed/e2b/envd/filesystem/filesystemconnect"
	"toolshed.dev/shed/e2b/envd/process"
	"toolshed.dev/shed/e2b/envd/process/processconnect"
	"toolshed.dev/shed/policy"
	"toolshed.dev/shed/records"
	"toolshed.dev/shed/store"
)

// server is an E2B API over a new store with one record, "tools", that nobody may launch, and a key
// for nobody. Its callers are identified as the socket would, except that no user is an operator.
func server(t *testing.T) (*httptest.Server, string, string) {
	t.Helper()
	s, key, root := newServer(t)
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(hs.Close)
	return hs, key, root
}

// newServer is server's Server, not yet serving.
func newServer(t *testing.T) (*Server, string, string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the store is root-only (CI runs as root)")
	}
	root := filepath.Join(t.TempDir(), "root")
	st, err := store.Init(root)
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	f := &records.Files{Recipe: []byte("name = \"tools\"\nseed = \"debian/bookworm\"\n"), Lock: []byte("# lock\n"), Extra: map[string][]byte{}}
	if _, err := records.Open(root).Add(context.Background(), records.Version{Name: "tools", By: "root", Users: []string{"nobody"}}, f, nil); err != nil {
		t.Fatal(err)
	}
	svc := &app.Service{Root: root, Version: "test", Policy: policy.Check, Detached: &app.Detached{Ctx: context.Background()}}
	keys := apikey.Open(root)
	key, _, err := keys.Create("nobody")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Service: svc, Keys: keys, CallerOf: func(uid, gid uint32, _ string) *app.Caller {
		return &app.Caller{UID: uid, GID: gid, User: "nobody", Role: app.User}
	}}
	return s, key, root
}

func do(t *testing.T, hs *httptest.Server, method, path, key, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, hs.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("X-API-Key", key)
	}
	resp, err := hs.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestControlPlaneRefusals: no key, a wrong key, a template that is no record the user may launch,
// what shed does not do (an egress proxy, volumes), malformed network rules and transforms, another
// user's or an unknown sandbox: each is refused with its status and a message that says what to do,
// and nothing is created.
func TestControlPlaneRefusals(t *testing.T) {
	hs, key, root := server(t)
	cases := []struct {
		name, method, path, key, body string
		status                        int
		want                          string
	}{
		{"no key", "POST", "/v2/sandboxes", "", `{"templateID":"tools"}`, 401, "shed agent key create"},
		{"wrong key", "POST", "/v2/sandboxes", "e2b_" + strings.Repeat("0", 40), `{"templateID":"tools"}`, 401, "E2B_API_KEY"},
		{"a key's hash", "GET", "/v2/sandboxes", hashOf(t, root), ``, 401, ""},
		{"no template", "POST", "/v2/sandboxes", key, `{}`, 400, "templateID"},
		{"unknown template", "POST", "/v2/sandboxes", key, `{"templateID":"nope"}`, 404, "shed workshop allow"},
		{"a file as template", "POST", "/v2/sandboxes", key, `{"templateID":"/etc/shadow"}`, 404, "no Workshop record"},
		{"malformed CIDR", "POST", "/v2/sandboxes", key, `{"templateID":"tools","network":{"allowOut":["8.8.8.8/33"]}}`, 400, `allow entry 0 (\"8.8.8.8/33\"): malformed CIDR block`},
		{"malformed name", "POST", "/v2/sandboxes", key, `{"templateID":"tools","network":{"denyOut":["1.1.1.1","a b"]}}`, 400, `deny entry 1 (\"a b\")`},
		{"malformed transforms", "POST", "/v2/sandboxes", key, `{"templateID":"tools","network":{"rules":{"*":[{"transform":{"headers":{"A":"b"}}}]}}}`, 400, `network.rules[\"*\"]: a bare *`},
		{"egress proxy", "POST", "/v2/sandboxes", key, `{"templateID":"tools","network":{"egressProxy":{"address":"p:1080"}}}`, 400, "SOCKS5"},
		{"unknown network field", "POST", "/v2/sandboxes", key, `{"templateID":"tools","network":{"allowout":["1.1.1.1"]}}`, 400, "network.allowout: unknown field"},
		{"network unknown", "PUT", "/sandboxes/tools-000000/network", key, `{}`, 404, "not found"},
		{"volumes", "POST", "/v2/sandboxes", key, `{"templateID":"tools","volumeMounts":[{"name":"v","path":"/v"}]}`, 400, "volume"},
		{"bad env", "POST", "/v2/sandboxes", key, `{"templateID":"tools","envVars":{"A=B":"c"}}`, 400, "not a variable name"},
		{"timeout too long", "POST", "/v2/sandboxes", key, `{"templateID":"tools","timeout":18446744074}`, 400, "from 1 to 86400"},
		{"timeout past int64", "POST", "/v2/sandboxes", key, `{"templateID":"tools","timeout":1e30}`, 400, "request body"},
		{"env with NUL", "POST", "/v2/sandboxes", key, `{"templateID":"tools","envVars":{"A":"b\u0000c"}}`, 400, "NUL"},
		{"bad json", "POST", "/v2/sandboxes", key, `{"templateID":`, 400, "request body"},
		{"unknown sandbox", "GET", "/sandboxes/tools-000000", key, ``, 404, "not found"},
		{"kill unknown", "DELETE", "/sandboxes/tools-000000", key, ``, 404, "not found"},
		{"timeout unknown", "POST", "/sandboxes/tools-000000/timeout", key, `{"timeout":10}`, 404, "not found"},
		{"connect unknown", "POST", "/sandboxes/tools-000000/connect", key, `{"timeout":10}`, 404, "not found"},
		// A refused route naming a sandbox that is not running is E2B's 404 first (SandboxNotFoundError).
		{"pause unknown", "POST", "/sandboxes/tools-000000/pause", key, ``, 404, "not found"},
		{"fork unknown", "POST", "/sandboxes/tools-000000/fork", key, `{}`, 404, "not found"},
		{"unnamed route of unknown", "POST", "/sandboxes/tools-000000/whatever", key, ``, 404, "not found"},
		{"templates", "GET", "/templates/", key, ``, 501, "Workshop records"},
		{"snapshots bad limit", "GET", "/snapshots?limit=0", key, ``, 400, "from 1 to 100"},
		{"delete no snapshot", "DELETE", "/templates/nobody%2Fnope:default", key, ``, 404, "not found"},
		{"snapshot unknown", "POST", "/sandboxes/tools-000000/snapshots", key, `{}`, 404, "not found"},
		{"resume unknown", "POST", "/sandboxes/tools-000000/resume", key, `{}`, 404, "not found"},
		{"autoResume without autoPause", "POST", "/v2/sandboxes", key, `{"templateID":"tools","autoResume":{"enabled":true}}`, 400, "set autoPause"},
		{"autoResume not E2B's", "POST", "/v2/sandboxes", key, `{"templateID":"tools","autoResume":7}`, 400, "autoResume"},
		{"metrics of no ids", "GET", "/sandboxes/metrics", key, ``, 400, "sandbox_ids is required"},
		{"metrics unknown", "GET", "/sandboxes/tools-000000/metrics?start=abc", key, ``, 404, "not found"},
		{"refusal needs a key", "GET", "/volumes", "", ``, 401, "E2B_API_KEY"},
		{"snapshots need a key", "GET", "/snapshots", "", ``, 401, "E2B_API_KEY"},
		{"unknown route", "GET", "/nowhere", key, ``, 404, "no route of E2B's API"},
		{"bad limit", "GET", "/v2/sandboxes?limit=0", key, ``, 400, "from 1 to 100"},
		{"limit past E2B's", "GET", "/v2/sandboxes?limit=101", key, ``, 400, "from 1 to 100"},
		{"bad order", "GET", "/v2/sandboxes?order=up", key, ``, 400, "asc or desc"},
		{"bad state", "GET", "/v2/sandboxes?state=running,gone", key, ``, 400, "running or paused"},
		{"bad startedAfter", "GET", "/v2/sandboxes?startedAfter=yesterday", key, ``, 400, "RFC 3339"},
		{"forged nextToken", "GET", "/v2/sandboxes?nextToken=abc", key, ``, 400, "X-Next-Token"},
	}
	for _, c := range cases {
		status, body := do(t, hs, c.method, c.path, c.key, c.body)
		if status != c.status || !strings.Contains(body, c.want) {
			t.Errorf("%s: %d %s, want %d with %q", c.name, status, body, c.status, c.want)
		}
		// Every refusal is in E2B's shape, never a bare status.
		var e apiError
		if err := json.Unmarshal([]byte(body), &e); err != nil || e.Code != status || e.Message == "" {
			t.Errorf("%s: body %q is not E2B's error ({code: %d, message})", c.name, body, status)
		}
	}
	if status, body := do(t, hs, "GET", "/v2/sandboxes", key, ""); status != 200 || strings.TrimSpace(body) != "[]" {
		t.Errorf("list: %d %s, want none", status, body)
	}
	if status, body := do(t, hs, "GET", "/snapshots?name=nope", key, ""); status != 200 || strings.TrimSpace(body) != "[]" {
		t.Errorf("snapshots: %d %s, want none", status, body)
	}
	if es, _ := os.ReadDir(filepath.Join(root, "benches")); len(es) != 0 {
		t.Errorf("a refused create left %d Benches", len(es))
	}
}

func hashOf(t *testing.T, root string) string {
	keys, err := apikey.Open(root).List()
	if err != nil || len(keys) == 0 {
		t.Fatal(err)
	}
	return keys[0].SHA256
}

// TestDataPlaneRefusals: envd's API without a sandbox's access token (none, a wrong one, the API key
// itself) is refused the same way for every sandbox id, so that it tells no one which exist.
func TestDataPlaneRefusals(t *testing.T) {
	hs, key, _ := server(t)
	headers := func(token string) http.Header {
		h := http.Header{}
		h.Set("E2b-Sandbox-Id", "tools-000000")
		if token != "" {
			h.Set("X-Access-Token", token)
		}
		return h
	}
	pc := processconnect.NewProcessClient(hs.Client(), hs.URL, connect.WithProtoJSON())
	fc := filesystemconnect.NewFilesystemClient(hs.Client(), hs.URL, connect.WithProtoJSON())
	for _, token := range []string{"", "0123", key} {
		req := connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "/bin/true"}})
		for k, v := range headers(token) {
			req.Header()[k] = v
		}
		stream, err := pc.Start(context.Background(), req)
		if err == nil {
			for stream.Receive() {
				t.Errorf("token %q: an event: %v", token, stream.Msg())
			}
			err = stream.Err()
		}
		if connect.CodeOf(err) != connect.CodeUnauthenticated || !strings.Contains(err.Error(), "no running sandbox") {
			t.Errorf("process.Start with token %q: %v", token, err)
		}
		lreq := connect.NewRequest(&filesystem.ListDirRequest{Path: "/"})
		for k, v := range headers(token) {
			lreq.Header()[k] = v
		}
		if _, err := fc.ListDir(context.Background(), lreq); connect.CodeOf(err) != connect.CodeUnauthenticated {
			t.Errorf("filesystem.ListDir with token %q: %v", token, err)
		}
		hreq, _ := http.NewRequest("GET", hs.URL+"/files?path=/etc/shadow", nil)
		hreq.Header = headers(token)
		resp, err := hs.Client().Do(hreq)
		if err != nil {
			t.Fatal(err)
		}
		var e apiError
		json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != 401 || !strings.Contains(e.Message, "no running sandbox") {
			t.Errorf("GET /files with token %q: %d %+v", token, resp.StatusCode, e)
		}
	}
}

// TestSlowStreamDropped: a stream that stops reading is dropped when its queue is full; publishing
// never waits for it, and the streams that read get every event.
func TestSlowStreamDropped(t *testing.T) {
	p := &proc{subs: map[*sub]struct{}{}, done: make(chan struct{})}
	slow, err := p.subscribe()
	if err != nil {
		t.Fatal(err)
	}
	fast, _ := p.subscribe()
	got := 0
	for i := 0; i < subQueue*2; i++ {
		p.publish(&process.ProcessEvent{})
		select {
		case <-fast.events:
			got++
		default:
		}
	}
	select {
	case <-slow.dropped:
	default:
		t.Fatal("a stream that read nothing was not dropped")
	}
	if got != subQueue*2 {
		t.Errorf("the reading stream got %d of %d events", got, subQueue*2)
	}
	for range maxSubs - 1 {
		if _, err := p.subscribe(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := p.subscribe(); connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Errorf("stream %d on one command: %v, want resource_exhausted", maxSubs+1, err)
	}
}

// TestCheckUser: a command or file for a user the Bench does not have is refused; root, its
// declared accounts and no user (its default) are its users.
func TestCheckUser(t *testing.T) {
	sb := &sandbox{id: "b", defaultUser: "user", accounts: []bench.Account{{Name: "user", UID: 1000, GID: 1000, Home: "/home/user"}}}
	for auth, ok := range map[string]bool{"": true, "Basic cm9vdDo=": true, "Basic dXNlcjo=": true, "Basic bm9ib2R5Og==": false} {
		h := http.Header{}
		if auth != "" {
			h.Set("Authorization", auth)
		}
		if err := checkUser(sb, h); (err == nil) != ok {
			t.Errorf("Authorization %q: %v", auth, err)
		}
	}
	for user, want := range map[string]string{"": "/home/user/x", "root": "/root/x", "user": "/home/user/x"} {
		h := http.Header{}
		if user != "" {
			h.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":")))
		}
		if got, err := sb.rpcPath(h, "x"); got != want || err != nil {
			t.Errorf("user %q: x is %q (%v), want %q", user, got, err, want)
		}
	}
}
