package recipe_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"toolshed.dev/shed/derivation"
	"toolshed.dev/shed/recipe"
	"toolshed.dev/shed/store"
)

const pipRecipe = `name = "py"
seed = "debian/bookworm"
[apt]
packages = ["python3-pip"]
[pip]
index = "http://127.0.0.1:8080/simple/"
packages = ["shedtest-beta"]
`

func pipLock(t *testing.T, r *recipe.Recipe) *recipe.Lock {
	t.Helper()
	fp, err := recipe.Fingerprint(r)
	if err != nil {
		t.Fatal(err)
	}
	return &recipe.Lock{
		Version: recipe.LockVersion, Inputs: fp,
		Seed: recipe.LockedSeed{Spec: "debian/bookworm", Epoch: 1700000000},
		Apt: []recipe.LockedDeb{{Name: "python3-pip", Version: "23.0.1+dfsg-1", Arch: "all", Declared: true, Size: 10,
			URL: "http://deb.debian.org/debian/pool/main/p/python-pip/python3-pip_23.0.1+dfsg-1_all.deb", SHA256: strings.Repeat("a", 64)}},
		Pip: []recipe.LockedWheel{
			{Name: "shedtest-beta", Version: "1.0", Declared: true, URL: "http://127.0.0.1:8080/files/shedtest_beta-1.0-py3-none-any.whl", SHA256: strings.Repeat("b", 64)},
			{Name: "shedtest-alpha", Version: "2.0", URL: "http://127.0.0.1:8080/files/shedtest_alpha-2.0-py3-none-any.whl", SHA256: strings.Repeat("c", 64)},
		},
	}
}

// TestCompilePipLocked: with a lock, each wheel is a fixed-output fetch named
// after its file, whose path depends only on hash and name; the pip layer
// installs exactly the lock's closure over the apt layer.
func TestCompilePipLocked(t *testing.T) {
	r, err := recipe.Parse("workshop.toml", []byte(pipRecipe), recipe.Options{})
	if err != nil {
		t.Fatal(err)
	}
	lock := pipLock(t, r)
	plan, err := recipe.Compile(r, lock, store.DefaultStoreDir)
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Layers) != 3 {
		t.Fatalf("%d layers, want seed, apt, pip", len(plan.Layers))
	}
	pip := plan.Derivations[len(plan.Derivations)-1]
	if pip.Builder != recipe.BuilderPipLayer || pip.Network != "none" {
		t.Fatalf("top derivation %s %s, network %q", pip.Name, pip.Builder, pip.Network)
	}
	if want := []string{"shedtest-alpha==2.0", "shedtest-beta==1.0"}; !slices.Equal(pip.Args, want) {
		t.Errorf("pip layer args %q, want %q", pip.Args, want)
	}
	var wheels []string
	for _, in := range pip.Inputs {
		info, ok := plan.Fetches[in.Out]
		if !ok {
			continue
		}
		wheels = append(wheels, in.Out.Name()+" "+info.Name+" "+info.Version)
	}
	slices.Sort(wheels)
	want := []string{"shedtest_alpha-2.0-py3-none-any.whl shedtest-alpha 2.0", "shedtest_beta-1.0-py3-none-any.whl shedtest-beta 1.0"}
	if !slices.Equal(wheels, want) {
		t.Errorf("wheel fetches %q, want %q", wheels, want)
	}
	// The same file from another index has the same path: a fetch is its hash and name.
	for _, d := range plan.Derivations {
		if d.Kind != derivation.KindFetch || !strings.HasSuffix(d.Name, ".whl") {
			continue
		}
		moved := *d
		moved.Args = []string{strings.Replace(d.Args[0], "127.0.0.1:8080", "mirror.example.org", 1)}
		moved.Network = "allow mirror.example.org"
		moved.Output = store.Path{}
		if err := moved.Finish(store.DefaultStoreDir); err != nil {
			t.Fatal(err)
		}
		if moved.Output != d.Output {
			t.Errorf("%s: path %s from another index, %s here", d.Name, moved.Output, d.Output)
		}
	}
}

// TestLockPipRoundTrip: a lock with wheels encodes, loads and validates; a
// lock that says what a recipe cannot is refused.
func TestLockPipRoundTrip(t *testing.T) {
	r, err := recipe.Parse("workshop.toml", []byte(pipRecipe), recipe.Options{})
	if err != nil {
		t.Fatal(err)
	}
	lock := pipLock(t, r)
	b, err := lock.Encode()
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "workshop.lock")
	if err := os.WriteFile(file, b, 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := recipe.LoadLock(file)
	if err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	if len(got.Pip) != 2 || got.Pip[0].Name != "shedtest-alpha" {
		t.Errorf("pip entries not kept in name order: %+v", got.Pip)
	}
	for _, bad := range []struct {
		edit func(w *recipe.LockedWheel)
		want string
	}{
		{func(w *recipe.LockedWheel) { w.Name = "Shedtest_Beta" }, "normalized"},
		{func(w *recipe.LockedWheel) { w.Version = "1.0; os_name=='nt'" }, "environment marker"},
		{func(w *recipe.LockedWheel) { w.URL = "http://127.0.0.1:8080/files/shedtest_beta-1.0.tar.gz" }, "not a wheel"},
		{func(w *recipe.LockedWheel) { w.URL = "file:///etc/passwd.whl" }, "pip[0].url"},
		{func(w *recipe.LockedWheel) { w.SHA256 = "md5:abc" }, "sha256"},
	} {
		l := pipLock(t, r)
		bad.edit(&l.Pip[0])
		if err := l.Validate(); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%+v: got %v, want an error with %q", l.Pip[0], err, bad.want)
		}
	}
	// Changing the pip packages or the index makes the lock stale.
	for _, src := range []string{
		strings.Replace(pipRecipe, `["shedtest-beta"]`, `["shedtest-beta", "shedtest-gamma"]`, 1),
		strings.Replace(pipRecipe, "8080", "8081", 1),
	} {
		r2, err := recipe.Parse("workshop.toml", []byte(src), recipe.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if ok, _ := lock.Matches(r2); ok {
			t.Errorf("the lock still matches after the recipe changed to:\n%s", src)
		}
	}
}

