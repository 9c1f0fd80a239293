package builder

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"toolshed.dev/shed/recipe"
)

// TestMissingPip: pip's "no version satisfies" about one of the recipe's packages is a recipe
// error at its line with the versions pip found; about anything else, nothing.
func TestMissingPip(t *testing.T) {
	r, err := recipe.Parse("w.toml", []byte("name = \"x\"\nseed = \"debian/bookworm\"\n[pip]\nindex = \"http://127.0.0.1:1/simple/\"\npackages = [\n  \"alpha\",\n  \"beta==9.9\",\n  \"gamma\",\n]\n"), recipe.Options{})
	if err != nil {
		t.Fatal(err)
	}
	reqs := []string{"alpha", "beta==9.9", "gamma==1.0"} // gamma: as the lock pins it
	for _, c := range []struct {
		out, want, hint string
	}{
		{"ERROR: Could not find a version that satisfies the requirement beta==9.9 (from versions: 1.0, 2.0)\nERROR: No matching distribution found for beta==9.9\n",
			`w.toml:7: pip.packages[1]: the index http://127.0.0.1:1/simple/ has no version "9.9" of beta that installs here; it has 1.0, 2.0`, "beta==2.0"},
		{"ERROR: Could not find a version that satisfies the requirement alpha (from versions: none)\n",
			`w.toml:6: pip.packages[0]: the index http://127.0.0.1:1/simple/ has no wheel of "alpha" that installs here`, "/simple/NAME/"},
		{"ERROR: Could not find a version that satisfies the requirement gamma==1.0 (from versions: 1.1)\n",
			`w.toml:8: pip.packages[2]: the index http://127.0.0.1:1/simple/ has no version "1.0" of gamma that installs here; it has 1.1`, "shed lock --update -f w.toml gamma"},
		{"ERROR: Could not find a version that satisfies the requirement delta>=2 (from versions: 1.0)\n", "", ""}, // a dependency
		{"ERROR: ResolutionImpossible: ...\n", "", ""},
	} {
		err := missingPip(r, reqs, c.out)
		if c.want == "" {
			if err != nil {
				t.Errorf("%q: %v, want nothing", c.out, err)
			}
			continue
		}
		e, ok := err.(*recipe.Error)
		if !ok {
			t.Errorf("%q: %v, want a recipe error", c.out, err)
		} else if e.Error() != c.want || !strings.Contains(e.Hint, c.hint) {
			t.Errorf("%q:\n got %v (hint %q)\nwant %s (hint with %q)", c.out, err, e.Hint, c.want, c.hint)
		}
	}
}

// TestNoSuite: a suite whose InRelease the mirror does not have is a recipe error at the seed's
// line, naming the suites of Debian's the mirror does serve, and a guess among them.
func TestNoSuite(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		switch req.URL.Path {
		case "/debian/dists/bookworm/InRelease", "/debian/dists/stable/InRelease":
			w.Write([]byte("Date: Sat, 11 Jul 2026 10:16:37 UTC\n"))
		default:
			http.NotFound(w, req)
		}
	}))
	defer srv.Close()
	mirror := srv.URL + "/debian"
	r, err := recipe.Parse("w.toml", []byte("name = \"x\"\n\nseed = \"debian/bookwrom@20250110T000000Z\"\n[apt]\nmirror = \""+mirror+"\"\n"), recipe.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := releaseDate(context.Background(), srv.Client(), mirror, "bookwrom"); !errors.Is(err, errNoSuite) {
		t.Fatalf("releaseDate of a suite not there: %v", err)
	}
	if _, err := releaseDate(context.Background(), srv.Client(), mirror, "bookworm"); err != nil {
		t.Fatalf("releaseDate: %v", err)
	}
	err = noSuiteError(context.Background(), srv.Client(), r, mirror, "bookwrom", "")
	e, ok := err.(*recipe.Error)
	want := `w.toml:3: seed: the mirror ` + mirror + ` has no suite "bookwrom" (no dists/bookwrom/InRelease); of Debian's suites, it serves bookworm, stable: did you mean "bookworm"?`
	if !ok {
		t.Fatalf("got %v, want a recipe error", err)
	}
	if e.Error() != want || e.Hint != `write seed = "debian/bookworm@20250110T000000Z"` {
		t.Errorf("got %v (hint %q)\nwant %s", err, e.Hint, want)
	}
}
