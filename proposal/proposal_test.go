package proposal

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
	"testing"
	"time"
	"toolshed.dev/shed/records"

	"toolshed.dev/shed/store"
)

func newProposals(t *testing.T) *Proposals {
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

func files(recipeText, lock string) *records.Files {
	return &records.Files{Recipe: []byte(recipeText), Lock: []byte(lock), Extra: map[string][]byte{}}
}

// proposal writes a proposal against base as Propose would, without a Bench.
func proposal(t *testing.T, sv *Proposals, base int, recipeText, lock string) *Proposal {
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

func TestPromote(t *testing.T) {
	sv := newProposals(t)
	ctx := context.Background()
	if _, err := sv.Records.Add(ctx, records.Version{Name: "tools", By: "op", Users: []string{"alice"}}, files(recipeV1, "lock1\n"), nil); err != nil {
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
	if _, err := sv.Promote(ctx, p.ID, p.DiffSHA256, "op"); !errors.Is(err, records.ErrConflict) && !errors.Is(err, ErrUsed) {
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
