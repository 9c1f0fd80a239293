package builder

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	ispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/opencontainers/umoci/oci/casext/blobcompress"
	"github.com/opencontainers/umoci/oci/casext/mediatype"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/registry/remote/errcode"

	"toolshed.dev/shed/cache"
	"toolshed.dev/shed/derivation"
	"toolshed.dev/shed/internal/hint"
	"toolshed.dev/shed/recipe"
	"toolshed.dev/shed/store"
)

// Docker's media types, which most images in registries still use; each is the OCI type's twin.
const (
	dockerManifest     = "application/vnd.docker.distribution.manifest.v2+json"
	dockerManifestList = "application/vnd.docker.distribution.manifest.list.v2+json"
	dockerConfig       = "application/vnd.docker.container.image.v1+json"
	dockerLayer        = "application/vnd.docker.image.rootfs.diff.tar.gzip"
)

// ResolveImage resolves a registry seed (ref HOST/REPO, with a tag or a digest) to the manifest of
// this machine's platform and pins it: its digest, and the digest, size and media type of its config
// and layers, which realize then fetches by digest alone. Every manifest read is verified against the
// digest it was asked by or announced with (oras-go's content.ReadAll), so a registry that serves
// other bytes for a pinned digest is refused.
func ResolveImage(ctx context.Context, seed recipe.Seed) (string, *recipe.LockedImage, error) {
	repo, err := cache.Repository(seed.Ref)
	if err != nil {
		return "", nil, fmt.Errorf("image %s: %w", seed.Ref, err)
	}
	name := cmpOr(seed.Digest, seed.Tag)
	shown := "oci://" + seed.Ref + sep(name) + name
	fetch := func(reference string) (ispec.Descriptor, []byte, error) {
		desc, rc, err := repo.FetchReference(ctx, reference)
		if err != nil {
			return desc, nil, registryError(shown, err)
		}
		defer rc.Close()
		if desc.Size > maxOCIJSONSize {
			return desc, nil, fmt.Errorf("image %s: manifest is larger than %d bytes: %w", shown, maxOCIJSONSize, ErrOCIRefused)
		}
		raw, err := content.ReadAll(rc, desc)
		if err != nil {
			return desc, nil, fmt.Errorf("image %s: manifest %s: %w: %w", shown, desc.Digest, err, ErrOCIRefused)
		}
		return desc, raw, nil
	}
	desc, raw, err := fetch(name)
	if err != nil {
		return "", nil, err
	}
	if seed.Digest != "" && desc.Digest.String() != seed.Digest {
		return "", nil, fmt.Errorf("image %s: the registry answered with manifest %s: %w", shown, desc.Digest, ErrOCIRefused)
	}
	platform := ""
	if desc.MediaType == ispec.MediaTypeImageIndex || desc.MediaType == dockerManifestList {
		var index ispec.Index
		if err := json.Unmarshal(raw, &index); err != nil {
			return "", nil, fmt.Errorf("image %s: index %s: %w: %w", shown, desc.Digest, err, ErrOCIRefused)
		}
		if index.MediaType != "" && index.MediaType != desc.MediaType {
			return "", nil, fmt.Errorf("image %s: index %s is served as %s but says it is a %s: %w", shown, desc.Digest, desc.MediaType, index.MediaType, ErrOCIRefused)
		}
		var ours, all []string
		var pick ispec.Descriptor
		for _, m := range index.Manifests {
			if m.Platform == nil || m.Platform.OS == "unknown" {
				continue // attestations
			}
			all = append(all, m.Platform.OS+"/"+m.Platform.Architecture+sep2(m.Platform.Variant))
			if m.Platform.OS == "linux" && m.Platform.Architecture == runtime.GOARCH {
				ours, pick = append(ours, m.Digest.String()), m
			}
		}
		switch {
		case len(ours) == 0:
			return "", nil, hint.Wrap(fmt.Errorf("image %s has no manifest for linux/%s (it has: %s): %w", shown, runtime.GOARCH, strings.Join(all, ", "), ErrOCIRefused),
				"use an image built for linux/"+runtime.GOARCH+", or name one of its manifests by digest")
		case len(ours) > 1:
			return "", nil, hint.Wrap(fmt.Errorf("image %s has %d manifests for linux/%s (%s): %w", shown, len(ours), runtime.GOARCH, strings.Join(ours, ", "), ErrOCIRefused),
				"pin one of them: oci://"+seed.Ref+"@DIGEST")
		}
		platform = "linux/" + runtime.GOARCH
		if desc, raw, err = fetch(pick.Digest.String()); err != nil {
			return "", nil, err
		}
		if desc.Digest != pick.Digest {
			return "", nil, fmt.Errorf("image %s: the registry answered with manifest %s for %s: %w", shown, desc.Digest, pick.Digest, ErrOCIRefused)
		}
	}
	if desc.MediaType != ispec.MediaTypeImageManifest && desc.MediaType != dockerManifest {
		return "", nil, fmt.Errorf("image %s: %s is a %s, not an image manifest: %w", shown, desc.Digest, desc.MediaType, ErrOCIRefused)
	}
	m, err := parseImageManifest(raw, desc.MediaType)
	if err != nil {
		return "", nil, fmt.Errorf("image %s: manifest %s: %w", shown, desc.Digest, err)
	}
	im := &recipe.LockedImage{Platform: platform,
		Manifest: recipe.LockedBlob{Digest: desc.Digest.String(), Size: int64(len(raw)), MediaType: desc.MediaType},
		Config:   recipe.LockedBlob{Digest: m.Config.Digest.String(), Size: m.Config.Size, MediaType: m.Config.MediaType}}
	for _, l := range m.Layers {
		im.Layers = append(im.Layers, recipe.LockedBlob{Digest: l.Digest.String(), Size: l.Size, MediaType: l.MediaType})
	}
	return desc.Digest.String(), im, nil
}

