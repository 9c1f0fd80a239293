package cache

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/klauspost/pgzip"
	digest "github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/content/oci"
	"oras.land/oras-go/v2/errdef"
	"oras.land/oras-go/v2/registry/remote"
	"oras.land/oras-go/v2/registry/remote/auth"
	"oras.land/oras-go/v2/registry/remote/credentials"
	"oras.land/oras-go/v2/registry/remote/errcode"
	"oras.land/oras-go/v2/registry/remote/retry"

	"toolshed.dev/shed/internal/hint"
	"toolshed.dev/shed/store"
	"toolshed.dev/shed/trust"
)

// One store path is one OCI artifact (an image manifest, OCI 1.1), tagged with the path's hash part:
//
//	config   the path's record: its full path, references, deriver (MediaRecord)
//	layer 0  the path's manifest, the canonical listing whose BLAKE3 is the content hash (MediaManifest)
//	layer 1  the signed provenance, a DSSE envelope (MediaProvenance)
//	layer 2  the path's tree as a gzip-compressed tar (MediaLayer, see WriteLayer)
//
// A pull reads the small parts first and checks the signature against the trust policy before it
// downloads the tree; the tree is then checked entry by entry against the manifest, each file hashed
// as it is written (ReadLayer), and registered with that manifest.
const (
	ArtifactType    = "application/vnd.toolshed.path.v1"
	MediaRecord     = "application/vnd.toolshed.path.v1+json"
	MediaManifest   = "application/vnd.toolshed.manifest.v1"
	MediaProvenance = "application/vnd.toolshed.provenance.v1+dsse"
	MediaLayer      = "application/vnd.toolshed.layer.v1.tar+gzip"
)

// Limits on what a pull reads before anything is verified.
const (
	maxOCIManifest = 1 << 20
	maxRecord      = 1 << 20
	maxProvenance  = 1 << 20
	maxManifest    = 256 << 20
)

// ErrNotFound is returned when a cache does not have a path.
var ErrNotFound = errors.New("not in the cache")

// ErrUnauthorized marks a registry that refused our credentials, or wanted some and got none.
var ErrUnauthorized = errors.New("the registry refused access")

// classify marks authorization failures with ErrUnauthorized, whatever step met them.
func classify(err error) error {
	var resp *errcode.ErrorResponse
	if errors.Is(err, auth.ErrBasicCredentialNotFound) || errors.As(err, &resp) && (resp.StatusCode == 401 || resp.StatusCode == 403) {
		return fmt.Errorf("%w: %v", ErrUnauthorized, err)
	}
	return err
}

// ErrBadArtifact marks an artifact that is not a well-formed store path: wrong media types, a record
// for another path, sizes out of bounds.
var ErrBadArtifact = errors.New("bad artifact")

// record is an artifact's config.
type record struct {
	Path        string   `json:"path"` // full: store directory and base name
	References  []string `json:"references"`
	BuildInputs []string `json:"build_inputs,omitempty"`
	Deriver     string   `json:"deriver,omitempty"`
	CA          string   `json:"ca,omitempty"`
}

// target is what a registry repository and an OCI layout have in common for us.
type target interface {
	content.Storage
	Resolve(ctx context.Context, reference string) (ocispec.Descriptor, error)
	Tag(ctx context.Context, desc ocispec.Descriptor, reference string) error
}

// Cache is a place that holds store paths as artifacts: a registry repository or an OCI image layout
// directory.
type Cache struct {
	Name   string // as the user wrote it
	target target
	layout *oci.Store // for an OCI layout directory: its index is saved after a push
}

