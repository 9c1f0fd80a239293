package recipe_test

import (
	"strings"
	"testing"

	"toolshed.dev/shed/recipe"
)

func TestSetArray(t *testing.T) {
	const src = `# my tools
name = "tools"
seed = "debian/bookworm"

[apt]
# what we need
packages = [
    "jq",   # json
    "curl", # fetch ] not the end
]

[network]
profile = "debian"
`
	for _, c := range []struct {
		table, key string
		values     []string
		want       string
	}{
		{"apt", "packages", []string{"jq", "curl", "git=1:2.39.5-0+deb12u2"}, `# my tools
name = "tools"
seed = "debian/bookworm"

[apt]
# what we need
packages = [
    "jq",
    "curl",
    "git=1:2.39.5-0+deb12u2",
]

[network]
profile = "debian"
`},
		{"network", "allow", []string{"pypi.org"}, `# my tools
name = "tools"
seed = "debian/bookworm"

[apt]
# what we need
packages = [
    "jq",   # json
    "curl", # fetch ] not the end
]

[network]
allow = ["pypi.org"]
profile = "debian"
`},
		{"pip", "packages", []string{"attrs==23.1.0"}, src + `
[pip]
packages = ["attrs==23.1.0"]
`},
	} {
		got, err := recipe.SetArray([]byte(src), c.table, c.key, c.values)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != c.want {
			t.Errorf("%s.%s: got\n%s\nwant\n%s", c.table, c.key, got, c.want)
		}
		if _, err := recipe.Parse("w.toml", got, recipe.Options{}); err != nil {
			t.Errorf("%s.%s: the result does not parse: %v", c.table, c.key, err)
		}
	}
}

func TestSetString(t *testing.T) {
	in := "# mine\nname = 'old'\nseed = \"debian/bookworm\"\n\n[apt]\npackages = [\"jq\"]\n"
	out, err := recipe.SetString([]byte(in), "", "name", "new")
	if err != nil || string(out) != "# mine\nname = \"new\"\nseed = \"debian/bookworm\"\n\n[apt]\npackages = [\"jq\"]\n" {
		t.Fatalf("replace: %q, %v", out, err)
	}
	out, err = recipe.SetString(out, "", "workdir", "/testbed")
	if err != nil || !strings.Contains(string(out), "seed = \"debian/bookworm\"\n\nworkdir = \"/testbed\"\n[apt]") {
		t.Fatalf("add top-level: %q, %v", out, err)
	}
	out, err = recipe.SetString(out, "env", "A_B", "x \"y\"")
	if err != nil || !strings.HasSuffix(string(out), "\n[env]\nA_B = \"x \\\"y\\\"\"\n") {
		t.Fatalf("add a table's key: %q, %v", out, err)
	}
	r, err := recipe.Parse("workshop.toml", out, recipe.Options{})
	if err != nil || r.Name != "new" || r.Workdir != "/testbed" || len(r.Env) != 1 || r.Env[0].Value != "x \"y\"" || len(r.Apt.Packages) != 1 {
		t.Fatalf("parse the result: %+v, %v\n%s", r, err, out)
	}
}
