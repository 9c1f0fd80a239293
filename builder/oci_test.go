package builder

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/opencontainers/go-digest"
	imeta "github.com/opencontainers/image-spec/specs-go"
	ispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/opencontainers/umoci/oci/cas/dir"
	"github.com/opencontainers/umoci/oci/casext"
	"github.com/opencontainers/umoci/pkg/hardening"
	"golang.org/x/sys/unix"
)

// tent is one tar entry of a test layer; tests may hand-write hostile ones.
type tent struct {
	hdr  tar.Header
	body string
}

var testMtime = time.Unix(1700000000, 0)

func dirE(name string, mode int64) tent {
	return tent{hdr: tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: mode, ModTime: testMtime}}
}

func fileE(name, body string, mode int64) tent {
	return tent{hdr: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, ModTime: testMtime}, body: body}
}

func symE(name, target string) tent {
	return tent{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777, ModTime: testMtime}}
}

func linkE(name, target string) tent {
	return tent{hdr: tar.Header{Typeflag: tar.TypeLink, Name: name, Linkname: target, ModTime: testMtime}}
}

func whE(name string) tent { return fileE(name, "", 0o644) }

// tarOf writes entries as an uncompressed tar stream.
func tarOf(t *testing.T, entries ...tent) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := e.hdr
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if len(h.PAXRecords) > 0 {
			h.Format = tar.FormatPAX
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatalf("tar header %s: %v", h.Name, err)
		}
		if _, err := io.WriteString(tw, e.body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// testLayer is a gzip layer blob and the diff ID of its uncompressed tar.
type testLayer struct {
	gz     []byte
	diffID digest.Digest
}

func gzLayer(t *testing.T, raw []byte) testLayer {
	t.Helper()
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := zw.Write(raw); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return testLayer{gz: buf.Bytes(), diffID: digest.FromBytes(raw)}
}

func mkLayer(t *testing.T, entries ...tent) testLayer { return gzLayer(t, tarOf(t, entries...)) }

// putImage stores the layers, a config and a manifest in the layout at
// layoutDir (created if missing) with umoci's CAS engine, and tags the
// manifest. editConfig, if set, may corrupt the config before it is stored.
// It returns the manifest descriptor and the layer digests.
func putImage(t *testing.T, layoutDir, tag string, layers []testLayer, editConfig func(*ispec.Image)) (ispec.Descriptor, []digest.Digest) {
	t.Helper()
	ctx := context.Background()
	if _, err := os.Stat(layoutDir); errors.Is(err, fs.ErrNotExist) {
		if err := dir.Create(layoutDir); err != nil {
			t.Fatal(err)
		}
	}
	engine, err := dir.Open(layoutDir)
	if err != nil {
		t.Fatal(err)
	}
	defer engine.Close()
	ext := casext.NewEngine(engine)

	config := ispec.Image{
		Platform: ispec.Platform{OS: "linux", Architecture: runtime.GOARCH},
		RootFS:   ispec.RootFS{Type: "layers"},
	}
	var descs []ispec.Descriptor
	var digests []digest.Digest
	for _, l := range layers {
		d, size, err := ext.PutBlob(ctx, bytes.NewReader(l.gz))
		if err != nil {
			t.Fatal(err)
		}
		descs = append(descs, ispec.Descriptor{MediaType: ispec.MediaTypeImageLayerGzip, Digest: d, Size: size})
		digests = append(digests, d)
		config.RootFS.DiffIDs = append(config.RootFS.DiffIDs, l.diffID)
	}
	if editConfig != nil {
		editConfig(&config)
	}
	cd, csize, err := ext.PutBlobJSON(ctx, config)
	if err != nil {
		t.Fatal(err)
	}
	manifest := ispec.Manifest{
		Versioned: imeta.Versioned{SchemaVersion: 2},
		MediaType: ispec.MediaTypeImageManifest,
		Config:    ispec.Descriptor{MediaType: ispec.MediaTypeImageConfig, Digest: cd, Size: csize},
		Layers:    descs,
	}
	md, msize, err := ext.PutBlobJSON(ctx, manifest)
	if err != nil {
		t.Fatal(err)
	}
	mdesc := ispec.Descriptor{MediaType: ispec.MediaTypeImageManifest, Digest: md, Size: msize,
		Platform: &ispec.Platform{OS: "linux", Architecture: runtime.GOARCH}}
	if tag != "" {
		if err := ext.UpdateReference(ctx, tag, mdesc); err != nil {
			t.Fatal(err)
		}
	}
	return mdesc, digests
}

func blobFile(layoutDir string, d digest.Digest) string {
	return filepath.Join(layoutDir, "blobs", d.Algorithm().String(), d.Encoded())
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("ImportOCI keeps the image's owners and needs root")
	}
}