// parseImageManifest parses an image manifest of the given media type (OCI's, or Docker's schema 2)
// and holds it to what shed can build: a config of an image config's type no larger than
// maxOCIJSONSize, and at least one layer, each of a layer type applyOCILayer reads, each blob
// named by a sha256 digest with a positive size.
func parseImageManifest(raw []byte, mediaType string) (ispec.Manifest, error) {
	var m ispec.Manifest
	switch mediaType {
	case ispec.MediaTypeImageManifest:
		// umoci's parser refuses a manifest carrying an index's fields (CVE-2021-41190).
		parsed, err := mediatype.GetParser(ispec.MediaTypeImageManifest)(bytes.NewReader(raw))
		if err != nil {
			return m, fmt.Errorf("%w: %w", err, ErrOCIRefused)
		}
		m = parsed.(ispec.Manifest)
	case dockerManifest:
		// The same check for Docker's type, whose body umoci's parser refuses for its media type.
		var probe struct {
			MediaType string          `json:"mediaType"`
			Manifests json.RawMessage `json:"manifests"`
		}
		if err := json.Unmarshal(raw, &probe); err != nil {
			return m, fmt.Errorf("%w: %w", err, ErrOCIRefused)
		}
		if probe.Manifests != nil || probe.MediaType != dockerManifest {
			return m, fmt.Errorf("a %s whose body says %q or lists manifests: %w", dockerManifest, probe.MediaType, ErrOCIRefused)
		}
		if err := json.Unmarshal(raw, &m); err != nil {
			return m, fmt.Errorf("%w: %w", err, ErrOCIRefused)
		}
	default:
		return m, fmt.Errorf("a %s, not an image manifest: %w", mediaType, ErrOCIRefused)
	}
	if m.Config.MediaType != ispec.MediaTypeImageConfig && m.Config.MediaType != dockerConfig {
		return m, fmt.Errorf("config has media type %q: %w", m.Config.MediaType, ErrOCIRefused)
	}
	if m.Config.Size <= 0 || m.Config.Size > maxOCIJSONSize {
		return m, fmt.Errorf("config has size %d (at most %d): %w", m.Config.Size, maxOCIJSONSize, ErrOCIRefused)
	}
	if len(m.Layers) == 0 {
		return m, fmt.Errorf("an image with no layers: %w", ErrOCIRefused)
	}
	var total int64
	for i, l := range append([]ispec.Descriptor{m.Config}, m.Layers...) {
		if l.Digest.Algorithm() != "sha256" || l.Digest.Validate() != nil {
			return m, fmt.Errorf("blob %q: only sha256 blobs can be fetched: %w", l.Digest, ErrOCIRefused)
		}
		if i > 0 && !layerTypeOK(l.MediaType) {
			return m, fmt.Errorf("layer %s has media type %q, which is not an image layer shed reads: %w", l.Digest, l.MediaType, ErrOCIRefused)
		}
		if total += l.Size; l.Size <= 0 || total > MaxOCIUnpackedSize {
			return m, fmt.Errorf("blob %s has size %d: %w", l.Digest, l.Size, ErrOCIRefused)
		}
	}
	return m, nil
}

