package supervisor

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"toolshed.dev/shed/store"
)

func newSupervisor(t *testing.T) *Supervisor {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the store is root-only (CI runs as root)")
	}
	s, err := store.Init(filepath.Join(t.TempDir(), "root"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return New(s, nil)
}

const recipeV1 = "name = \"tools\"\nseed = \"debian/bookworm\"\n[apt]\npackages = [\"jq\"]\n"

func files(recipeText, lock string) *Files {
	return &Files{Recipe: []byte(recipeText), Lock: []byte(lock), Extra: map[string][]byte{}}
}

// proposal writes a proposal against base as Propose would, without a Bench.
func proposal(t *testing.T, sv *Supervisor, base int, recipeText, lock string) *Proposal {
	t.Helper()
	var oldR, oldL []byte
	if base > 0 {
		oldR, _ = os.ReadFile(sv.Records.File("tools", base))
		oldL, _ = os.ReadFile(filepath.Join(sv.Records.Dir("tools", base), "workshop.lock"))
	}
	p := &Proposal{ID: randomID(), Workshop: "tools", Base: base, Bench: "b", Created: time.Now().UTC(), Added: []string{"apt curl"}}
	dir := sv.proposalDir(p.ID)
	os.MkdirAll(dir, 0o700)
	os.WriteFile(filepath.Join(dir, "workshop.toml"), []byte(recipeText), 0o644)
	os.WriteFile(filepath.Join(dir, "workshop.lock"), []byte(lock), 0o644)
	diff := sv.diff(p, oldR, []byte(recipeText), oldL, []byte(lock))
	p.DiffSHA256 = sha(diff)
	os.WriteFile(filepath.Join(dir, "diff"), []byte(diff), 0o644)
	b, _ := json.Marshal(p)
	os.WriteFile(filepath.Join(dir, "proposal.json"), b, 0o644)
	return p
}

func TestRecordsCompareAndSwap(t *testing.T) {
	sv := newSupervisor(t)
	ctx := context.Background()
	v, err := sv.Records.Add(ctx, Version{Name: "tools", By: "op"}, files(recipeV1, "lock1\n"), nil)
	if err != nil || v.N != 1 {
		t.Fatalf("add: %+v %v", v, err)
	}
	if _, err := sv.Records.Add(ctx, Version{Name: "tools", By: "op"}, files(recipeV1, "lock1\n"), nil); !errors.Is(err, ErrConflict) {
		t.Errorf("second add of a new record: %v, want ErrConflict", err)
	}
	// Ten racing versions on base 1: exactly one wins.
	var wg sync.WaitGroup
	var mu sync.Mutex
	wins := 0
	for i := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := sv.Records.Add(ctx, Version{Name: "tools", Base: 1, By: "op"}, files(recipeV1+"# "+string(rune('a'+i))+"\n", "lock\n"), nil)
			if err == nil {
				mu.Lock()
				wins++
				mu.Unlock()
			} else if !errors.Is(err, ErrConflict) {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if wins != 1 {
		t.Errorf("%d racing adds on one base won, want 1", wins)
	}
	log, err := sv.Records.Log("tools")
	if err != nil || len(log) != 2 {
		t.Errorf("log: %d versions, %v", len(log), err)
	}
}

func TestPromote(t *testing.T) {
	sv := newSupervisor(t)
	ctx := context.Background()
	if _, err := sv.Records.Add(ctx, Version{Name: "tools", By: "op", Users: []string{"alice"}}, files(recipeV1, "lock1\n"), nil); err != nil {
		t.Fatal(err)
	}
	next := strings.Replace(recipeV1, `["jq"]`, `["jq", "curl=7.88.1-10+deb12u5"]`, 1)

	// Confirming other bytes than the proposal's diff is refused.
	p := proposal(t, sv, 1, next, "lock2\n")
	if _, err := sv.Promote(ctx, p.ID, strings.Repeat("0", 64), "op"); !errors.Is(err, ErrChanged) {
		t.Errorf("wrong confirmation: %v", err)
	}
	// A proposal edited after it was shown is refused.
	os.WriteFile(filepath.Join(sv.proposalDir(p.ID), "workshop.toml"), []byte(next+"[network]\nallow = [\"evil.example.org\"]\n"), 0o644)
	if _, err := sv.Promote(ctx, p.ID, p.DiffSHA256, "op"); !errors.Is(err, ErrChanged) {
		t.Errorf("edited proposal: %v", err)
	}
	// A good one is promoted once; a replay is refused.
	p = proposal(t, sv, 1, next, "lock2\n")
	v, err := sv.Promote(ctx, p.ID, p.DiffSHA256, "op")
	if err != nil || v.N != 2 || v.Proposal != p.ID || len(v.Users) != 1 {
		t.Fatalf("promote: %+v %v", v, err)
	}
	if _, err := sv.Promote(ctx, p.ID, p.DiffSHA256, "op"); !errors.Is(err, ErrConflict) && !errors.Is(err, ErrUsed) {
		t.Errorf("replayed confirmation: %v", err)
	}
	if b, _ := os.ReadFile(sv.Records.File("tools", 2)); string(b) != next {
		t.Errorf("version 2 is %q", b)
	}

	// Two proposals on base 2, confirmed at once: exactly one wins.
	a := proposal(t, sv, 2, next+"# a\n", "lock3\n")
	b := proposal(t, sv, 2, next+"# b\n", "lock3\n")
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, q := range []*Proposal{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = sv.Promote(ctx, q.ID, q.DiffSHA256, "op")
		}()
	}
	wg.Wait()
	if (errs[0] == nil) == (errs[1] == nil) {
		t.Errorf("racing confirmations: %v, %v; want exactly one to win", errs[0], errs[1])
	}
	// The diff of a proposal is what a confirmation hashes.
	_, diff, _ := sv.Get(a.ID)
	h := sha256.Sum256([]byte(diff))
	if hex.EncodeToString(h[:]) != a.DiffSHA256 {
		t.Error("a proposal's diff does not hash to its recorded SHA-256")
	}
}

func TestVisible(t *testing.T) {
	got := Visible("+packages = [\"r\u0435quests\", \"x\u200b\"]\tok\n\x1b[2J")
	want := "+packages = [\"r«U+0435»quests\", \"x«U+200B»\"]\tok\n«U+001B»[2J"
	if got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestAuthorize(t *testing.T) {
	sv := newSupervisor(t)
	if _, err := sv.Records.Add(context.Background(), Version{Name: "tools", By: "op", Users: []string{"alice", "@devs"}}, files(recipeV1, "l\n"), nil); err != nil {
		t.Fatal(err)
	}
	op := &Peer{User: "root", Operator: true}
	alice := &Peer{User: "alice"}
	bob := &Peer{User: "bob", Groups: []string{"devs"}}
	eve := &Peer{User: "eve"}
	for _, c := range []struct {
		p    *Peer
		args []string
		ok   bool
	}{
		{op, []string{"gc"}, true},
		{op, []string{"workshop", "promote", "x"}, true},
		{alice, []string{"workshop", "ls"}, true},
		{alice, []string{"--json", "workshop", "show", "tools"}, true},
		{alice, []string{"realize", "tools"}, true},
		{alice, []string{"realize", "--substituter", "oci://x/y", "tools"}, false},
		{alice, []string{"realize", "--json", "tools"}, true},
		{alice, []string{"bench", "run", "-f", "tools", "--", "sh"}, true},
		{bob, []string{"bench", "shell", "--file=tools"}, true},
		{alice, []string{"bench", "run", "-f", "tools", "--grant", "/etc:/x:ro", "--", "sh"}, false},
		{alice, []string{"bench", "run", "-f", "/tmp/any.toml", "--", "sh"}, false},
		{alice, []string{"realize", "/tmp/any.toml"}, false},
		{eve, []string{"realize", "tools"}, false},
		{alice, []string{"gc"}, false},
		{alice, []string{"workshop", "add", "x.toml"}, false},
		{alice, []string{"workshop", "promote", "x"}, false},
		{alice, []string{"key", "trust", "k:x"}, false},
		{alice, []string{"store", "verify"}, false},
		{alice, []string{"bench", "run", "--", "sh"}, false},
	} {
		err := sv.Records.Authorize(c.p, c.args)
		if (err == nil) != c.ok {
			t.Errorf("%s: %q: got %v, want allowed=%v", c.p.User, c.args, err, c.ok)
		}
	}
}

// TestListenModes: the supervisor's socket is open to every local user (each request is checked),
// in a directory only root writes; the process's umask is left as it was (the supervisor serves
// requests concurrently, and a umask is the whole process's).
func TestListenModes(t *testing.T) {
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	path := filepath.Join(t.TempDir(), "run", "shed.sock")
	ln, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if fi, err := os.Stat(path); err != nil || fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o666 {
		t.Errorf("socket: %v %v, want a socket of mode 0666", fi.Mode(), err)
	}
	if fi, err := os.Stat(filepath.Dir(path)); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("its directory: %v %v, want 0755", fi.Mode(), err)
	}
	if now := syscall.Umask(0o077); now != 0o077 {
		t.Errorf("Listen left the umask at %#o", now)
	}
	if _, err := Listen(path); err == nil || !strings.Contains(err.Error(), "already listens") {
		t.Errorf("a second supervisor on a live socket: %v, want refused", err)
	}
}