func lstat(t *testing.T, path string) *syscall.Stat_t {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t)
}

func assertAbsent(t *testing.T, path string) {
	t.Helper()
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("%s exists (err %v), want absent", path, err)
	}
}

// fileCap is a security.capability value (v2, cap_net_raw effective and permitted).
var fileCap = []byte{0x01, 0, 0, 0x02, 0x00, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}

func twoLayerImage(t *testing.T, layoutDir string) (ispec.Descriptor, []digest.Digest) {
	t.Helper()
	home := fileE("home/user/notes", "mine\n", 0o640)
	home.hdr.Uid, home.hdr.Gid = 1000, 1000
	l1 := mkLayer(t,
		dirE("etc/", 0o755),
		fileE("etc/hostname", "image-host\n", 0o644),
		fileE("etc/gone", "layer 1 only\n", 0o644),
		dirE("opq/", 0o755),
		fileE("opq/a", "lower a\n", 0o644),
		dirE("opq/sub/", 0o755),
		fileE("opq/sub/b", "lower b\n", 0o644),
		dirE("usr/", 0o755),
		dirE("usr/lib/", 0o755),
		fileE("usr/lib/libx.so.1", "ELF\n", 0o644),
		dirE("usr/bin/", 0o755),
		dirE("home/", 0o755),
		dirE("home/user/", 0o750),
		home,
	)
	su := fileE("usr/bin/su", "setuid\n", 0o4755)
	su.hdr.PAXRecords = map[string]string{"SCHILY.xattr.user.shed.test": "v1"}
	ping := fileE("usr/bin/ping", "ping\n", 0o755)
	ping.hdr.PAXRecords = map[string]string{"SCHILY.xattr.security.capability": string(fileCap)}
	l2 := mkLayer(t,
		dirE("etc/", 0o755),
		whE("etc/.wh.gone"),
		dirE("opq/", 0o755),
		whE("opq/.wh..wh..opq"),
		fileE("opq/c", "upper c\n", 0o644),
		su,
		ping,
		fileE("usr/bin/gzip", "gzip\n", 0o755),
		linkE("usr/bin/gunzip", "usr/bin/gzip"),
		symE("lib", "usr/lib"),
	)
	return putImage(t, layoutDir, "latest", []testLayer{l1, l2}, nil)
}

