package e2b

import (
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"toolshed.dev/shed/app"
	"toolshed.dev/shed/e2b/envd/process"
)

func TestMetadataOf(t *testing.T) {
	h := http.Header{}
	h.Set("X-Metadata-Author", "mish")
	h.Add("x-metadata-purpose", "upload")
	h.Add("X-Metadata-Purpose", "second")
	h.Set("X-Metadata-", "no key")
	h.Set("Content-Type", "application/octet-stream")
	if got, want := metadataOf(h), map[string]string{"author": "mish", "purpose": "upload"}; !reflect.DeepEqual(got, want) {
		t.Errorf("metadataOf: %v, want %v", got, want)
	}
	if got := metadataOf(http.Header{"X-Access-Token": {"t"}}); got != nil {
		t.Errorf("no metadata headers: %v, want nil", got)
	}
}

func TestPtyRequest(t *testing.T) {
	req := &app.BenchExecRequest{Env: []string{"A=1", "TERM=xterm-256color", "B=2"}}
	if err := ptyRequest(req, &process.PTY{Size: &process.PTY_Size{Cols: 100, Rows: 30}}); err != nil {
		t.Fatal(err)
	}
	if !req.TTY || req.Cols != 100 || req.Rows != 30 || req.Term != "xterm-256color" || !reflect.DeepEqual(req.Env, []string{"A=1", "B=2"}) {
		t.Errorf("ptyRequest: %+v", req)
	}
	if err := ptyRequest(&app.BenchExecRequest{}, &process.PTY{Size: &process.PTY_Size{Cols: 1 << 20, Rows: 30}}); err == nil || !strings.Contains(err.Error(), "at most 65535") {
		t.Errorf("a size over 16 bits: %v", err)
	}
}

// TestBoundedMessages: a Connect request over the bound is refused as invalid_argument, with the
// bound, before the handler reads it.
func TestBoundedMessages(t *testing.T) {
	called := false
	h := boundedMessages(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { called = true }))
	r := httptest.NewRequest("POST", "/process.Process/SendInput", strings.NewReader("{}"))
	r.Header.Set("Content-Type", "application/json")
	r.ContentLength = maxRPCMessage + 1
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if called || w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), `"code":"invalid_argument"`) || !strings.Contains(w.Body.String(), "at most 4194304 bytes a message") {
		t.Errorf("an oversized request: called %v, %d %s", called, w.Code, w.Body.String())
	}
	r = httptest.NewRequest("POST", "/process.Process/SendInput", strings.NewReader("{}"))
	r.Header.Set("Content-Type", "application/json")
	h.ServeHTTP(httptest.NewRecorder(), r)
	if !called {
		t.Error("a small request did not reach the handler")
	}
}
