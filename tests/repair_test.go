package tests

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// storeInfoJSON is the part of `shed --json store info` these tests read.
type storeInfoJSON struct {
	References  []string `json:"references"`
	BuildInputs []struct {
		Path    string `json:"path"`
		Present bool   `json:"present"`
	} `json:"build_inputs"`
}

func storeInfo(t *testing.T, root, path string) storeInfoJSON {
	t.Helper()
	var j storeInfoJSON
	if err := json.Unmarshal([]byte(mustShed(t, root, "--json", "store", "info", path).stdout), &j); err != nil {
		t.Fatal(err)
	}
	return j
}

// TestRepair damages a realized Workshop the way a disk or a stray command would, and checks that
// every way in refuses or names the damage (bench run --verify, the store's verify_before_launch,
// realize --check, which also tells a damaged store from an unreproducible build), and that
// `store verify --repair` puts back the registered bytes: a layer rebuilt from its .drv, a .deb
// downloaded again, a seed substituted from a cache. After it, the store verifies and a Bench runs.
// It also shows a layer's .debs as build inputs: not pulled with it, not kept by gc unless the
// store says so, pushed only with --with-build-inputs.
func TestRepair(t *testing.T) {
	parallel(t) // see parallelTests in main_test.go
	requireRoot(t)
	a := sharedRoot(t)
	file, _ := benchWorkshop(t)
	layers := realize(t, a, file).Layers
	seed, layer := layers[0], layers[len(layers)-1]

	// The layer needs the seed at run time; its .debs only to build.
	info := storeInfo(t, a, layer)
	if len(info.References) != 1 || info.References[0] != seed {
		t.Errorf("layer references %v, want only the seed %s", info.References, seed)
	}
	if len(info.BuildInputs) < 3 { // jq, libjq1, libonig5
		t.Errorf("layer build inputs %v, want jq's .debs", info.BuildInputs)
	}
	for _, bi := range info.BuildInputs {
		if !strings.HasSuffix(bi.Path, ".deb") {
			t.Errorf("build input %s is not a .deb", bi.Path)
		}
	}

	// A copy ships what runs (the seed and the layer); --with-build-inputs adds the .debs.
	runtimeDir := filepath.Join(t.TempDir(), "runtime")
	r := mustShed(t, a, "--json", "export", "--oci", runtimeDir, file)
	var pushed struct {
		Pushed  []string `json:"pushed"`
		Present []string `json:"present"`
	}
	json.Unmarshal([]byte(r.stdout), &pushed)
	if n := len(pushed.Pushed) + len(pushed.Present); n != 2 {
		t.Errorf("export pushed %v: want the seed and the layer only", pushed)
	}
	fullDir := filepath.Join(t.TempDir(), "full")
	r = mustShed(t, a, "--json", "export", "--with-build-inputs", "--oci", fullDir, file)
	json.Unmarshal([]byte(r.stdout), &pushed)
	if n := len(pushed.Pushed); n != 2+len(info.BuildInputs) {
		t.Errorf("export --with-build-inputs pushed %d paths, want 2 + %d .debs", n, len(info.BuildInputs))
	}

	// A store of its own, from the cache: the seed and the layer, and no .deb.
	b := newRoot(t)
	mustShed(t, b, "key", "trust", strings.TrimSpace(mustShed(t, a, "key", "export").stdout))
	cache := "oci-layout:" + runtimeDir
	realize(t, b, file, "--substituter", cache)
	for _, bi := range storeInfo(t, b, filepath.Base(layer)).BuildInputs {
		if bi.Present {
			t.Errorf("substituting the layer brought its build input %s", bi.Path)
		}
	}
	loc := func(storePath string) string { return filepath.Join(b, "store", filepath.Base(storePath)) }

	// Damage the layer: jq replaced, a file gone.
	jq := filepath.Join(loc(layer), "usr/bin/jq")
	os.Chmod(jq, 0o755)
	if err := os.WriteFile(jq, []byte("#!/bin/sh\necho owned\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	doc := findFile(t, filepath.Join(loc(layer), "usr/share/doc"))
	if err := os.Remove(doc); err != nil {
		t.Fatal(err)
	}

	// bench run --verify refuses it, and says how to repair; so does every launch once the store says so.
	r = shed(t, b, nil, "bench", "run", "--verify", "-f", file, "--", "jq", "-n", "1+1")
	hint := "shed: hint: `shed store verify --repair " + loc(layer) + "`"
	if r.code != 4 || !strings.Contains(r.stderr, "layer "+loc(layer)+" is damaged") || !strings.Contains(r.stderr, hint) || strings.Contains(r.stdout, "owned") {
		t.Errorf("bench run --verify over a damaged layer: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = shed(t, b, nil, "bench", "run", "-f", file, "--", "jq", "-n", "1+1")
	if r.code != 0 || !strings.Contains(r.stdout, "owned") {
		t.Fatalf("without --verify the damaged layer should run (the damage is what this test checks): exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	cfg := filepath.Join(b, "config.toml")
	orig, _ := os.ReadFile(cfg)
	os.WriteFile(cfg, append(orig, []byte("verify_before_launch = true\n")...), 0o600)
	r = shed(t, b, nil, "bench", "run", "-f", file, "--", "jq", "-n", "1+1")
	if r.code != 4 || !strings.Contains(r.stderr, hint) {
		t.Errorf("bench run with verify_before_launch over a damaged layer: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	// realize --check: the rebuild (from .debs fetched again: gc-free build inputs) matches the
	// record; the files on disk do not. It says which.
	r = shed(t, b, nil, "realize", "--check", file)
	for _, want := range []string{
		`(?m)^shed: fetching \d+ build inputs that gc freed, to rebuild\.\.\.$`,
		`(?m)^shed: check: ` + regexp.QuoteMeta(loc(seed)) + `: files intact \(a seed is not rebuilt\)$`,
		`(?m)^shed: check: ` + regexp.QuoteMeta(loc(layer)) + `: files on disk DIFFER from its record \(the rebuild matches the record\):$`,
		`(?m)^  usr/bin/jq: content differs`,
		`(?m)^shed: hint: ` + regexp.QuoteMeta("`shed store verify --repair "+loc(layer)+"`"),
	} {
		if !regexp.MustCompile(want).MatchString(r.stderr) {
			t.Errorf("realize --check: no match for %s\n%s", want, r.stderr)
		}
	}
	if r.code != 4 {
		t.Errorf("realize --check over a damaged layer: exit %d, want 4", r.code)
	}

	// A .deb damaged too, and the seed: the repair fetches the one, substitutes the other (a seed
	// rebuilt from the live mirror could differ) and rebuilds the layer over the repaired seed.
	deb := loc(storeInfo(t, b, filepath.Base(layer)).BuildInputs[0].Path)
	os.Chmod(deb, 0o644)
	if err := os.WriteFile(deb, []byte("not a deb"), 0o644); err != nil {
		t.Fatal(err)
	}
	osRelease := filepath.Join(loc(seed), "etc/debian_version")
	os.Chmod(osRelease, 0o644)
	os.WriteFile(osRelease, []byte("evil\n"), 0o644)

	r = shed(t, b, nil, "store", "verify", "--repair", "--substituter", cache)
	for _, want := range []string{
		`(?m)^repaired: ` + regexp.QuoteMeta(loc(seed)) + ` \(substituted\)$`,
		`(?m)^repaired: ` + regexp.QuoteMeta(deb) + ` \(fetched\)$`,
		`(?m)^repaired: ` + regexp.QuoteMeta(loc(layer)) + ` \(substituted\)$`,
		`(?m): 0 problems$`,
	} {
		if !regexp.MustCompile(want).MatchString(r.stdout) {
			t.Errorf("verify --repair: no match for %s\n%s%s", want, r.stdout, r.stderr)
		}
	}
	if r.code != 0 {
		t.Errorf("verify --repair: exit %d\n%s", r.code, r.stderr)
	}

	// Without a cache, the layer is rebuilt from its .drv.
	os.WriteFile(jq, []byte("#!/bin/sh\necho owned again\n"), 0o755)
	r = shed(t, b, nil, "store", "verify", "--repair", loc(layer))
	if r.code != 0 || !regexp.MustCompile(`(?m)^repaired: `+regexp.QuoteMeta(loc(layer))+` \(rebuilt\)$`).MatchString(r.stdout) {
		t.Errorf("verify --repair without a cache: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	mustShed(t, b, "store", "verify", "--check-contents")
	r = mustShed(t, b, "bench", "run", "-f", file, "--", "jq", "-n", "1+1")
	if strings.TrimSpace(r.stdout) != "2" {
		t.Errorf("after the repair, jq printed %q", r.stdout)
	}

	// gc keeps the .debs realize --check fetched once the store says so, and frees them otherwise.
	orig, _ = os.ReadFile(cfg)
	os.WriteFile(cfg, append(orig, []byte("keep_build_inputs = true\n")...), 0o600)
	mustShed(t, b, "gc")
	for _, bi := range storeInfo(t, b, filepath.Base(layer)).BuildInputs {
		if !bi.Present {
			t.Errorf("gc freed the build input %s with keep_build_inputs = true", bi.Path)
		}
	}
	os.WriteFile(cfg, orig, 0o600)
	mustShed(t, b, "gc")
	for _, bi := range storeInfo(t, b, filepath.Base(layer)).BuildInputs {
		if bi.Present {
			t.Errorf("gc kept the build input %s", bi.Path)
		}
	}
	if !strings.Contains(mustShed(t, b, "bench", "run", "-f", file, "--", "jq", "--version").stdout, "jq-1.6") {
		t.Error("after gc freed the build inputs, the Workshop does not run")
	}
}

// findFile returns a regular file under dir.
func findFile(t *testing.T, dir string) string {
	t.Helper()
	var found string
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && found == "" && d.Type().IsRegular() {
			found = p
		}
		return nil
	})
	if found == "" {
		t.Fatalf("no file under %s", dir)
	}
	return found
}