func TestOCIImportTwoLayers(t *testing.T) {
	needRoot(t)
	ctx := context.Background()
	tmp := t.TempDir()
	layout := filepath.Join(tmp, "layout")
	mdesc, _ := twoLayerImage(t, layout)
	img := OCIImage{Dir: layout}

	got, err := ResolveOCI(ctx, img)
	if err != nil {
		t.Fatal(err)
	}
	if got != mdesc.Digest.String() {
		t.Fatalf("ResolveOCI = %s, want %s", got, mdesc.Digest)
	}

	out := filepath.Join(tmp, "out")
	if err := ImportOCI(ctx, img, got, out); err != nil {
		t.Fatal(err)
	}

	assertAbsent(t, filepath.Join(out, "etc/gone"))
	ents, err := os.ReadDir(filepath.Join(out, "opq"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if diff := cmp.Diff([]string{"c"}, names); diff != "" {
		t.Errorf("opaque dir entries (-want +got):\n%s", diff)
	}

	su := filepath.Join(out, "usr/bin/su")
	fi, err := os.Lstat(su)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode() != os.ModeSetuid|0o755 {
		t.Errorf("su mode %v, want setuid 0755", fi.Mode())
	}
	if st := lstat(t, su); st.Uid != 0 || st.Gid != 0 {
		t.Errorf("su owned by %d:%d, want 0:0", st.Uid, st.Gid)
	}
	if st := lstat(t, filepath.Join(out, "home/user/notes")); st.Uid != 1000 || st.Gid != 1000 || st.Mode&0o7777 != 0o640 {
		t.Errorf("home/user/notes is %d:%d %o, want 1000:1000 0640", st.Uid, st.Gid, st.Mode&0o7777)
	}
	if st := lstat(t, filepath.Join(out, "home/user")); st.Mode&0o7777 != 0o750 {
		t.Errorf("home/user mode %o, want 0750", st.Mode&0o7777)
	}

	gz, gunzip := lstat(t, filepath.Join(out, "usr/bin/gzip")), lstat(t, filepath.Join(out, "usr/bin/gunzip"))
	if gz.Ino != gunzip.Ino || gz.Nlink != 2 {
		t.Errorf("gzip inode %d nlink %d, gunzip inode %d: want one inode with 2 links", gz.Ino, gz.Nlink, gunzip.Ino)
	}
	if target, err := os.Readlink(filepath.Join(out, "lib")); err != nil || target != "usr/lib" {
		t.Errorf("lib -> %q (%v), want usr/lib", target, err)
	}
	if _, err := os.Stat(filepath.Join(out, "lib/libx.so.1")); err != nil {
		t.Errorf("lib/libx.so.1 through the symlink: %v", err)
	}

	buf := make([]byte, 64)
	n, err := unix.Lgetxattr(su, "user.shed.test", buf)
	if err != nil || string(buf[:n]) != "v1" {
		t.Errorf("su xattr user.shed.test = %q (%v), want v1", buf[:n], err)
	}
	n, err = unix.Lgetxattr(filepath.Join(out, "usr/bin/ping"), "security.capability", buf)
	if err != nil || !bytes.Equal(buf[:n], fileCap) {
		t.Errorf("ping security.capability = %x (%v), want %x", buf[:n], err, fileCap)
	}

	// The image's own files stay as the image has them; nothing of the host's is added.
	if b, err := os.ReadFile(filepath.Join(out, "etc/hostname")); err != nil || string(b) != "image-host\n" {
		t.Errorf("etc/hostname = %q (%v), want the image's", b, err)
	}
	assertAbsent(t, filepath.Join(out, "etc/resolv.conf"))

	if err := filepath.WalkDir(out, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if strings.HasPrefix(d.Name(), ".wh.") {
			t.Errorf("whiteout file left: %s", p)
		}
		if d.Type()&fs.ModeCharDevice != 0 {
			t.Errorf("device left: %s", p)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	// A second import into an existing out is refused and leaves it alone.
	err = ImportOCI(ctx, img, got, out)
	if !errors.Is(err, fs.ErrExist) {
		t.Errorf("import into existing out: %v, want ErrExist", err)
	}
	if _, err := os.Stat(filepath.Join(out, "usr/bin/su")); err != nil {
		t.Errorf("existing out was touched: %v", err)
	}
}

func TestOCIDigestWinsOverTag(t *testing.T) {
	needRoot(t)
	ctx := context.Background()
	tmp := t.TempDir()
	layout := filepath.Join(tmp, "layout")
	old, _ := twoLayerImage(t, layout)
	img := OCIImage{Dir: layout, Tag: "latest"}

	// Retag: latest now names a one-layer image.
	newer, _ := putImage(t, layout, "latest", []testLayer{mkLayer(t, fileE("new", "x", 0o644))}, nil)
	got, err := ResolveOCI(ctx, img)
	if err != nil {
		t.Fatal(err)
	}
	if got != newer.Digest.String() {
		t.Fatalf("ResolveOCI after retag = %s, want %s", got, newer.Digest)
	}

	out := filepath.Join(tmp, "out")
	if err := ImportOCI(ctx, img, old.Digest.String(), out); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(out, "usr/bin/su")); err != nil {
		t.Errorf("the pinned image was not imported: %v", err)
	}
	assertAbsent(t, filepath.Join(out, "new"))
}

func TestOCIResolveErrors(t *testing.T) {
	ctx := context.Background()
	tmp := t.TempDir()
	layout := filepath.Join(tmp, "layout")
	putImage(t, layout, "v1", []testLayer{mkLayer(t, fileE("a", "a", 0o644))}, nil)
	putImage(t, layout, "v2", []testLayer{mkLayer(t, fileE("b", "b", 0o644))}, nil)
	empty := filepath.Join(tmp, "empty")
	if err := os.Mkdir(empty, 0o755); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name string
		img  OCIImage
		want []string
	}{
		{"wrong tag", OCIImage{Dir: layout, Tag: "v3"}, []string{`no manifest tagged "v3"`, "tags: v1, v2"}},
		{"default tag absent", OCIImage{Dir: layout}, []string{`no manifest tagged "latest"`, "tags: v1, v2"}},
		{"no such directory", OCIImage{Dir: filepath.Join(tmp, "nope")}, []string{"does not exist"}},
		{"not a layout", OCIImage{Dir: empty}, []string{"is not an OCI image layout"}},
		{"relative", OCIImage{Dir: "layout"}, []string{"not an absolute path"}},
		{"invalid tag", OCIImage{Dir: layout, Tag: "a b"}, []string{"not a valid tag"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := ResolveOCI(ctx, tc.img)
			if err == nil {
				t.Fatalf("ResolveOCI = %s, want an error", d)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

func TestOCIResolveIndex(t *testing.T) {
	ctx := context.Background()
	layout := filepath.Join(t.TempDir(), "layout")
	ours, _ := putImage(t, layout, "", []testLayer{mkLayer(t, fileE("a", "a", 0o644))}, nil)
	theirs, _ := putImage(t, layout, "", []testLayer{mkLayer(t, fileE("b", "b", 0o644))}, nil)
	other := "arm64"
	if runtime.GOARCH == other {
		other = "amd64"
	}
	theirs.Platform = &ispec.Platform{OS: "linux", Architecture: other}

	engine, err := dir.Open(layout)
	if err != nil {
		t.Fatal(err)
	}
	defer engine.Close()
	ext := casext.NewEngine(engine)
	index := ispec.Index{Versioned: imeta.Versioned{SchemaVersion: 2}, MediaType: ispec.MediaTypeImageIndex,
		Manifests: []ispec.Descriptor{theirs, ours}}
	id, isize, err := ext.PutBlobJSON(ctx, index)
	if err != nil {
		t.Fatal(err)
	}
	if err := ext.UpdateReference(ctx, "multi", ispec.Descriptor{MediaType: ispec.MediaTypeImageIndex, Digest: id, Size: isize}); err != nil {
		t.Fatal(err)
	}
	got, err := ResolveOCI(ctx, OCIImage{Dir: layout, Tag: "multi"})
	if err != nil {
		t.Fatal(err)
	}
	if got != ours.Digest.String() {
		t.Errorf("ResolveOCI(multi) = %s, want this platform's %s", got, ours.Digest)
	}

	// A Docker manifest list is not something umoci (or we) can unpack.
	docker := ispec.Descriptor{MediaType: "application/vnd.docker.distribution.manifest.list.v2+json", Digest: id, Size: isize}
	if err := ext.UpdateReference(ctx, "docker", docker); err != nil {
		t.Fatal(err)
	}
	_, err = ResolveOCI(ctx, OCIImage{Dir: layout, Tag: "docker"})
	if err == nil || !strings.Contains(err.Error(), "not an image manifest") {
		t.Errorf("ResolveOCI(docker) error %v, want it to say the tag names no image manifest", err)
	}
}

func TestOCIImportRefusesBadImages(t *testing.T) {
	needRoot(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name       string
		layers     []tent
		editConfig func(*ispec.Image)
		digest     string // instead of the manifest's
		want       error
		wantText   string
	}{
		{name: "diff ids fewer than layers", layers: []tent{fileE("a", "a", 0o644)},
			editConfig: func(c *ispec.Image) { c.RootFS.DiffIDs = nil }, want: ErrOCIRefused, wantText: "diff ids"},
		{name: "wrong diff id", layers: []tent{fileE("a", "a", 0o644)},
			editConfig: func(c *ispec.Image) { c.RootFS.DiffIDs[0] = digest.FromString("other") }, want: ErrOCIRefused, wantText: "diff id"},
		{name: "overlay whiteout device", layers: []tent{{hdr: tar.Header{Typeflag: tar.TypeChar, Name: "etc/x", Mode: 0o644}}},
			want: ErrOCIRefused, wantText: "overlay whiteout"},
		{name: "device node", layers: []tent{{hdr: tar.Header{Typeflag: tar.TypeChar, Name: "dev/null", Mode: 0o666, Devmajor: 1, Devminor: 3}}},
			want: ErrOCIRefused, wantText: "device node (1:3)"},
		{name: "block device", layers: []tent{{hdr: tar.Header{Typeflag: tar.TypeBlock, Name: "dev/sda", Mode: 0o660, Devmajor: 8}}},
			want: ErrOCIRefused, wantText: "device node (8:0)"},
		{name: "overlay xattr", layers: []tent{{hdr: tar.Header{Typeflag: tar.TypeDir, Name: "d/", Mode: 0o755,
			PAXRecords: map[string]string{"SCHILY.xattr.trusted.overlay.redirect": "/etc"}}}},
			want: ErrOCIRefused, wantText: "trusted.overlay.redirect"},
		{name: "user overlay opaque", layers: []tent{{hdr: tar.Header{Typeflag: tar.TypeDir, Name: "d/", Mode: 0o755,
			PAXRecords: map[string]string{"SCHILY.xattr.user.overlay.opaque": "y"}}}},
			want: ErrOCIRefused, wantText: "user.overlay.opaque"},
		{name: "escaped user overlay opaque", layers: []tent{{hdr: tar.Header{Typeflag: tar.TypeDir, Name: "d/", Mode: 0o755,
			PAXRecords: map[string]string{"SCHILY.xattr.user.overlay.overlay.opaque": "y"}}}},
			want: ErrOCIRefused, wantText: "user.overlay.overlay.opaque"},
		{name: "manifest not in layout", layers: []tent{fileE("a", "a", 0o644)},
			digest: digest.FromString("absent").String(), want: fs.ErrNotExist, wantText: "not in the layout"},
		{name: "malformed digest", layers: []tent{fileE("a", "a", 0o644)},
			digest: "sha256:xyz", wantText: "manifest digest"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tmp := t.TempDir()
			layout := filepath.Join(tmp, "layout")
			mdesc, _ := putImage(t, layout, "latest", []testLayer{mkLayer(t, tc.layers...)}, tc.editConfig)
			d := mdesc.Digest.String()
			if tc.digest != "" {
				d = tc.digest
			}
			out := filepath.Join(tmp, "out")
			err := ImportOCI(ctx, OCIImage{Dir: layout}, d, out)
			if err == nil {
				t.Fatal("ImportOCI succeeded, want an error")
			}
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Errorf("error %v, want %v", err, tc.want)
			}
			if !strings.Contains(err.Error(), tc.wantText) {
				t.Errorf("error %q does not say %q", err, tc.wantText)
			}
			assertAbsent(t, out)
		})
	}
}

func TestOCIImportCanceled(t *testing.T) {
	needRoot(t)
	tmp := t.TempDir()
	layout := filepath.Join(tmp, "layout")
	mdesc, _ := putImage(t, layout, "latest", []testLayer{mkLayer(t, fileE("a", "a", 0o644))}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	out := filepath.Join(tmp, "out")
	if err := ImportOCI(ctx, OCIImage{Dir: layout}, mdesc.Digest.String(), out); !errors.Is(err, context.Canceled) {
		t.Errorf("ImportOCI with a canceled context: %v, want context.Canceled", err)
	}
	assertAbsent(t, out)
}

func TestOCITamperedBlob(t *testing.T) {
	needRoot(t)
	ctx := context.Background()
	// Varied content, so that the middle of the blob is deflate data.
	var body strings.Builder
	for i := range 4000 {
		body.WriteString(hex.EncodeToString([]byte{byte(i), byte(i >> 8), byte(i * 7)}))
	}
	for _, tc := range []struct {
		name string
		at   func(size int) int
	}{
		// gzip's header mtime: the stream still decompresses, only the digest catches it.
		{"gzip header", func(int) int { return 4 }},
		// deflate data: gzip fails first; the digest is still the reported cause.
		{"middle", func(size int) int { return size / 2 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tmp := t.TempDir()
			layout := filepath.Join(tmp, "layout")
			l1 := mkLayer(t, fileE("ok", "fine", 0o644))
			l2 := mkLayer(t, dirE("data/", 0o755), fileE("data/big", body.String(), 0o644))
			mdesc, layers := putImage(t, layout, "latest", []testLayer{l1, l2}, nil)

			p := blobFile(layout, layers[1])
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			b[tc.at(len(b))] ^= 0x01
			if err := os.WriteFile(p, b, 0o644); err != nil {
				t.Fatal(err)
			}

			out := filepath.Join(tmp, "out")
			err = ImportOCI(ctx, OCIImage{Dir: layout}, mdesc.Digest.String(), out)
			if err == nil {
				t.Fatal("ImportOCI of a tampered blob succeeded")
			}
			if !strings.Contains(err.Error(), layers[1].String()) {
				t.Errorf("error %q does not name the layer digest %s", err, layers[1])
			}
			if !errors.Is(err, hardening.ErrDigestMismatch) {
				t.Errorf("error %v is not a digest mismatch", err)
			}
			assertAbsent(t, out)
		})
	}

	t.Run("config", func(t *testing.T) {
		tmp := t.TempDir()
		layout := filepath.Join(tmp, "layout")
		mdesc, _ := putImage(t, layout, "latest", []testLayer{mkLayer(t, fileE("ok", "fine", 0o644))}, nil)
		engine, err := dir.Open(layout)
		if err != nil {
			t.Fatal(err)
		}
		blob, err := casext.NewEngine(engine).FromDescriptor(ctx, mdesc)
		engine.Close()
		if err != nil {
			t.Fatal(err)
		}
		cfg := blob.Data.(ispec.Manifest).Config.Digest
		p := blobFile(layout, cfg)
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		b = bytes.Replace(b, []byte(runtime.GOARCH), []byte(strings.ToUpper(runtime.GOARCH)), 1)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(tmp, "out")
		err = ImportOCI(ctx, OCIImage{Dir: layout}, mdesc.Digest.String(), out)
		if !errors.Is(err, hardening.ErrDigestMismatch) || !strings.Contains(err.Error(), cfg.String()) {
			t.Errorf("tampered config: error %v, want a digest mismatch naming %s", err, cfg)
		}
		assertAbsent(t, out)
	})
}

// hostSnapshot records everything under root that an escape could change.
func hostSnapshot(t *testing.T, root string) map[string]string {
	t.Helper()
	snap := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		st := lstat(t, p)
		s := fmt.Sprintf("%v %o %d:%d %d %d", d.Type(), st.Mode, st.Uid, st.Gid, st.Mtim.Nano(), st.Nlink)
		switch {
		case d.Type().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(b)
			s += " " + hex.EncodeToString(sum[:])
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			s += " -> " + target
		}
		snap[p] = s
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

func topLevel(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// TestOCIHostileLayers checks that no layer entry writes outside out. umoci
// re-roots every path and resolves symlinks inside out (filepath-securejoin),
// so most escapes are contained (written under out instead); a hard link to
// something that does not exist under out fails, as does turning the root
// into a symlink. Each case states which it expects.
func TestOCIHostileLayers(t *testing.T) {
	needRoot(t)
	ctx := context.Background()
	passwdBefore := hostSnapshot(t, "/etc/passwd")
	_, evilErr := os.Lstat("/etc/evil")
	evilExisted := evilErr == nil

	const rejected = "" // want.inside == rejected: ImportOCI must fail
	for _, tc := range []struct {
		name string
		// layers are built once host (the test's stand-in for the host
		// filesystem) exists; deep is "../../.." up to / then host's path.
		layers func(host, deep string) [][]tent
		inside string // a path under out the contained entry must land at
	}{
		{"dotdot", func(host, deep string) [][]tent {
			return [][]tent{{fileE("../escape", "pwned", 0o644)}}
		}, "escape"},
		{"deep dotdot", func(host, deep string) [][]tent {
			return [][]tent{{fileE(deep+"/escape", "pwned", 0o644)}}
		}, "HOST/escape"},
		{"absolute /etc/evil", func(host, deep string) [][]tent {
			return [][]tent{{fileE("/etc/evil", "pwned", 0o644)}}
		}, "etc/evil"},
		{"absolute into host", func(host, deep string) [][]tent {
			return [][]tent{{fileE(host+"/abs", "pwned", 0o644)}}
		}, "HOST/abs"},
		{"write through absolute symlink", func(host, deep string) [][]tent {
			return [][]tent{{symE("link", host+"/outside"), fileE("link/pwned", "pwned", 0o644)}}
		}, "HOST/outside/pwned"},
		{"write through relative symlink", func(host, deep string) [][]tent {
			return [][]tent{{symE("rel", deep+"/outside"), fileE("rel/pwned", "pwned", 0o644)}}
		}, "HOST/outside/pwned"},
		{"write through symlink of a lower layer", func(host, deep string) [][]tent {
			return [][]tent{
				{dirE("d/", 0o755), symE("d/link", host+"/outside")},
				{fileE("d/link/pwned", "pwned", 0o644)},
			}
		}, "HOST/outside/pwned"},
		{"symlink replacing a parent dir", func(host, deep string) [][]tent {
			return [][]tent{
				{dirE("var/", 0o755), fileE("var/x", "x", 0o644)},
				{symE("var", host+"/outside"), fileE("var/pwned", "pwned", 0o644)},
			}
		}, "HOST/outside/pwned"},
		{"hard link to ../../etc/passwd", func(host, deep string) [][]tent {
			return [][]tent{{linkE("passwd", "../../etc/passwd")}}
		}, rejected},
		{"hard link to ../../etc/passwd present in the image", func(host, deep string) [][]tent {
			return [][]tent{{dirE("etc/", 0o755), fileE("etc/passwd", "root:x:0:0::/root:/bin/sh\n", 0o644),
				linkE("passwd", "../../etc/passwd")}}
		}, "passwd"},
		{"hard link out of the tree, then a write to it", func(host, deep string) [][]tent {
			return [][]tent{{linkE("victim", deep+"/victim"), fileE("victim", "pwned", 0o644)}}
		}, rejected},
		{"hard link through a symlink", func(host, deep string) [][]tent {
			return [][]tent{{symE("h", host), linkE("v", "h/victim")}}
		}, rejected},
		{"whiteout through a symlink", func(host, deep string) [][]tent {
			return [][]tent{{symE("l", host+"/victimdir"), whE("l/.wh.victim"), whE("l/.wh..wh..opq")}}
		}, "l"},
		{"whiteout with dotdot", func(host, deep string) [][]tent {
			return [][]tent{{whE(deep + "/.wh.victim"), whE("../.wh.host")}}
		}, "."},
		{"root turned into a symlink", func(host, deep string) [][]tent {
			return [][]tent{{symE(".", host), fileE("pwned", "pwned", 0o644)}}
		}, rejected},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tmp := t.TempDir()
			host := filepath.Join(tmp, "host")
			for _, d := range []string{host, host + "/outside", host + "/victimdir"} {
				if err := os.Mkdir(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			for _, f := range []string{host + "/victim", host + "/victimdir/victim"} {
				if err := os.WriteFile(f, []byte("original\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			deep := strings.Repeat("../", 32) + strings.TrimPrefix(host, "/")
			var layers []testLayer
			for _, l := range tc.layers(host, deep) {
				layers = append(layers, mkLayer(t, l...))
			}
			layout := filepath.Join(tmp, "layout")
			mdesc, _ := putImage(t, layout, "latest", layers, nil)

			hostBefore := hostSnapshot(t, host)
			topBefore := topLevel(t, tmp)
			out := filepath.Join(tmp, "out")
			err := ImportOCI(ctx, OCIImage{Dir: layout}, mdesc.Digest.String(), out)

			if diff := cmp.Diff(hostBefore, hostSnapshot(t, host)); diff != "" {
				t.Errorf("host files changed (-before +after):\n%s", diff)
			}
			if diff := cmp.Diff(passwdBefore, hostSnapshot(t, "/etc/passwd")); diff != "" {
				t.Errorf("/etc/passwd changed (-before +after):\n%s", diff)
			}
			if !evilExisted {
				assertAbsent(t, "/etc/evil")
			}
			topAfter := topLevel(t, tmp)
			if err == nil {
				topBefore = append(topBefore, "out")
			}
			if diff := cmp.Diff(slices.Sorted(slices.Values(topBefore)), topAfter); diff != "" {
				t.Errorf("entries beside out changed (-before +after):\n%s", diff)
			}

			if tc.inside == rejected {
				if err == nil {
					t.Fatal("ImportOCI succeeded, want it rejected")
				}
				t.Logf("rejected: %v", err)
				assertAbsent(t, out)
				return
			}
			if err != nil {
				t.Fatalf("ImportOCI: %v, want the entry contained", err)
			}
			in := filepath.Join(out, strings.ReplaceAll(tc.inside, "HOST", strings.TrimPrefix(host, "/")))
			if _, err := os.Lstat(in); err != nil {
				t.Errorf("contained entry not at %s: %v", in, err)
			}
			t.Logf("contained at %s", in)
		})
	}
}

func TestOCIDecompressionBomb(t *testing.T) {
	needRoot(t)
	ctx := context.Background()
	old := MaxOCIUnpackedSize
	MaxOCIUnpackedSize = 1 << 20
	t.Cleanup(func() { MaxOCIUnpackedSize = old })

	const zeros = 16 << 20 // 16 times the limit
	bomb := func(t *testing.T, withHeader bool) testLayer {
		// Stream the tar through gzip: the test never holds the expanded layer.
		var gz bytes.Buffer
		zw, err := gzip.NewWriterLevel(&gz, gzip.BestSpeed) // BestCompression is slow under -race
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.New()
		w := io.MultiWriter(zw, h)
		tw := tar.NewWriter(w)
		if withHeader {
			// One honest file that expands far past the limit.
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "zeros", Mode: 0o644, Size: zeros}); err != nil {
				t.Fatal(err)
			}
			if _, err := io.CopyN(tw, zeroReader{}, zeros); err != nil {
				t.Fatal(err)
			}
			if err := tw.Close(); err != nil {
				t.Fatal(err)
			}
		} else {
			// A tiny archive followed by padding: no header claims
			// anything, only the stream is large.
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "small", Mode: 0o644, Size: 1}); err != nil {
				t.Fatal(err)
			}
			if _, err := tw.Write([]byte("x")); err != nil {
				t.Fatal(err)
			}
			if err := tw.Close(); err != nil {
				t.Fatal(err)
			}
			if _, err := io.CopyN(w, zeroReader{}, zeros); err != nil {
				t.Fatal(err)
			}
		}
		if err := zw.Close(); err != nil {
			t.Fatal(err)
		}
		return testLayer{gz: gz.Bytes(), diffID: digest.NewDigestFromBytes(digest.SHA256, h.Sum(nil))}
	}

	for _, tc := range []struct {
		name       string
		withHeader bool
		wantText   string
	}{
		{"file", true, "claim more than"},
		{"stream padding", false, "uncompressed layers exceed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tmp := t.TempDir()
			layout := filepath.Join(tmp, "layout")
			l := bomb(t, tc.withHeader)
			if len(l.gz) > zeros/100 {
				t.Fatalf("bomb is %d bytes compressed, not much of a bomb", len(l.gz))
			}
			mdesc, _ := putImage(t, layout, "latest", []testLayer{l}, nil)
			out := filepath.Join(tmp, "out")
			start := time.Now()
			err := ImportOCI(ctx, OCIImage{Dir: layout}, mdesc.Digest.String(), out)
			if !errors.Is(err, ErrOCITooLarge) || !strings.Contains(err.Error(), tc.wantText) {
				t.Fatalf("ImportOCI of a %d-byte bomb: %v, want ErrOCITooLarge saying %q", len(l.gz), err, tc.wantText)
			}
			t.Logf("%d bytes compressed refused in %v: %v", len(l.gz), time.Since(start), err)
			assertAbsent(t, out)

			// With the limit above the bomb's size the same image imports.
			MaxOCIUnpackedSize = 2 * zeros
			defer func() { MaxOCIUnpackedSize = 1 << 20 }()
			if err := ImportOCI(ctx, OCIImage{Dir: layout}, mdesc.Digest.String(), out); err != nil {
				t.Fatalf("under a higher limit: %v", err)
			}
		})
	}
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
