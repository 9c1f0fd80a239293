package builder

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	apexlog "github.com/apex/log"
	"github.com/opencontainers/go-digest"
	ispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/opencontainers/umoci/oci/cas"
	"github.com/opencontainers/umoci/oci/cas/dir"
	"github.com/opencontainers/umoci/oci/casext"
	"github.com/opencontainers/umoci/oci/casext/blobcompress"
	"github.com/opencontainers/umoci/oci/casext/mediatype"
	"github.com/opencontainers/umoci/oci/layer"
	"github.com/opencontainers/umoci/pkg/hardening"

	"toolshed.dev/shed/recipe"
)

// OCIImage identifies an image in an OCI image layout directory.
type OCIImage struct {
	Dir string // absolute path of the layout (has oci-layout, index.json, blobs/)
	Tag string // the index.json manifest annotated org.opencontainers.image.ref.name = Tag ("latest" by default)
}

// MaxOCIUnpackedSize bounds what ImportOCI unpacks, counted twice: the
// uncompressed tar streams of all layers together, and the sizes their entries
// claim (a sparse entry claims more than it streams). gzip expands up to about
// 1000:1, so a small layer can fill a disk; a real seed is a few hundred MB.
var MaxOCIUnpackedSize int64 = 64 << 30

// maxOCIJSONSize bounds manifests and configs, which are read into memory
// (registries refuse manifests over 4 MiB).
const maxOCIJSONSize = 4 << 20

var (
	// ErrOCITooLarge marks an image that unpacks to more than MaxOCIUnpackedSize.
	ErrOCITooLarge = errors.New("oci image exceeds the unpack size limit")
	// ErrOCIRefused marks an image that is well-formed but may not become a
	// seed, or whose parts contradict each other.
	ErrOCIRefused = errors.New("oci image refused")
)

// ResolveOCI finds the image's manifest and returns its digest ("sha256:..."),
// so that a lock can pin the seed by digest: a tag that later points elsewhere
// must not silently change the seed. A tag naming an image index resolves to
// its linux/GOARCH manifest when there are several.
func ResolveOCI(ctx context.Context, img OCIImage) (string, error) {
	engine, tag, err := openOCI(img)
	if err != nil {
		return "", err
	}
	defer engine.Close()
	ext := casext.NewEngine(engine)

	if !casext.IsValidReferenceName(tag) {
		return "", fmt.Errorf("oci image %s: %q is not a valid tag", img.Dir, tag)
	}
	paths, err := ext.ResolveReference(ctx, tag)
	if err != nil {
		return "", fmt.Errorf("oci image %s: resolve tag %q: %w", img.Dir, tag, err)
	}
	if len(paths) == 0 {
		return "", noOCIManifest(ctx, ext, img.Dir, tag)
	}
	if len(paths) > 1 {
		paths = ourPlatform(paths)
	}
	if len(paths) != 1 {
		var ds []string
		for _, p := range paths {
			ds = append(ds, p.Descriptor().Digest.String())
		}
		return "", fmt.Errorf("oci image %s: tag %q is ambiguous: it names %d manifests (%s); pin one by digest",
			img.Dir, tag, len(paths), strings.Join(ds, ", "))
	}
	desc := paths[0].Descriptor()
	if desc.MediaType != ispec.MediaTypeImageManifest {
		return "", fmt.Errorf("oci image %s: tag %q names a %s, not an image manifest", img.Dir, tag, desc.MediaType)
	}
	return desc.Digest.String(), nil
}

// noOCIManifest explains why a tag resolved to nothing: it is absent (listing
// the tags that exist), or it names something that is not an OCI manifest
// (a Docker manifest list, for instance).
func noOCIManifest(ctx context.Context, ext casext.Engine, layoutDir, tag string) error {
	index, err := ext.GetIndex(ctx)
	if err != nil {
		return fmt.Errorf("oci image %s: read index.json: %w", layoutDir, err)
	}
	var tags []string
	for _, d := range index.Manifests {
		name, ok := d.Annotations[ispec.AnnotationRefName]
		if !ok {
			continue
		}
		if name == tag {
			return fmt.Errorf("oci image %s: tag %q names a %s, which holds no OCI image manifest", layoutDir, tag, d.MediaType)
		}
		tags = append(tags, name)
	}
	slices.Sort(tags)
	tags = slices.Compact(tags)
	if len(tags) == 0 {
		return fmt.Errorf("oci image %s: no manifest tagged %q: the layout has no tags: %w", layoutDir, tag, errNoOCITag)
	}
	if guess := recipe.Suggest(tag, tags, 1); len(guess) > 0 {
		return fmt.Errorf("oci image %s: no manifest tagged %q (tags: %s): did you mean %q?: %w", layoutDir, tag, strings.Join(tags, ", "), guess[0], errNoOCITag)
	}
	return fmt.Errorf("oci image %s: no manifest tagged %q (tags: %s): %w", layoutDir, tag, strings.Join(tags, ", "), errNoOCITag)
}

