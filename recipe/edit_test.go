package recipe_test

import (
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
