package proposal

import (
	"bytes"
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

	"toolshed.dev/shed/recipe"
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
	return proposalWith(t, sv, base, files(recipeText, lock))
}

// proposalWith is proposal with the recipe's files (f.Extra: the keys of its [[apt.source]]).
func proposalWith(t *testing.T, sv *Proposals, base int, f *records.Files) *Proposal {
	t.Helper()
	old := &records.Files{}
	if base > 0 {
		r, err := recipe.Load(sv.Records.File("tools", base), recipe.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if old, err = records.ReadFiles(r); err != nil {
			t.Fatal(err)
		}
	}
	p := &Proposal{ID: randomID(), Workshop: "tools", Base: base, Bench: "b", Created: time.Now().UTC(), Added: []string{"apt curl"}}
	dir := sv.proposalDir(p.ID)
	write := func(rel string, b []byte) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, rel)), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, rel), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for rel, b := range f.Extra {
		write(rel, b)
	}
	write("workshop.toml", f.Recipe)
	write("workshop.lock", f.Lock)
	diff := sv.diff(p, old, f)
	p.DiffSHA256 = sha(diff)
	write("diff", []byte(diff))
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	write("proposal.json", b)
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
	// A good one is promotable, and promoted once; a replay is refused, and it is no longer
	// promotable (used), nor is another made against the version it replaced (stale).
	p = proposal(t, sv, 1, next, "lock2\n")
	stale := proposal(t, sv, 1, next+"# other\n", "lock2\n")
	if err := sv.Promotable(p.ID); err != nil {
		t.Errorf("Promotable before: %v", err)
	}
	v, err := sv.Promote(ctx, p.ID, p.DiffSHA256, "op")
	if err != nil || v.N != 2 || v.Proposal != p.ID || len(v.Users) != 1 {
		t.Fatalf("promote: %+v %v", v, err)
	}
	if _, err := sv.Promote(ctx, p.ID, p.DiffSHA256, "op"); !errors.Is(err, records.ErrConflict) && !errors.Is(err, ErrUsed) {
		t.Errorf("replayed confirmation: %v", err)
	}
	if err := sv.Promotable(p.ID); !errors.Is(err, ErrUsed) {
		t.Errorf("Promotable after its promotion: %v, want ErrUsed", err)
	}
	if err := sv.Promotable(stale.ID); !errors.Is(err, records.ErrConflict) || !strings.Contains(err.Error(), "now at version 2") {
		t.Errorf("Promotable of a proposal against version 1, now 2: %v, want ErrConflict", err)
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

// sourceRecipe is a recipe with an extra signed apt repository, whose key file a record keeps.
const sourceRecipe = recipeV1 + `[[apt.source]]
url = "https://vendor.example.com/apt"
suite = "stable"
components = ["main"]
key = "keys/vendor.asc"
`

const keyV1 = "-----BEGIN PGP PUBLIC KEY BLOCK-----\nmQINBGV1\n-----END PGP PUBLIC KEY BLOCK-----\n"

func withKey(recipeText, lock string, key []byte) *records.Files {
	f := files(recipeText, lock)
	f.Extra["keys/vendor.asc"] = key
	return f
}

// recordIs fails unless name's current version is n with recipe, lock and key.
func recordIs(t *testing.T, sv *Proposals, n int, recipeText, lock string, key []byte) {
	t.Helper()
	cur, err := sv.Records.Current("tools")
	if err != nil || cur.N != n {
		t.Fatalf("current: %+v %v, want version %d", cur, err, n)
	}
	dir := sv.Records.Dir("tools", n)
	for rel, want := range map[string][]byte{"workshop.toml": []byte(recipeText), "workshop.lock": []byte(lock), "keys/vendor.asc": key} {
		if b, err := os.ReadFile(filepath.Join(dir, rel)); err != nil || !bytes.Equal(b, want) {
			t.Errorf("version %d's %s is %q (%v), want %q", n, rel, b, err, want)
		}
	}
}

// TestPromoteExtraFiles: a key file the recipe refers to is part of the diff (text as lines, binary as
// its size and SHA-256) and is checked again at confirmation.
func TestPromoteExtraFiles(t *testing.T) {
	sv := newProposals(t)
	ctx := context.Background()
	if _, err := sv.Records.Add(ctx, records.Version{Name: "tools", By: "op"}, withKey(sourceRecipe, "lock1\n", []byte(keyV1)), nil); err != nil {
		t.Fatal(err)
	}
	next := sourceRecipe + "# curl\n"
	keyV2 := []byte(strings.Replace(keyV1, "mQINBGV1", "mQINBGV2", 1))

	// A changed key is shown as lines.
	p := proposalWith(t, sv, 1, withKey(next, "lock2\n", keyV2))
	_, diff, err := sv.Get(p.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"--- a/keys/vendor.asc (version 1)", "+++ b/keys/vendor.asc (proposed)", "-mQINBGV1\n", "+mQINBGV2\n"} {
		if !strings.Contains(diff, want) {
			t.Errorf("the diff lacks %q:\n%s", want, diff)
		}
	}
	// The key edited after the diff was shown: refused, the record unchanged.
	keyFile := filepath.Join(sv.proposalDir(p.ID), "keys", "vendor.asc")
	if err := os.WriteFile(keyFile, []byte(strings.Replace(keyV1, "mQINBGV1", "mQINEVIL", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := sv.Promote(ctx, p.ID, p.DiffSHA256, "op"); !errors.Is(err, ErrChanged) {
		t.Errorf("a key edited after it was shown: %v, want ErrChanged", err)
	}
	recordIs(t, sv, 1, sourceRecipe, "lock1\n", []byte(keyV1))

	// An unchanged key is not in the diff, and still checked: an edit is refused.
	p = proposalWith(t, sv, 1, withKey(next, "lock2\n", []byte(keyV1)))
	if _, diff, _ := sv.Get(p.ID); strings.Contains(diff, "vendor.asc (version") {
		t.Errorf("an unchanged key is in the diff:\n%s", diff)
	}
	keyFile = filepath.Join(sv.proposalDir(p.ID), "keys", "vendor.asc")
	if err := os.WriteFile(keyFile, keyV2, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := sv.Promote(ctx, p.ID, p.DiffSHA256, "op"); !errors.Is(err, ErrChanged) {
		t.Errorf("an unchanged key edited after it was shown: %v, want ErrChanged", err)
	}
	recordIs(t, sv, 1, sourceRecipe, "lock1\n", []byte(keyV1))

	// A binary key is shown as its size and SHA-256, never as raw bytes.
	binKey := []byte{0x99, 0x02, 0x0d, 0x04, 0x00, 0x1b, 0x5b, 0x32, 0x4a}
	p = proposalWith(t, sv, 1, withKey(next, "lock2\n", binKey))
	_, diff, _ = sv.Get(p.ID)
	h := sha256.Sum256(binKey)
	want := "binary file keys/vendor.asc: version 1 " + describe([]byte(keyV1), true) + ", proposed 9 bytes, sha256 " + hex.EncodeToString(h[:]) + "\n"
	if !strings.Contains(diff, want) || strings.Contains(diff, string(binKey[5:])) {
		t.Errorf("the diff of a binary key, want the line %q:\n%s", want, diff)
	}
	// Confirmed as shown, it is recorded.
	if _, err := sv.Promote(ctx, p.ID, p.DiffSHA256, "op"); err != nil {
		t.Fatal(err)
	}
	recordIs(t, sv, 2, next, "lock2\n", binKey)
}

// TestPromoteNewRecord: a proposal for a Workshop with no record (base 0) shows everything it would
// record, is diffed again at confirmation like any other, and is refused if the record appeared.
func TestPromoteNewRecord(t *testing.T) {
	sv := newProposals(t)
	ctx := context.Background()
	f := withKey(sourceRecipe, "lock1\n", []byte(keyV1))

	p := proposalWith(t, sv, 0, f)
	_, diff, _ := sv.Get(p.ID)
	for _, want := range []string{"+name = \"tools\"\n", "+lock1\n", "new file keys/vendor.asc\n", "+-----BEGIN PGP PUBLIC KEY BLOCK-----\n"} {
		if !strings.Contains(diff, want) {
			t.Errorf("the diff of a new record lacks %q:\n%s", want, diff)
		}
	}
	// Edited after it was shown (the recipe, then the key): refused, no record made.
	for _, edit := range []struct{ rel, text string }{
		{"workshop.toml", sourceRecipe + "[network]\nallow = [\"evil.example.org\"]\n"},
		{"keys/vendor.asc", strings.Replace(keyV1, "mQINBGV1", "mQINEVIL", 1)},
	} {
		p := proposalWith(t, sv, 0, f)
		if err := os.WriteFile(filepath.Join(sv.proposalDir(p.ID), edit.rel), []byte(edit.text), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := sv.Promote(ctx, p.ID, p.DiffSHA256, "op"); !errors.Is(err, ErrChanged) {
			t.Errorf("a new record's proposal with %s edited after it was shown: %v, want ErrChanged", edit.rel, err)
		}
		if _, err := sv.Records.Current("tools"); !errors.Is(err, records.ErrNoRecord) {
			t.Errorf("a refused proposal made a record: %v", err)
		}
	}
	// A record of that name appeared meanwhile: refused, the other record kept.
	if _, err := sv.Records.Add(ctx, records.Version{Name: "tools", By: "op"}, files(recipeV1, "lock0\n"), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := sv.Promote(ctx, p.ID, p.DiffSHA256, "op"); !errors.Is(err, records.ErrConflict) {
		t.Errorf("a new record's proposal after the record appeared: %v, want ErrConflict", err)
	}
	if cur, err := sv.Records.Current("tools"); err != nil || cur.N != 1 || cur.Proposal != "" {
		t.Errorf("the record is %+v (%v), want the one added meanwhile", cur, err)
	}
	// In a store without the record, the same proposal as shown is promoted.
	sv2 := newProposals(t)
	q := proposalWith(t, sv2, 0, f)
	if v, err := sv2.Promote(ctx, q.ID, q.DiffSHA256, "op"); err != nil || v.N != 1 || v.Proposal != q.ID {
		t.Fatalf("promote a new record: %+v %v", v, err)
	}
	recordIs(t, sv2, 1, sourceRecipe, "lock1\n", []byte(keyV1))
}

func TestVisible(t *testing.T) {
	got := Visible("+packages = [\"r\u0435quests\", \"x\u200b\"]\tok\n\x1b[2J")
	want := "+packages = [\"r«U+0435»quests\", \"x«U+200B»\"]\tok\n«U+001B»[2J"
	if got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}
