package tests

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// These tests realize real Debian recipes against the real mirror.

const jqRecipe = `name = "jq-tools"
seed = "debian/bookworm"
[apt]
packages = ["jq"]
`

// TestRealizeJq: lock, fetch, build a jq layer; a rerun is a cache hit that
// touches no network, also with --offline; --check rebuilds the layer and
// finds the same bytes; why and log explain it.
func TestRealizeJq(t *testing.T) {
	requireRoot(t)
	root := sharedRoot(t)
	dir := t.TempDir()
	file := writeFile(t, filepath.Join(dir, "workshop.toml"), jqRecipe)

	first := realize(t, root, file)
	if len(first.Layers) != 2 || !strings.HasSuffix(first.Layers[1], "-apt-jq") {
		t.Fatalf("layers %v, want a seed and an apt-jq layer", first.Layers)
	}
	jq := filepath.Join(first.Layers[1], "usr/bin/jq")
	if fi, err := os.Stat(jq); err != nil || fi.Mode().Perm()&0o111 == 0 {
		t.Fatalf("%s: %v", jq, err)
	}
	lock, err := os.ReadFile(filepath.Join(dir, "workshop.lock"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"name = 'jq'", "name = 'libjq1'", "name = 'libonig5'", "sha256 = '", "epoch = "} {
		if !strings.Contains(string(lock), want) {
			t.Errorf("workshop.lock lacks %q:\n%s", want, lock)
		}
	}
	// The layer holds the payload, not apt's lists, caches or logs.
	for _, junk := range []string{"var/lib/apt/lists", "var/cache/apt/pkgcache.bin", "var/log/dpkg.log", "var/cache/ldconfig/aux-cache", "var/lib/dpkg/status-old"} {
		if _, err := os.Lstat(filepath.Join(first.Layers[1], junk)); err == nil {
			t.Errorf("layer holds %s", junk)
		}
	}

	// The seed carries nothing of the host or of how it was built.
	for _, f := range []string{"etc/resolv.conf", "etc/hostname"} {
		if b, err := os.ReadFile(filepath.Join(first.Layers[0], f)); err != nil || len(b) != 0 {
			t.Errorf("seed %s: %q, %v; want empty (the builder's host must not leak in)", f, b, err)
		}
	}
	if _, err := os.Lstat(filepath.Join(first.Layers[0], "etc/apt/apt.conf.d/99mmdebstrap")); err == nil {
		t.Error("the seed keeps mmdebstrap's apt options (the build's proxy)")
	}

	// Cache hit: nothing built or fetched, and fast; --offline as well.
	start := time.Now()
	again := realize(t, root, file)
	t.Logf("cache-hit realize took %v", time.Since(start))
	if len(again.Built) != 0 || len(again.Fetched) != 0 || strings.Join(again.Layers, " ") != strings.Join(first.Layers, " ") {
		t.Errorf("second realize: built %v fetched %v layers %v; want a cache hit", again.Built, again.Fetched, again.Layers)
	}
	offline := realize(t, root, file, "--offline")
	if len(offline.Built) != 0 {
		t.Errorf("offline realize built %v", offline.Built)
	}

	r := mustShed(t, root, "realize", "--check", file)
	if !strings.Contains(r.stderr, "-apt-jq: rebuilt, same as its record and as its files on disk") || !strings.Contains(r.stderr, "-debian-bookworm: files intact") {
		t.Errorf("--check: %s", r.stderr)
	}

	r = mustShed(t, root, "why", file, "/usr/bin/jq")
	for _, want := range []string{"package:  jq ", "declared: " + file + ":4: apt.packages: \"jq\""} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("why /usr/bin/jq lacks %q:\n%s", want, r.stdout)
		}
	}
	r = mustShed(t, root, "why", file, "/usr/lib/x86_64-linux-gnu/libonig.so.5")
	if !strings.Contains(r.stdout, "needed by: jq → libjq1 → libonig5") {
		t.Errorf("why libonig:\n%s", r.stdout)
	}
	r = mustShed(t, root, "log", first.Layers[1])
	if !strings.Contains(r.stdout, "Setting up jq") {
		t.Errorf("build log lacks apt's output:\n%s", r.stdout)
	}
	// A Workshop root keeps it all through gc.
	mustShed(t, root, "gc")
	realize(t, root, file, "--offline")

	// Offline on a store that lacks the paths: one error listing them.
	empty := newRoot(t)
	r = shed(t, empty, nil, "realize", "--offline", file)
	if r.code != 1 || !strings.Contains(r.stderr, "offline") || !strings.Contains(r.stderr, "-debian-bookworm") || !strings.Contains(r.stderr, "shed: hint:") {
		t.Errorf("offline realize on an empty store: exit %d\n%s", r.code, r.stderr)
	}
}

