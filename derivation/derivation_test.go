package derivation_test

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"toolshed.dev/shed/derivation"
	"toolshed.dev/shed/store"
)

var update = flag.Bool("update", false, "rewrite golden files")

func mustPath(t testing.TB, s string) store.Path {
	t.Helper()
	p, err := store.ParsePath(s)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// examples are the derivations whose paths the golden file pins. Changing any
// of these paths is a store-format change: bump derivation.Version.
func examples(t testing.TB) []*derivation.Derivation {
	seed := &derivation.Derivation{
		Name:    "debian-bookworm",
		Kind:    derivation.KindSeed,
		Builder: "builtin:mmdebstrap",
		Network: "allow deb.debian.org:80",
		Args:    []string{"--variant=minbase", "bookworm", "http://deb.debian.org/debian"},
		Env:     map[string]string{"SOURCE_DATE_EPOCH": "1783764997"},
	}
	fetchA := &derivation.Derivation{
		Name:    "jq_1.6-2.1_amd64.deb",
		Kind:    derivation.KindFetch,
		Builder: "builtin:fetch",
		Network: "allow deb.debian.org:80",
		Fixed:   &derivation.Fixed{Algo: "sha256", Hash: strings.Repeat("ab", 32)},
		Args:    []string{"http://deb.debian.org/debian/pool/main/j/jq/jq_1.6-2.1_amd64.deb"},
	}
	fetchB := *fetchA // same file from another mirror
	fetchB.Args = []string{"http://mirror.example.org/debian/pool/main/j/jq/jq_1.6-2.1_amd64.deb"}
	for _, d := range []*derivation.Derivation{seed, fetchA, &fetchB} {
		if err := d.Finish(store.DefaultStoreDir); err != nil {
			t.Fatal(err)
		}
	}
	layer := &derivation.Derivation{
		Name:    "jq-tools-apt",
		Kind:    derivation.KindLayer,
		Builder: "builtin:apt-layer",
		Network: "none",
		Inputs:  []derivation.Input{{Drv: drvPath(t, seed), Out: seed.Output}, {Drv: drvPath(t, fetchA), Out: fetchA.Output}},
		Args:    []string{"jq=1.6-2.1"},
		Env:     map[string]string{"SOURCE_DATE_EPOCH": "1783764997", "LANG": "C.UTF-8"},
	}
	layer.SortInputs()
	if err := layer.Finish(store.DefaultStoreDir); err != nil {
		t.Fatal(err)
	}
	return []*derivation.Derivation{seed, fetchA, &fetchB, layer}
}

func drvPath(t testing.TB, d *derivation.Derivation) store.Path {
	p, err := store.MakePath("text", store.Sum(d.Encode()).Hex(), store.DefaultStoreDir, d.DrvName())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestGoldenPaths(t *testing.T) {
	var b strings.Builder
	for _, d := range examples(t) {
		fmt.Fprintf(&b, "%s\n  drv %s\n  out %s\n", d.Name, drvPath(t, d), d.Output)
	}
	b.WriteString("--- layer encoding ---\n")
	b.Write(examples(t)[3].Encode())
	golden := filepath.Join("testdata", "paths.golden")
	if *update {
		if err := os.WriteFile(golden, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(string(want), b.String()); diff != "" {
		t.Errorf("store paths changed (-golden +got); this is a store-format change, bump derivation.Version:\n%s", diff)
	}
}

func TestFixedOutputIgnoresMirror(t *testing.T) {
	ex := examples(t)
	a, b := ex[1], ex[2]
	if a.Output != b.Output {
		t.Errorf("same file from two mirrors: got outputs %s and %s, want equal", a.Output, b.Output)
	}
	if drvPath(t, a) == drvPath(t, b) {
		t.Errorf("two fetch recipes with different URLs have the same .drv %s", drvPath(t, a))
	}
}

func TestLayerModuloInputDrv(t *testing.T) {
	// A layer over the same fetched file has the same output whichever .drv
	// (mirror) fetched it: inputs count by output path.
	ex := examples(t)
	layer := ex[3]
	alt := *layer
	alt.Inputs = append([]derivation.Input(nil), layer.Inputs...)
	for i := range alt.Inputs {
		if alt.Inputs[i].Out == ex[1].Output {
			alt.Inputs[i].Drv = drvPath(t, ex[2])
		}
	}
	if err := alt.Finish(store.DefaultStoreDir); err != nil {
		t.Fatal(err)
	}
	if alt.Output != layer.Output {
		t.Errorf("got %s, want %s", alt.Output, layer.Output)
	}
}

// TestEveryInputChangesHash: any change of any input gives another output path.
func TestEveryInputChangesHash(t *testing.T) {
	base := examples(t)[3]
	other := mustPath(t, examples(t)[0].Output.HashPart()+"-other")
	mutations := map[string]func(d *derivation.Derivation){
		"name":      func(d *derivation.Derivation) { d.Name += "x" },
		"builder":   func(d *derivation.Derivation) { d.Builder = "builtin:pip-layer" },
		"arg value": func(d *derivation.Derivation) { d.Args = []string{"jq=1.6-2.2"} },
		"arg added": func(d *derivation.Derivation) { d.Args = append(d.Args, "curl") },
		"arg split": func(d *derivation.Derivation) { d.Args = []string{"jq=1.6", "-2.1"} },
		"env value": func(d *derivation.Derivation) {
			d.Env = map[string]string{"SOURCE_DATE_EPOCH": "1783764998", "LANG": "C.UTF-8"}
		},
		"env key": func(d *derivation.Derivation) {
			d.Env = map[string]string{"SOURCE_DATE_EPOCH": "1783764997", "LC_ALL": "C.UTF-8"}
		},
		"env removed": func(d *derivation.Derivation) { d.Env = map[string]string{"LANG": "C.UTF-8"} },
		"input out": func(d *derivation.Derivation) {
			d.Inputs = append([]derivation.Input(nil), d.Inputs...)
			d.Inputs[0].Out = other
			d.SortInputs()
		},
		"input removed": func(d *derivation.Derivation) { d.Inputs = d.Inputs[:1] },
		"kind":          func(d *derivation.Derivation) { d.Kind = derivation.KindSeed },
	}
	for name, mutate := range mutations {
		t.Run(name, func(t *testing.T) {
			d := *base
			mutate(&d)
			if err := d.Finish(store.DefaultStoreDir); err != nil {
				t.Fatal(err)
			}
			if d.Output == base.Output {
				t.Errorf("output unchanged: %s", d.Output)
			}
		})
	}
	t.Run("store dir", func(t *testing.T) {
		d := *base
		if err := d.Finish("/other/store"); err != nil {
			t.Fatal(err)
		}
		if d.Output == base.Output {
			t.Errorf("output unchanged: %s", d.Output)
		}
	})
	t.Run("fixed hash", func(t *testing.T) {
		f := *examples(t)[1]
		f.Fixed = &derivation.Fixed{Algo: "sha256", Hash: strings.Repeat("cd", 32)}
		if err := f.Finish(store.DefaultStoreDir); err != nil {
			t.Fatal(err)
		}
		if f.Output == examples(t)[1].Output {
			t.Errorf("output unchanged: %s", f.Output)
		}
	})
}

// TestMapOrderDoesNotMatter: the env map is encoded sorted, so building it in
// another order gives the same bytes.
func TestMapOrderDoesNotMatter(t *testing.T) {
	base := examples(t)[3]
	for i := 0; i < 20; i++ {
		d := *base
		d.Env = map[string]string{}
		for _, k := range []string{"LANG", "SOURCE_DATE_EPOCH"} {
			d.Env[k] = base.Env[k]
		}
		if err := d.Finish(store.DefaultStoreDir); err != nil {
			t.Fatal(err)
		}
		if string(d.Encode()) != string(base.Encode()) {
			t.Fatalf("encoding depends on map order")
		}
	}
}

func TestDecodeRoundTrip(t *testing.T) {
	for _, d := range examples(t) {
		got, err := derivation.Decode(d.Encode(), store.DefaultStoreDir)
		if err != nil {
			t.Fatalf("%s: %v", d.Name, err)
		}
		if diff := cmp.Diff(d, got, cmp.Comparer(func(a, b store.Path) bool { return a == b })); diff != "" {
			t.Errorf("%s: round trip (-want +got):\n%s", d.Name, diff)
		}
	}
}

func TestDecodeRejects(t *testing.T) {
	good := string(examples(t)[3].Encode())
	cases := map[string]string{
		"empty":            "",
		"no header":        strings.TrimPrefix(good, derivation.Version+"\n"),
		"future version":   strings.Replace(good, "v1", "v2", 1),
		"no final newline": strings.TrimSuffix(good, "\n"),
		"fields swapped":   strings.Replace(good, "name \"jq-tools-apt\"\nkind \"layer\"", "kind \"layer\"\nname \"jq-tools-apt\"", 1),
		"unknown field":    strings.Replace(good, "arg ", "argh ", 1),
		"two spaces":       strings.Replace(good, "arg \"", "arg  \"", 1),
		"raw quote":        strings.Replace(good, "\"jq=1.6-2.1\"", "jq=1.6-2.1", 1),
		"escaped oddly":    strings.Replace(good, "\"C.UTF-8\"", "\"C\\x2eUTF-8\"", 1),
		"tampered output":  strings.Replace(good, "jq=1.6-2.1", "jq=1.6-2.2", 1),
		"layer with net":   strings.Replace(good, "network \"none\"", "network \"all\"", 1),
		"duplicate name":   strings.Replace(good, "kind", "name \"x\"\nkind", 1),
		"missing output":   good[:strings.Index(good, "output ")],
	}
	for name, in := range cases {
		t.Run(name, func(t *testing.T) {
			if _, err := derivation.Decode([]byte(in), store.DefaultStoreDir); err == nil {
				t.Errorf("Decode accepted:\n%s", in)
			}
		})
	}
}
