package app

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"toolshed.dev/shed/recipe"
	"toolshed.dev/shed/store"
)

// TestPlanMemo: a long-lived Service compiles a Workshop once, and sees a changed recipe or lock
// by its content, though the file's size and mtime stay the same.
func TestPlanMemo(t *testing.T) {
	root := t.TempDir()
	st, err := store.Init(filepath.Join(root, "store"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	s := &Service{Root: st.Root()}
	c := &Call{Caller: &Caller{Role: Operator}}
	file := filepath.Join(root, "workshop.toml")
	mtime := time.Unix(1700000000, 0)
	write := func(name string, data []byte) {
		t.Helper()
		if err := os.WriteFile(name, data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(name, mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
	writeLock := func(r *recipe.Recipe, version string) {
		t.Helper()
		fp, err := recipe.Fingerprint(r)
		if err != nil {
			t.Fatal(err)
		}
		l := &recipe.Lock{Version: recipe.LockVersion, Inputs: fp, Accounts: recipe.LockAccounts(r),
			Seed: recipe.LockedSeed{Spec: "debian/bookworm", Mirror: recipe.DefaultMirror, Epoch: 1700000000},
			Apt: []recipe.LockedDeb{{Name: "jq", Version: version, Arch: "amd64", URL: "http://deb.example/jq_" + version + ".deb",
				SHA256: strings.Repeat(version, 64), Size: 1000, Declared: true}}}
		if err := recipe.WriteLock(recipe.LockFile(file), l); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(recipe.LockFile(file), mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
	load := func() (*recipe.Recipe, *recipe.Plan) {
		t.Helper()
		r, err := s.loadRecipe(c, file)
		if err != nil {
			t.Fatal(err)
		}
		plan, _, _, err := s.lockedPlanBuilt(t.Context(), c, st, r, true)
		if err != nil {
			t.Fatal(err)
		}
		return r, plan
	}

	write(file, []byte("name = \"a\"\nseed = \"debian/bookworm\"\n[apt]\npackages = [\"jq\"]\n"))
	r, err := recipe.Load(file, recipe.Options{})
	if err != nil {
		t.Fatal(err)
	}
	writeLock(r, "1")
	r1, p1 := load()
	r2, p2 := load()
	if r2 != r1 || p2 != p1 {
		t.Errorf("the same recipe and lock were parsed or compiled again")
	}

	// The lock's content changes (the same size, the same mtime): a new plan, over the new .deb.
	writeLock(r, "2")
	_, p3 := load()
	if p3 == p1 || p3.Layers[1] == p1.Layers[1] {
		t.Errorf("a changed lock gave the plan of the old one: layer %s", p3.Layers[1])
	}
	// The recipe's content changes (the same size, the same mtime): the new recipe.
	write(file, []byte("name = \"b\"\nseed = \"debian/bookworm\"\n[apt]\npackages = [\"jq\"]\n"))
	r4, _ := load()
	if r4 == r1 || r4.Name != "b" {
		t.Errorf("a changed recipe read as the old one: name %q", r4.Name)
	}
}