// errNoOCITag marks a seed's tag that its layout does not have; errNoOCIDir a layout directory
// that does not exist (an fs.ErrNotExist).
var (
	errNoOCITag       = errors.New("no such tag")
	errNoOCIDir error = noOCIDir{}
)

type noOCIDir struct{}

func (noOCIDir) Error() string        { return fs.ErrNotExist.Error() }
func (noOCIDir) Is(target error) bool { return target == fs.ErrNotExist }

// ourPlatform keeps the manifests an index lists for linux on this machine's
// architecture; it also drops attestation manifests (platform unknown/unknown).
func ourPlatform(paths []casext.DescriptorPath) []casext.DescriptorPath {
	var ours []casext.DescriptorPath
	for _, p := range paths {
		if pl := p.Descriptor().Platform; pl != nil && pl.OS == "linux" && pl.Architecture == runtime.GOARCH {
			ours = append(ours, p)
		}
	}
	return ours
}

// openOCI opens the layout with umoci's directory CAS engine, which validates
// oci-layout, index.json and blobs/ and verifies every blob it reads.
func openOCI(img OCIImage) (cas.Engine, string, error) {
	routeUmociLogs()
	if !filepath.IsAbs(img.Dir) {
		// A relative path would make the seed depend on the working directory.
		return nil, "", fmt.Errorf("oci image directory %q is not an absolute path", img.Dir)
	}
	fi, err := os.Stat(img.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, "", fmt.Errorf("oci image directory %s does not exist: %w", img.Dir, errNoOCIDir)
	}
	if err != nil {
		return nil, "", fmt.Errorf("oci image directory: %w", err)
	}
	if !fi.IsDir() {
		return nil, "", fmt.Errorf("oci image %s is not a directory", img.Dir)
	}
	engine, err := dir.Open(img.Dir)
	if err != nil {
		return nil, "", fmt.Errorf("%s is not an OCI image layout (oci-layout, index.json, blobs/): %w", img.Dir, err)
	}
	tag := img.Tag
	if tag == "" {
		tag = "latest"
	}
	return engine, tag, nil
}

// ImportOCI unpacks the image whose manifest digest is dgst into out, which
// must not exist, as a plain root filesystem: layers applied in order by
// umoci's tar extractor (whiteouts resolved, owners, modes, setuid bits,
// xattrs and links kept, every path confined to out), each blob verified
// against its digest and each layer against the config's diff ID. The digest
// wins over whatever the tag names now. On any failure out is removed.
//
// It must run as root (it keeps the image's owners). umoci only detects a
// corrupt blob once it has read it to the end, so a tampered layer may be
// partly unpacked, inside out, before the import fails and out is removed.
func ImportOCI(ctx context.Context, img OCIImage, dgst string, out string) (err error) {
	d, err := digest.Parse(dgst)
	if err != nil {
		return fmt.Errorf("oci image %s: manifest digest %q: %w", img.Dir, dgst, err)
	}
	engine, _, err := openOCI(img)
	if err != nil {
		return err
	}
	defer engine.Close()
	ext := casext.NewEngine(engine)

	manifest, config, err := readOCIManifest(ctx, ext, d)
	if err != nil {
		return fmt.Errorf("oci image %s: %w", img.Dir, err)
	}

	// Mkdir, not MkdirAll: it fails if out exists, so we never unpack over
	// (or later remove) something that was not ours.
	if err := os.Mkdir(out, 0o755); err != nil {
		return fmt.Errorf("oci import: %w", err)
	}
	defer func() {
		if err != nil {
			if rmErr := os.RemoveAll(out); rmErr != nil {
				err = errors.Join(err, fmt.Errorf("remove partial import: %w", rmErr))
			}
		}
	}()
	// The umask must not decide the root's mode, and images rarely carry an
	// entry for "/": give it the mode and time umoci's own unpacker gives it.
	if err := os.Chmod(out, 0o755); err != nil {
		return fmt.Errorf("oci import: %w", err)
	}
	epoch := time.Unix(0, 0)
	if err := os.Chtimes(out, epoch, epoch); err != nil {
		return fmt.Errorf("oci import: %w", err)
	}

	lim := &unpackLimit{max: MaxOCIUnpackedSize}
	for i, l := range manifest.Layers {
		if err := unpackOCILayer(ctx, ext, out, l, config.RootFS.DiffIDs[i], lim); err != nil {
			return fmt.Errorf("oci image %s: layer %d (%s): %w", img.Dir, i+1, l.Digest, err)
		}
	}
	return nil
}