// TestSecondRecipeSharesPackages: a recipe sharing jq with the first fetches
// only what it does not share, and builds python3-minimal. The first recipe is
// this test's own (jq and bc), so that its .debs are fetched here: gc frees a
// layer's .debs, and another test's gc of the shared store may have.
func TestSecondRecipeSharesPackages(t *testing.T) {
	requireRoot(t)
	root := sharedRoot(t)
	dir := t.TempDir()
	first := realize(t, root, writeFile(t, filepath.Join(dir, "a", "workshop.toml"), `name = "jq-bc"
seed = "debian/bookworm"
[apt]
packages = ["jq", "bc"]
`))
	if len(first.Built) == 0 {
		t.Fatalf("the first recipe was not built here (built %v): another test realizes it too, and its .debs may be gone", first.Built)
	}
	py := realize(t, root, writeFile(t, filepath.Join(dir, "b", "workshop.toml"), `name = "py"
seed = "debian/bookworm"
[apt]
packages = ["jq", "bc", "python3-minimal"]
`))
	for _, f := range py.Fetched {
		for _, shared := range []string{"_jq_", "libjq1", "libonig5", "-bc_"} {
			if strings.Contains(filepath.Base(f), shared) || strings.HasSuffix(filepath.Base(f), "-jq_1.6") {
				t.Errorf("fetched %s again although the first recipe has it", f)
			}
		}
	}
	// (Other tests share the store: python3-minimal may have been fetched before; it must be there now.)
	if ls := mustShed(t, root, "store", "ls").stdout; !regexp.MustCompile(`-python3-minimal_\S+\.deb\s`).MatchString(ls) {
		t.Error("python3-minimal's .deb is not in the store")
	}
	if _, err := os.Stat(filepath.Join(py.Layers[1], "usr/bin/python3.11")); err != nil {
		t.Error(err)
	}
	// The layer's dpkg state knows both jq and python3: layers chain.
	st, err := os.ReadFile(filepath.Join(py.Layers[1], "var/lib/dpkg/status"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"Package: jq\n", "Package: python3-minimal\n", "Package: coreutils\n"} {
		if !strings.Contains(string(st), p) {
			t.Errorf("dpkg status lacks %q", p)
		}
	}
}

// TestReproducibleFromEmptyStores: two stores, both empty, realize the same
// locked recipe; the layer has the same content hash in both (invariant 4),
// and so does the seed while the mirror does not move.
func TestReproducibleFromEmptyStores(t *testing.T) {
	parallel(t) // see parallelTests in main_test.go
	requireRoot(t)
	// Each store locks its own copy of the recipe, at the same time (a seed build is mostly one
	// dpkg at a time: two overlap on two cores); the locks must come out the same, and so must
	// every path built from them.
	hashes := make([]map[string]string, 2)
	roots, files := make([]string, 2), make([]string, 2)
	outs, errs := make([][]byte, 2), make([]error, 2)
	var wg sync.WaitGroup
	for i := range roots {
		roots[i] = newRoot(t)
		files[i] = writeFile(t, filepath.Join(t.TempDir(), "workshop.toml"), jqRecipe)
		cmd := shedCmd(t, roots[i], "--json", "realize", files[i])
		wg.Add(1)
		go func() {
			defer wg.Done()
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			errs[i] = cmd.Run()
			outs[i] = stdout.Bytes()
			if errs[i] != nil {
				outs[i] = append(outs[i], stderr.Bytes()...)
			}
		}()
	}
	wg.Wait()
	for i := range roots {
		if errs[i] != nil {
			t.Fatalf("realize in empty store %d: %v\n%s", i, errs[i], outs[i])
		}
	}
	lock0, _ := os.ReadFile(strings.TrimSuffix(files[0], ".toml") + ".lock")
	lock1, _ := os.ReadFile(strings.TrimSuffix(files[1], ".toml") + ".lock")
	if len(lock0) == 0 || !bytes.Equal(lock0, lock1) {
		t.Fatalf("the two stores locked the same recipe differently:\n%s\n---\n%s", lock0, lock1)
	}
	for i, root := range roots {
		var j realizeJSON
		if err := json.Unmarshal(outs[i], &j); err != nil {
			t.Fatalf("realize --json: %v\n%s", err, outs[i])
		}
		hashes[i] = map[string]string{}
		for _, l := range j.Layers {
			r := mustShed(t, root, "--json", "store", "info", l)
			var info struct {
				ContentHash string `json:"content_hash"`
			}
			if err := json.Unmarshal([]byte(r.stdout), &info); err != nil {
				t.Fatal(err)
			}
			hashes[i][filepath.Base(l)] = info.ContentHash
		}
	}
	if len(hashes[0]) != 2 {
		t.Fatalf("got %v", hashes[0])
	}
	for p, h := range hashes[0] {
		if hashes[1][p] != h {
			t.Errorf("%s: content hash %s in the first store, %s in the second", p, h, hashes[1][p])
		}
	}
}
