package tests

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"
)

// notThere checks a recipe error about something the recipe names that does not exist: exit 3
// (an invalid recipe), one error at the recipe's file and line, and what does exist (each of want).
func notThere(t *testing.T, what string, r result, line int, want ...string) {
	t.Helper()
	at := fmt.Sprintf("workshop.toml:%d: ", line)
	if r.code != 3 || strings.Count(r.stderr, "shed: error:") != 1 || !strings.Contains(r.stderr, at) {
		t.Errorf("%s: exit %d, want 3 and one error at %q:\n%s", what, r.code, at, r.stderr)
		return
	}
	for _, w := range want {
		if !regexp.MustCompile(w).MatchString(r.stderr) {
			t.Errorf("%s: the error does not say %q:\n%s", what, w, r.stderr)
		}
	}
}

// TestSuiteNotThere: a seed's suite that Debian's mirror does not serve is an error at the seed's
// line: a near miss of Debian's suites offline (`recipe check`), any other at realize, naming the
// suites the mirror serves.
func TestSuiteNotThere(t *testing.T) {
	parallel(t) // see parallelTests in main_test.go
	requireRoot(t)
	root := sharedRoot(t)
	dir := t.TempDir()

	typo := writeFile(t, filepath.Join(dir, "typo", "workshop.toml"), "name = \"typo\"\nseed = \"debian/bookwrom\"\n")
	notThere(t, "recipe check of a near miss", shed(t, root, nil, "recipe", "check", typo), 2, `did you mean "bookworm"\?`)
	notThere(t, "realize of a near miss", shed(t, root, nil, "realize", typo), 2, `did you mean "bookworm"\?`)

	// Another way to write Debian's mirror: not checked offline, the mirror says.
	other := writeFile(t, filepath.Join(dir, "other", "workshop.toml"),
		"name = \"other\"\n\n# the suite\nseed = \"debian/bookwrom\"\n[apt]\nmirror = \"http://deb.debian.org:80/debian\"\n")
	mustShed(t, root, "recipe", "check", other)
	notThere(t, "realize against another mirror", shed(t, root, nil, "realize", other), 4,
		`has no suite "bookwrom"`, `it serves [^\n]*\bbookworm\b`, `did you mean "bookworm"\?`)

	far := writeFile(t, filepath.Join(dir, "far", "workshop.toml"), "name = \"far\"\nseed = \"debian/nosuchsuite\"\n[apt]\npackages = [\"jq\"]\n")
	mustShed(t, root, "recipe", "check", far)
	notThere(t, "realize of an unknown suite", shed(t, root, nil, "realize", far), 2,
		`has no suite "nosuchsuite"`, `it serves [^\n]*\bbookworm\b[^\n]*\bstable\b`)
}

// TestAptPackageNotThere: an apt package the mirror does not have, or a version of one it does not
// have, is an error at the package's line naming what the mirror has (from the indexes apt fetched).
func TestAptPackageNotThere(t *testing.T) {
	parallel(t) // see parallelTests in main_test.go
	requireRoot(t)
	root := sharedRoot(t)
	dir := t.TempDir()

	name := writeFile(t, filepath.Join(dir, "name", "workshop.toml"),
		"name = \"apt-name\"\nseed = \"debian/bookworm\"\n[apt]\npackages = [\n  \"jq\",\n  \"python3-requestz\",\n]\n")
	notThere(t, "an unknown package", shed(t, root, nil, "realize", name), 6,
		`apt\.packages\[1\]: no package "python3-requestz" in `, `did you mean python3-requests\b`)

	version := writeFile(t, filepath.Join(dir, "version", "workshop.toml"),
		"name = \"apt-version\"\nseed = \"debian/bookworm\"\n\n[apt]\npackages = [\"jq=9.9\"]\n")
	notThere(t, "a version that does not exist", shed(t, root, nil, "lock", version), 5,
		`apt\.packages\[0\]: no version "9\.9" of jq in `, `there (is|are) 1\.6-2\.1`, `pin (one of those|that version) \(jq=1\.6-2\.1`)
}