// readOCIManifest reads and checks the manifest named d and its config.
func readOCIManifest(ctx context.Context, ext casext.Engine, d digest.Digest) (ispec.Manifest, ispec.Image, error) {
	var manifest ispec.Manifest
	var config ispec.Image

	// The index need not point at d any more, so read the blob directly;
	// the engine checks its digest when the read reaches the end.
	rc, err := ext.GetBlob(ctx, d)
	if errors.Is(err, fs.ErrNotExist) {
		return manifest, config, fmt.Errorf("manifest %s is not in the layout: %w", d, fs.ErrNotExist)
	}
	if err != nil {
		return manifest, config, fmt.Errorf("manifest %s: %w", d, err)
	}
	raw, err := io.ReadAll(io.LimitReader(rc, maxOCIJSONSize+1))
	if cerr := rc.Close(); err == nil && len(raw) <= maxOCIJSONSize {
		err = cerr
	}
	if err != nil {
		return manifest, config, fmt.Errorf("manifest %s: %w", d, err)
	}
	if len(raw) > maxOCIJSONSize {
		return manifest, config, fmt.Errorf("manifest %s is larger than %d bytes: %w", d, maxOCIJSONSize, ErrOCIRefused)
	}
	// umoci's parser also refuses manifests carrying index fields (CVE-2021-41190).
	parsed, err := mediatype.GetParser(ispec.MediaTypeImageManifest)(bytes.NewReader(raw))
	if err != nil {
		return manifest, config, fmt.Errorf("manifest %s: %w", d, err)
	}
	manifest = parsed.(ispec.Manifest)

	if manifest.Config.MediaType != ispec.MediaTypeImageConfig {
		return manifest, config, fmt.Errorf("manifest %s: config has media type %q, want %s: %w",
			d, manifest.Config.MediaType, ispec.MediaTypeImageConfig, ErrOCIRefused)
	}
	if manifest.Config.Size > maxOCIJSONSize {
		return manifest, config, fmt.Errorf("manifest %s: config is larger than %d bytes: %w", d, maxOCIJSONSize, ErrOCIRefused)
	}
	blob, err := ext.FromDescriptor(ctx, manifest.Config)
	if err != nil {
		return manifest, config, fmt.Errorf("config %s: %w", manifest.Config.Digest, err)
	}
	if err := blob.Close(); err != nil {
		return manifest, config, fmt.Errorf("config %s: %w", manifest.Config.Digest, err)
	}
	config = blob.Data.(ispec.Image)

	if config.RootFS.Type != "layers" {
		return manifest, config, fmt.Errorf("config %s: rootfs type %q, want \"layers\": %w", manifest.Config.Digest, config.RootFS.Type, ErrOCIRefused)
	}
	// umoci's UnpackRootfs indexes DiffIDs by layer without this check, and
	// panics on a config that lists fewer.
	if len(config.RootFS.DiffIDs) != len(manifest.Layers) {
		return manifest, config, fmt.Errorf("manifest %s has %d layers but its config lists %d diff ids: %w",
			d, len(manifest.Layers), len(config.RootFS.DiffIDs), ErrOCIRefused)
	}
	var total int64
	for _, l := range manifest.Layers {
		if l.Size < 0 {
			return manifest, config, fmt.Errorf("layer %s has negative size: %w", l.Digest, ErrOCIRefused)
		}
		total += l.Size
		if total > MaxOCIUnpackedSize {
			return manifest, config, fmt.Errorf("manifest %s: layers are larger than %d bytes compressed: %w", d, MaxOCIUnpackedSize, ErrOCITooLarge)
		}
	}
	return manifest, config, nil
}

