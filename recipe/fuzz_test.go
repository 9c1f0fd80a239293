package recipe_test

import (
	"bytes"
	"errors"
	"path/filepath"
	"reflect"
	"regexp"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/rogpeppe/go-internal/txtar"

	"toolshed.dev/shed/recipe"
)

var fuzzName = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`)

// FuzzParse checks that Parse never panics, that it fails with one *Error that
// says where and what to do, that it is deterministic, and that whatever it
// accepts re-validates with the exported grammar checkers and is plain ASCII.
// The corpus is testdata/fuzz/FuzzParse plus every testdata/*.txtar recipe.
func FuzzParse(f *testing.F) {
	files, _ := filepath.Glob("testdata/*.txtar")
	for _, file := range files {
		ar, err := txtar.ParseFile(file)
		if err != nil {
			f.Fatal(err)
		}
		for _, af := range ar.Files {
			if af.Name == "workshop.toml" {
				f.Add(af.Data)
			}
		}
	}
	opts := recipe.Options{ForbiddenPaths: []string{"/srv/shed-root"}}
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := recipe.Parse("/r/workshop.toml", data, opts)
		r2, err2 := recipe.Parse("/r/workshop.toml", data, opts)
		if diff := cmp.Diff(r, r2, cmp.AllowUnexported(recipe.Recipe{})); diff != "" {
			t.Fatalf("two parses differ (-first +second)\n%s", diff)
		}
		if err != nil {
			var e *recipe.Error
			if !errors.As(err, &e) || !errors.Is(err, recipe.ErrInvalid) {
				t.Fatalf("got %T %v, want a *recipe.Error", err, err)
			}
			if r != nil {
				t.Fatalf("got a recipe and an error")
			}
			if err2 == nil || err.Error() != err2.Error() || e.Hint != err2.(*recipe.Error).Hint {
				t.Fatalf("two parses fail differently: %v, then %v", err, err2)
			}
			if e.File != "/r/workshop.toml" || e.Msg == "" || e.Hint == "" {
				t.Fatalf("error lacks file, message or hint: %#v", e)
			}
			if e.Line < 0 || e.Line > bytes.Count(data, []byte("\n"))+1 {
				t.Fatalf("line %d out of range: %v", e.Line, err)
			}
			return
		}
		if err2 != nil {
			t.Fatalf("second parse failed: %v", err2)
		}
		checkASCII(t, reflect.ValueOf(r).Elem(), "Recipe")
		if !fuzzName.MatchString(r.Name) {
			t.Errorf("accepted name %q", r.Name)
		}
		if r.Seed.Kind != "debian" && r.Seed.Kind != "oci" {
			t.Errorf("accepted seed %#v", r.Seed)
		}
		for _, p := range r.Apt.Packages {
			if q, err := recipe.ParseAptPackage(p.String()); err != nil || q != p {
				t.Errorf("apt package %#v does not re-parse: %v, %#v", p, err, q)
			}
		}
		for _, p := range r.Pip.Packages {
			if q, err := recipe.ParsePipPackage(p.String()); err != nil || q != p {
				t.Errorf("pip package %#v does not re-parse: %v, %#v", p, err, q)
			}
		}
		for _, h := range r.Network.Allow {
			if q, err := recipe.ParseHost(h.String()); err != nil || q != h {
				t.Errorf("host %#v does not re-parse: %v, %#v", h, err, q)
			}
		}
		if r.Network.Profile != "none" && r.Network.Profile != "debian" {
			t.Errorf("accepted profile %q", r.Network.Profile)
		}
		for _, g := range r.Grants {
			if err := recipe.CheckGrantPath(g.Path, opts.ForbiddenPaths); err != nil {
				t.Errorf("grant %#v does not re-check: %v", g, err)
			}
			if g.Mode != "ro" && g.Mode != "rw" {
				t.Errorf("accepted mode %q", g.Mode)
			}
		}
		for _, s := range r.Apt.Sources {
			if s.Key == "" || len(s.Components) == 0 {
				t.Errorf("accepted source %#v", s)
			}
		}
	})
}

// checkASCII fails if any string reachable from v holds a byte outside printable ASCII.
func checkASCII(t *testing.T, v reflect.Value, path string) {
	t.Helper()
	switch v.Kind() {
	case reflect.String:
		s := v.String()
		for i := 0; i < len(s); i++ {
			if s[i] < 0x20 || s[i] >= 0x7f {
				t.Errorf("%s = %q: byte %d is not printable ASCII", path, s, i)
				return
			}
		}
	case reflect.Struct:
		for i := 0; i < v.NumField(); i++ {
			checkASCII(t, v.Field(i), path+"."+v.Type().Field(i).Name)
		}
	case reflect.Slice:
		for i := 0; i < v.Len(); i++ {
			checkASCII(t, v.Index(i), path+"[]")
		}
	}
}