// Credentials for a registry come from the environment (SHED_REGISTRY_USERNAME and
// SHED_REGISTRY_PASSWORD), else from the Docker credentials file ($DOCKER_CONFIG/config.json,
// ~/.docker/config.json, and its credential helpers), else from podman's auth files (podmanAuthFiles),
// at run time only: they never reach a derivation, a store path, a log or a provenance.
func credentialFunc(host string, env bool) (auth.CredentialFunc, error) {
	if u, p := os.Getenv("SHED_REGISTRY_USERNAME"), os.Getenv("SHED_REGISTRY_PASSWORD"); env && (u != "" || p != "") {
		return auth.StaticCredential(host, auth.Credential{Username: u, Password: p}), nil
	}
	cs, err := credentials.NewStoreFromDocker(credentials.StoreOptions{})
	if err != nil {
		return nil, fmt.Errorf("read the Docker credentials file: %w", err)
	}
	var fallbacks []credentials.Store
	for _, f := range podmanAuthFiles() {
		if _, err := os.Stat(f); err != nil {
			continue
		}
		ps, err := credentials.NewStore(f, credentials.StoreOptions{})
		if err != nil {
			return nil, fmt.Errorf("read podman's credentials file %s: %w", f, err)
		}
		fallbacks = append(fallbacks, ps)
	}
	return credentials.Credential(credentials.NewStoreWithFallbacks(cs, fallbacks...)), nil
}

// podmanAuthFiles are where `podman login` keeps credentials (containers-auth.json(5)), in the order
// podman reads them: $REGISTRY_AUTH_FILE, then $XDG_RUNTIME_DIR/containers/auth.json (or
// /run/containers/UID/auth.json), then $XDG_CONFIG_HOME/containers/auth.json. Their format is Docker's.
func podmanAuthFiles() []string {
	var files []string
	if f := os.Getenv("REGISTRY_AUTH_FILE"); f != "" {
		files = append(files, f)
	}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		files = append(files, filepath.Join(d, "containers", "auth.json"))
	} else {
		files = append(files, fmt.Sprintf("/run/containers/%d/auth.json", os.Getuid()))
	}
	if d, err := os.UserConfigDir(); err == nil {
		files = append(files, filepath.Join(d, "containers", "auth.json"))
	}
	return files
}

// Open opens a cache named oci://HOST[:PORT]/REPO (a registry; plain HTTP only for a loopback host, as
// Docker treats localhost) or oci-layout:DIR (an OCI image layout directory, created if missing).
func Open(name string) (*Cache, error) {
	switch {
	case strings.HasPrefix(name, "oci://"):
		repo, err := repository(strings.TrimPrefix(name, "oci://"), true)
		if err != nil {
			return nil, fmt.Errorf("cache %s: %w", name, err)
		}
		return &Cache{Name: name, target: repo}, nil
	case strings.HasPrefix(name, "oci-layout:"):
		dir := strings.TrimPrefix(name, "oci-layout:")
		st, err := oci.New(dir)
		if err != nil {
			return nil, fmt.Errorf("cache %s: %w", name, err)
		}
		st.AutoSaveIndex = false
		return &Cache{Name: name, target: st, layout: st}, nil
	}
	return nil, fmt.Errorf("cache %q: want oci://HOST[:PORT]/REPO or oci-layout:DIR", name)
}

// Repository opens a registry repository that a recipe named (an image seed), ref being
// HOST[:PORT]/REPO (a tag or digest after it is allowed and ignored), the way every registry client
// of shed does: plain HTTP only for a loopback host, as Docker treats localhost; credentials as
// credentialFunc finds them in the files that key them by host, answered to the registry's
// challenges by oras-go's auth client (with retries of transient failures). SHED_REGISTRY_USERNAME
// and SHED_REGISTRY_PASSWORD are not offered: they name no host, and are meant for the caches the
// user names, not for whatever registry a recipe names. Its Client also serves requests made by
// hand, such as a fixed-output fetch of a blob.
func Repository(ref string) (*remote.Repository, error) { return repository(ref, false) }

