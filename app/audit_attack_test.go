package app_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"toolshed.dev/shed/app"
	"toolshed.dev/shed/audit"
	"toolshed.dev/shed/policy"
	"toolshed.dev/shed/store"
	"toolshed.dev/shed/trust"
)

// TestAuditAttack is issue 23's attack on the audit log through the real Service and policy: a user's
// refused realize of a Workshop named with 100 KB, then a flood of refusals. Afterwards an
// operator's key.trust, and the user's refused key.trust, are both in the log, so is the count of
// what was dropped, and the log verifies. (The huge entry made every later append fail, and the
// refused key.trust was dropped behind the junk.)
func TestAuditAttack(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the store is root-only (CI runs as root)")
	}
	root := filepath.Join(t.TempDir(), "root")
	st, err := store.Init(root)
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	if _, _, err := trust.OpenKeys(root).Ensure("test-1"); err != nil {
		t.Fatal(err)
	}
	s := &app.Service{Root: root, Policy: policy.Check, Audit: audit.Open(root)}
	ctx := context.Background()
	op := &app.Call{Caller: &app.Caller{UID: 0, User: "root", Role: app.Operator, Dir: "/"}}
	user := &app.Call{Caller: &app.Caller{UID: 65534, User: "nobody", Role: app.User, Dir: "/"}}

	huge := strings.Repeat("w", 100_000)
	if _, err := s.Do(ctx, user, "realize", &app.RealizeRequest{Workshop: huge}); app.Classify(err).Code != app.CodeDenied {
		t.Fatalf("realize of a 100 KB name: %v", err)
	}
	for range 59 {
		s.Do(ctx, user, "realize", &app.RealizeRequest{Workshop: "junk"})
	}
	k, _ := trust.GenerateKey("other-1")
	key := k.Public().String()
	if _, err := s.Do(ctx, op, "key.trust", &app.KeyRequest{Key: key}); err != nil {
		t.Fatalf("the operator's key.trust: %v", err)
	}
	if _, err := s.Do(ctx, user, "key.trust", &app.KeyRequest{Key: "mallory:AAAA"}); app.Classify(err).Code != app.CodeDenied {
		t.Fatalf("nobody's key.trust: %v", err)
	}

	var es []audit.Entry
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if es, err = s.Audit.Entries(audit.Filter{}); err != nil {
			t.Fatal(err)
		}
		if find(es, "audit.dropped", "nobody") != nil || time.Now().After(deadline) {
			break
		}
	}
	first := find(es, "realize", "nobody")
	if first == nil || !strings.HasPrefix(first.Workshop, "wwww") || !strings.Contains(first.Workshop, "…[truncated, 100000 bytes, blake3:") || first.Error != "denied" {
		t.Errorf("the huge realize's entry: %+v", first)
	}
	if e := find(es, "key.trust", "root"); e == nil || e.Detail != key || !e.Intent {
		t.Errorf("the operator's key.trust intent: %+v", e)
	}
	if e := findLast(es, "key.trust", "root"); e == nil || e.Intent || e.Error != "" || e.Of == 0 {
		t.Errorf("the operator's key.trust outcome: %+v", e)
	}
	if e := find(es, "key.trust", "nobody"); e == nil || e.Error != "denied" || e.Detail != "mallory:AAAA" {
		t.Errorf("nobody's refused key.trust: %+v", e)
	}
	realizes := 0
	for _, e := range es {
		if e.Event == "realize" {
			realizes++
		}
	}
	d := find(es, "audit.dropped", "nobody")
	if d == nil || int(d.Count)+realizes != 60 || !strings.Contains(d.Detail, "realize denied") {
		t.Errorf("%d realizes written; the count of the rest: %+v", realizes, d)
	}
	n, problems, err := s.Audit.Verify()
	if err != nil || len(problems) != 0 || n != len(es) {
		t.Errorf("verify: %d entries of %d, %v, %v", n, len(es), problems, err)
	}
}

func find(es []audit.Entry, event, user string) *audit.Entry {
	for i := range es {
		if es[i].Event == event && es[i].User == user {
			return &es[i]
		}
	}
	return nil
}

func findLast(es []audit.Entry, event, user string) *audit.Entry {
	for i := len(es) - 1; i >= 0; i-- {
		if es[i].Event == event && es[i].User == user {
			return &es[i]
		}
	}
	return nil
}
