package cache

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"runtime"

	"github.com/klauspost/pgzip"
	digest "github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"toolshed.dev/shed/store"
)

// Annotations of a Workshop image's layer descriptors. PathAnnotation names the store path the
// layer is (its full name, store_dir included). SnapshotPathLabel is the same under containerd's
// prefix for labels a snapshotter inherits: containerd's unpacker passes a layer descriptor's
// annotations that start with "containerd.io/snapshot/" to the snapshotter's Prepare as labels, so
// shed's snapshotter learns the path without downloading the layer.
const (
	PathAnnotation    = "dev.toolshed.path"
	SnapshotPathLabel = "containerd.io/snapshot/dev.toolshed.path"
)

// ImageConfig is what a Workshop image's config says beyond its layers.
type ImageConfig struct {
	Env        []string // KEY=VALUE
	WorkingDir string
	User       string
	Cmd        []string
}

// ImageResult is a pushed Workshop image.
type ImageResult struct {
	Digest digest.Digest // the manifest's
	Layers int
	Bytes  int64 // compressed bytes of the layers pushed now (not those already there)
}

// DiffID is the digest of the uncompressed layer a store path is in a Workshop image: its tree
// rooted at "/", as WriteImageLayer writes it. The stream is deterministic, so every machine gets
// the same digest for the same path.
func DiffID(ctx context.Context, s *store.Store, p store.Path) (digest.Digest, error) {
	h := sha256.New()
	if err := WriteImageLayer(ctx, h, s.Location(p)); err != nil {
		return "", err
	}
	return digest.NewDigestFromEncoded(digest.SHA256, hex.EncodeToString(h.Sum(nil))), nil
}

// WriteImageLayer writes the store path at src as an OCI image layer: the tree rooted at "/",
// overlay whiteouts and opaque directories as ".wh." entries (what WriteLayer writes under
// LayerRoot).
func WriteImageLayer(ctx context.Context, w io.Writer, src string) error {
	return writeTree(ctx, w, src, "/")
}

// PushImage pushes a Workshop as an OCI image tagged tag: one gzip layer per store path in layers
// (bottom first), each annotated with its path, and a config with cfg. A plain runtime pulls and
// runs it as any image; containerd with shed's snapshotter takes each layer from the node's store
// instead. The config has no creation time, so the same Workshop gives the same config and diff IDs
// (the compressed layers' digests are the gzip writer's, the same for the same build).
func PushImage(ctx context.Context, s *store.Store, c *Cache, tag string, layers []store.Path, cfg ImageConfig) (*ImageResult, error) {
	res := &ImageResult{Layers: len(layers)}
	var descs []ocispec.Descriptor
	var diffIDs []digest.Digest
	for _, p := range layers {
		desc, diffID, n, err := pushImageLayer(ctx, s, c, p)
		if err != nil {
			return nil, fmt.Errorf("image layer %s: %w", p, err)
		}
		descs = append(descs, desc)
		diffIDs = append(diffIDs, diffID)
		res.Bytes += n
	}
	img := ocispec.Image{
		Platform: ocispec.Platform{OS: "linux", Architecture: runtime.GOARCH},
		Config:   ocispec.ImageConfig{Env: cfg.Env, WorkingDir: cfg.WorkingDir, User: cfg.User, Cmd: cfg.Cmd},
		RootFS:   ocispec.RootFS{Type: "layers", DiffIDs: diffIDs},
	}
	config, err := json.Marshal(img)
	if err != nil {
		return nil, err
	}
	configDesc := blobDesc(ocispec.MediaTypeImageConfig, config)
	if err := pushBlob(ctx, c, configDesc, bytes.NewReader(config)); err != nil {
		return nil, err
	}
	manifest, err := json.Marshal(ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageManifest,
		Config:    configDesc,
		Layers:    descs,
	})
	if err != nil {
		return nil, err
	}
	desc := blobDesc(ocispec.MediaTypeImageManifest, manifest)
	if err := pushBlob(ctx, c, desc, bytes.NewReader(manifest)); err != nil {
		return nil, err
	}
	if err := c.target.Tag(ctx, desc, tag); err != nil {
		return nil, err
	}
	if c.layout != nil {
		if err := c.layout.SaveIndex(); err != nil {
			return nil, err
		}
	}
	res.Digest = desc.Digest
	return res, nil
}

// pushImageLayer pushes one path's image layer and returns its descriptor, its diff ID and the
// compressed bytes pushed (0 when the registry had it).
func pushImageLayer(ctx context.Context, s *store.Store, c *Cache, p store.Path) (ocispec.Descriptor, digest.Digest, int64, error) {
	// Compressed into a temporary file first: a push names its digest and size up front.
	tmp, err := os.CreateTemp(s.TmpDir(), "image-*.tar.gz")
	if err != nil {
		return ocispec.Descriptor{}, "", 0, err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	zh, th := sha256.New(), sha256.New()
	zw := pgzip.NewWriter(io.MultiWriter(tmp, zh))
	if err := WriteImageLayer(ctx, io.MultiWriter(zw, th), s.Location(p)); err != nil {
		return ocispec.Descriptor{}, "", 0, err
	}
	if err := zw.Close(); err != nil {
		return ocispec.Descriptor{}, "", 0, err
	}
	size, err := tmp.Seek(0, io.SeekCurrent)
	if err != nil {
		return ocispec.Descriptor{}, "", 0, err
	}
	full := path.Join(s.StoreDir(), p.String())
	desc := ocispec.Descriptor{
		MediaType:   ocispec.MediaTypeImageLayerGzip,
		Digest:      digest.NewDigestFromEncoded(digest.SHA256, hex.EncodeToString(zh.Sum(nil))),
		Size:        size,
		Annotations: map[string]string{PathAnnotation: full, SnapshotPathLabel: full},
	}
	diffID := digest.NewDigestFromEncoded(digest.SHA256, hex.EncodeToString(th.Sum(nil)))
	if ok, err := c.target.Exists(ctx, desc); err == nil && ok {
		return desc, diffID, 0, nil
	}
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		return ocispec.Descriptor{}, "", 0, err
	}
	if err := pushBlob(ctx, c, desc, tmp); err != nil {
		return ocispec.Descriptor{}, "", 0, err
	}
	return desc, diffID, size, nil
}