func repository(ref string, envCredentials bool) (*remote.Repository, error) {
	repo, err := remote.NewRepository(ref)
	if err != nil {
		return nil, err
	}
	host := repo.Reference.Registry
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	repo.PlainHTTP = isLoopback(host)
	cred, err := credentialFunc(repo.Reference.Registry, envCredentials)
	if err != nil {
		return nil, err
	}
	repo.Client = &auth.Client{Client: retry.DefaultClient, Cache: auth.NewCache(), Credential: cred}
	return repo, nil
}

// ErrUnauthorizedOf marks err with ErrUnauthorized when a registry refused access on its way.
func ErrUnauthorizedOf(err error) error { return classify(err) }

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Tag returns the tag of a store path: its hash part, which is a valid tag and names the path
// without its (free-form) name.
func Tag(p store.Path) string { return p.HashPart() }

// Has reports whether the cache has an artifact for p.
func (c *Cache) Has(ctx context.Context, p store.Path) (ocispec.Descriptor, bool, error) {
	desc, err := c.target.Resolve(ctx, Tag(p))
	if errors.Is(err, errdef.ErrNotFound) {
		return ocispec.Descriptor{}, false, nil
	}
	if err != nil {
		return ocispec.Descriptor{}, false, fmt.Errorf("cache %s: %w", c.Name, classify(err))
	}
	return desc, true, nil
}

