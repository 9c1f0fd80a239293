package e2b

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"toolshed.dev/shed/apikey"
	"toolshed.dev/shed/app"
	"toolshed.dev/shed/e2b/envd/filesystem"
	"toolshed.dev/shed/e2b/envd/process"
)

// TestEntryInfoAsEnvd: a directory's mode is its permission bits (493, not Go's ModeDir bit); a
// symlink is described by what it resolves to, its symlinkTarget the resolved path (its own path
// when it resolves to nothing), as envd's GetEntryInfo does.
func TestEntryInfoAsEnvd(t *testing.T) {
	cases := []struct {
		e           app.FileEntry
		typ         filesystem.FileType
		mode        uint32
		permissions string
		target      string
	}{
		{app.FileEntry{Type: "dir", Mode: 0o755}, filesystem.FileType_FILE_TYPE_DIRECTORY, 493, "drwxr-xr-x", ""},
		{app.FileEntry{Type: "file", Mode: 0o644}, filesystem.FileType_FILE_TYPE_FILE, 0o644, "-rw-r--r--", ""},
		{app.FileEntry{Type: "file", Mode: 0o4755}, filesystem.FileType_FILE_TYPE_FILE, 0o755, "urwxr-xr-x", ""},
		{app.FileEntry{Type: "dir", Mode: 0o1777}, filesystem.FileType_FILE_TYPE_DIRECTORY, 0o777, "dtrwxrwxrwx", ""},
		{app.FileEntry{Path: "/root/l", Type: "symlink", Mode: 0o777, Target: "f", Resolved: "/root/f", TargetType: "file", TargetMode: 0o600},
			filesystem.FileType_FILE_TYPE_FILE, 0o600, "Lrwxrwxrwx", "/root/f"},
		{app.FileEntry{Path: "/root/d", Type: "symlink", Mode: 0o777, Target: "/etc", Resolved: "/etc", TargetType: "dir", TargetMode: 0o755},
			filesystem.FileType_FILE_TYPE_DIRECTORY, 0o755, "Lrwxrwxrwx", "/etc"},
		{app.FileEntry{Path: "/root/dangling", Type: "symlink", Mode: 0o777, Target: "nowhere"},
			filesystem.FileType_FILE_TYPE_UNSPECIFIED, 0, "Lrwxrwxrwx", "/root/dangling"},
	}
	for _, c := range cases {
		got := entryInfo(&c.e)
		if got.Type != c.typ || got.Mode != c.mode || got.Permissions != c.permissions || got.GetSymlinkTarget() != c.target {
			t.Errorf("%+v: type %v mode %d (%o) permissions %q target %q; want %v %d %q %q",
				c.e, got.Type, got.Mode, got.Mode, got.Permissions, got.GetSymlinkTarget(), c.typ, c.mode, c.permissions, c.target)
		}
	}
}

// TestListPages: limit pages the list in its order (newest first unless asc), each page's token
// names the next, and the last has none; sandboxes of the same start keep one order.
func TestListPages(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var sbs []*sandbox // oldest first, as running gives them
	for i, id := range []string{"a", "b", "c", "d", "e"} {
		sbs = append(sbs, &sandbox{id: id, started: t0.Add(time.Duration(i/2) * time.Second)}) // a,b and c,d start together
	}
	for _, order := range []string{"", "desc", "asc"} {
		want := "edcba"
		if order == "asc" {
			want = "abcde"
		}
		token, got := "", ""
		for pages := 0; ; pages++ {
			if pages > 5 {
				t.Fatalf("order %q: pages do not end: %q", order, got)
			}
			r := httptest.NewRequest("GET", "/v2/sandboxes?limit=2&order="+order+"&nextToken="+token, nil)
			q, err := listQueryOf(r)
			if err != nil {
				t.Fatal(err)
			}
			page, next := q.page(sbs)
			if len(page) > 2 {
				t.Errorf("order %q: a page of %d, limit 2", order, len(page))
			}
			for _, sb := range page {
				got += sb.id
			}
			if next == "" {
				break
			}
			token = next
		}
		if got != want {
			t.Errorf("order %q: pages gave %q, want %q", order, got, want)
		}
	}
	// The older list pages nothing; startedAfter is "at or after".
	q, _ := listQueryOf(httptest.NewRequest("GET", "/sandboxes", nil))
	if page, next := q.page(sbs); len(page) != 5 || next != "" {
		t.Errorf("GET /sandboxes: %d sandboxes, next %q", len(page), next)
	}
	q, _ = listQueryOf(httptest.NewRequest("GET", "/v2/sandboxes?startedAfter="+t0.Add(time.Second).Format(time.RFC3339Nano), nil))
	if !q.after.Equal(t0.Add(time.Second)) || !q.running {
		t.Errorf("startedAfter: %v, running %v", q.after, q.running)
	}
	// state as the SDK sends it (comma-joined) or repeated; none is both.
	for query, want := range map[string][2]bool{"state=running,paused": {true, true}, "state=paused&state=running": {true, true},
		"state=paused": {false, true}, "state=running": {true, false}, "": {true, true}} {
		q, err := listQueryOf(httptest.NewRequest("GET", "/v2/sandboxes?"+query, nil))
		if err != nil || q.running != want[0] || q.paused != want[1] {
			t.Errorf("%s: running %v, paused %v, %v", query, q.running, q.paused, err)
		}
	}
}

