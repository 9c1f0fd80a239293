package tests

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/opencontainers/go-digest"
	imeta "github.com/opencontainers/image-spec/specs-go"
	ispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/crypto/bcrypt"
	"oras.land/oras-go/v2/registry/remote"
	"oras.land/oras-go/v2/registry/remote/auth"
)

// testLayer is a gzip layer and the digest of its uncompressed tar (its diff id).
type testLayer struct {
	gz     []byte
	diffID digest.Digest
	size   int64 // of the uncompressed tar
}

func gzipLayer(t testing.TB, plain []byte) testLayer {
	t.Helper()
	var gz bytes.Buffer
	w, _ := gzip.NewWriterLevel(&gz, gzip.BestSpeed)
	w.Write(plain)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return testLayer{gz: gz.Bytes(), diffID: digest.FromBytes(plain), size: int64(len(plain))}
}

// tarLayer is a layer of the given entries, written as an attacker or an image tool would.
func tarLayer(t testing.TB, hdrs ...*tar.Header) testLayer {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, h := range hdrs {
		body := []byte(h.Linkname) // a regular file's content rides in Linkname here
		if h.Typeflag == tar.TypeReg {
			h.Size, h.Linkname = int64(len(body)), ""
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write(body)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return gzipLayer(t, b.Bytes())
}

// pushImage pushes an image of the layers to ref (HOST/REPO:TAG) with oras-go and returns its
// manifest's digest.
func pushImage(t testing.TB, ref string, layers ...testLayer) string {
	t.Helper()
	return pushImageAs(t, auth.EmptyCredential, ref, layers...)
}

func pushImageAs(t testing.TB, cred auth.Credential, ref string, layers ...testLayer) string {
	t.Helper()
	return pushImageWith(t, cred, ref, ispec.ImageConfig{}, nil, layers...)
}

// pushImageConfig is pushImage with the image's config.
func pushImageConfig(t testing.TB, ref string, cfg ispec.ImageConfig, layers ...testLayer) string {
	t.Helper()
	return pushImageWith(t, auth.EmptyCredential, ref, cfg, nil, layers...)
}

// pushImageWith is pushImageAs with the image's config and each layer's annotations (nil: none).
func pushImageWith(t testing.TB, cred auth.Credential, ref string, cfg ispec.ImageConfig, annotations []map[string]string, layers ...testLayer) string {
	t.Helper()
	ctx := context.Background()
	repo, err := remote.NewRepository(ref)
	if err != nil {
		t.Fatal(err)
	}
	repo.PlainHTTP = true
	if cred != auth.EmptyCredential {
		repo.Client = &auth.Client{Credential: auth.StaticCredential(repo.Reference.Registry, cred)}
	}
	push := func(mt string, b []byte) ispec.Descriptor {
		d := ispec.Descriptor{MediaType: mt, Digest: digest.FromBytes(b), Size: int64(len(b))}
		if ok, _ := repo.Exists(ctx, d); !ok {
			if err := repo.Push(ctx, d, bytes.NewReader(b)); err != nil {
				t.Fatal(err)
			}
		}
		return d
	}
	config := ispec.Image{Platform: ispec.Platform{OS: "linux", Architecture: runtime.GOARCH}, Config: cfg, RootFS: ispec.RootFS{Type: "layers"}}
	m := ispec.Manifest{Versioned: imeta.Versioned{SchemaVersion: 2}, MediaType: ispec.MediaTypeImageManifest}
	for i, l := range layers {
		config.RootFS.DiffIDs = append(config.RootFS.DiffIDs, l.diffID)
		d := push(ispec.MediaTypeImageLayerGzip, l.gz)
		if i < len(annotations) {
			d.Annotations = annotations[i]
		}
		m.Layers = append(m.Layers, d)
	}
	cj, _ := json.Marshal(config)
	m.Config = push(ispec.MediaTypeImageConfig, cj)
	mj, _ := json.Marshal(m)
	md := ispec.Descriptor{MediaType: ispec.MediaTypeImageManifest, Digest: digest.FromBytes(mj), Size: int64(len(mj))}
	if err := repo.PushReference(ctx, md, bytes.NewReader(mj), repo.Reference.Reference); err != nil {
		t.Fatal(err)
	}
	return md.Digest.String()
}

// debianLayers holds the Debian seed as an image layer, made once per run (a tar and a gzip of the
// seed: seconds).
var debianLayers struct {
	once  sync.Once
	layer testLayer
	err   error
}

// debianLayer is the shared store's Debian seed (debian/bookworm) as a gzipped image layer: the base
// the tests' task images are made over, as SWE-bench's are over one base image.
func debianLayer(t testing.TB, root string) testLayer {
	t.Helper()
	debianLayers.once.Do(func() {
		seedRecipe := writeFile(t, filepath.Join(t.TempDir(), "workshop.toml"), "name = \"oci-source\"\nseed = \"debian/bookworm\"\n")
		seed := realize(t, root, seedRecipe).Layers[0]
		raw, err := exec.Command("tar", "-C", seed, "--numeric-owner", "--xattrs", "--xattrs-include=security.capability", "-cf", "-", ".").Output()
		if err != nil {
			debianLayers.err = err
			return
		}
		debianLayers.layer = gzipLayer(t, raw)
	})
	if debianLayers.err != nil {
		t.Fatal(debianLayers.err)
	}
	return debianLayers.layer
}

// blobFile is where docker-registry keeps a blob's bytes.
func (r *registry) blobFile(d string) string {
	h := strings.TrimPrefix(d, "sha256:")
	return filepath.Join(r.dir, "data/docker/registry/v2/blobs/sha256", h[:2], h, "data")
}

// TestRegistrySeed is a harness's flow from a registry: two task images over one Debian base layer,
// in Debian's docker-registry on loopback. `shed lock` pins each by manifest digest and its blobs;
// realize fetches each blob once as a fixed-output path (the base layer once for both images),
// applies the layers (a whiteout removes a file), and once fetched the seed realizes and a Bench
// launches with the registry gone.
func TestRegistrySeed(t *testing.T) {
	parallel(t) // see parallelTests in main_test.go
	requireRoot(t)
	root := sharedRoot(t)
	base := debianLayer(t, root)
	task := func(n int) testLayer {
		return tarLayer(t,
			&tar.Header{Name: "etc/task-id", Typeflag: tar.TypeReg, Mode: 0o644, Linkname: fmt.Sprintf("task %d\n", n)},
			&tar.Header{Name: "etc/.wh.motd", Typeflag: tar.TypeReg, Mode: 0o644})
	}
	reg := startRegistry(t, "")
	host := fmt.Sprintf("127.0.0.1:%d", reg.port)
	d1 := pushImage(t, host+"/swe/task1:v1", base, task(1))
	pushImage(t, host+"/swe/task2:v1", base, task(2))

	dir := t.TempDir()
	file := writeFile(t, filepath.Join(dir, "one", "workshop.toml"), fmt.Sprintf("name = \"task1\"\nseed = \"oci://%s/swe/task1:v1\"\n", host))
	j := realize(t, root, file)
	lock, _ := os.ReadFile(filepath.Join(dir, "one", "workshop.lock"))
	if !strings.Contains(string(lock), "digest = '"+d1+"'") || strings.Count(string(lock), "[[seed.image.layer]]") != 2 {
		t.Errorf("lock:\n%s", lock)
	}
	// The base layer's blob is a fixed-output path of the shared store: a parallel test that pushed
	// the same base (TestE2BTemplate, a Bench's image test) may have fetched it already, from its
	// own registry, and then it is not fetched again.
	baseName := "oci-blob-" + digest.FromBytes(base.gz).Encoded()[:16]
	fetchedBase := slices.ContainsFunc(j.Fetched, func(p string) bool { return strings.HasSuffix(p, baseName) })
	switch {
	case fetchedBase && (len(j.Fetched) != 4 || j.FetchedBytes < int64(len(base.gz))):
		t.Errorf("first image fetched %v (%d bytes), want its manifest, config and two layers", j.Fetched, j.FetchedBytes)
	case !fetchedBase && (len(j.Fetched) != 3 || !strings.Contains(mustShed(t, root, "store", "ls").stdout, baseName)):
		t.Errorf("first image fetched %v (%d bytes), want its manifest, config and task layer, and the base already in the store", j.Fetched, j.FetchedBytes)
	}
	if b, err := os.ReadFile(filepath.Join(j.Layers[0], "etc/task-id")); err != nil || string(b) != "task 1\n" {
		t.Errorf("etc/task-id: %q %v", b, err)
	}
	if _, err := os.Lstat(filepath.Join(j.Layers[0], "etc/motd")); !os.IsNotExist(err) {
		t.Errorf("etc/motd, removed by a whiteout in the top layer: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(j.Layers[0], "etc/.wh.motd")); !os.IsNotExist(err) {
		t.Errorf("the whiteout itself is in the seed: %v", err)
	}

	// `shed why` names the image layer that brought a file.
	taskDigest := digest.FromBytes(task(1).gz).String()
	baseDigest := digest.FromBytes(base.gz).String()
	if w := mustShed(t, root, "why", file, "/etc/task-id").stdout; !strings.Contains(w, "image:    layer "+taskDigest) {
		t.Errorf("why /etc/task-id:\n%s", w)
	}
	if w := mustShed(t, root, "--json", "why", file, "/etc/os-release").stdout; !strings.Contains(w, `"image_layer": "`+baseDigest+`"`) {
		t.Errorf("why /etc/os-release:\n%s", w)
	}

	// The second image shares the base layer: fetched once, by the first.
	// It also has packages: apt resolves against the image's own suite (its os-release).
	file2 := writeFile(t, filepath.Join(dir, "two", "workshop.toml"), fmt.Sprintf("name = \"task2\"\nseed = \"oci://%s/swe/task2:v1\"\n[apt]\npackages = [\"jq\"]\n", host))
	j2 := realize(t, root, file2)
	var images []string
	for _, p := range j2.Fetched {
		if strings.Contains(p, "-oci-") {
			images = append(images, p)
		}
	}
	if len(images) != 3 || slices.ContainsFunc(images, func(p string) bool {
		return slices.Contains(j.Fetched, p) || strings.Contains(p, strings.TrimPrefix(baseDigest, "sha256:")[:16])
	}) {
		t.Errorf("second image fetched %v, want only its own manifest, config and layer", images)
	}
	if _, err := os.Stat(filepath.Join(j2.Layers[1], "usr/bin/jq")); err != nil {
		t.Errorf("jq over the image: %v", err)
	}
	// The images' seeds are two paths that each hold the base's files: on disk, one copy
	// (and the Debian seed the base was made from is a third holder of it).
	var bash1, bash2 syscall.Stat_t
	syscall.Lstat(filepath.Join(j.Layers[0], "usr/bin/bash"), &bash1)
	syscall.Lstat(filepath.Join(j2.Layers[0], "usr/bin/bash"), &bash2)
	if bash1.Ino == 0 || bash1.Ino != bash2.Ino || bash1.Nlink < 4 {
		t.Errorf("usr/bin/bash of the two image seeds: inodes %d and %d, %d links; want one file", bash1.Ino, bash2.Ino, bash1.Nlink)
	}
	var stats struct {
		Size, Disk int64
		Links      struct{ Saved int64 }
	}
	if err := json.Unmarshal([]byte(mustShed(t, root, "--json", "store", "info").stdout), &stats); err != nil {
		t.Fatal(err)
	}
	if stats.Links.Saved < 2*bash1.Size || stats.Disk != stats.Size-stats.Links.Saved {
		t.Errorf("store info: %+v; want at least two copies of bash saved", stats)
	}

	// A lock edited to build other layers under the first image's digest: the manifest, fetched by
	// that digest, says otherwise.
	lock2, _ := os.ReadFile(filepath.Join(dir, "two", "workshop.lock"))
	t2 := digest.FromBytes(task(2).gz).String()
	if !strings.Contains(string(lock2), t2) {
		t.Fatalf("lock of the second image has no %s:\n%s", t2, lock2)
	}
	edited := strings.ReplaceAll(string(lock), taskDigest, t2)
	edited = strings.Replace(edited, fmt.Sprintf("size = %d\n", len(task(1).gz)), fmt.Sprintf("size = %d\n", len(task(2).gz)), 1)
	evilDir := filepath.Join(dir, "edited")
	evilFile := writeFile(t, filepath.Join(evilDir, "workshop.toml"), fmt.Sprintf("name = \"task1\"\nseed = \"oci://%s/swe/task1:v1\"\n", host))
	writeFile(t, filepath.Join(evilDir, "workshop.lock"), edited)
	if r := shed(t, root, nil, "realize", evilFile); r.code == 0 || !strings.Contains(r.stderr, "are not those of manifest "+d1) {
		t.Errorf("an edited lock: exit %d\n%s", r.code, r.stderr)
	}

	// With the registry gone: the seed is the store's; a Bench launches offline.
	reg.stop()
	if again := realize(t, root, file, "--offline"); len(again.Fetched) != 0 || len(again.Built) != 0 {
		t.Errorf("realize again: %+v", again)
	}
	if r := mustShed(t, root, "bench", "run", "--offline", "-f", file2, "--", "cat", "/etc/task-id"); r.stdout != "task 2\n" {
		t.Errorf("bench run: %q", r.stdout)
	}
	mustShed(t, root, "store", "verify", "--check-contents")
}

// TestRegistrySeedHostile: a registry that lies, and references that must not be used. Each is one
// clear error, nothing is registered, and the store verifies.
func TestRegistrySeedHostile(t *testing.T) {
	parallel(t) // see parallelTests in main_test.go
	requireRoot(t)
	root := newRoot(t)
	reg := startRegistry(t, "")
	host := fmt.Sprintf("127.0.0.1:%d", reg.port)
	ok := tarLayer(t, &tar.Header{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755},
		&tar.Header{Name: "etc/hostname", Typeflag: tar.TypeReg, Mode: 0o644, Linkname: "box\n"})
	dir := t.TempDir()
	recipeFor := func(name, seed string) string {
		return writeFile(t, filepath.Join(dir, name, "workshop.toml"), fmt.Sprintf("name = %q\nseed = %q\n", name, seed))
	}

	// A manifest that does not hash to the digest the recipe pins. docker-registry checks its own
	// storage, so the liar is a proxy in front of it that answers every manifest request with
	// another image's manifest (and the digest asked for in its header).
	md := pushImage(t, host+"/bad/manifest:v1", ok)
	other := pushImage(t, host+"/bad/manifest:other", tarLayer(t, &tar.Header{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755}))
	otherBytes, err := os.ReadFile(reg.blobFile(other))
	if err != nil {
		t.Fatal(err)
	}
	liar := httptest.NewServer(&httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(&url.URL{Scheme: "http", Host: host}) },
		ModifyResponse: func(resp *http.Response) error {
			if strings.Contains(resp.Request.URL.Path, "/manifests/") && resp.StatusCode == 200 {
				resp.Body.Close()
				resp.Body = io.NopCloser(bytes.NewReader(otherBytes))
				resp.ContentLength = int64(len(otherBytes))
				resp.Header.Set("Content-Length", fmt.Sprint(len(otherBytes)))
			}
			return nil
		},
	})
	t.Cleanup(liar.Close)
	liarHost := strings.TrimPrefix(liar.URL, "http://")
	for _, ref := range []string{"@" + md, ":v1"} {
		r := shed(t, root, nil, "lock", recipeFor("manifest", "oci://"+liarHost+"/bad/manifest"+ref))
		if r.code == 0 || !strings.Contains(r.stderr, "shed: error:") || !strings.Contains(r.stderr, "mismatch") {
			t.Errorf("a lying registry, %s: exit %d\n%s", ref, r.code, r.stderr)
		}
		if _, err := os.Stat(filepath.Join(dir, "manifest", "workshop.lock")); err == nil {
			t.Errorf("a lying registry, %s: a lock was written", ref)
		}
	}

	// A layer that does not hash to its digest: found while it streams, nothing registered.
	evil := tarLayer(t, &tar.Header{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755},
		&tar.Header{Name: "etc/motd", Typeflag: tar.TypeReg, Mode: 0o644, Linkname: "an honest layer"})
	pushImage(t, host+"/bad/layer:v1", evil)
	lf := reg.blobFile(digest.FromBytes(evil.gz).String())
	lb, _ := os.ReadFile(lf)
	lb[len(lb)/2] ^= 0xff
	if err := os.WriteFile(lf, lb, 0o644); err != nil {
		t.Fatal(err)
	}
	r := shed(t, root, nil, "realize", recipeFor("layer", "oci://"+host+"/bad/layer:v1"))
	if r.code == 0 || !strings.Contains(r.stderr, "hash mismatch") {
		t.Errorf("tampered layer: exit %d\n%s", r.code, r.stderr)
	}

	// Entries that climb out, are absolute, are devices, or claim a terabyte.
	for name, h := range map[string]*tar.Header{
		"dotdot":   {Name: "../../../../etc/shed-escape", Typeflag: tar.TypeReg, Mode: 0o644, Linkname: "x"},
		"device":   {Name: "dev/sda", Typeflag: tar.TypeBlock, Mode: 0o600, Devmajor: 8},
		"absolute": {Name: "/etc/shed-escape-abs", Typeflag: tar.TypeReg, Mode: 0o644, Linkname: "x"},
	} {
		pushImage(t, host+"/bad/"+name+":v1", tarLayer(t, h))
		r = shed(t, root, nil, "realize", recipeFor(name, "oci://"+host+"/bad/"+name+":v1"))
		if name == "device" && (r.code == 0 || !strings.Contains(r.stderr, "device node")) {
			t.Errorf("%s: exit %d\n%s", name, r.code, r.stderr)
		}
		if r.code == 0 {
			// Confined, as umoci confines paths: the entry lands inside the seed, never outside.
			var j realizeJSON
			jr := mustShed(t, root, "--json", "realize", filepath.Join(dir, name, "workshop.toml"))
			json.Unmarshal([]byte(jr.stdout), &j)
			if _, err := os.Stat(filepath.Join(j.Layers[0], "etc", filepath.Base(h.Name))); err != nil {
				t.Errorf("%s: the entry is not confined to the seed: %v", name, err)
			}
		}
	}
	for _, p := range []string{"/etc/shed-escape", "/etc/shed-escape-abs"} {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("%s was written on the host", p)
		}
	}
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	tw.WriteHeader(&tar.Header{Name: "huge", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1 << 40})
	pushImage(t, host+"/bad/huge:v1", gzipLayer(t, b.Bytes())) // a header claiming 1 TB, and no bytes
	r = shed(t, root, nil, "realize", recipeFor("huge", "oci://"+host+"/bad/huge:v1"))
	if r.code == 0 || !strings.Contains(r.stderr, "exceeds the unpack size limit") {
		t.Errorf("a 1 TB entry: exit %d\n%s", r.code, r.stderr)
	}

	// An index with no manifest for this machine's platform.
	ctx := context.Background()
	repo, _ := remote.NewRepository(host + "/bad/platform:v1")
	repo.PlainHTTP = true
	armDigest := pushImage(t, host+"/bad/platform:arm", ok)
	armManifest, _ := os.ReadFile(reg.blobFile(armDigest))
	idx := ispec.Index{Versioned: imeta.Versioned{SchemaVersion: 2}, MediaType: ispec.MediaTypeImageIndex, Manifests: []ispec.Descriptor{{
		MediaType: ispec.MediaTypeImageManifest, Digest: digest.Digest(armDigest), Size: int64(len(armManifest)),
		Platform: &ispec.Platform{OS: "linux", Architecture: "riscv64"}}}}
	ij, _ := json.Marshal(idx)
	if err := repo.PushReference(ctx, ispec.Descriptor{MediaType: ispec.MediaTypeImageIndex, Digest: digest.FromBytes(ij), Size: int64(len(ij))}, bytes.NewReader(ij), "v1"); err != nil {
		t.Fatal(err)
	}
	r = shed(t, root, nil, "lock", recipeFor("platform", "oci://"+host+"/bad/platform:v1"))
	if r.code == 0 || !strings.Contains(r.stderr, "no manifest for linux/"+runtime.GOARCH+" (it has: linux/riscv64)") || !strings.Contains(r.stderr, "shed: hint:") {
		t.Errorf("index without our platform: exit %d\n%s", r.code, r.stderr)
	}

	// Credentials in the reference: refused before anything is sent, and said nowhere.
	r = shed(t, root, nil, "lock", recipeFor("creds", "oci://someone:hunter2@"+host+"/bad/layer:v1"))
	if r.code == 0 || !strings.Contains(r.stderr, "holds no credentials") || strings.Contains(r.stderr, "hunter2") {
		t.Errorf("credentials in the reference: exit %d\n%s", r.code, r.stderr)
	}

	// Nothing of what was refused is registered: no seed of a bad image, no blob that did not verify.
	ls := mustShed(t, root, "store", "ls").stdout
	for _, name := range []string{"-oci-manifest-v1", "-oci-layer-v1", "-oci-device-v1", "-oci-huge-v1", "-oci-platform-", "oci-blob-" + strings.TrimPrefix(digest.FromBytes(evil.gz).String(), "sha256:")[:16]} {
		for _, line := range strings.Split(ls, "\n") {
			if f := strings.Fields(line); len(f) > 0 && strings.Contains(f[0], name) && !strings.HasSuffix(f[0], ".drv") {
				t.Errorf("%s is registered: %s", name, line)
			}
		}
	}
	if v := mustShed(t, root, "store", "verify"); !strings.Contains(v.stdout+v.stderr, "0 problems") {
		t.Errorf("store verify: %s%s", v.stdout, v.stderr)
	}
}