// Closure returns paths and everything they reference, references first: what they need to run.
// With buildInputs, it adds the build inputs of every path in it (the .debs and wheels its layers were
// built from), each before the path built from it; a build input that gc freed is an error.
func Closure(s *store.Store, paths []store.Path, buildInputs bool) ([]store.Path, error) {
	var out []store.Path
	seen := map[store.Path]bool{}
	var visit func(p store.Path) error
	visit = func(p store.Path) error {
		if seen[p] {
			return nil
		}
		seen[p] = true
		info, err := s.Info(p)
		if err != nil {
			return err
		}
		for _, r := range info.References {
			if r != p {
				if err := visit(r); err != nil {
					return err
				}
			}
		}
		if buildInputs {
			for _, r := range info.BuildInputs {
				if !s.IsValid(r) {
					return fmt.Errorf("%w: build input %s of %s is not in the store: gc freed it (keep_build_inputs is off)", store.ErrNotExist, r, p)
				}
				if err := visit(r); err != nil {
					return err
				}
			}
		}
		out = append(out, p)
		return nil
	}
	for _, p := range paths {
		if err := visit(p); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// PushResult says what a push did.
type PushResult struct {
	Pushed  []store.Path `json:"pushed"`
	Present []store.Path `json:"present"` // already in the cache with the same provenance
	Bytes   int64        `json:"bytes"`   // compressed bytes of the trees pushed
}

// Push copies paths and their reference closures into the cache. Every path must carry a provenance
// that t's policy verifies: a cache never receives an unsigned path. A path already there with the
// same provenance is skipped; with another one (signed again after a key rotation) it is replaced.
// Only store paths can be pushed: a Bench's upper layer is not a store path and has no way in.
//
// A path's closure is what it needs to run; with buildInputs, the .debs and wheels it was built from
// go too (for a mirror, or to rebuild elsewhere a version that is gone upstream).
func Push(ctx context.Context, s *store.Store, t *trust.Store, c *Cache, paths []store.Path, buildInputs bool) (*PushResult, error) {
	all, err := Closure(s, paths, buildInputs)
	if err != nil {
		return nil, err
	}
	res := &PushResult{Pushed: []store.Path{}, Present: []store.Path{}}
	for _, p := range all {
		n, pushed, err := pushOne(ctx, s, t, c, p)
		if err != nil {
			return res, fmt.Errorf("push %s to %s: %w", p, c.Name, classify(err))
		}
		if pushed {
			res.Pushed = append(res.Pushed, p)
			res.Bytes += n
		} else {
			res.Present = append(res.Present, p)
		}
	}
	if c.layout != nil {
		if err := c.layout.SaveIndex(); err != nil {
			return res, err
		}
	}
	return res, nil
}

func pushOne(ctx context.Context, s *store.Store, t *trust.Store, c *Cache, p store.Path) (int64, bool, error) {
	info, err := s.Info(p)
	if err != nil {
		return 0, false, err
	}
	prov, err := s.Provenance(p)
	if err != nil {
		return 0, false, hint.Wrap(err, "`shed store sign "+s.Location(p)+"` signs it with this store's key, if you vouch for it")
	}
	if err := t.Verify(info, prov); err != nil {
		return 0, false, fmt.Errorf("its provenance does not verify here: %w", err)
	}
	provDesc := blobDesc(MediaProvenance, prov)
	if desc, ok, err := c.Has(ctx, p); err != nil {
		return 0, false, err
	} else if ok {
		if m, err := fetchManifest(ctx, c, desc); err == nil && len(m.Layers) == 3 && m.Layers[1].Digest == provDesc.Digest {
			return 0, false, nil
		}
	}
	m, err := s.Manifest(p)
	if err != nil {
		return 0, false, err
	}
	rec := record{Path: path.Join(s.StoreDir(), p.String()), References: []string{}, CA: info.CA}
	for _, r := range info.References {
		rec.References = append(rec.References, path.Join(s.StoreDir(), r.String()))
	}
	for _, r := range info.BuildInputs {
		rec.BuildInputs = append(rec.BuildInputs, path.Join(s.StoreDir(), r.String()))
	}
	if !info.Deriver.IsZero() {
		rec.Deriver = path.Join(s.StoreDir(), info.Deriver.String())
	}
	recJSON, err := json.Marshal(rec)
	if err != nil {
		return 0, false, err
	}
	// The tree is compressed into a temporary file first: a push names its digest and size up front.
	tmp, err := os.CreateTemp(s.TmpDir(), "push-*.tar.gz")
	if err != nil {
		return 0, false, err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	h := sha256.New()
	zw := pgzip.NewWriter(io.MultiWriter(tmp, h))
	if err := WriteLayer(ctx, zw, s.Location(p)); err != nil {
		return 0, false, err
	}
	if err := zw.Close(); err != nil {
		return 0, false, err
	}
	size, err := tmp.Seek(0, io.SeekCurrent)
	if err != nil {
		return 0, false, err
	}
	layerDesc := ocispec.Descriptor{MediaType: MediaLayer, Digest: digest.NewDigestFromEncoded(digest.SHA256, hex.EncodeToString(h.Sum(nil))), Size: size}
	manDesc := blobDesc(MediaManifest, m.Encode())
	recDesc := blobDesc(MediaRecord, recJSON)
	for _, b := range []struct {
		desc ocispec.Descriptor
		data []byte
	}{{recDesc, recJSON}, {manDesc, m.Encode()}, {provDesc, prov}} {
		if err := pushBlob(ctx, c, b.desc, bytes.NewReader(b.data)); err != nil {
			return 0, false, err
		}
	}
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		return 0, false, err
	}
	if err := pushBlob(ctx, c, layerDesc, tmp); err != nil {
		return 0, false, err
	}
	manifest, err := json.Marshal(ocispec.Manifest{
		Versioned:    specs.Versioned{SchemaVersion: 2},
		MediaType:    ocispec.MediaTypeImageManifest,
		ArtifactType: ArtifactType,
		Config:       recDesc,
		Layers:       []ocispec.Descriptor{manDesc, provDesc, layerDesc},
		// No creation time: the manifest stays reproducible, and the provenance says when it was built.
		Annotations: map[string]string{"dev.toolshed.path": rec.Path},
	})
	if err != nil {
		return 0, false, err
	}
	desc := blobDesc(ocispec.MediaTypeImageManifest, manifest)
	if err := pushBlob(ctx, c, desc, bytes.NewReader(manifest)); err != nil {
		return 0, false, err
	}
	if err := c.target.Tag(ctx, desc, Tag(p)); err != nil {
		return 0, false, err
	}
	return size, true, nil
}

func blobDesc(mediaType string, b []byte) ocispec.Descriptor {
	return ocispec.Descriptor{MediaType: mediaType, Digest: digest.FromBytes(b), Size: int64(len(b))}
}

func pushBlob(ctx context.Context, c *Cache, desc ocispec.Descriptor, r io.Reader) error {
	if ok, err := c.target.Exists(ctx, desc); err == nil && ok {
		return nil
	}
	err := c.target.Push(ctx, desc, r)
	if errors.Is(err, errdef.ErrAlreadyExists) {
		return nil
	}
	return err
}

func fetchManifest(ctx context.Context, c *Cache, desc ocispec.Descriptor) (*ocispec.Manifest, error) {
	if desc.MediaType != ocispec.MediaTypeImageManifest || desc.Size > maxOCIManifest {
		return nil, fmt.Errorf("%w: manifest of type %q, %d bytes", ErrBadArtifact, desc.MediaType, desc.Size)
	}
	b, err := content.FetchAll(ctx, c.target, desc) // checks size and digest
	if err != nil {
		return nil, err
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%w: manifest: %v", ErrBadArtifact, err)
	}
	return &m, nil
}

// fetchSmall fetches a blob of at most limit bytes, checking its media type, size and digest.
func fetchSmall(ctx context.Context, c *Cache, desc ocispec.Descriptor, mediaType string, limit int64) ([]byte, error) {
	if desc.MediaType != mediaType || desc.Size < 0 || desc.Size > limit {
		return nil, fmt.Errorf("%w: blob of type %q, %d bytes, want %s of at most %d", ErrBadArtifact, desc.MediaType, desc.Size, mediaType, limit)
	}
	return content.FetchAll(ctx, c.target, desc)
}

// Puller brings store paths from caches into a store, verifying each before it is registered.
type Puller struct {
	Store  *store.Store
	Trust  *trust.Store
	Caches []*Cache
	// Log, if set, hears about each path pulled and each refusal.
	Log func(format string, args ...any)

	slotsOnce sync.Once
	slots     chan struct{} // one per tree being downloaded and extracted
}

// maxTrees bounds the trees one Puller downloads and extracts at once: a path's references are
// pulled while its own tree arrives, so a Workshop's seed and layers come in together.
const maxTrees = 4

func (pl *Puller) acquire(ctx context.Context) (release func(), err error) {
	pl.slotsOnce.Do(func() { pl.slots = make(chan struct{}, maxTrees) })
	select {
	case pl.slots <- struct{}{}:
		return func() { <-pl.slots }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (pl *Puller) logf(format string, args ...any) {
	if pl.Log != nil {
		pl.Log(format, args...)
	}
}

// Pull makes p valid from the first cache that has it (with its reference closure), and reports
// whether it did. A cache that has p but fails a check is an error that says which check failed;
// nothing of p is registered then. found, unless nil, hears the name of the cache that has p before
// any of p downloads (a miss calls nothing); progress, unless nil, hears the bytes of the trees
// downloaded so far and of those expected: each tree's compressed size, added as its manifest is
// read (p's first, then its references' as they are pulled).
func (pl *Puller) Pull(ctx context.Context, p store.Path, found func(cache string), progress func(done, expected int64)) (bool, error) {
	var pr *pullProgress
	if progress != nil {
		pr = &pullProgress{report: progress}
	}
	return pl.pull(ctx, p, found, pr)
}

// pullProgress counts the bytes of one Pull, its references' included (pulled at the same time:
// report is called by one goroutine at a time).
type pullProgress struct {
	report         func(done, expected int64)
	mu             sync.Mutex
	done, expected int64
}

func (pr *pullProgress) expect(n int64) {
	if pr != nil {
		pr.mu.Lock()
		defer pr.mu.Unlock()
		pr.expected += n
		pr.report(pr.done, pr.expected)
	}
}

// reader counts what r reads.
func (pr *pullProgress) reader(r io.Reader) io.Reader {
	if pr == nil {
		return r
	}
	return &progressReader{r, pr}
}

type progressReader struct {
	r  io.Reader
	pr *pullProgress
}

func (c *progressReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if n > 0 {
		c.pr.mu.Lock()
		c.pr.done += int64(n)
		c.pr.report(c.pr.done, c.pr.expected)
		c.pr.mu.Unlock()
	}
	return n, err
}

func (pl *Puller) pull(ctx context.Context, p store.Path, found func(cache string), pr *pullProgress) (bool, error) {
	if pl.Store.IsValid(p) {
		return true, nil
	}
	for _, c := range pl.Caches {
		desc, ok, err := c.Has(ctx, p)
		if err != nil {
			return false, err
		}
		if !ok {
			continue
		}
		if found != nil {
			found(c.Name)
		}
		if err := pl.pullFrom(ctx, c, p, desc, pr); err != nil {
			return false, fmt.Errorf("substitute %s from %s: %w", p, c.Name, classify(err))
		}
		return true, nil
	}
	return false, nil
}

// extractTree downloads a path's tree (layer) and writes it at out, as man describes it.
// wrap, if set, wraps the download (to count its bytes).
func extractTree(ctx context.Context, c *Cache, layer ocispec.Descriptor, man *store.Manifest, out string, wrap func(io.Reader) io.Reader) error {
	rc, err := c.target.Fetch(ctx, layer)
	if err != nil {
		return err
	}
	defer rc.Close()
	var r io.Reader = rc
	if wrap != nil {
		r = wrap(rc)
	}
	vr := content.NewVerifyReader(r, layer) // digest and size of the compressed bytes
	// pgzip decompresses ahead, in a goroutine of its own, while ReadLayer hashes and writes.
	zr, err := pgzip.NewReader(vr)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrBadLayer, err)
	}
	defer zr.Close()
	if err := ReadLayer(ctx, zr, out, man); err != nil {
		return err
	}
	// Read to the gzip trailer (its CRC is checked) and the blob's end (its digest). Through Read only:
	// pgzip's WriteTo panics on a stream already read to its end.
	if _, err := io.Copy(io.Discard, struct{ io.Reader }{zr}); err != nil {
		return fmt.Errorf("%w: %v", ErrBadLayer, err)
	}
	return vr.Verify()
}

// PullTree writes at out the tree of p, a path registered here, from the first cache whose copy
// has exactly the content hash of p's record (want): a repair's bytes are checked against this
// store's own record, trusted when p was registered, so no signature is needed. It reports whether
// a cache had it.
func (pl *Puller) PullTree(ctx context.Context, p store.Path, want store.Hash, out string) (bool, error) {
	var errs []error
	for _, c := range pl.Caches {
		desc, ok, err := c.Has(ctx, p)
		if err != nil {
			errs = append(errs, err) // another cache may have it
			continue
		}
		if !ok {
			continue
		}
		m, err := fetchManifest(ctx, c, desc)
		if err != nil {
			return false, fmt.Errorf("repair %s from %s: %w", p, c.Name, err)
		}
		if m.ArtifactType != ArtifactType || len(m.Layers) != 3 || m.Layers[2].MediaType != MediaLayer {
			return false, fmt.Errorf("repair %s from %s: %w: artifact type %q with %d layers", p, c.Name, ErrBadArtifact, m.ArtifactType, len(m.Layers))
		}
		manBytes, err := fetchSmall(ctx, c, m.Layers[0], MediaManifest, maxManifest)
		if err != nil {
			return false, fmt.Errorf("repair %s from %s: %w", p, c.Name, err)
		}
		man, err := store.ParseManifest(manBytes)
		if err != nil {
			return false, fmt.Errorf("repair %s from %s: %w: %v", p, c.Name, ErrBadArtifact, err)
		}
		if man.Hash() != want {
			pl.logf("%s in %s has other content than registered here; not used for the repair", p, c.Name)
			continue
		}
		if err := extractTree(ctx, c, m.Layers[2], man, out, nil); err != nil {
			return false, fmt.Errorf("repair %s from %s: %w", p, c.Name, classify(err))
		}
		return true, nil
	}
	return false, errors.Join(errs...)
}

func (pl *Puller) pullFrom(ctx context.Context, c *Cache, p store.Path, desc ocispec.Descriptor, pr *pullProgress) error {
	s := pl.Store
	m, err := fetchManifest(ctx, c, desc)
	if err != nil {
		return err
	}
	if m.ArtifactType != ArtifactType || len(m.Layers) != 3 {
		return fmt.Errorf("%w: artifact type %q with %d layers", ErrBadArtifact, m.ArtifactType, len(m.Layers))
	}
	recJSON, err := fetchSmall(ctx, c, m.Config, MediaRecord, maxRecord)
	if err != nil {
		return err
	}
	var rec record
	if err := json.Unmarshal(recJSON, &rec); err != nil {
		return fmt.Errorf("%w: record: %v", ErrBadArtifact, err)
	}
	if want := path.Join(s.StoreDir(), p.String()); rec.Path != want {
		return fmt.Errorf("%w: the artifact tagged %s is %s", ErrBadArtifact, Tag(p), rec.Path)
	}
	info := &store.PathInfo{Path: p, References: []store.Path{}, CA: rec.CA}
	for _, r := range rec.References {
		rp, err := parseFull(s, r)
		if err != nil {
			return fmt.Errorf("%w: reference %q: %v", ErrBadArtifact, r, err)
		}
		info.References = append(info.References, rp)
	}
	for _, r := range rec.BuildInputs {
		rp, err := parseFull(s, r)
		if err != nil {
			return fmt.Errorf("%w: build input %q: %v", ErrBadArtifact, r, err)
		}
		info.BuildInputs = append(info.BuildInputs, rp)
	}
	if rec.Deriver != "" {
		if info.Deriver, err = parseFull(s, rec.Deriver); err != nil {
			return fmt.Errorf("%w: deriver %q: %v", ErrBadArtifact, rec.Deriver, err)
		}
	}
	manBytes, err := fetchSmall(ctx, c, m.Layers[0], MediaManifest, maxManifest)
	if err != nil {
		return err
	}
	man, err := store.ParseManifest(manBytes)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrBadArtifact, err)
	}
	info.ContentHash, info.Size = man.Hash(), man.Size()
	prov, err := fetchSmall(ctx, c, m.Layers[1], MediaProvenance, maxProvenance)
	if err != nil {
		return err
	}
	// The policy decides before a byte of the tree is downloaded. The record beside the provenance is
	// not signed: each of its fields (path, references, deriver, content address) must be what the
	// provenance signed, or the pull is refused here.
	if err := pl.Trust.Accept(info, prov); err != nil {
		return err
	}
	layer := m.Layers[2]
	if layer.MediaType != MediaLayer || layer.Size < 0 {
		return fmt.Errorf("%w: tree of type %q", ErrBadArtifact, layer.MediaType)
	}
	pr.expect(layer.Size)
	// The references are pulled while this path's tree downloads; the path is registered only once
	// they are valid (a path is registered only over valid references). Either failing stops the other.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	refsDone := make(chan error, 1)
	go func() {
		err := pl.pullRefs(ctx, p, info.References, pr)
		if err != nil {
			cancel()
		}
		refsDone <- err
	}()
	waitRefs := sync.OnceValue(func() error { return <-refsDone })
	opts := store.AddOptions{
		Deriver: info.Deriver, References: info.References, BuildInputs: info.BuildInputs, CA: info.CA,
		Manifest: man, // what extractTree checked the tree against, entry by entry and byte by byte
		Attestation: func(got *store.PathInfo) ([]byte, error) {
			// Registered only if what is on disk is what was signed.
			return prov, pl.Trust.Verify(got, prov)
		},
	}
	got, built, err := s.Realize(ctx, p, opts, func(ctx context.Context, out string) error {
		release, err := pl.acquire(ctx)
		if err != nil {
			return err
		}
		err = extractTree(ctx, c, layer, man, out, pr.reader)
		release()
		if err != nil {
			cancel()
			return err
		}
		return waitRefs()
	})
	if err != nil {
		cancel() // the references' pulls need not go on for a path that failed
	}
	// A reference's failure is the cause of this path's cancellation, if it was canceled.
	if refsErr := waitRefs(); refsErr != nil && (err == nil || errors.Is(err, context.Canceled)) {
		return refsErr
	}
	if err != nil {
		return err
	}
	if !built {
		return nil // registered by another process meanwhile, from its own provenance
	}
	// Only now, the tree verified and the path registered with the provenance, does its time become
	// the path's replay bound: a refused artifact leaves no trace in the trust state.
	if err := pl.Trust.Accepted(got, prov); err != nil {
		return fmt.Errorf("record the replay state: %w", err)
	}
	pl.logf("substituted %s from %s", p, c.Name)
	return nil
}

