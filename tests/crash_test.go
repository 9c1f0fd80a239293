package tests

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// addSteps are the store's failpoints of adding a path (store.Failpoints).
var addSteps = []string{"add-staged", "add-clamped", "add-scanned", "add-linked", "add-synced", "add-renamed", "add-manifest-written", "add-registered"}

// TestBuildCrashAtEveryStep kills `shed realize` with SIGKILL at each step of
// registering a fetched .deb ("*.deb") and a built layer ("apt-*"): the store verifies after each
// crash, and the next run completes.
func TestBuildCrashAtEveryStep(t *testing.T) {
	if !viaDaemon {
		parallel(t) // see parallelTests; through a supervisor, its failpoints kill the supervisor the others use
	}
	requireRoot(t)
	root := sharedRoot(t)
	i := 0
	for _, step := range addSteps {
		for _, target := range []string{"*.deb", "apt-*"} {
			i++
			t.Run(step+"@"+target, func(t *testing.T) {
				// A fresh package per step, so every run has a fetch and a
				// layer to build (the seed is shared and already there).
				repo := newAptRepo(t, debSpec{name: fmt.Sprintf("crash-shed-%d", i), version: "1", files: map[string]string{"usr/share/crash/file": step}})
				file := repo.recipe(t, t.TempDir(), fmt.Sprintf("crash-%d", i), fmt.Sprintf("crash-shed-%d", i))
				mustShed(t, root, "lock", file)
				r := shed(t, root, []string{"SHED_FAILPOINT=" + step + "@" + target}, "realize", file)
				// The process that builds is killed at the step: shed itself, or the supervisor,
				// whose client then has no answer.
				if viaDaemon && (r.code != 1 || !strings.Contains(r.stderr, "without an answer")) {
					t.Fatalf("realize with SHED_FAILPOINT=%s in the supervisor: exit %d, want its client told it died\n%s", step, r.code, r.stderr)
				} else if !viaDaemon && r.code != -9 {
					t.Fatalf("realize with SHED_FAILPOINT=%s: exit %d, want killed\n%s", step, r.code, r.stderr)
				}
				// Every record of the (shared) store is checked; the bytes re-hashed are those of the
				// paths the crashed realize was making, the only ones it wrote (a whole-store re-hash,
				// 1 GiB by then, twice per step, was half of this test's time).
				outputs := recipeOutputs(t, root, file)
				mustShed(t, root, "store", "verify")
				mustShed(t, root, append([]string{"store", "verify", "--check-contents"}, validOf(t, root, outputs)...)...)
				j := realize(t, root, file)
				if b, err := os.ReadFile(filepath.Join(j.Layers[1], "usr/share/crash/file")); err != nil || string(b) != step {
					t.Fatalf("after the rerun, the layer has %q, %v", b, err)
				}
				mustShed(t, root, "store", "verify")
				mustShed(t, root, append([]string{"store", "verify", "--check-contents"}, outputs...)...)
			})
		}
	}
}

// recipeOutputs lists the store paths a locked recipe's derivations build (`shed instantiate`).
func recipeOutputs(t *testing.T, root, file string) []string {
	t.Helper()
	var drvs []struct {
		Output string `json:"output"`
	}
	if err := json.Unmarshal([]byte(mustShed(t, root, "--json", "instantiate", file).stdout), &drvs); err != nil {
		t.Fatal(err)
	}
	var outs []string
	for _, d := range drvs {
		outs = append(outs, d.Output)
	}
	return outs
}

// validOf keeps the paths that are registered in root (a crash leaves some unbuilt).
func validOf(t *testing.T, root string, paths []string) []string {
	t.Helper()
	var valid []string
	for _, p := range paths {
		if shed(t, root, nil, "store", "info", p).code == 0 {
			valid = append(valid, p)
		}
	}
	return valid
}

// TestConcurrentRealize: two `shed realize` of one recipe at once build each
// derivation once between them, and both print the same layers.
func TestConcurrentRealize(t *testing.T) {
	parallel(t) // see parallelTests in main_test.go
	requireRoot(t)
	root := sharedRoot(t)
	repo := newAptRepo(t,
		debSpec{name: "conc-shed", version: "1", depends: "conc-dep", files: map[string]string{"usr/share/conc/a": "a"}},
		debSpec{name: "conc-dep", version: "1", files: map[string]string{"usr/share/conc/b": "b"}},
	)
	file := repo.recipe(t, t.TempDir(), "concurrent", "conc-shed")
	mustShed(t, root, "lock", file)
	var wg sync.WaitGroup
	outs := make([]result, 2)
	for i := range outs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[i] = shed(t, root, nil, "--json", "realize", file)
		}()
	}
	wg.Wait()
	built, fetched := map[string]int{}, map[string]int{}
	var layers []string
	for i, r := range outs {
		if r.code != 0 {
			t.Fatalf("realize %d: exit %d\n%s", i, r.code, r.stderr)
		}
		var j realizeJSON
		if err := json.Unmarshal([]byte(r.stdout), &j); err != nil {
			t.Fatal(err)
		}
		for _, p := range j.Built {
			built[p]++
		}
		for _, p := range j.Fetched {
			fetched[p]++
		}
		if layers == nil {
			layers = j.Layers
		} else if strings.Join(layers, " ") != strings.Join(j.Layers, " ") {
			t.Errorf("the two realizes printed different layers: %v and %v", layers, j.Layers)
		}
	}
	if len(built) != 1 || len(fetched) != 2 {
		t.Errorf("built %v, fetched %v; want the layer built once and two .debs fetched once", built, fetched)
	}
	for p, n := range built {
		if n != 1 {
			t.Errorf("%s built %d times", p, n)
		}
	}
	for p, n := range fetched {
		if n != 1 {
			t.Errorf("%s fetched %d times", p, n)
		}
	}
}
