package app

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"toolshed.dev/shed/audit"
	"toolshed.dev/shed/store"
	"toolshed.dev/shed/trust"
)

type noopRequest struct{}

func init() {
	op("test.noop", func(s *Service, ctx context.Context, c *Call, req *noopRequest) (*Empty, error) { return &Empty{}, nil })
}

// usersRefused is a policy: operators may do anything, everyone else nothing.
func usersRefused(_ *Service, c *Caller, op string, _ any) error {
	if c.Role == Operator {
		return nil
	}
	return &Error{Code: CodeDenied, Err: fmt.Errorf("%w: %s is for operators", ErrDenied, op), Hint: "ask an operator"}
}

// auditedStore is a Service on a real store with a signing key and an audit log.
func auditedStore(t *testing.T) *Service {
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
	if _, _, err := trust.OpenKeys(root).Ensure("test-1"); err != nil {
		t.Fatal(err)
	}
	return &Service{Root: root, Policy: usersRefused, Audit: audit.Open(root)}
}

var (
	root   = &Call{Caller: &Caller{UID: 0, User: "root", Role: Operator}}
	nobody = &Call{Caller: &Caller{UID: 65534, User: "nobody", Role: User}}
)

func publicKey(t *testing.T, name string) string {
	t.Helper()
	k, err := trust.GenerateKey(name)
	if err != nil {
		t.Fatal(err)
	}
	return k.Public().String()
}

// breakAudit makes the audit log unwritable: its file is a directory.
func breakAudit(t *testing.T, s *Service) {
	t.Helper()
	dir := filepath.Join(s.Root, "audit")
	os.RemoveAll(dir)
	if err := os.MkdirAll(filepath.Join(dir, "log.jsonl"), 0o700); err != nil {
		t.Fatal(err)
	}
	s.Audit = audit.Open(s.Root)
}

// TestAuditFailsClosed: an operation that changes authority is not done when its intent cannot be
// written; when it can, the log holds the intent and then the outcome, which names it.
func TestAuditFailsClosed(t *testing.T) {
	s := auditedStore(t)
	ctx := context.Background()
	key := publicKey(t, "other-1")
	if _, err := s.Do(ctx, root, "key.trust", &KeyRequest{Key: key}); err != nil {
		t.Fatal(err)
	}
	es, _ := s.Audit.Entries(audit.Filter{})
	if len(es) != 2 || !es[0].Intent || es[0].Event != "key.trust" || es[0].Detail != key || es[1].Intent || es[1].Of != es[0].Seq || es[1].Error != "" {
		t.Errorf("entries of a key.trust: %+v", es)
	}

	breakAudit(t, s)
	other := publicKey(t, "other-2")
	_, err := s.Do(ctx, root, "key.trust", &KeyRequest{Key: other})
	if Classify(err).Code != CodeFailed || !strings.Contains(err.Error(), "not done: the audit log cannot record it") {
		t.Errorf("key.trust with the audit log broken: %v, want it not done", err)
	}
	cfg, _ := os.ReadFile(filepath.Join(s.Root, "config.toml"))
	if strings.Contains(string(cfg), other) || !strings.Contains(string(cfg), key) {
		t.Errorf("config after a key.trust the log could not record:\n%s", cfg)
	}
}

// TestAuditAfterTheFact: any other operation runs, and an append that fails after it is its error:
// its own code kept if it failed, "failed" if it succeeded; a refusal stays a refusal.
func TestAuditAfterTheFact(t *testing.T) {
	s := auditedStore(t)
	ctx := context.Background()
	breakAudit(t, s)
	if _, err := s.Do(ctx, root, "test.noop", &noopRequest{}); Classify(err).Code != CodeFailed || !strings.Contains(err.Error(), "was done, but the audit log could not record it") {
		t.Errorf("a successful operation, unrecorded: %v", err)
	}
	_, err := s.Do(ctx, root, "bench.rm", &BenchRemoveRequest{Benches: []string{"nosuch"}})
	if Classify(err).Code != CodeNotFound || !strings.Contains(err.Error(), "the audit log could not record it") {
		t.Errorf("a failed operation, unrecorded: %v", err)
	}
	_, err = s.Do(ctx, nobody, "gc", &GCRequest{})
	if Classify(err).Code != CodeDenied || !errors.Is(err, ErrDenied) || !strings.Contains(err.Error(), "the audit log could not record it") {
		t.Errorf("a refusal, unrecorded: %v", err)
	}
}