// pullRefs makes the references of p valid, all at once.
func (pl *Puller) pullRefs(ctx context.Context, p store.Path, refs []store.Path, pr *pullProgress) error {
	var wg sync.WaitGroup
	errs := make([]error, len(refs))
	for i, r := range refs {
		if r == p || pl.Store.IsValid(r) {
			continue
		}
		wg.Go(func() {
			ok, err := pl.pull(ctx, r, nil, pr)
			if err == nil && !ok {
				err = fmt.Errorf("reference %s is in no cache", r)
			}
			errs[i] = err
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// parseFull parses a full store path of this store's directory.
func parseFull(s *store.Store, full string) (store.Path, error) {
	dir, base := path.Split(full)
	if path.Clean(dir) != path.Clean(s.StoreDir()) {
		return store.Path{}, fmt.Errorf("not in store directory %s", s.StoreDir())
	}
	return store.ParsePath(base)
}

// Tags lists the store paths a cache holds (its tags that are hash parts).
func (c *Cache) Tags(ctx context.Context) ([]string, error) {
	lister, ok := c.target.(interface {
		Tags(ctx context.Context, last string, fn func(tags []string) error) error
	})
	if !ok {
		return nil, fmt.Errorf("cache %s cannot list its tags", c.Name)
	}
	var out []string
	err := lister.Tags(ctx, "", func(tags []string) error {
		out = append(out, tags...)
		return nil
	})
	slices.Sort(out)
	return out, err
}

// PathOf resolves a tag (a hash part) to the store path its artifact names.
func (c *Cache) PathOf(ctx context.Context, s *store.Store, tag string) (store.Path, error) {
	desc, err := c.target.Resolve(ctx, tag)
	if err != nil {
		return store.Path{}, err
	}
	m, err := fetchManifest(ctx, c, desc)
	if err != nil {
		return store.Path{}, err
	}
	recJSON, err := fetchSmall(ctx, c, m.Config, MediaRecord, maxRecord)
	if err != nil {
		return store.Path{}, err
	}
	var rec record
	if err := json.Unmarshal(recJSON, &rec); err != nil {
		return store.Path{}, fmt.Errorf("%w: record: %v", ErrBadArtifact, err)
	}
	p, err := parseFull(s, rec.Path)
	if err != nil || p.HashPart() != tag {
		return store.Path{}, fmt.Errorf("%w: tag %s names %s", ErrBadArtifact, tag, rec.Path)
	}
	return p, nil
}
