package tests

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestInstantiateMatchesRealize: for a locked recipe, instantiate's outputs are the paths realize
// built (it compiles with the lock beside the recipe, as realize does), fetches included.
func TestInstantiateMatchesRealize(t *testing.T) {
	parallel(t) // see parallelTests in main_test.go
	requireRoot(t)
	root := sharedRoot(t)
	file := writeFile(t, filepath.Join(t.TempDir(), "workshop.toml"), fmt.Sprintf("name = \"inst-%d\"\nseed = \"debian/bookworm\"\n[apt]\npackages = [\"jq\"]\n", os.Getpid()))
	// The first realize says the lock's start and end, and sums up. (Its layer may be another test's
	// already; TestInterrupt checks the build's lines.)
	first := mustShed(t, root, "realize", file)
	for _, want := range []string{"shed: locking: ", "shed: resolved ", "shed: realized "} {
		if !strings.Contains(first.stderr, want) {
			t.Errorf("realize's stderr lacks %q:\n%s", want, first.stderr)
		}
	}
	layers := realize(t, root, file).Layers
	r := mustShed(t, root, "--json", "instantiate", file)
	var res struct {
		Derivations []struct{ Kind, Output string }
	}
	if err := json.Unmarshal([]byte(r.stdout), &res.Derivations); err != nil {
		t.Fatalf("instantiate --json: %v\n%s", err, r.stdout)
	}
	var outs []string
	fetches := 0
	for _, d := range res.Derivations {
		if d.Kind == "fetch" {
			fetches++
			continue
		}
		outs = append(outs, d.Output)
	}
	if !slices.Equal(outs, layers) {
		t.Errorf("instantiate's seed and layer outputs %v, realize's %v", outs, layers)
	}
	if fetches == 0 {
		t.Errorf("instantiate of a locked recipe wrote no fetch derivations: %s", r.stdout)
	}
}