// TestPipPackageNotThere: a pip package the index does not have, or a version it does not have, is
// an error at the package's line naming the versions the index has.
func TestPipPackageNotThere(t *testing.T) {
	parallel(t) // see parallelTests in main_test.go
	requireRoot(t)
	root := sharedRoot(t)
	idx := newPipIndex(t)

	notThere(t, "an unknown pip package", shed(t, root, nil, "lock", pipRecipe(t, idx, "nosuch", "shedtest-alpha", "shedtest-nosuch")), 7,
		`pip\.packages\[1\]: the index \S+ has no wheel of "shedtest-nosuch"`)
	notThere(t, "a pip version that does not exist", shed(t, root, nil, "lock", pipRecipe(t, idx, "noversion", "shedtest-alpha==9.9")), 7,
		`pip\.packages\[0\]: the index \S+ has no version "9\.9" of shedtest-alpha that installs here; it has 1\.0, 2\.0`,
		`pin one of those \(shedtest-alpha==2\.0\)`)

	// The way out the hints name for a pin an index stopped serving: --update of a pip package (by
	// any spelling pip takes); a name the recipe does not declare is a usage error with a guess.
	file := pipRecipe(t, idx, "update", "shedtest-alpha")
	mustShed(t, root, "lock", file)
	mustShed(t, root, "lock", "--update", "-f", file, "Shedtest_Alpha")
	if r := shed(t, root, nil, "lock", "--update", "-f", file, "shedtest-alpah"); r.code != 2 || !strings.Contains(r.stderr, "did you mean shedtest-alpha?") {
		t.Errorf("--update of a name the recipe does not declare: exit %d, want 2 and a guess:\n%s", r.code, r.stderr)
	}
}

// TestSourceNotThere: an [[apt.source]] suite the repository does not serve is an error at the
// suite's line; a package it does not have, at the package's line with a did-you-mean from its index.
func TestSourceNotThere(t *testing.T) {
	parallel(t) // see parallelTests in main_test.go
	requireRoot(t)
	root := sharedRoot(t)
	repo := newAptRepo(t, debSpec{name: "hello-shed", version: "1.0", files: map[string]string{"usr/share/hello-shed/data": "hello\n"}})

	suite := repo.recipe(t, filepath.Join(t.TempDir(), "suite"), "source-suite", "hello-shed")
	b, _ := os.ReadFile(suite)
	writeFile(t, suite, strings.Replace(string(b), `suite = "stable"`, `suite = "stabel"`, 1))
	notThere(t, "a source's suite", shed(t, root, nil, "lock", suite), 7, `apt\.source\[0\]\.suite: the repository \S+ has no suite "stabel"`)

	notThere(t, "a package of the source", shed(t, root, nil, "lock", repo.recipe(t, filepath.Join(t.TempDir(), "name"), "source-name", "hello-shedd")), 4,
		`no package "hello-shedd" in \S+ bookworm or the recipe's \[\[apt\.source\]\]: did you mean hello-shed\?`)
}

// TestOCISeedNotThere: an OCI seed's tag its layout does not have, or a layout that does not exist,
// is an error at the seed's line (with the tags the layout has).
func TestOCISeedNotThere(t *testing.T) {
	parallel(t) // see parallelTests in main_test.go
	requireRoot(t)
	root := sharedRoot(t)
	dir := t.TempDir()
	var raw, gz bytes.Buffer
	tar.NewWriter(&raw).Close()
	zw := gzip.NewWriter(&gz)
	zw.Write(raw.Bytes())
	zw.Close()
	putOCIImage(t, filepath.Join(dir, "image"), "release-1", gz.Bytes(), digest.FromBytes(raw.Bytes()))

	tag := writeFile(t, filepath.Join(dir, "workshop.toml"), "name = \"oci-tag\"\n\nseed = \"oci:./image:relase-1\"\n")
	notThere(t, "a tag the layout does not have", shed(t, root, nil, "lock", tag), 3, `no manifest tagged "relase-1" \(tags: release-1\): did you mean "release-1"\?`)
	nodir := writeFile(t, filepath.Join(dir, "nodir", "workshop.toml"), "name = \"oci-dir\"\nseed = \"oci:./image\"\n")
	notThere(t, "a layout that does not exist", shed(t, root, nil, "lock", nodir), 2, `nodir/image does not exist`)
}
