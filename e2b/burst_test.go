package e2b

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"toolshed.dev/shed/app"
)

// TestRunningKeepsNewSandboxes: a sandbox made while another request listed the Benches (its Bench
// not in that list) is not forgotten by it; one whose Bench is gone and that was made before is.
func TestRunningKeepsNewSandboxes(t *testing.T) {
	s, _, _ := newServer(t)
	c := &app.Caller{UID: 65534, GID: 65534, User: "nobody", Role: app.User}
	gone := &sandbox{id: "gone", bench: "00000000000000aa", user: "nobody", started: time.Now().Add(-time.Minute)}
	// Made after this listing begins: its create returned while the list was read.
	fresh := &sandbox{id: "fresh", bench: "00000000000000bb", user: "nobody", started: time.Now().Add(time.Minute)}
	s.add(gone)
	s.add(fresh)
	r := httptest.NewRequest(http.MethodGet, "/v2/sandboxes", nil)
	if _, _, ok := s.running(httptest.NewRecorder(), r, c); !ok {
		t.Fatal("running failed")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sandboxes["fresh"] == nil {
		t.Error("a sandbox made during the listing was forgotten: its commands would be refused")
	}
	if s.sandboxes["gone"] != nil {
		t.Error("a sandbox whose Bench ended was kept")
	}
}