// unpackOCILayer applies one layer to root. It is umoci's UnpackRootfs loop
// with two additions UnpackRootfs has no hook for: every tar header is checked
// before umoci's extractor sees it, and the uncompressed stream is counted so
// that a decompression bomb stops at MaxOCIUnpackedSize rather than the disk's
// size. Extraction itself (path confinement, whiteouts, metadata) is umoci's.
func unpackOCILayer(ctx context.Context, ext casext.Engine, root string, desc ispec.Descriptor, diffID digest.Digest, lim *unpackLimit) (err error) {
	blob, err := ext.GetVerifiedBlob(ctx, desc)
	if err != nil {
		return fmt.Errorf("open blob: %w", err)
	}
	defer func() {
		// The blob's digest is checked when it is read to the end. Finish
		// reading even after a failure: a flipped byte usually breaks gzip
		// before the end, and "does not match its descriptor" is the cause to
		// report. The read is bounded by the descriptor's size.
		_, rerr := io.Copy(io.Discard, blob)
		verr := errors.Join(rerr, blob.Close())
		switch {
		case errors.Is(verr, hardening.ErrDigestMismatch) || errors.Is(verr, hardening.ErrSizeMismatch):
			err = fmt.Errorf("blob does not match its descriptor: %w", verr)
		case err == nil && verr != nil:
			err = fmt.Errorf("read blob: %w", verr)
		}
	}()
	return applyOCILayer(ctx, root, blob, desc.MediaType, diffID, lim)
}

// applyOCILayer applies one layer's blob, of the given media type, to root: every tar header is
// checked before umoci's extractor sees it, and the uncompressed stream is counted so that a
// decompression bomb stops at MaxOCIUnpackedSize rather than the disk's size, and must hash to
// diffID. Extraction itself (path confinement, whiteouts, metadata) is umoci's.
func applyOCILayer(ctx context.Context, root string, blob io.Reader, mediaType string, diffID digest.Digest, lim *unpackLimit) (err error) {
	base, suffix := mediatype.SplitMediaTypeSuffix(mediaType)
	//lint:ignore SA1019 non-distributable layers are deprecated but still found in images
	if base != ispec.MediaTypeImageLayer && base != ispec.MediaTypeImageLayerNonDistributable {
		return fmt.Errorf("media type %q is not an image layer: %w", mediaType, ErrOCIRefused)
	}
	algo := blobcompress.GetAlgorithm(suffix)
	if algo == nil {
		return fmt.Errorf("layer compression %q is not supported: %w", suffix, ErrOCIRefused)
	}
	if err := diffID.Validate(); err != nil {
		return fmt.Errorf("config diff id: %w", err)
	}
	plain, err := algo.Decompress(blob)
	if err != nil {
		return fmt.Errorf("decompress: %w", err)
	}
	// Deferred after the caller's drain of the blob, so it runs first: pgzip's Close waits
	// for its read-ahead goroutine, which must stop reading the blob before the drain does.
	defer plain.Close()
	diff := diffID.Algorithm().Digester()
	stream := &countingReader{r: io.TeeReader(plain, diff.Hash()), lim: lim}

	te := layer.NewTarExtractor(&layer.UnpackOptions{
		// Plain directory with OCI whiteouts applied, no ID mapping, not
		// rootless: owners are kept as the image has them (in shed's user
		// namespace, as ids of it). A plain directory has no overlay marks,
		// so unlike a cache's layers there is no xattr form to choose.
		OnDiskFormat: layer.DirRootfs{MapOptions: layer.MapOptions{Rootless: false}},
	})
	tr := tar.NewReader(stream)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("read tar: %w", err)
		}
		if err := checkOCIEntry(hdr, lim); err != nil {
			return err
		}
		if err := te.UnpackEntry(root, hdr, tr); err != nil {
			return fmt.Errorf("unpack %s: %w", hdr.Name, err)
		}
	}
	// The diff ID covers the whole uncompressed stream, including any padding
	// after the end-of-archive blocks (GNU tar adds some); still counted.
	if _, err := io.Copy(io.Discard, stream); err != nil {
		return fmt.Errorf("read tar padding: %w", err)
	}
	if err := plain.Close(); err != nil {
		return fmt.Errorf("decompress: %w", err)
	}
	if got := diff.Digest(); got != diffID {
		return fmt.Errorf("uncompressed layer is %s but the config's diff id is %s: %w", got, diffID, ErrOCIRefused)
	}
	return nil
}

