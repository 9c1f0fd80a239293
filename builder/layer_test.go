package builder

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"toolshed.dev/shed/derivation"
)

// TestCheckInstalled: what dpkg installed (new or changed against the parent)
// must be exactly the lock's packages.
func TestCheckInstalled(t *testing.T) {
	parent := map[string]Installed{"libc6": {"libc6", "2.36", "amd64"}, "old": {"old", "1", "all"}}
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
