package e2b

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestFileSignature: the SDK's own vector (tests/sandbox/secure.test.ts, "static signing key
// comparison").
func TestFileSignature(t *testing.T) {
	if got := fileSignature("hello.txt", "read", "user", "0tQG31xiMp0IOQfaz9dcwi72L1CPo8e0", nil); got != "v1_gUtH/s9YCJWgCizjfUxuWfhFE4QSydOWEIIvfLwDr6E" {
		t.Errorf("got %s", got)
	}
}

func TestPortHost(t *testing.T) {
	s := &Server{Domain: "localhost:3000"}
	for _, c := range []struct {
		host  string
		port  int
		id    string
		under bool
	}{
		{"8000-base-abc.localhost:3000", 8000, "base-abc", true},
		{"8000-Base-abc.LOCALHOST", 8000, "base-abc", true},
		{"49983-x.localhost", EnvdPort, "x", true},
		{"0-x.localhost", 0, "x", true},
		{"65536-x.localhost", 0, "x", true},
		{"08000-x.localhost", 0, "x", true},
		{"port-x.localhost", 0, "x", true},
		{"8000.localhost", 0, "", true},
		{"localhost:3000", 0, "", false},
		{"127.0.0.1:3000", 0, "", false},
		{"a.8000-x.localhost", 0, "", false},
		{"8000-x.example.com", 0, "", false},
	} {
		_, port, id, under := s.portHost(c.host)
		if port != c.port || under != c.under || (c.id != "" && id != c.id) {
			t.Errorf("%s: port %d id %q under %v, want %d %q %v", c.host, port, id, under, c.port, c.id, c.under)
		}
	}
}

func TestNetworkAccess(t *testing.T) {
	public, mask, rest, err := networkAccess(json.RawMessage(`{"allowPublicTraffic":false,"maskRequestHost":"${PORT}-x.example.com","allowOut":["1.1.1.1"]}`))
	if err != nil || public || mask != "${PORT}-x.example.com" || string(rest) != `{"allowOut":["1.1.1.1"]}` {
		t.Errorf("got %v %q %s %v", public, mask, rest, err)
	}
	if public, _, rest, err := networkAccess(json.RawMessage(`{"allowPublicTraffic":true}`)); err != nil || !public || rest != nil {
		t.Errorf("public only: %v %s %v", public, rest, err)
	}
	for _, bad := range []string{`[]`, `{"allowPublicTraffic":"no"}`, `{"maskRequestHost":"a b"}`, `{"maskRequestHost":"a/b"}`} {
		if _, _, _, err := networkAccess(json.RawMessage(bad)); err == nil {
			t.Errorf("%s: accepted", bad)
		}
	}
}

