package tests

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestAuditAttack is issue 23's attack on the audit log, through `shed daemon`: a local user
// (nobody) asks to realize a Workshop whose name is 100 KB, then floods the supervisor with
// refusals. Root then trusts a key, and nobody tries to. Both are in the log, whole; so is the count
// of the refusals that were not written one by one; and the log verifies. (The huge entry used to
// make every later append fail, with verify saying all was well, and the refused key.trust was
// dropped behind the junk with nothing to count it.)
func TestAuditAttack(t *testing.T) {
	requireRoot(t)
	root := newRoot(t)
	sock, logPath := daemonWith(t, root)
	uid := nobodyUID(t)

	huge := strings.Repeat("w", 100_000)
	if r := via(t, sock, uid, "", "realize", huge); r.code != 2 || !strings.Contains(r.stderr, "users run records only") {
		t.Fatalf("nobody: realize of a 100 KB name: exit %d, want 2 (refused)\n%.500s", r.code, r.stderr)
	}
	// The flood: faster than 5 a second, so most are counted, not written.
	const junk = 59
	var wg sync.WaitGroup
	work := make(chan int)
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range work {
				if r := via(t, sock, uid, "", "realize", "junk"); r.code != 2 {
					t.Errorf("nobody: realize junk: exit %d\n%s", r.code, r.stderr)
				}
			}
		}()
	}
	for i := range junk {
		work <- i
	}
	close(work)
	wg.Wait()

	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	key := "attack-test-1:" + base64.StdEncoding.EncodeToString(pub)
	if r := via(t, sock, 0, "", "key", "trust", key); r.code != 0 {
		t.Fatalf("root: key trust: exit %d\n%s", r.code, r.stderr)
	}
	if r := via(t, sock, uid, "", "key", "trust", "mallory:AAAA"); r.code != 2 || !strings.Contains(r.stderr, "for operators") {
		t.Fatalf("nobody: key trust: exit %d, want 2\n%s", r.code, r.stderr)
	}
	if cfg, _ := os.ReadFile(root + "/config.toml"); !strings.Contains(string(cfg), key) || strings.Contains(string(cfg), "mallory") {
		t.Errorf("the store's trusted keys after root's key trust and nobody's:\n%s", cfg)
	}

	type entry struct {
		Seq                                        int64
		User, Role, Event, Workshop, Error, Detail string
		Count, Of                                  int64
		Intent                                     bool
	}
	var entries []entry
	var drops []entry
	counted := func() (realizes, dropped int) {
		for _, e := range entries {
			if e.Event == "realize" && e.User == "nobody" && e.Error == "denied" {
				realizes++
			}
		}
		drops = nil
		for _, e := range entries {
			if e.Event == "audit.dropped" && e.User == "nobody" {
				drops = append(drops, e)
				dropped += int(e.Count)
			}
		}
		return
	}
	// Each count is written before nobody's next written refusal, or a second after the drops stop:
	// wait for them a little.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		r := via(t, sock, 0, "", "--json", "audit")
		if r.code != 0 {
			t.Fatalf("audit --json: exit %d\n%s", r.code, r.stderr)
		}
		entries = nil
		if err := json.Unmarshal([]byte(r.stdout), &entries); err != nil {
			t.Fatalf("audit --json: %v\n%.2000s", err, r.stdout)
		}
		if w, d := counted(); w+d == junk+1 || time.Now().After(deadline) {
			break
		}
	}
	var hugeSeen, trustIntent, trustOutcome, refusedTrust int
	for _, e := range entries {
		switch {
		case e.Event == "realize" && e.User == "nobody" && e.Error == "denied":
			if strings.HasPrefix(e.Workshop, "wwww") {
				hugeSeen++
			}
			if strings.HasPrefix(e.Workshop, "wwww") && (len(e.Workshop) > 300 || !strings.Contains(e.Workshop, "…[truncated, 100000 bytes, blake3:")) {
				t.Errorf("the huge realize's workshop is not bounded and marked: %d bytes, ends %q", len(e.Workshop), e.Workshop[max(0, len(e.Workshop)-100):])
			}
		case e.Event == "key.trust" && e.User == "root" && e.Intent && e.Detail == key:
			trustIntent++
		case e.Event == "key.trust" && e.User == "root" && e.Of > 0 && e.Error == "":
			trustOutcome++
		case e.Event == "key.trust" && e.User == "nobody" && e.Error == "denied" && e.Detail == "mallory:AAAA":
			refusedTrust++
		}
	}
	if hugeSeen != 1 {
		t.Errorf("the realize of a 100 KB name: %d in the log, want 1", hugeSeen)
	}
	if trustIntent != 1 || trustOutcome != 1 {
		t.Errorf("root's key trust: %d intents, %d outcomes in the log, want 1 each", trustIntent, trustOutcome)
	}
	if refusedTrust != 1 {
		t.Errorf("nobody's refused key trust: %d in the log, want 1", refusedTrust)
	}
	written, dropped := counted()
	if len(drops) == 0 || dropped < 1 || written+dropped != junk+1 {
		t.Errorf("%d of nobody's %d refused realizes written, %d counted, want each written or counted: %+v", written, junk+1, dropped, drops)
	}
	for _, d := range drops {
		if !strings.Contains(d.Detail, "uid 65534") || !strings.Contains(d.Detail, "realize denied") {
			t.Errorf("a count that does not say whose and what: %+v", d)
		}
	}
	if t.Failed() {
		t.Logf("the log: %+v", entries)
	}

	r := via(t, sock, 0, "", "--json", "audit", "verify")
	var v struct {
		Entries  int
		Problems []struct {
			Line int
			What string
		}
	}
	if err := json.Unmarshal([]byte(r.stdout), &v); r.code != 0 || err != nil || len(v.Problems) != 0 || v.Entries != len(entries) {
		t.Errorf("audit verify: exit %d, %d entries of %d, problems %v (%v)\n%s", r.code, v.Entries, len(entries), v.Problems, err, r.stderr)
	}
	if r := via(t, sock, 0, "", "audit", "verify"); r.code != 0 || !strings.Contains(r.stdout, "0 problems") {
		t.Errorf("audit verify: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if b, _ := os.ReadFile(logPath); strings.Contains(string(b), "audit log") {
		t.Errorf("the supervisor logged an audit failure:\n%s", b)
	}
}