// TestWriteLockConcurrent: two `shed realize` of one unlocked recipe lock it at once. Every writer
// succeeds, the lock decodes, and no temporary file is left beside it.
func TestWriteLockConcurrent(t *testing.T) {
	r, err := recipe.Parse("workshop.toml", []byte(pipRecipe), recipe.Options{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "workshop.lock")
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := pipLock(t, r)
			l.Seed.Epoch += int64(i) // each writer's lock its own
			errs[i] = recipe.WriteLock(file, l)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("writer %d: %v", i, err)
		}
	}
	got, err := recipe.LoadLock(file)
	if err != nil {
		t.Fatal(err)
	}
	if got.Seed.Epoch < 1700000000 || got.Seed.Epoch >= 1700000008 || len(got.Pip) != 2 {
		t.Errorf("the lock is none of the writes: %+v", got)
	}
	if st, err := os.Stat(file); err != nil {
		t.Error(err)
	} else if st.Mode().Perm() != 0o644 {
		t.Errorf("lock mode %04o, want 0644", st.Mode().Perm())
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 1 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("beside the lock: %q, want nothing", names)
	}
	// A failed write names the lock.
	if err := recipe.WriteLock(filepath.Join(dir, "gone", "workshop.lock"), got); err == nil ||
		!strings.HasPrefix(err.Error(), "write lock "+filepath.Join(dir, "gone", "workshop.lock")+": ") {
		t.Errorf("a write into a missing directory: %v", err)
	}
}

func TestDiffLocksPip(t *testing.T) {
	r, err := recipe.Parse("workshop.toml", []byte(pipRecipe), recipe.Options{})
	if err != nil {
		t.Fatal(err)
	}
	a, b := pipLock(t, r), pipLock(t, r)
	b.Pip[1].Version = "1.0"
	b.Pip = append(b.Pip, recipe.LockedWheel{Name: "shedtest-gamma", Version: "1.0"})
	want := []string{"~ pip:shedtest-alpha 2.0 → 1.0", "+ pip:shedtest-gamma 1.0"}
	if got := recipe.DiffLocks(a, b); !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

// TestLockAccounts: a lock records the recipe's accounts, every default filled in; a lock whose
// accounts differ no longer matches, and says that only they differ (nothing to resolve again).
func TestLockAccounts(t *testing.T) {
	dir := t.TempDir()
	parse := func(src string) *recipe.Recipe {
		r, err := recipe.Parse(filepath.Join(dir, "workshop.toml"), []byte(src), recipe.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	const base = "name = \"x\"\nseed = \"debian/bookworm\"\n[apt]\npackages = [\"sudo\"]\n"
	r := parse(base + "[[account]]\nname = \"user\"\nsudo = true\n")
	fp, err := recipe.Fingerprint(r)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "workshop.lock")
	if err := recipe.WriteLock(file, &recipe.Lock{Version: recipe.LockVersion, Inputs: fp, Accounts: recipe.LockAccounts(r)}); err != nil {
		t.Fatal(err)
	}
	l, err := recipe.LoadLock(file)
	if err != nil {
		t.Fatal(err)
	}
	want := []recipe.LockedAccount{{Name: "user", UID: 1000, GID: 1000, Home: "/home/user", Shell: "/bin/bash", Sudo: true}}
	if diff := cmp.Diff(want, l.Accounts); diff != "" {
		t.Errorf("accounts (-want +got):\n%s", diff)
	}
	if ok, err := l.Matches(r); !ok || err != nil {
		t.Errorf("Matches the recipe it was made of: %v %v", ok, err)
	}
	other := parse(base + "[[account]]\nname = \"user\"\nuid = 1001\nsudo = true\n")
	if ok, _ := l.Matches(other); ok {
		t.Error("a lock matches a recipe whose account has another uid")
	}
	if only, _ := l.AccountsDiffer(other); !only {
		t.Error("AccountsDiffer is false for a recipe whose accounts alone changed")
	}
	if only, _ := l.AccountsDiffer(parse(strings.Replace(base, `"sudo"`, `"sudo", "jq"`, 1))); only {
		t.Error("AccountsDiffer is true for a recipe whose packages changed")
	}
	data, _ := os.ReadFile(file)
	bad := strings.Replace(string(data), "uid = 1000", "uid = 0", 1)
	os.WriteFile(file, []byte(bad), 0o644)
	if _, err := recipe.LoadLock(file); err == nil || !strings.Contains(err.Error(), "account[0]") {
		t.Errorf("a lock with uid 0: %v", err)
	}
}