// layerTypeOK says whether applyOCILayer reads layers of media type mt.
func layerTypeOK(mt string) bool {
	if mt == dockerLayer {
		return true
	}
	base, suffix := mediatype.SplitMediaTypeSuffix(mt)
	//lint:ignore SA1019 non-distributable layers are deprecated but still found in images
	return (base == ispec.MediaTypeImageLayer || base == ispec.MediaTypeImageLayerNonDistributable) && blobcompress.GetAlgorithm(suffix) != nil
}

// registryError names what the registry said, with the hint for a refusal of access.
func registryError(shown string, err error) error {
	var resp *errcode.ErrorResponse
	if errors.As(err, &resp) && resp.StatusCode == 404 {
		return hint.Wrap(fmt.Errorf("image %s is not in the registry: %w", shown, err), "check the repository and the tag (or digest) of the seed")
	}
	if errors.Is(cache.ErrUnauthorizedOf(err), cache.ErrUnauthorized) {
		return hint.Wrap(fmt.Errorf("image %s: %w", shown, err), registryLoginHint)
	}
	return fmt.Errorf("image %s: %w", shown, err)
}

// buildImageSeed makes a registry image's root filesystem from its blobs, each a fixed-output path
// among the derivation's inputs (verified against its digest when it was fetched): the config's diff
// ids checked against every layer's uncompressed stream, the layers applied in order as ImportOCI
// applies a layout's (whiteouts resolved, every entry checked first).
func (b *Builder) buildImageSeed(ctx context.Context, d *derivation.Derivation, byOut map[store.Path]*derivation.Derivation, out string, log io.Writer) error {
	mf := strings.Fields(d.Args[0])
	if len(d.Args) < 3 || len(mf) != 3 || mf[0] != "manifest" {
		return hint.Wrap(fmt.Errorf("seed derivation %s: not locked: want the image's manifest, config and layers", d.Name), "run `shed lock`: it pins the image's digest")
	}
	blob := map[string]store.Path{} // sha256 hex → its fetched path
	for _, in := range d.Inputs {
		if f := byOut[in.Out]; f != nil && f.Fixed != nil {
			blob[f.Fixed.Hash] = in.Out
		}
	}
	open := func(dgst string) (*os.File, error) {
		p, ok := blob[strings.TrimPrefix(dgst, "sha256:")]
		if !ok {
			return nil, fmt.Errorf("seed derivation %s: blob %s is not among its inputs", d.Name, dgst)
		}
		return os.Open(b.Store.Location(p))
	}
	// The manifest, fetched by the digest the lock pins, says what the seed is made of: the lock's
	// config and layers must be exactly its own, so an edited lock cannot build another image
	// under a familiar digest.
	mfile, err := open(mf[2])
	if err != nil {
		return err
	}
	mraw, err := io.ReadAll(io.LimitReader(mfile, maxOCIJSONSize+1))
	mfile.Close()
	if err != nil {
		return err
	}
	manifest, err := parseImageManifest(mraw, mf[1])
	if err != nil {
		return fmt.Errorf("manifest %s: %w", mf[2], err)
	}
	want := []string{"config " + manifest.Config.Digest.String()}
	for _, l := range manifest.Layers {
		want = append(want, "layer "+l.MediaType+" "+l.Digest.String())
	}
	if !slices.Equal(want, d.Args[1:]) {
		return hint.Wrap(fmt.Errorf("seed derivation %s: the lock's config and layers are not those of manifest %s: %w", d.Name, mf[2], ErrOCIRefused),
			"a lock is written by `shed lock`: run `shed lock --update` to pin the image again")
	}
	cfgDigest := manifest.Config.Digest.String()
	f, err := open(cfgDigest)
	if err != nil {
		return err
	}
	raw, err := io.ReadAll(io.LimitReader(f, maxOCIJSONSize+1))
	f.Close()
	if err != nil {
		return err
	}
	var config ispec.Image
	if len(raw) > maxOCIJSONSize {
		return fmt.Errorf("config %s is larger than %d bytes: %w", cfgDigest, maxOCIJSONSize, ErrOCIRefused)
	}
	if err := json.Unmarshal(raw, &config); err != nil {
		return fmt.Errorf("config %s: %w: %w", cfgDigest, err, ErrOCIRefused)
	}
	layers := d.Args[2:]
	if config.RootFS.Type != "layers" || len(config.RootFS.DiffIDs) != len(layers) {
		return fmt.Errorf("config %s: rootfs %q with %d diff ids for %d layers: %w", cfgDigest, config.RootFS.Type, len(config.RootFS.DiffIDs), len(layers), ErrOCIRefused)
	}
	if config.OS != "linux" || config.Architecture != runtime.GOARCH {
		return hint.Wrap(fmt.Errorf("image %s is for %s/%s, not linux/%s: %w", mf[2], config.OS, config.Architecture, runtime.GOARCH, ErrOCIRefused),
			"lock the recipe on this machine (`shed lock --update`), or name an image built for linux/"+runtime.GOARCH)
	}
	fmt.Fprintf(log, "shed: importing %s (%s, %d layers)\n", d.Name, mf[2], len(layers))
	if err := os.Mkdir(out, 0o755); err != nil {
		return fmt.Errorf("image import: %w", err)
	}
	if err := os.Chmod(out, 0o755); err != nil {
		return err
	}
	epoch := time.Unix(0, 0)
	if err := os.Chtimes(out, epoch, epoch); err != nil {
		return err
	}
	lim := &unpackLimit{max: MaxOCIUnpackedSize}
	for i, l := range layers {
		fields := strings.Fields(strings.TrimPrefix(l, "layer "))
		if !strings.HasPrefix(l, "layer ") || len(fields) != 2 {
			return fmt.Errorf("seed derivation %s: bad layer argument %q", d.Name, l)
		}
		mt := fields[0]
		if mt == dockerLayer {
			mt = ispec.MediaTypeImageLayerGzip
		}
		f, err := open(fields[1])
		if err != nil {
			return err
		}
		err = applyOCILayer(ctx, out, f, mt, config.RootFS.DiffIDs[i], lim)
		f.Close()
		if err != nil {
			return fmt.Errorf("image layer %d (%s): %w", i+1, fields[1], err)
		}
	}
	return Normalize(out)
}

func sep(name string) string {
	if strings.HasPrefix(name, "sha256:") {
		return "@"
	}
	return ":"
}

func sep2(variant string) string {
	if variant == "" {
		return ""
	}
	return "/" + variant
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
