package recipe_test

import (
	"testing"

	"toolshed.dev/shed/derivation"
	"toolshed.dev/shed/recipe"
	"toolshed.dev/shed/store"
)

const fullRecipe = `name = "tools"
seed = "debian/bookworm"
[apt]
packages = ["jq", "curl=7.88.1-10+deb12u5", "python3-pip"]
[pip]
packages = ["attrs==23.1.0", "Requests"]
[network]
allow = ["api.github.com"]
[[grant]]
path = "/srv/project"
mode = "rw"
`

func compile(t testing.TB, src string) *recipe.Plan {
	t.Helper()
	r, err := recipe.Parse("workshop.toml", []byte(src), recipe.Options{})
	if err != nil {
		t.Fatal(err)
	}
	plan, err := recipe.Compile(r, nil, store.DefaultStoreDir)
	if err != nil {
		t.Fatal(err)
	}
	return plan
}

func TestCompileChainsLayers(t *testing.T) {
	plan := compile(t, fullRecipe)
	if len(plan.Derivations) != 3 || len(plan.Layers) != 3 {
		t.Fatalf("got %d derivations, %d layers; want seed, apt, pip", len(plan.Derivations), len(plan.Layers))
	}
	seed, apt, pip := plan.Derivations[0], plan.Derivations[1], plan.Derivations[2]
	if seed.Kind != derivation.KindSeed || apt.Kind != derivation.KindLayer || pip.Kind != derivation.KindLayer {
		t.Fatalf("kinds: %s %s %s", seed.Kind, apt.Kind, pip.Kind)
	}
	// Each layer's only input is the layer below it: layers chain.
	if len(apt.Inputs) != 1 || apt.Inputs[0].Out != seed.Output {
		t.Errorf("apt layer inputs %v, want the seed %s", apt.Inputs, seed.Output)
	}
	if len(pip.Inputs) != 1 || pip.Inputs[0].Out != apt.Output {
		t.Errorf("pip layer inputs %v, want the apt layer %s", pip.Inputs, apt.Output)
	}
	if apt.Network != "none" || pip.Network != "none" {
		t.Errorf("layers must build without network, got %q and %q", apt.Network, pip.Network)
	}
	if got, want := pip.Args, []string{"attrs==23.1.0", "requests"}; len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("pip args %v, want normalized and sorted %v", got, want)
	}
}

// TestCompileSharesPrefixes: what the Bench is allowed to do (network,
// grants) and the recipe's name are not build inputs, so two recipes with the
// same seed and packages build the same paths.
func TestCompileSharesPrefixes(t *testing.T) {
	a := compile(t, fullRecipe)
	b := compile(t, `name = "other"
seed = "debian/bookworm"
[apt]
packages = ["python3-pip", "curl=7.88.1-10+deb12u5", "jq"]
[pip]
packages = ["requests", "attrs==23.1.0"]
`)
	for i := range a.Layers {
		if a.Layers[i] != b.Layers[i] {
			t.Errorf("layer %d: %s vs %s, want equal", i, a.Layers[i], b.Layers[i])
		}
	}
	c := compile(t, `name = "tools"
seed = "debian/bookworm"
[apt]
packages = ["jq", "curl", "python3-pip"]
`)
	if c.Layers[0] != a.Layers[0] || c.Layers[1] == a.Layers[1] {
		t.Errorf("unpinning curl: got layers %v, want the same seed and another apt layer than %v", c.Layers, a.Layers)
	}
}

func BenchmarkParseAndCompile(b *testing.B) {
	for b.Loop() {
		compile(b, fullRecipe)
	}
}

func TestPackageLines(t *testing.T) {
	apt, pip, err := recipe.PackageLines([]byte(fullRecipe))
	if err != nil {
		t.Fatal(err)
	}
	if len(apt) != 3 || apt[0] != 4 || apt[2] != 4 || len(pip) != 2 || pip[1] != 6 {
		t.Errorf("got apt %v pip %v, want [4 4 4] and [6 6]", apt, pip)
	}
}

// TestCompileAccounts: accounts are a layer of their own on top, whose hash changes with each
// declaration (a name, a uid, a home, a shell, sudo) and not with the default user; the layers below
// stay the paths a recipe without accounts has.
func TestCompileAccounts(t *testing.T) {
	const base = "name = \"x\"\nseed = \"debian/bookworm\"\n[apt]\npackages = [\"sudo\"]\n"
	without := compile(t, base)
	with := compile(t, base+"[[account]]\nname = \"user\"\nsudo = true\n")
	if len(with.Layers) != len(without.Layers)+1 {
		t.Fatalf("%d layers with an account, %d without: want one more", len(with.Layers), len(without.Layers))
	}
	for i, l := range without.Layers {
		if with.Layers[i] != l {
			t.Errorf("layer %d: %s with an account, %s without: the layers below must not change", i, with.Layers[i], l)
		}
	}
	top := with.Derivations[len(with.Derivations)-1]
	if top.Builder != recipe.BuilderAccountsLayer || top.Name != "accounts-user" || len(top.Args) != 1 || top.Args[0] != "user:1000:/home/user:/bin/bash:sudo" {
		t.Errorf("accounts layer: %s %s %q", top.Name, top.Builder, top.Args)
	}
	seen := map[store.Path]string{with.Layers[len(with.Layers)-1]: "user with sudo"}
	for what, src := range map[string]string{
		"no sudo":    "[[account]]\nname = \"user\"\n",
		"other name": "[[account]]\nname = \"agent\"\nsudo = true\n",
		"other uid":  "[[account]]\nname = \"user\"\nuid = 1001\nsudo = true\n",
		"other home": "[[account]]\nname = \"user\"\nhome = \"/srv/user\"\nsudo = true\n",
		"two":        "[[account]]\nname = \"user\"\nsudo = true\n[[account]]\nname = \"agent\"\n",
	} {
		p := compile(t, base+src)
		top := p.Layers[len(p.Layers)-1]
		if prev, dup := seen[top]; dup {
			t.Errorf("%s: the accounts layer is %s, as %s's", what, top, prev)
		}
		seen[top] = what
	}
	user := compile(t, "user = \"user\"\n"+base+"[[account]]\nname = \"user\"\nsudo = true\n")
	if got, want := user.Layers[len(user.Layers)-1], with.Layers[len(with.Layers)-1]; got != want {
		t.Errorf("the default user changed the accounts layer: %s, want %s", got, want)
	}
}