// TestDroppedRefusals: past the rate, a caller's refusals are counted per operation; a refusal of
// another operation is still written whole; the count is written as its own entry when the caller's
// next refusal is, or soon after the drops stop. Nothing is lost.
func TestDroppedRefusals(t *testing.T) {
	s := auditedStore(t)
	ctx := context.Background()
	const junk = 59
	for range junk {
		s.Do(ctx, nobody, "gc", &GCRequest{})
	}
	if _, err := s.Do(ctx, nobody, "key.trust", &KeyRequest{Key: "x:AAAA"}); Classify(err).Code != CodeDenied {
		t.Fatalf("key.trust as nobody: %v", err)
	}
	count := func() (gc, trusts, dropped int64, drops []audit.Entry) {
		es, err := s.Audit.Entries(audit.Filter{User: "nobody"})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range es {
			switch e.Event {
			case "gc":
				gc++
			case "key.trust":
				trusts++
			case "audit.dropped":
				dropped += e.Count
				drops = append(drops, e)
			}
		}
		return
	}
	gc, trusts, dropped, _ := count()
	if trusts != 1 || gc < refusalBurst || gc+dropped > junk {
		t.Errorf("after the flood: %d gc, %d key.trust, %d counted; want key.trust written", gc, trusts, dropped)
	}
	// Soon after the drops stop, their count is written.
	deadline := time.Now().Add(5 * time.Second)
	for dropped == 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		_, _, dropped, _ = count()
	}
	gc, _, dropped, drops := count()
	if gc+dropped != junk || len(drops) != 1 || !strings.Contains(drops[0].Detail, fmt.Sprintf("gc denied %d", dropped)) ||
		!strings.Contains(drops[0].Detail, "uid 65534") || drops[0].Role != "user" {
		t.Errorf("%d gc written and %d counted, want %d; the count: %+v", gc, dropped, junk, drops)
	}
	// A count pending when the caller's next refusal is written goes first.
	for range refusalBurst + 5 {
		s.Do(ctx, nobody, "root.rm", &RootRequest{Name: "x"})
	}
	time.Sleep(300 * time.Millisecond) // a token comes back
	s.Do(ctx, nobody, "root.rm", &RootRequest{Name: "x"})
	es, _ := s.Audit.Entries(audit.Filter{})
	last := es[len(es)-2:]
	// (5 were dropped, fewer if the refusals took so long that tokens came back: 4 at load 15.)
	if last[0].Event != "audit.dropped" || last[0].Count < 1 || last[1].Event != "root.rm" {
		t.Errorf("the last entries: %+v", last)
	}
	if n, problems, err := s.Audit.Verify(); err != nil || len(problems) != 0 {
		t.Errorf("verify: %d %v %v", n, problems, err)
	}
}

// TestProposeFlood: an agent that asks for proposals of its Bench as fast as it can (each one fails:
// the Bench is unchanged) writes two durable entries for each only up to authorityBurst, then a
// second; the rest are refused busy before any intent, and counted like refusals. An operator is
// not held to it.
func TestProposeFlood(t *testing.T) {
	s := auditedStore(t)
	s.Policy = func(*Service, *Caller, string, any) error { return nil }
	ctx := context.Background()
	agent := &Call{Caller: &Caller{User: "agent of bench b1", Role: Agent, Bench: "b1", Dir: "/"}}
	const n = 200
	busy := 0
	for range n {
		_, err := s.Do(ctx, agent, "bench.propose", &BenchProposeRequest{Bench: "b1"})
		if Classify(err).Code == CodeBusy {
			busy++
		}
	}
	s.FlushAudit()
	es, _ := s.Audit.Entries(audit.Filter{})
	var intents, written, counted int64
	for _, e := range es {
		switch {
		case e.Event == "bench.propose" && e.Intent:
			intents++
		case e.Event == "bench.propose" && e.Error == string(CodeBusy):
			written++
		case e.Event == "audit.dropped":
			counted += e.Count
		}
	}
	if intents > authorityBurst+1 || busy < n-authorityBurst-1 || intents+written+counted != n {
		t.Errorf("%d proposals: %d intents, %d busy (%d written, %d counted); want at most %d intents, and every one accounted for",
			n, intents, busy, written, counted, authorityBurst+1)
	}
	for range authorityBurst + 5 {
		if _, err := s.Do(ctx, root, "bench.propose", &BenchProposeRequest{Bench: "b1"}); Classify(err).Code == CodeBusy {
			t.Fatalf("an operator's proposal: %v", err)
		}
	}
}

