package proposal

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"toolshed.dev/shed/bench"
	"toolshed.dev/shed/proxy"
)

// TestObserveLongLogLines: long lines in a Bench's network log (the agent chooses the method and host
// it asks its proxy for) do not end its reading: every refused destination after them is in the
// proposal, and a line the proxy can write (a long method before a real host) is read.
func TestObserveLongLogLines(t *testing.T) {
	sv := newProposals(t)
	rec := &bench.Record{ID: "0123456789abcdef", Name: "b", Keep: true}
	dir := filepath.Join(bench.Dir(sv.Store), rec.ID)
	if err := os.MkdirAll(filepath.Join(dir, "upper"), 0o700); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(dir, "network.log"))
	if err != nil {
		t.Fatal(err)
	}
	enc := json.NewEncoder(f) // as bench writes it
	log := func(method, host string, port int, allowed bool) {
		t.Helper()
		if err := enc.Encode(proxy.Decision{Time: time.Now(), Method: method, Host: host, Port: port, Allowed: allowed, Reason: "not in allowlist"}); err != nil {
			t.Fatal(err)
		}
	}
	log("CONNECT", "before.example", 443, false)
	log("CONNECT", strings.Repeat("a", 100_000), 443, false) // a 100 KB line
	log("CONNECT", "after.example", 443, false)
	log(strings.Repeat("M", 60_000), "long-method.example", 80, false)
	log("GET", "deb.debian.org", 80, true)
	if _, err := f.WriteString(strings.Repeat("x", 3<<20) + "\n"); err != nil { // no line the proxy writes
		t.Fatal(err)
	}
	log("CONNECT", "last.example", 8443, false)
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}

	obs, err := Observe(sv.Store, rec)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{strings.Repeat("a", 100_000), "after.example", "before.example", "last.example:8443", "long-method.example"}
	if d := cmp.Diff(want, obs.Refused); d != "" {
		t.Errorf("refused (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]string{"deb.debian.org"}, obs.Allowed); d != "" {
		t.Errorf("allowed (-want +got):\n%s", d)
	}
}