// TestRegistrySeedCredentials: an image in a registry that wants a password. Without credentials the
// lock fails and says where shed reads them; with podman's auth file (REGISTRY_AUTH_FILE, as `podman
// login` writes it) it locks and realizes; the password, in clear, in base64 or as the auth file's
// user:password, is in no lock, store path, log or provenance.
func TestRegistrySeedCredentials(t *testing.T) {
	parallel(t) // see parallelTests in main_test.go
	requireRoot(t)
	root := newRoot(t)
	canary := "canary-" + strings.Repeat("5", 20)
	hash, err := bcrypt.GenerateFromPassword([]byte(canary), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	reg := startRegistry(t, writeFile(t, filepath.Join(t.TempDir(), "htpasswd"), "shed:"+string(hash)+"\n"))
	host := fmt.Sprintf("127.0.0.1:%d", reg.port)
	pushImageAs(t, auth.Credential{Username: "shed", Password: canary}, host+"/private/box:v1",
		tarLayer(t, &tar.Header{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755},
			&tar.Header{Name: "etc/hostname", Typeflag: tar.TypeReg, Mode: 0o644, Linkname: "box\n"}))
	dir := t.TempDir()
	file := writeFile(t, filepath.Join(dir, "workshop.toml"), fmt.Sprintf("name = \"private\"\nseed = \"oci://%s/private/box:v1\"\n", host))

	r := shed(t, root, []string{"REGISTRY_AUTH_FILE=" + filepath.Join(dir, "none.json")}, "lock", file)
	if r.code == 0 || !strings.Contains(r.stderr, "shed: error:") || !strings.Contains(r.stderr, "podman login") {
		t.Errorf("lock without credentials: exit %d\n%s", r.code, r.stderr)
	}
	// SHED_REGISTRY_USERNAME and _PASSWORD are for the caches a user names; a recipe's registry
	// (which could be anyone's) is not offered them.
	r = shed(t, root, []string{"REGISTRY_AUTH_FILE=" + filepath.Join(dir, "none.json"), "SHED_REGISTRY_USERNAME=shed", "SHED_REGISTRY_PASSWORD=" + canary}, "lock", file)
	if r.code == 0 || !strings.Contains(r.stderr, "the registry wants credentials") {
		t.Errorf("lock with the cache's credentials in the environment: exit %d\n%s", r.code, r.stderr)
	}
	basic := base64.StdEncoding.EncodeToString([]byte("shed:" + canary))
	authFile := writeFile(t, filepath.Join(t.TempDir(), "auth.json"), fmt.Sprintf(`{"auths": {%q: {"auth": %q}}}`, host, basic))
	env := []string{"REGISTRY_AUTH_FILE=" + authFile}
	r = shed(t, root, env, "--json", "realize", file)
	if r.code != 0 || !strings.Contains(r.stdout, "oci-box-v1") {
		t.Fatalf("realize with podman's auth file: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	for _, secret := range []string{canary, basic, base64.StdEncoding.EncodeToString([]byte(canary))} {
		for _, where := range []string{root, dir} {
			if out, _ := exec.Command("grep", "-rl", secret, where).Output(); len(out) > 0 {
				t.Errorf("the registry password (%s) is written:\n%s", secret, out)
			}
		}
		if strings.Contains(r.stdout+r.stderr, secret) {
			t.Errorf("the registry password (%s) is in shed's output", secret)
		}
	}
}