// TestFirstLineBounded: a command in a Bench (a tar its agent replaced) that writes a 1 MiB line to
// stderr is quoted in the error within maxErrLine, cut on a rune.
func TestFirstLineBounded(t *testing.T) {
	got := firstLine(strings.Repeat("é", 1<<19)+"\nrest", 1)
	if len(got) > maxErrLine+32 || !utf8.ValidString(got) || !strings.HasSuffix(got, "…[1048576 bytes]") {
		t.Errorf("firstLine of a 1 MiB line: %d bytes, ends %q", len(got), got[max(0, len(got)-40):])
	}
	if got := firstLine("tar: /x: Cannot open\nmore", 2); got != "tar: /x: Cannot open" {
		t.Errorf("firstLine = %q", got)
	}
}

// TestBenchEventsBounded: a Bench's event with a huge destination (a CONNECT to a 12,000-character
// host) is noted bounded, and the log goes on.
func TestBenchEventsBounded(t *testing.T) {
	s := auditedStore(t)
	hook := s.benchEvents(nobody, "tools").hook()
	hook("b1", "net.refused", strings.Repeat("h", 12_000)+":443", "not in the profile")
	if _, err := s.Do(context.Background(), root, "test.noop", &noopRequest{}); err != nil {
		t.Fatal(err)
	}
	es, _ := s.Audit.Entries(audit.Filter{})
	if len(es) != 2 || !es[0].Noted || !strings.Contains(es[0].Dest, "truncated, 12004 bytes") || len(es[0].Dest) > audit.MaxField {
		t.Errorf("entries: %+v", es)
	}
	if n, problems, err := s.Audit.Verify(); err != nil || len(problems) != 0 || n != 2 {
		t.Errorf("verify: %d %v %v", n, problems, err)
	}
}

// TestHugeRequestFields: whatever a request carries into its entry (a Workshop name, an E2B file
// path, a move's two paths, an API key's user) is written bounded, by every face of the log, and the
// log verifies after.
func TestHugeRequestFields(t *testing.T) {
	s := auditedStore(t)
	ctx := context.Background()
	long := strings.Repeat("p", 12_000)
	viaKey := &Call{Caller: &Caller{UID: 65534, User: long, Role: User, Via: "e2b key " + long}}
	for _, c := range []struct {
		op  string
		req any
	}{
		{"realize", &RealizeRequest{Workshop: strings.Repeat("w", 100_000)}},
		{"bench.write_file", &WriteFileRequest{Bench: long, Path: "/" + long}},
		{"bench.move_file", &MoveFileRequest{Bench: "b", From: long, To: long}},
		{"workshop.allow", &WorkshopAllowRequest{Name: long}},
	} {
		if _, err := s.Do(ctx, viaKey, c.op, c.req); Classify(err).Code != CodeDenied {
			t.Errorf("%s: %v", c.op, err)
		}
	}
	b, _ := os.ReadFile(filepath.Join(s.Root, "audit", "log.jsonl"))
	for i, line := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		if len(line)+1 > audit.MaxLine || !strings.Contains(line, "truncated, 12") {
			t.Errorf("line %d: %d bytes: %.200s", i+1, len(line), line)
		}
	}
	if n, problems, err := s.Audit.Verify(); err != nil || len(problems) != 0 || n != 4 {
		t.Errorf("verify: %d %v %v", n, problems, err)
	}
}