// TestPortRefusals: a port host of a sandbox that is not running is E2B's 502 "not found" body; a bad
// port label is a 400 that says what a port host is; a sandbox made with allowPublicTraffic false
// wants its token (403 without, or with another); a local user other than the owner is refused.
// None of these reaches a Bench (there is none): the refusals come first.
func TestPortRefusals(t *testing.T) {
	s, key, _ := newServer(t)
	s.Domain = "localhost"
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(hs.Close)
	k, _ := s.Keys.Lookup(key)
	s.add(&sandbox{id: "tools-priv", user: "nobody", keyID: k.ID, token: "tok", traffic: "traffic-secret", files: make(chan struct{}, 1)})
	s.add(&sandbox{id: "tools-pub", bench: "no-such-bench", user: "nobody", keyID: k.ID, token: "tok2", files: make(chan struct{}, 1)})
	get := func(host string, hdr map[string]string) (int, map[string]any, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", hs.URL+"/", nil)
		req.Host = host
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := hs.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body map[string]any
		json.NewDecoder(resp.Body).Decode(&body)
		return resp.StatusCode, body, resp.Header.Get("Content-Type")
	}
	code, body, ct := get("3000-gone-123.localhost", nil)
	if code != 502 || body["message"] != "The sandbox was not found" || body["sandboxId"] != "gone-123" || body["code"] != float64(502) || !strings.HasPrefix(ct, "application/json") {
		t.Errorf("gone: %d %v %s", code, body, ct)
	}
	// In the table, but its Bench is gone (ended at its timeout, removed with `shed bench rm`).
	code, body, _ = get("3000-tools-pub.localhost", nil)
	if code != 502 || body["message"] != "The sandbox was not found" || body["sandboxId"] != "tools-pub" {
		t.Errorf("a sandbox whose Bench ended: %d %v", code, body)
	}
	for _, h := range []string{"0-tools-pub.localhost", "65536-tools-pub.localhost", "x-tools-pub.localhost"} {
		if code, body, _ := get(h, nil); code != 400 || !strings.Contains(body["message"].(string), "PORT from 1 to 65535") {
			t.Errorf("%s: %d %v", h, code, body)
		}
	}
	if code, body, _ := get("8000-tools-priv.localhost", nil); code != 403 || !strings.Contains(body["message"].(string), "e2b-traffic-access-token") {
		t.Errorf("no token: %d %v", code, body)
	}
	if code, body, _ := get("8000-tools-priv.localhost", map[string]string{"e2b-traffic-access-token": "wrong"}); code != 403 {
		t.Errorf("wrong token: %d %v", code, body)
	}
	// This test runs as root, which may reach any sandbox: as nobody's owner... the owner check is
	// mayReach's, tested with another uid than the caller's.
	req := httptest.NewRequest("GET", "/", nil)
	if why := s.mayReach(req, &sandbox{user: "nobody"}); why != "" {
		t.Errorf("a request of no connection (off loopback): %q", why)
	}
}

// TestSignedFiles: a /files request with the SDK's signature instead of the token: a wrong one is
// "invalid signature", an expired one "signature is already expired", both 401 in envd's body and
// checked before anything else; a read signature does not write.
func TestSignedFiles(t *testing.T) {
	s, key, _ := newServer(t)
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(hs.Close)
	k, _ := s.Keys.Lookup(key)
	s.add(&sandbox{id: "tools-sig", user: "nobody", keyID: k.ID, token: "the-token", secure: true, files: make(chan struct{}, 1)})
	past := time.Now().Unix() - 10
	sig := func(path, op string, exp *int64) string {
		q := "path=" + path + "&signature=" + strings.ReplaceAll(fileSignature(path, op, "", "the-token", exp), "+", "%2B")
		if exp != nil {
			q += "&signature_expiration=" + strconv.FormatInt(*exp, 10)
		}
		return q
	}
	for _, c := range []struct {
		method, query string
		status        int
		msg           string
	}{
		{"GET", "path=a&signature=v1_forged", 401, "invalid signature"},
		{"GET", "path=a&signature=v1_forged&signature_expiration=" + strconv.FormatInt(past, 10), 401, "invalid signature"},
		{"GET", sig("a", "read", &past), 401, "signature is already expired"},
		{"POST", sig("a", "read", nil), 401, "invalid signature"},
		{"GET", sig("a", "read", nil) + "&signature_expiration=soon", 400, "signature_expiration"},
	} {
		code, body := do(t, hs, c.method, "/files?"+c.query, "", "")
		var e apiError
		json.Unmarshal([]byte(body), &e)
		if code != c.status || e.Code != c.status || !strings.Contains(e.Message, c.msg) {
			t.Errorf("%s %s: %d %s, want %d %q", c.method, c.query, code, body, c.status, c.msg)
		}
	}
	// On envd's host (49983-ID.DOMAIN, the SDK's URL without E2B_SANDBOX_URL) the host names the
	// sandbox: a good signature gets past the check (to the policy: there is no Bench here), and one
	// sent to another sandbox's host is invalid there.
	good := sig("a", "read", nil)
	for host, want := range map[string]int{"49983-tools-sig.localhost": http.StatusForbidden, "49983-tools-other.localhost": http.StatusUnauthorized} {
		req, _ := http.NewRequest("GET", hs.URL+"/files?"+good, nil)
		req.Host = host
		resp, err := hs.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("a good signature on %s: %s, want %d", host, resp.Status, want)
		}
	}
}
