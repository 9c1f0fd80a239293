package tests

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"toolshed.dev/shed/recipe"
)

// pipRecipe writes a Workshop with python3-pip and the given pip packages
// against idx, and returns its file.
func pipRecipe(t *testing.T, idx *pipIndex, name string, pkgs ...string) string {
	t.Helper()
	q := make([]string, len(pkgs))
	for i, p := range pkgs {
		q[i] = fmt.Sprintf("%q", p)
	}
	return writeFile(t, filepath.Join(t.TempDir(), "workshop.toml"), fmt.Sprintf(`name = %q
seed = "debian/bookworm"
[apt]
packages = ["python3-pip"]
[pip]
index = %q
packages = [%s]
`, name, idx.URL(), strings.Join(q, ", ")))
}

const (
	alpha1 = "shedtest_alpha-1.0-py3-none-any.whl"
	alpha2 = "shedtest_alpha-2.0-py3-none-any.whl"
	gamma1 = "shedtest_gamma-1.0-py3-none-any.whl"
)

// TestPipWorkshop: pip packages are resolved into the lock by pip's own
// resolver against a loopback index, fetched once as fixed-output paths,
// installed by a build with no network, reproducibly, and a Bench imports
// them with no network at all.
func TestPipWorkshop(t *testing.T) {
	parallel(t) // see parallelTests in main_test.go
	requireRoot(t)
	root := sharedRoot(t)
	idx := newPipIndex(t)
	file := pipRecipe(t, idx, "py", "shedtest-beta")

	mustShed(t, root, "lock", file)
	lock, err := recipe.LoadLock(recipe.LockFile(file))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]recipe.LockedWheel{}
	for _, w := range lock.Pip {
		got[w.Name] = w
	}
	if a, b := got["shedtest-alpha"], got["shedtest-beta"]; len(lock.Pip) != 2 || a.Version != "2.0" || a.Declared || b.Version != "1.0" || !b.Declared ||
		!strings.HasPrefix(a.URL, strings.TrimSuffix(idx.URL(), "simple/")) || len(a.SHA256) != 64 {
		t.Fatalf("pip entries of the lock: %+v", lock.Pip)
	}

	idx.ResetDownloads()
	j := realize(t, root, file)
	if len(j.Layers) != 3 {
		t.Fatalf("layers %q, want seed, apt, pip", j.Layers)
	}
	if idx.Downloads(alpha2) != 1 {
		t.Errorf("%s downloaded %d times by realize, want once", alpha2, idx.Downloads(alpha2))
	}
	top := j.Layers[2]
	if fi, err := os.Stat(filepath.Join(top, "usr/local/lib/python3.11/dist-packages/shedtest_beta.py")); err != nil || fi.ModTime().Unix() != lock.Seed.Epoch {
		t.Errorf("shedtest_beta.py in the pip layer: %v (mtime %v, want the lock's epoch %d)", err, fi, lock.Seed.Epoch)
	}
	pycs, _ := exec.Command("find", top, "-name", "*.pyc", "-o", "-name", "__pycache__").Output()
	if len(pycs) > 0 {
		t.Errorf("the pip layer holds bytecode:\n%s", pycs)
	}

	// The Bench imports them with no network at all: shed runs in a network
	// namespace of its own with only a loopback that is down.
	out, err := exec.Command("unshare", "--net", shedBin, "--root", root, "bench", "run", "--offline", "-f", file, "--",
		"python3", "-c", "import shedtest_beta; print(shedtest_beta.hello())").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "beta 2.0" {
		t.Errorf("import in an offline Bench: %v\n%s", err, out)
	}
	// shed why names the distribution a file of the pip layer belongs to.
	why := mustShed(t, root, "why", file, "/usr/local/lib/python3.11/dist-packages/shedtest_beta.py").stdout
	if !strings.Contains(why, "package:  shedtest-beta 1.0") || !strings.Contains(why, `pip.packages: "shedtest-beta"`) || !strings.Contains(why, "pip layer") {
		t.Errorf("shed why of a declared distribution's file:\n%s", why)
	}
	why = mustShed(t, root, "why", file, "/usr/local/lib/python3.11/dist-packages/shedtest_alpha.py").stdout
	if !strings.Contains(why, "package:  shedtest-alpha 2.0") || !strings.Contains(why, "dependency pip's resolver added") {
		t.Errorf("shed why of a dependency's file:\n%s", why)
	}
	// Reproducible: --check rebuilds the layers and compares.
	if r := shed(t, root, nil, "realize", "--check", file); r.code != 0 {
		t.Errorf("realize --check: exit %d\n%s", r.code, r.stderr)
	}

	// A second recipe that shares a wheel does not fetch it again.
	file2 := pipRecipe(t, idx, "py2", "shedtest-gamma", "shedtest-alpha==2.0")
	mustShed(t, root, "lock", file2)
	idx.ResetDownloads()
	j2 := realize(t, root, file2)
	// Other tests share the store, and one of them may fetch gamma at any time, before this realize
	// or during it: gamma is downloaded once if this realize fetched it, else not at all.
	wantGamma := 0
	for _, f := range j2.Fetched {
		if strings.HasSuffix(f, "-"+gamma1) {
			wantGamma++
		}
	}
	if idx.Downloads(alpha2) != 0 || idx.Downloads(gamma1) != wantGamma || wantGamma > 1 {
		t.Errorf("second recipe: %s downloaded %d times (want 0: it is in the store), %s %d times (want %d: the times this realize fetched it); fetched %q",
			alpha2, idx.Downloads(alpha2), gamma1, idx.Downloads(gamma1), wantGamma, j2.Fetched)
	}
	if j2.Layers[1] != j.Layers[1] {
		t.Errorf("the two recipes do not share their apt layer: %s, %s", j2.Layers[1], j.Layers[1])
	}
}

