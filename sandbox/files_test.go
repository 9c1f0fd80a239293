package sandbox_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"toolshed.dev/shed/sandbox"
)

// TestFiles: Spec.Files are written into the upper as the sandbox's root, replacing a layer's file,
// with their directories made; the layers stay as they were.
func TestFiles(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	spec, upper := writableSpec(t, "sh", "-c", "cat /etc/ssl/certs/bundle.crt /etc/which; ls -ln /etc/ssl/certs/bundle.crt")
	spec.Files = []sandbox.File{{Path: "/etc/ssl/certs/bundle.crt", Data: []byte("the bundle\n"), Mode: 0o644}, {Path: "/etc/which", Data: []byte("replaced\n")}}
	r := run(t, spec)
	if r.code != 0 || !strings.HasPrefix(r.stdout, "the bundle\nreplaced\n-rw-r--r--    1 0        0 ") {
		t.Fatalf("exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	if b, err := os.ReadFile(filepath.Join(upper, "etc/ssl/certs/bundle.crt")); err != nil || string(b) != "the bundle\n" {
		t.Errorf("the upper's file: %q %v", b, err)
	}
	if b, _ := os.ReadFile(filepath.Join(busyboxLowers(t)[1], "etc/which")); string(b) != "top\n" {
		t.Errorf("the layer's file changed: %q", b)
	}
	// Only over a writable root of layers.
	ro := readOnlySpec(t, "true")
	ro.Files = spec.Files
	if err := ro.Validate(); err == nil || !strings.Contains(err.Error(), "files[0].path") {
		t.Errorf("files on a read-only root: %v", err)
	}
}

// TestFilesHostile: a layer that plants a symlink where a file goes, to a granted host directory
// (the file's own path, and a directory above it), cannot make the write land on the host: the file
// replaces the symlink, and a directory that leads through a mount fails the launch. The host's
// files are unchanged.
func TestFilesHostile(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	host := t.TempDir()
	victim := filepath.Join(host, "victim")
	if err := os.WriteFile(victim, []byte("host file\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(host, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	os.Chown(victim, 65534, 65534)
	layer := t.TempDir()
	for _, d := range []string{"etc/a", "etc/b"} {
		if err := os.MkdirAll(filepath.Join(layer, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// /etc/a/file -> the granted file; /etc/b/certs -> the granted directory.
	if err := os.Symlink("/run/grant/victim", filepath.Join(layer, "etc/a/file")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/run/grant", filepath.Join(layer, "etc/b/certs")); err != nil {
		t.Fatal(err)
	}
	spec := func(path string) *sandbox.Spec {
		s, _ := writableSpec(t, "sh", "-c", "cat "+path+"; cat /run/grant/victim")
		s.Root.Lowers = append(s.Root.Lowers, layer)
		s.Binds = []sandbox.Bind{{Source: host, Target: "/run/grant", Writable: true, IDs: sandbox.IDsOwner}}
		s.Files = []sandbox.File{{Path: path, Data: []byte("planted\n")}}
		return s
	}
	r := run(t, spec("/etc/a/file"))
	if r.code != 0 || r.stdout != "planted\nhost file\n" {
		t.Errorf("a symlinked file: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	_, err := sandbox.Run(t.Context(), spec("/etc/b/certs/victim"), sandbox.Stdio{})
	if err == nil || !strings.Contains(err.Error(), "write file") {
		t.Errorf("a file under a symlink to a mount: %v, want the launch refused", err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "host file\n" {
		t.Errorf("the host's file was written: %q", b)
	}
	if ents, _ := os.ReadDir(host); len(ents) != 1 {
		t.Errorf("the host's directory has %d entries, want 1 (nothing made there)", len(ents))
	}
}
