package tests

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"
	imeta "github.com/opencontainers/image-spec/specs-go"
	ispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/opencontainers/umoci/oci/cas/dir"
	"github.com/opencontainers/umoci/oci/casext"
)

// TestOCISeed: a user starts from an image they already have. The test makes
// an OCI image layout of a Debian root filesystem (one gzip layer, tagged
// v1), and a recipe `seed = "oci:./image:v1"` with jq: the lock pins the
// image by digest, the seed is imported with umoci, and apt resolves against
// the image's own suite (from its os-release).
func TestOCISeed(t *testing.T) {
	parallel(t) // see parallelTests in main_test.go
	requireRoot(t)
	root := sharedRoot(t)
	// A Debian root filesystem to package: the shared store's seed.
	seedRecipe := writeFile(t, filepath.Join(t.TempDir(), "workshop.toml"), "name = \"oci-source\"\nseed = \"debian/bookworm\"\n")
	seed := realize(t, root, seedRecipe).Layers[0]

	dir := t.TempDir()
	layout := filepath.Join(dir, "image")
	var raw bytes.Buffer
	tarCmd := exec.Command("tar", "-C", seed, "--numeric-owner", "--xattrs", "--xattrs-include=security.capability", "-cf", "-", ".")
	tarCmd.Stdout = &raw
	if err := tarCmd.Run(); err != nil {
		t.Fatal(err)
	}
	var gz bytes.Buffer
	gzCmd := exec.Command("gzip", "-1", "-n")
	gzCmd.Stdin, gzCmd.Stdout = bytes.NewReader(raw.Bytes()), &gz
	if err := gzCmd.Run(); err != nil {
		t.Fatal(err)
	}
	putOCIImage(t, layout, "v1", gz.Bytes(), digest.FromBytes(raw.Bytes()))

	file := writeFile(t, filepath.Join(dir, "workshop.toml"), `name = "from-image"
seed = "oci:./image:v1"
[apt]
packages = ["jq"]
`)
	j := realize(t, root, file)
	lock, _ := os.ReadFile(filepath.Join(dir, "workshop.lock"))
	if !strings.Contains(string(lock), "digest = 'sha256:") || !strings.Contains(string(lock), "name = 'jq'") {
		t.Errorf("lock:\n%s", lock)
	}
	if len(j.Layers) != 2 || !strings.Contains(j.Layers[0], "-oci-image-v1") {
		t.Fatalf("layers %v", j.Layers)
	}
	if _, err := os.Stat(filepath.Join(j.Layers[1], "usr/bin/jq")); err != nil {
		t.Error(err)
	}
	// The imported seed is the same tree as the one it was made from.
	a := mustShed(t, root, "--json", "store", "info", seed).stdout
	b := mustShed(t, root, "--json", "store", "info", j.Layers[0]).stdout
	if hashOf(a) != hashOf(b) {
		t.Errorf("imported seed hashes %s, source %s", hashOf(b), hashOf(a))
	}
}

func hashOf(infoJSON string) string {
	i := strings.Index(infoJSON, `"content_hash": "`)
	if i < 0 {
		return ""
	}
	rest := infoJSON[i+len(`"content_hash": "`):]
	return rest[:strings.IndexByte(rest, '"')]
}

// putOCIImage writes a one-layer image into an OCI layout with umoci's CAS.
func putOCIImage(t *testing.T, layout, tag string, gz []byte, diffID digest.Digest) {
	t.Helper()
	ctx := context.Background()
	if err := dir.Create(layout); err != nil {
		t.Fatal(err)
	}
	engine, err := dir.Open(layout)
	if err != nil {
		t.Fatal(err)
	}
	defer engine.Close()
	ext := casext.NewEngine(engine)
	ld, lsize, err := ext.PutBlob(ctx, bytes.NewReader(gz))
	if err != nil {
		t.Fatal(err)
	}
	config := ispec.Image{
		Platform: ispec.Platform{OS: "linux", Architecture: runtime.GOARCH},
		RootFS:   ispec.RootFS{Type: "layers", DiffIDs: []digest.Digest{diffID}},
	}
	cd, csize, err := ext.PutBlobJSON(ctx, config)
	if err != nil {
		t.Fatal(err)
	}
	m := ispec.Manifest{
		Versioned: imeta.Versioned{SchemaVersion: 2},
		MediaType: ispec.MediaTypeImageManifest,
		Config:    ispec.Descriptor{MediaType: ispec.MediaTypeImageConfig, Digest: cd, Size: csize},
		Layers:    []ispec.Descriptor{{MediaType: ispec.MediaTypeImageLayerGzip, Digest: ld, Size: lsize}},
	}
	md, msize, err := ext.PutBlobJSON(ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	if err := ext.UpdateReference(ctx, tag, ispec.Descriptor{MediaType: ispec.MediaTypeImageManifest, Digest: md, Size: msize}); err != nil {
		t.Fatal(err)
	}
}