// TestPipRealizeCounts: a realize that locks first counts everything it downloaded, locking
// included: resolving pip packages builds the apt layer pip runs in, whose .debs are downloaded
// then. Its summary line says as many files as its fetch lines did.
func TestPipRealizeCounts(t *testing.T) {
	parallel(t) // see parallelTests in main_test.go
	requireRoot(t)
	// A store of its own: in the shared store TestPipWorkshop's realize, beside this one, would find
	// the wheels this one fetched (the same bytes, the same fixed-output paths) and fetch none.
	root := seededRoot(t)
	idx := newPipIndex(t)
	// python3-six is this test's alone: its .deb is downloaded by the lock, whatever else ran.
	file := writeFile(t, filepath.Join(t.TempDir(), "workshop.toml"), fmt.Sprintf(`name = "pycount"
seed = "debian/bookworm"
[apt]
packages = ["python3-pip", "python3-six"]
[pip]
index = %q
packages = ["shedtest-beta"]
`, idx.URL()))
	r := mustShed(t, root, "realize", file)
	// What the fetch lines say was downloaded: "fetched 30 files, 12.8 MiB in 700ms".
	printed, lines := 0, 0
	for _, m := range regexp.MustCompile(`(?m)^fetched (\d+) files?, `).FindAllStringSubmatch(r.stderr, -1) {
		n, _ := strconv.Atoi(m[1])
		printed, lines = printed+n, lines+1
	}
	summary := regexp.MustCompile(`(?m)^shed: realized pycount in .*, fetched (\d+) files? \(`).FindStringSubmatch(r.stderr)
	if lines < 1 || summary == nil || summary[1] != strconv.Itoa(printed) {
		t.Errorf("the summary does not count the %d files the fetch lines say were downloaded:\n%s", printed, r.stderr)
	}
}

// TestPipBadInput: each failure is one clear error, leaves the store valid,
// and a rerun succeeds once the cause is gone.
func TestPipBadInput(t *testing.T) {
	parallel(t) // see parallelTests in main_test.go
	requireRoot(t)
	root := sharedRoot(t)
	idx := newPipIndex(t)

	// A package or a version the index does not have: TestPipPackageNotThere.

	// pip without python3: the seed alone has none.
	noPython := writeFile(t, filepath.Join(t.TempDir(), "workshop.toml"), fmt.Sprintf("name = \"nopy\"\nseed = \"debian/bookworm\"\n[pip]\nindex = %q\npackages = [\"shedtest-gamma\"]\n", idx.URL()))
	r := shed(t, root, nil, "lock", noPython)
	if r.code != 1 || !strings.Contains(r.stderr, "no python3") || !strings.Contains(r.stderr, "add python3 and python3-pip to [apt] packages") {
		t.Errorf("no python3: exit %d\n%s", r.code, r.stderr)
	}

	// Fetch failures of a locked wheel that is in no store yet.
	file := pipRecipe(t, idx, "old-alpha", "shedtest-alpha==1.0")
	mustShed(t, root, "lock", file)
	for _, c := range []struct {
		fault func(string)
		want  string
	}{
		{idx.Corrupt, "sha256"},
		{idx.FailMidway, alpha1},
		{idx.Remove, "no longer served"},
	} {
		idx.Restore()
		c.fault(alpha1)
		r := shed(t, root, nil, "realize", file)
		if r.code != 1 || !strings.Contains(r.stderr, c.want) || strings.Count(r.stderr, "shed: error:") != 1 {
			t.Errorf("realize with %s faulty: exit %d, want 1 and one error with %q:\n%s", alpha1, r.code, c.want, r.stderr)
		}
		mustShed(t, root, "store", "verify")
		if m, _ := filepath.Glob(filepath.Join(root, "store", "*-"+alpha1)); len(m) != 0 {
			t.Errorf("a faulty fetch left %q in the store", m)
		}
	}
	idx.Restore()
	j := realize(t, root, file)
	out := mustShed(t, root, "bench", "run", "--offline", "-f", file, "--", "python3", "-c", "import shedtest_alpha; print(shedtest_alpha.VERSION)")
	if strings.TrimSpace(out.stdout) != "1.0" || len(j.Layers) != 3 {
		t.Errorf("after the index recovered: %q, layers %q", out.stdout, j.Layers)
	}
}
