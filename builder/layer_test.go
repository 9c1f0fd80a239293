package builder

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"toolshed.dev/shed/debian"

	"toolshed.dev/shed/derivation"
)

// TestCheckInstalled: what dpkg installed (new or changed against the parent)
// must be exactly the lock's packages.
func TestCheckInstalled(t *testing.T) {
	parent := map[string]debian.Installed{"libc6": {Package: "libc6", Version: "2.36", Architecture: "amd64"}, "old": {Package: "old", Version: "1", Architecture: "all"}}
	status := func(pkgs ...string) string {
		var b strings.Builder
		for _, p := range pkgs {
			name, v, _ := strings.Cut(p, "=")
			b.WriteString("Package: " + name + "\nStatus: install ok installed\nVersion: " + v + "\nArchitecture: amd64\n\n")
		}
		return b.String()
	}
	cases := []struct {
		name      string
		installed string
		args      []string
		wantErr   string
	}{
		{"exact", status("libc6=2.36", "jq=1.6", "libjq1=1.6"), []string{"jq=1.6", "libjq1=1.6"}, ""},
		{"missing", status("libc6=2.36", "jq=1.6"), []string{"jq=1.6", "libjq1=1.6"}, `libjq1: locked 1.6, installed ""`},
		{"other version", status("libc6=2.36", "jq=1.7", "libjq1=1.6"), []string{"jq=1.6", "libjq1=1.6"}, `jq: locked 1.6, installed "1.7"`},
		{"extra", status("libc6=2.36", "jq=1.6", "libjq1=1.6", "sneaky=1"), []string{"jq=1.6", "libjq1=1.6"}, "sneaky 1: installed but not in the lock"},
		{"upgraded from parent", status("libc6=2.37", "jq=1.6"), []string{"jq=1.6"}, "libc6 2.37: installed but not in the lock"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			upper := t.TempDir()
			os.MkdirAll(filepath.Join(upper, "var/lib/dpkg"), 0o755)
			os.WriteFile(filepath.Join(upper, "var/lib/dpkg/status"), []byte(c.installed), 0o644)
			err := checkInstalled(&derivation.Derivation{Args: c.args}, upper, parent)
			switch {
			case c.wantErr == "" && err != nil:
				t.Fatalf("got %v, want no error", err)
			case c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr) || !errors.Is(err, ErrBuildFailed)):
				t.Fatalf("got %v, want an ErrBuildFailed naming %q", err, c.wantErr)
			}
		})
	}
}

// TestBuildEnv: a build's environment is fixed; an extra variable is added, or replaces the one of
// its name (a seed's HOME), so that no program sees two values.
func TestBuildEnv(t *testing.T) {
	d := &derivation.Derivation{Env: map[string]string{"SOURCE_DATE_EPOCH": "1"}}
	env := buildEnv(d, "HOME=/tmp", "http_proxy=http://p")
	var homes []string
	for _, e := range env {
		if strings.HasPrefix(e, "HOME=") {
			homes = append(homes, e)
		}
	}
	if len(homes) != 1 || homes[0] != "HOME=/tmp" {
		t.Errorf("HOME: got %q, want only HOME=/tmp", homes)
	}
	for _, want := range []string{"SOURCE_DATE_EPOCH=1", "http_proxy=http://p", "TZ=UTC"} {
		if !slices.Contains(env, want) {
			t.Errorf("%s missing from %q", want, env)
		}
	}
	if plain := buildEnv(d); !slices.Contains(plain, "HOME=/root") {
		t.Errorf("without extras, HOME is not /root: %q", plain)
	}
}