// TestHealth: /health is 204 without a sandbox id (the port's liveness) and 502 for a sandbox that
// is not running or a token that is not its, as E2B's proxy answers an ended sandbox.
func TestHealth(t *testing.T) {
	hs, key, _ := server(t)
	for _, h := range []map[string]string{
		{},
		{"E2b-Sandbox-Id": "tools-000000"},
		{"E2b-Sandbox-Id": "tools-000000", "X-Access-Token": key},
	} {
		req, _ := http.NewRequest("GET", hs.URL+"/health", nil)
		for k, v := range h {
			req.Header.Set(k, v)
		}
		resp, err := hs.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		want := http.StatusBadGateway
		if len(h) == 0 {
			want = http.StatusNoContent
		}
		if resp.StatusCode != want {
			t.Errorf("/health with %v: %d, want %d", h, resp.StatusCode, want)
		}
	}
}

// TestRefusedRPC: a refused envd RPC is a Connect error that names the reason (never a bare 404),
// after the sandbox's token is checked as for the RPCs served.
func TestRefusedRPC(t *testing.T) {
	// Every envd RPC is served today: a refusal of a procedure envd may add stands in.
	saved := refusedRPCs
	defer func() { refusedRPCs = saved }()
	refusedRPCs = []refusal{{"/filesystem.Filesystem/NotYet", "not yet served: a reason"}}
	s, _, root := newServer(t)
	hs := httptest.NewServer(s.Handler())
	defer hs.Close()
	keys, err := apikey.Open(root).List()
	if err != nil {
		t.Fatal(err)
	}
	s.add(&sandbox{id: "tools-000001", token: "secret", keyID: keys[0].ID, user: "nobody"})
	call := func(token string) (int, string) {
		req, _ := http.NewRequest("POST", hs.URL+"/filesystem.Filesystem/NotYet", strings.NewReader(`{"path":"/"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("E2b-Sandbox-Id", "tools-000001")
		req.Header.Set("X-Access-Token", token)
		resp, err := hs.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if status, body := call("wrong"); status != http.StatusUnauthorized || !strings.Contains(body, `"unauthenticated"`) {
		t.Errorf("a refused RPC with a wrong token: %d %s", status, body)
	}
	if status, body := call("secret"); status != http.StatusNotImplemented || !strings.Contains(body, `"unimplemented"`) || !strings.Contains(body, "not yet served: a reason") {
		t.Errorf("a refused RPC: %d %s, want unimplemented with its reason", status, body)
	}
}

// TestRefusalRowsNotServed: a row of refusedRPCs that the generated services serve panics, so that
// a helper who serves one cannot leave its refusal shadowing it.
func TestRefusalRowsNotServed(t *testing.T) {
	saved := refusedRPCs
	defer func() { refusedRPCs = saved }()
	refusedRPCs = append(refusedRPCs, refusal{"/filesystem.Filesystem/Stat", "x"})
	defer func() {
		if recover() == nil {
			t.Error("a refusal of a served RPC was registered")
		}
	}()
	(&Server{}).Handler()
}

// TestGoneCommandBreaksStream: a command that ended with its sandbox sends what it wrote, then its
// stream breaks (net/http's abort) instead of sending an end the SDK would read as an exit.
func TestGoneCommandBreaksStream(t *testing.T) {
	p := &proc{subs: map[*sub]struct{}{}, done: make(chan struct{})}
	w, _ := p.subscribe()
	p.publish(&process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: &process.ProcessEvent_DataEvent{}}})
	p.end, p.gone = &process.ProcessEvent{Event: &process.ProcessEvent_End{End: &process.ProcessEvent_EndEvent{ExitCode: -1}}}, true
	close(p.done)
	var sent []*process.ProcessEvent
	err := watch(t.Context(), http.Header{}, p, w, func(ev *process.ProcessEvent) error { sent = append(sent, ev); return nil })
	if err != errSandboxGone || len(sent) != 1 || sent[0].GetData() == nil {
		t.Errorf("watch of a gone command: %v after %v, want its output then errSandboxGone", err, sent)
	}
	defer func() {
		if r := recover(); r != http.ErrAbortHandler {
			t.Errorf("abortIfGone: %v, want a panic with http.ErrAbortHandler", r)
		}
	}()
	_ = abortIfGone(err)
}
