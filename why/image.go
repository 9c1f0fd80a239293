package why

import (
	"archive/tar"
	"os"
	"path"
	"strings"

	"github.com/opencontainers/umoci/oci/casext/blobcompress"
	"github.com/opencontainers/umoci/oci/casext/mediatype"

	"toolshed.dev/shed/derivation"
	"toolshed.dev/shed/recipe"
	"toolshed.dev/shed/store"
)

// imageLayerOf names the layer of a registry image's seed that brought rel (a path in the merged
// view): the topmost layer whose tar has an entry for it, read from the layer's fetched blob. It is
// "" when the seed is not a registry image's or a blob has been freed (blobs are build inputs, which
// gc frees unless keep_build_inputs is set; a repair of the seed fetches them again). It matches the
// tar's own names: a file an upper layer wrote through a symlinked directory (lib/x with lib ->
// usr/lib) is credited to the layer that has usr/lib/x, if any. Each question reads the layers again.
func imageLayerOf(s *store.Store, plan *recipe.Plan, seed *derivation.Derivation, rel string) string {
	if seed.Builder != recipe.BuilderImageImport || len(seed.Args) < 3 {
		return ""
	}
	blobs := map[string]store.Path{}
	for _, d := range plan.Derivations {
		if d.Fixed != nil {
			blobs["sha256:"+d.Fixed.Hash] = d.Output
		}
	}
	layers := seed.Args[2:]
	for i := len(layers) - 1; i >= 0; i-- {
		f := strings.Fields(strings.TrimPrefix(layers[i], "layer "))
		if len(f) != 2 {
			return ""
		}
		p, ok := blobs[f[1]]
		if !ok || !s.IsValid(p) {
			return ""
		}
		if hasEntry(s.Location(p), f[0], rel) {
			return f[1]
		}
	}
	return ""
}

// hasEntry reports whether the layer blob at file, of media type mt, has an entry for rel (not a
// whiteout of it).
func hasEntry(file, mt, rel string) bool {
	_, suffix := mediatype.SplitMediaTypeSuffix(mt)
	if mt == "application/vnd.docker.image.rootfs.diff.tar.gzip" {
		suffix = "gzip"
	}
	algo := blobcompress.GetAlgorithm(suffix)
	if algo == nil {
		return false
	}
	fh, err := os.Open(file)
	if err != nil {
		return false
	}
	defer fh.Close()
	plain, err := algo.Decompress(fh)
	if err != nil {
		return false
	}
	defer plain.Close()
	tr := tar.NewReader(plain)
	for {
		h, err := tr.Next()
		if err != nil {
			return false
		}
		name := strings.Trim(path.Clean("/"+h.Name), "/")
		if name == rel && !strings.HasPrefix(path.Base(name), ".wh.") {
			return true
		}
	}
}
