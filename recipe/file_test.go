package recipe_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/rogpeppe/go-internal/txtar"

	"toolshed.dev/shed/recipe"
)

var update = flag.Bool("update", false, "rewrite the expected results in testdata/*.txtar")

// want is what a failing case expects, written in its archive as "key: value" lines.
type want struct {
	Error string
	Line  int
	Field string
	Hint  string
}

func parseWant(data []byte) (want, error) {
	var w want
	for _, l := range strings.Split(strings.TrimRight(string(data), "\n"), "\n") {
		k, v, _ := strings.Cut(l, ": ")
		switch k {
		case "error":
			w.Error = v
		case "line":
			n, err := strconv.Atoi(v)
			if err != nil {
				return w, err
			}
			w.Line = n
		case "field":
			w.Field = v
		case "hint":
			w.Hint = v
		default:
			return w, errors.New("unknown line " + strconv.Quote(l))
		}
	}
	return w, nil
}

func (w want) format() []byte {
	return []byte("error: " + w.Error + "\nline: " + strconv.Itoa(w.Line) + "\nfield: " + w.Field + "\nhint: " + w.Hint + "\n")
}

// TestFiles parses each testdata/*.txtar: its workshop.toml must fail with the
// archive's "error" (bad-*) or parse to its recipe.json (good-*). Failing cases
// sort first. Refresh with -update, then read the diff.
func TestFiles(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txtar")
	if err != nil || len(files) == 0 {
		t.Fatalf("no testdata: %v", err)
	}
	for _, file := range files {
		name := strings.TrimSuffix(filepath.Base(file), ".txtar")
		t.Run(name, func(t *testing.T) {
			ar, err := txtar.ParseFile(file)
			if err != nil {
				t.Fatal(err)
			}
			sections := make(map[string]*txtar.File)
			for i := range ar.Files {
				sections[ar.Files[i].Name] = &ar.Files[i]
			}
			input := sections["workshop.toml"]
			if input == nil {
				t.Fatal("no workshop.toml in archive")
			}
			switch {
			case strings.HasPrefix(name, "bad-"):
				testBad(t, file, ar, sections["error"], input.Data)
			case strings.HasPrefix(name, "good-"):
				testGood(t, file, ar, sections["recipe.json"], name, input.Data)
			default:
				t.Fatal("archive name must start with bad- or good-")
			}
		})
	}
}

func testBad(t *testing.T, file string, ar *txtar.Archive, sec *txtar.File, data []byte) {
	_, err := recipe.Parse("workshop.toml", data, recipe.Options{ForbiddenPaths: []string{"/srv/shed-root"}})
	var e *recipe.Error
	if !errors.As(err, &e) {
		t.Fatalf("got %v, want a *recipe.Error", err)
	}
	if !errors.Is(err, recipe.ErrInvalid) {
		t.Errorf("errors.Is(err, ErrInvalid) is false")
	}
	got := want{Error: e.Error(), Line: e.Line, Field: e.Field, Hint: e.Hint}
	if *update {
		if sec == nil {
			ar.Files = append(ar.Files, txtar.File{Name: "error"})
			sec = &ar.Files[len(ar.Files)-1]
		}
		sec.Data = got.format()
		if err := os.WriteFile(file, txtar.Format(ar), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if sec == nil {
		t.Fatal("no error section in archive (run with -update)")
	}
	w, err := parseWant(sec.Data)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(w, got); diff != "" {
		t.Errorf("(-want +got)\n%s", diff)
	}
}

func testGood(t *testing.T, file string, ar *txtar.Archive, sec *txtar.File, name string, data []byte) {
	// An absolute, made-up file name: Dir and AbsDir are then the same everywhere.
	r, err := recipe.Parse("/recipes/"+name+"/workshop.toml", data, recipe.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if *update {
		out, err := json.MarshalIndent(r, "", "\t")
		if err != nil {
			t.Fatal(err)
		}
		if sec == nil {
			ar.Files = append(ar.Files, txtar.File{Name: "recipe.json"})
			sec = &ar.Files[len(ar.Files)-1]
		}
		sec.Data = append(out, '\n')
		if err := os.WriteFile(file, txtar.Format(ar), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if sec == nil {
		t.Fatal("no recipe.json section in archive (run with -update)")
	}
	var w recipe.Recipe
	dec := json.NewDecoder(bytes.NewReader(sec.Data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&w); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(&w, r, cmpopts.IgnoreUnexported(recipe.Recipe{})); diff != "" {
		t.Errorf("(-want +got)\n%s", diff)
	}
}