// TestAuditNoted: the entries of operations whose own effects no fsync keeps (a command or a file
// operation in a Bench, a launch whose Bench goes, a realize that found everything in the store) are
// noted, written without waiting for the disk; every other entry is durable before the operation
// answers: a kept Bench's launch, a realize that added to the store, an operation that changes
// authority, a refusal, a failure.
func TestAuditNoted(t *testing.T) {
	dir := t.TempDir()
	s := &Service{Root: dir, Audit: audit.Open(dir)}
	refused := &Error{Code: CodeDenied, Err: ErrDenied}
	for _, c := range []struct {
		op       string
		req, res any
		err      error
		intent   int64
		noted    bool
	}{
		{"bench.exec", &BenchExecRequest{Bench: "b"}, &ExitResult{}, nil, 0, true},
		{"bench.write_files", &WriteFilesRequest{Bench: "b"}, nil, nil, 0, true},
		{"bench.run", &BenchRunRequest{Workshop: "w"}, &ExitResult{}, nil, 0, true},
		{"realize", &RealizeRequest{Workshop: "w"}, &RealizeResult{Workshop: "w", Layers: []string{"/l"}}, nil, 0, true},
		{"bench.run", &BenchRunRequest{Workshop: "w", Keep: true}, &ExitResult{}, nil, 0, false},
		{"realize", &RealizeRequest{Workshop: "w"}, &RealizeResult{Workshop: "w", Built: []string{"/l"}}, nil, 0, false},
		{"realize", &RealizeRequest{Workshop: "w"}, &RealizeResult{Workshop: "w", Substituted: []string{"/l"}}, nil, 0, false},
		{"bench.exec", &BenchExecRequest{Bench: "b"}, nil, refused, 0, false},
		{"bench.run", &BenchRunRequest{Workshop: "w"}, nil, errors.New("no such Workshop"), 0, false},
		{"bench.create", &BenchCreateRequest{Workshop: "w"}, &BenchCreateResult{Bench: "b"}, nil, 0, false},
		{"bench.rm", &BenchRemoveRequest{Benches: []string{"b"}}, &Empty{}, nil, 0, false},
		{"workshop.add", &WorkshopAddRequest{File: "f"}, nil, nil, 7, false},
	} {
		if err := s.record(root, c.op, c.req, c.res, c.err, c.intent, ""); err != nil {
			t.Fatal(err)
		}
		es, err := s.Audit.Entries(audit.Filter{})
		if err != nil {
			t.Fatal(err)
		}
		if e := es[len(es)-1]; e.Event != c.op || e.Noted != c.noted {
			t.Errorf("%s %+v (error %v): entry %s noted %v, want noted %v", c.op, c.req, c.err, e.Event, e.Noted, c.noted)
		}
	}
	// An operation that wrote a lock or added store paths on the way (a launch that locked first, a
	// realize whose lock only gained the recipe's accounts) waits for its fsync whatever its op.
	for _, c := range []struct {
		op       string
		req, res any
	}{
		{"bench.run", &BenchRunRequest{Workshop: "w"}, &ExitResult{}},
		{"realize", &RealizeRequest{Workshop: "w"}, &RealizeResult{Workshop: "w", Layers: []string{"/l"}}},
	} {
		call := &Call{Caller: root.Caller}
		call.wrote.Store(true)
		if err := s.record(call, c.op, c.req, c.res, nil, 0, ""); err != nil {
			t.Fatal(err)
		}
		es, err := s.Audit.Entries(audit.Filter{})
		if err != nil {
			t.Fatal(err)
		}
		if e := es[len(es)-1]; e.Event != c.op || e.Noted {
			t.Errorf("%s that wrote a lock: entry %s noted %v, want it durable", c.op, e.Event, e.Noted)
		}
	}
	if n, problems, err := s.Audit.Verify(); err != nil || len(problems) != 0 {
		t.Errorf("verify: %d entries, %v, %v", n, problems, err)
	}
}