// checkOCIEntry refuses what a seed may not hold before umoci writes it.
// Paths need no check here: umoci confines them to the root.
func checkOCIEntry(hdr *tar.Header, lim *unpackLimit) error {
	if hdr.Size > 0 {
		lim.claimed += hdr.Size
		if lim.claimed > lim.max {
			return fmt.Errorf("%s: entries claim more than %d bytes: %w", hdr.Name, lim.max, ErrOCITooLarge)
		}
	}
	// A seed is an overlay lower layer: a 0:0 character device there is an
	// overlay whiteout, and overlay xattrs (redirect, metacopy, opaque) are
	// obeyed by the kernel. Neither belongs in a plain root filesystem. Both
	// namespaces are refused, as root and rootless: unpacked here, not
	// through an overlay that would escape it, an image's user.overlay.opaque
	// is a real mark to an overlay mounted with userxattr, and one that
	// Normalize keeps rootless.
	if hdr.Typeflag == tar.TypeChar && hdr.Devmajor == 0 && hdr.Devminor == 0 {
		return fmt.Errorf("%s: a 0:0 character device is an overlay whiteout: %w", hdr.Name, ErrOCIRefused)
	}
	// Other devices are refused here rather than by Normalize: in a user
	// namespace (shed without root) umoci writes an empty file in their place.
	if hdr.Typeflag == tar.TypeChar || hdr.Typeflag == tar.TypeBlock {
		return fmt.Errorf("%s: a device node (%d:%d); layers hold files, not devices: %w", hdr.Name, hdr.Devmajor, hdr.Devminor, ErrOCIRefused)
	}
	for key := range hdr.PAXRecords {
		name, ok := strings.CutPrefix(key, "SCHILY.xattr.")
		if ok && (strings.HasPrefix(name, "trusted.overlay.") || strings.HasPrefix(name, "user.overlay.")) {
			return fmt.Errorf("%s: overlayfs xattr %s: %w", hdr.Name, name, ErrOCIRefused)
		}
	}
	return nil
}

// unpackLimit counts what one import has unpacked so far, across layers.
type unpackLimit struct {
	max     int64 // MaxOCIUnpackedSize when the import started
	stream  int64 // uncompressed tar bytes read
	claimed int64 // sum of the sizes tar headers claim
}

// countingReader fails once the uncompressed streams pass the limit. It
// hands out at most one byte past the limit, so a bomb is never expanded
// further than that.
type countingReader struct {
	r   io.Reader
	lim *unpackLimit
}

func (c *countingReader) Read(p []byte) (int, error) {
	left := c.lim.max - c.lim.stream
	if left < 0 {
		return 0, fmt.Errorf("uncompressed layers exceed %d bytes: %w", c.lim.max, ErrOCITooLarge)
	}
	if int64(len(p)) > left+1 {
		p = p[:left+1]
	}
	n, err := c.r.Read(p)
	c.lim.stream += int64(n)
	if c.lim.stream > c.lim.max {
		return n, fmt.Errorf("uncompressed layers exceed %d bytes: %w", c.lim.max, ErrOCITooLarge)
	}
	return n, err
}

var umociLogsOnce sync.Once

// routeUmociLogs sends umoci's apex/log output (which goes to stderr by
// default) to slog at debug level: libraries do not print, and umoci's notes
// ("ignoring forbidden xattr security.selinux") are debugging detail. apex/log
// has a single process-wide logger, so this is set once, before any umoci call.
func routeUmociLogs() {
	umociLogsOnce.Do(func() {
		apexlog.SetHandler(apexlog.HandlerFunc(func(e *apexlog.Entry) error {
			attrs := make([]any, 0, 2*len(e.Fields))
			for _, k := range e.Fields.Names() {
				attrs = append(attrs, k, e.Fields.Get(k))
			}
			slog.Debug("umoci: "+e.Message, attrs...)
			return nil
		}))
	})
}
