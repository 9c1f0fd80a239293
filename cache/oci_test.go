package cache_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/content/oci"

	"toolshed.dev/shed/cache"
	"toolshed.dev/shed/store"
	"toolshed.dev/shed/trust"
)

// newSigned makes a store whose paths its own key signs.
func newSigned(t *testing.T, keyName string) (*store.Store, *trust.Store) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: store paths keep owners (CI runs as root)")
	}
	root := filepath.Join(t.TempDir(), "root")
	s, err := store.Init(root)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if _, _, err := trust.OpenKeys(root).Ensure(keyName); err != nil {
		t.Fatal(err)
	}
	ts, err := trust.Open(s, "test")
	if err != nil {
		t.Fatal(err)
	}
	s.SetAttestor(ts.Attest)
	return s, ts
}

// trusting opens b's trust again with a's key trusted.
func trusting(t *testing.T, b *store.Store, a *trust.Store) *trust.Store {
	t.Helper()
	if err := b.UpdateConfig(func(c *store.Config) error {
		c.TrustedPublicKeys = append(c.TrustedPublicKeys, a.Key.Public().String())
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	ts, err := trust.Open(b, "test")
	if err != nil {
		t.Fatal(err)
	}
	b.SetAttestor(ts.Attest)
	return ts
}

// twoPaths adds a file tree and a path that references it, and returns both (dependency first).
func twoPaths(t *testing.T, s *store.Store) (dep, top store.Path) {
	t.Helper()
	ctx := context.Background()
	src := t.TempDir()
	os.MkdirAll(filepath.Join(src, "bin"), 0o755)
	os.WriteFile(filepath.Join(src, "bin", "tool"), []byte("#!/bin/sh\necho tool\n"), 0o755)
	os.Symlink("/etc/passwd", filepath.Join(src, "link"))
	d, err := s.AddDir(ctx, src, "dep", nil)
	if err != nil {
		t.Fatal(err)
	}
	src2 := t.TempDir()
	os.WriteFile(filepath.Join(src2, "data"), []byte(strings.Repeat("top ", 1000)), 0o644)
	p, err := s.AddDir(ctx, src2, "top", []store.Path{d.Path})
	if err != nil {
		t.Fatal(err)
	}
	return d.Path, p.Path
}

func export(t *testing.T, s *store.Store, ts *trust.Store, paths ...store.Path) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "layout")
	c, err := cache.Open("oci-layout:" + dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cache.Push(context.Background(), s, ts, c, paths, false); err != nil {
		t.Fatal(err)
	}
	return dir
}

func pull(t *testing.T, s *store.Store, ts *trust.Store, dir string, p store.Path) error {
	t.Helper()
	c, err := cache.Open("oci-layout:" + dir)
	if err != nil {
		t.Fatal(err)
	}
	pl := &cache.Puller{Store: s, Trust: ts, Caches: []*cache.Cache{c}}
	ok, err := pl.Pull(context.Background(), p, nil, nil)
	if err == nil && !ok {
		return errors.New("not found")
	}
	return err
}

func TestRoundTrip(t *testing.T) {
	a, ta := newSigned(t, "a-1")
	dep, top := twoPaths(t, a)
	dir := export(t, a, ta, top)
	b, _ := newSigned(t, "b-1")
	tb := trusting(t, b, ta)
	if err := pull(t, b, tb, dir, top); err != nil {
		t.Fatal(err)
	}
	for _, p := range []store.Path{dep, top} {
		ia, _ := a.Info(p)
		ib, err := b.Info(p)
		if err != nil || ib.ContentHash != ia.ContentHash || len(ib.References) != len(ia.References) {
			t.Errorf("%s in b: %+v, %v; in a: %+v", p, ib, err, ia)
		}
	}
	res, err := b.Verify(context.Background(), store.VerifyOptions{CheckContents: true, CheckProvenance: tb.Verify})
	if err != nil || len(res.Problems) != 0 {
		t.Errorf("verify b: %v %v", res.Problems, err)
	}
	// Pushing again pushes nothing.
	c, _ := cache.Open("oci-layout:" + dir)
	r, err := cache.Push(context.Background(), a, ta, c, []store.Path{top}, false)
	if err != nil || len(r.Pushed) != 0 || len(r.Present) != 2 {
		t.Errorf("second push: %+v, %v", r, err)
	}
}

// mutate opens the layout, lets f rewrite the artifact of p (its manifest,
// given as the decoded manifest and the store), and tags the result as p.
func mutate(t *testing.T, dir string, p store.Path, f func(st *oci.Store, m *ocispec.Manifest)) {
	t.Helper()
	ctx := context.Background()
	st, err := oci.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	desc, err := st.Resolve(ctx, cache.Tag(p))
	if err != nil {
		t.Fatal(err)
	}
	b, err := content.FetchAll(ctx, st, desc)
	if err != nil {
		t.Fatal(err)
	}
	var m ocispec.Manifest
	json.Unmarshal(b, &m)
	f(st, &m)
	nb, _ := json.Marshal(m)
	nd := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: digest.FromBytes(nb), Size: int64(len(nb))}
	if err := st.Push(ctx, nd, bytes.NewReader(nb)); err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
	if err := st.Tag(ctx, nd, cache.Tag(p)); err != nil {
		t.Fatal(err)
	}
}

func putBlob(t *testing.T, st *oci.Store, mediaType string, b []byte) ocispec.Descriptor {
	t.Helper()
	d := ocispec.Descriptor{MediaType: mediaType, Digest: digest.FromBytes(b), Size: int64(len(b))}
	if err := st.Push(context.Background(), d, bytes.NewReader(b)); err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
	return d
}

func blob(t *testing.T, st *oci.Store, d ocispec.Descriptor) []byte {
	t.Helper()
	b, err := content.FetchAll(context.Background(), st, d)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestHostileArtifacts: each is refused before anything is registered, with
// an error that says which check failed.
func TestHostileArtifacts(t *testing.T) {
	a, ta := newSigned(t, "a-1")
	dep, top := twoPaths(t, a)
	stranger, tstr := newSigned(t, "stranger-1")
	_, strangerTop := twoPaths(t, stranger)
	_ = strangerTop

	cases := []struct {
		name  string
		setup func(t *testing.T, dir string)
		trust bool // b trusts a's key
		want  string
	}{
		{"untrusted key", func(t *testing.T, dir string) {}, false, "not signed by a trusted key"},
		{"tampered tree blob", func(t *testing.T, dir string) {
			mutate(t, dir, dep, func(st *oci.Store, m *ocispec.Manifest) {
				path := filepath.Join(dir, "blobs", "sha256", m.Layers[2].Digest.Encoded())
				b, _ := os.ReadFile(path)
				b[len(b)/2] ^= 0xff
				os.WriteFile(path, b, 0o644)
			})
		}, true, ""},
		{"wrong digest", func(t *testing.T, dir string) {
			mutate(t, dir, dep, func(st *oci.Store, m *ocispec.Manifest) {
				m.Layers[2].Digest = digest.FromString("something else")
			})
		}, true, "not found"},
		{"stripped signature", func(t *testing.T, dir string) {
			mutate(t, dir, dep, func(st *oci.Store, m *ocispec.Manifest) {
				var env map[string]any
				json.Unmarshal(blob(t, st, m.Layers[1]), &env)
				env["signatures"] = []any{}
				b, _ := json.Marshal(env)
				m.Layers[1] = putBlob(t, st, cache.MediaProvenance, b)
			})
		}, true, "no signed provenance"},
		{"signature moved to another path", func(t *testing.T, dir string) {
			// top's signed provenance in dep's artifact.
			var topProv ocispec.Descriptor
			mutate(t, dir, top, func(st *oci.Store, m *ocispec.Manifest) { topProv = m.Layers[1] })
			mutate(t, dir, dep, func(st *oci.Store, m *ocispec.Manifest) { m.Layers[1] = topProv })
		}, true, "does not describe these bytes"},
		{"signed by a key b does not trust, over a's bytes", func(t *testing.T, dir string) {
			mutate(t, dir, dep, func(st *oci.Store, m *ocispec.Manifest) {
				info, _ := a.Info(dep)
				env, _ := trust.Sign(tstr.Key, trust.New(a.StoreDir(), info, nil, "x", tstr.Key.Public(), time.Now()))
				m.Layers[1] = putBlob(t, st, cache.MediaProvenance, env)
			})
		}, true, "not signed by a trusted key"},
		{"record for another path", func(t *testing.T, dir string) {
			mutate(t, dir, dep, func(st *oci.Store, m *ocispec.Manifest) {
				var rec map[string]any
				json.Unmarshal(blob(t, st, m.Config), &rec)
				rec["path"] = a.StoreDir() + "/" + top.String()
				b, _ := json.Marshal(rec)
				m.Config = putBlob(t, st, cache.MediaRecord, b)
			})
		}, true, "bad artifact"},
		{"tree with an entry that escapes", func(t *testing.T, dir string) {
			mutate(t, dir, dep, func(st *oci.Store, m *ocispec.Manifest) {
				var buf bytes.Buffer
				zw := gzip.NewWriter(&buf)
				tw := tar.NewWriter(zw)
				// The root as the signed manifest has it, so that the escape is what is refused.
				man, err := store.ParseManifest(blob(t, st, m.Layers[0]))
				if err != nil {
					t.Fatal(err)
				}
				root := man.Entries[0]
				tw.WriteHeader(&tar.Header{Name: "content/", Typeflag: tar.TypeDir, Mode: int64(root.Mode), Uid: int(root.UID), Gid: int(root.GID), ModTime: time.Unix(root.Mtime, 0)})
				tw.WriteHeader(&tar.Header{Name: "content/../../escape", Typeflag: tar.TypeReg, Mode: 0o644, Size: 4})
				tw.Write([]byte("evil"))
				tw.Close()
				zw.Close()
				m.Layers[2] = putBlob(t, st, cache.MediaLayer, buf.Bytes())
			})
		}, true, "escape"},
		{"tree blob with a gzip member appended", func(t *testing.T, dir string) {
			// The layer as signed, then a second gzip member: 64 MiB of zeros
			// (a few hundred KiB sent; a larger one inflates to terabytes),
			// which extractTree would inflate to its end after ReadLayer.
			mutate(t, dir, dep, func(st *oci.Store, m *ocispec.Manifest) {
				var buf bytes.Buffer
				buf.Write(blob(t, st, m.Layers[2]))
				zw, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
				zeros := make([]byte, 1<<20)
				for range 64 {
					zw.Write(zeros)
				}
				zw.Close()
				m.Layers[2] = putBlob(t, st, cache.MediaLayer, buf.Bytes())
			})
		}, true, "after the end-of-archive marker"},
		{"manifest of other content", func(t *testing.T, dir string) {
			mutate(t, dir, dep, func(st *oci.Store, m *ocispec.Manifest) {
				b := blob(t, st, m.Layers[0])
				b = bytes.Replace(b, []byte("tool"), []byte("evil"), 1)
				m.Layers[0] = putBlob(t, st, cache.MediaManifest, b)
			})
		}, true, "does not describe these bytes"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := export(t, a, ta, top)
			c.setup(t, dir)
			b, tb := newSigned(t, "b-1")
			if c.trust {
				tb = trusting(t, b, ta)
			}
			err := pull(t, b, tb, dir, dep)
			if err == nil || (c.want != "" && !strings.Contains(err.Error(), c.want)) {
				t.Fatalf("got %v, want an error with %q", err, c.want)
			}
			t.Logf("refused: %v", err)
			if b.IsValid(dep) {
				t.Error("the refused path is registered")
			}
			if ents, _ := os.ReadDir(filepath.Join(b.Root(), "store")); len(ents) != 0 {
				t.Errorf("store/ holds %d entries after a refusal", len(ents))
			}
			if ents, _ := os.ReadDir(b.TmpDir()); len(ents) != 0 {
				t.Errorf("tmp/ holds %d entries after a refusal", len(ents))
			}
		})
	}
}

// TestPullBadReference: a path's references are pulled while its own tree downloads; a reference
// that fails its checks fails the pull with its own error, and the path is not registered.
func TestPullBadReference(t *testing.T) {
	a, ta := newSigned(t, "a-1")
	dep, top := twoPaths(t, a)
	dir := export(t, a, ta, top)
	mutate(t, dir, dep, func(st *oci.Store, m *ocispec.Manifest) {
		b := blob(t, st, m.Layers[0])
		m.Layers[0] = putBlob(t, st, cache.MediaManifest, bytes.Replace(b, []byte("tool"), []byte("evil"), 1))
	})
	b, _ := newSigned(t, "b-1")
	tb := trusting(t, b, ta)
	err := pull(t, b, tb, dir, top)
	if err == nil || !strings.Contains(err.Error(), "does not describe these bytes") || !strings.Contains(err.Error(), dep.String()) {
		t.Fatalf("got %v, want the reference's refusal", err)
	}
	if b.IsValid(dep) || b.IsValid(top) {
		t.Error("a path is registered over a refused reference")
	}
	if ents, _ := os.ReadDir(filepath.Join(b.Root(), "store")); len(ents) != 0 {
		t.Errorf("store/ holds %d entries after a refusal", len(ents))
	}
	if ents, _ := os.ReadDir(b.TmpDir()); len(ents) != 0 {
		t.Errorf("tmp/ holds %d entries after a refusal", len(ents))
	}
}

// TestReplay: a registry that serves an older provenance after a newer one
// was accepted is refused, even after gc removed the path.
func TestReplay(t *testing.T) {
	ctx := context.Background()
	a, ta := newSigned(t, "a-1")
	dep, _ := twoPaths(t, a)
	oldDir := export(t, a, ta, dep)
	time.Sleep(1100 * time.Millisecond) // provenance times are in seconds
	if err := ta.Resign(ctx, dep); err != nil {
		t.Fatal(err)
	}
	newDir := export(t, a, ta, dep)
	b, _ := newSigned(t, "b-1")
	tb := trusting(t, b, ta)
	if err := pull(t, b, tb, newDir, dep); err != nil {
		t.Fatal(err)
	}
	// This handle's temporary roots keep what it pulled: gc through another.
	b.Close()
	b, err := store.Open(b.Root())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := b.GC(ctx, store.GCOptions{}); err != nil {
		t.Fatal(err)
	}
	if b.IsValid(dep) {
		t.Fatal("gc kept the path")
	}
	if tb, err = trust.Open(b, "test"); err != nil {
		t.Fatal(err)
	}
	err = pull(t, b, tb, oldDir, dep)
	if !errors.Is(err, trust.ErrReplay) {
		t.Fatalf("older provenance after a newer one: %v, want ErrReplay", err)
	}
}

// refusedCleanly checks what a refused pull of p must leave in b: p not valid, nothing in store/ or
// tmp/, no replay state for p, and a store that verifies.
func refusedCleanly(t *testing.T, b *store.Store, tb *trust.Store, p store.Path) {
	t.Helper()
	if b.IsValid(p) {
		t.Error("the refused path is registered")
	}
	for _, d := range []string{filepath.Join(b.Root(), "store"), b.TmpDir()} {
		if ents, _ := os.ReadDir(d); len(ents) != 0 {
			t.Errorf("%s holds %d entries after a refusal", d, len(ents))
		}
	}
	if _, err := os.Stat(filepath.Join(b.Root(), "trust", "seen", p.HashPart())); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused artifact left replay state for %s: %v", p, err)
	}
	res, err := b.Verify(context.Background(), store.VerifyOptions{CheckContents: true, CheckProvenance: tb.Verify})
	if err != nil || len(res.Problems) != 0 {
		t.Errorf("verify after a refusal: %v %v", res.Problems, err)
	}
}

// TestForgedRecord: the artifact's record (its config) is not signed. A record whose deriver or
// content address is not the signed one is refused, and nothing is registered from it; an honest one
// registers the signed deriver and content address.
func TestForgedRecord(t *testing.T) {
	ctx := context.Background()
	a, ta := newSigned(t, "a-1")
	dep, _ := twoPaths(t, a)
	drv, err := a.AddText(ctx, "thing.drv", []byte("the derivation\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	evilDrv, err := a.AddText(ctx, "thing.drv", []byte("another derivation\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	thing, err := store.MakePath("output", "thing", a.StoreDir(), "thing")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.Realize(ctx, thing, store.AddOptions{Deriver: drv.Path}, func(ctx context.Context, out string) error {
		return os.WriteFile(out, []byte("built\n"), 0o644)
	}); err != nil {
		t.Fatal(err)
	}
	editRecord := func(p store.Path, f func(rec map[string]any)) func(t *testing.T, dir string) {
		return func(t *testing.T, dir string) {
			mutate(t, dir, p, func(st *oci.Store, m *ocispec.Manifest) {
				var rec map[string]any
				if err := json.Unmarshal(blob(t, st, m.Config), &rec); err != nil {
					t.Fatal(err)
				}
				f(rec)
				b, _ := json.Marshal(rec)
				m.Config = putBlob(t, st, cache.MediaRecord, b)
			})
		}
	}
	for _, c := range []struct {
		name  string
		p     store.Path
		setup func(t *testing.T, dir string)
		want  string
	}{
		{"another deriver", thing, editRecord(thing, func(rec map[string]any) { rec["deriver"] = a.StoreDir() + "/" + evilDrv.Path.String() }), "signed deriver"},
		{"no deriver", thing, editRecord(thing, func(rec map[string]any) { delete(rec, "deriver") }), "signed deriver"},
		{"a deriver where none was signed", dep, editRecord(dep, func(rec map[string]any) { rec["deriver"] = a.StoreDir() + "/" + evilDrv.Path.String() }), "signed deriver"},
		{"another content address", dep, editRecord(dep, func(rec map[string]any) { rec["ca"] = "fixed:sha256:" + strings.Repeat("0", 64) }), "signed content address"},
		{"no content address", dep, editRecord(dep, func(rec map[string]any) { delete(rec, "ca") }), "signed content address"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := export(t, a, ta, c.p)
			c.setup(t, dir)
			b, _ := newSigned(t, "b-1")
			tb := trusting(t, b, ta)
			err := pull(t, b, tb, dir, c.p)
			if !errors.Is(err, trust.ErrMismatch) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want ErrMismatch with %q", err, c.want)
			}
			t.Logf("refused: %v", err)
			refusedCleanly(t, b, tb, c.p)
		})
	}
	// The honest record: the signed deriver and content address are registered.
	dir := export(t, a, ta, thing, dep)
	b, _ := newSigned(t, "b-1")
	tb := trusting(t, b, ta)
	for _, p := range []store.Path{thing, dep} {
		if err := pull(t, b, tb, dir, p); err != nil {
			t.Fatal(err)
		}
		ia, _ := a.Info(p)
		ib, err := b.Info(p)
		if err != nil || ib.Deriver != ia.Deriver || ib.CA != ia.CA {
			t.Errorf("%s in b: %+v, %v; in a: %+v", p, ib, err, ia)
		}
	}
	if ib, _ := b.Info(thing); ib.Deriver != drv.Path {
		t.Errorf("thing's deriver in b is %s, want %s", ib.Deriver, drv.Path)
	}
}

// TestRefusedLeavesNoReplayState: an artifact whose tree does not hash to its signed content hash is
// refused without moving the path's replay bound, so the older but valid artifact is still accepted
// afterwards (Accept refuses a provenance older than the newest accepted for the path).
func TestRefusedLeavesNoReplayState(t *testing.T) {
	ctx := context.Background()
	a, ta := newSigned(t, "a-1")
	dep, _ := twoPaths(t, a)
	// A tree of the same shape (names, sizes, modes, owners, times) with other bytes.
	src := t.TempDir()
	os.MkdirAll(filepath.Join(src, "bin"), 0o755)
	os.WriteFile(filepath.Join(src, "bin", "tool"), []byte("#!/bin/sh\necho evil\n"), 0o755)
	os.Symlink("/etc/passwd", filepath.Join(src, "link"))
	evil, err := a.AddDir(ctx, src, "dep", nil)
	if err != nil {
		t.Fatal(err)
	}
	oldDir := export(t, a, ta, dep)
	time.Sleep(1100 * time.Millisecond) // provenance times are in seconds
	if err := ta.Resign(ctx, dep); err != nil {
		t.Fatal(err)
	}
	// The newer provenance over the other tree's bytes.
	newDir := export(t, a, ta, dep, evil.Path)
	var evilTree ocispec.Descriptor
	mutate(t, newDir, evil.Path, func(st *oci.Store, m *ocispec.Manifest) { evilTree = m.Layers[2] })
	mutate(t, newDir, dep, func(st *oci.Store, m *ocispec.Manifest) { m.Layers[2] = evilTree })

	b, _ := newSigned(t, "b-1")
	tb := trusting(t, b, ta)
	err = pull(t, b, tb, newDir, dep)
	if !errors.Is(err, cache.ErrBadLayer) || !strings.Contains(err.Error(), "differs from its manifest") {
		t.Fatalf("a tree that does not hash to the signed content hash: %v", err)
	}
	t.Logf("refused: %v", err)
	refusedCleanly(t, b, tb, dep)
	// The older artifact is not a replay of anything accepted.
	if err := pull(t, b, tb, oldDir, dep); err != nil {
		t.Fatalf("the older valid artifact after a refused newer one: %v", err)
	}
	if _, err := os.Stat(filepath.Join(b.Root(), "trust", "seen", dep.HashPart())); err != nil {
		t.Errorf("no replay state after the path was registered: %v", err)
	}
}

// A copy ships what a path needs to run; --with-build-inputs adds what it was built from. The build
// inputs travel in the record and are signed: a record that names others is refused.
func TestBuildInputs(t *testing.T) {
	ctx := context.Background()
	a, ta := newSigned(t, "a-1")
	dep, _ := twoPaths(t, a)
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "pkg.deb"), []byte("not really a .deb"), 0o644)
	deb, err := a.AddDir(ctx, filepath.Join(src, "pkg.deb"), "pkg.deb", nil)
	if err != nil {
		t.Fatal(err)
	}
	layer, err := store.MakePath("output", "layer", a.StoreDir(), "layer")
	if err != nil {
		t.Fatal(err)
	}
	opts := store.AddOptions{References: []store.Path{dep}, BuildInputs: []store.Path{deb.Path}}
	if _, _, err := a.Realize(ctx, layer, opts, func(ctx context.Context, out string) error {
		return os.WriteFile(out, []byte("installed\n"), 0o644)
	}); err != nil {
		t.Fatal(err)
	}
	pushed := func(buildInputs bool) (string, []store.Path) {
		dir := filepath.Join(t.TempDir(), "layout")
		c, err := cache.Open("oci-layout:" + dir)
		if err != nil {
			t.Fatal(err)
		}
		r, err := cache.Push(ctx, a, ta, c, []store.Path{layer}, buildInputs)
		if err != nil {
			t.Fatal(err)
		}
		return dir, r.Pushed
	}
	if _, got := pushed(false); fmt.Sprint(got) != fmt.Sprint([]store.Path{dep, layer}) {
		t.Errorf("runtime closure pushed %v, want %v", got, []store.Path{dep, layer})
	}
	dir, got := pushed(true)
	if fmt.Sprint(got) != fmt.Sprint([]store.Path{dep, deb.Path, layer}) {
		t.Errorf("with build inputs pushed %v, want %v", got, []store.Path{dep, deb.Path, layer})
	}

	// The record names the build inputs, and the pulled path keeps them (but pulls only what it runs on).
	b, _ := newSigned(t, "b-1")
	tb := trusting(t, b, ta)
	if err := pull(t, b, tb, dir, layer); err != nil {
		t.Fatal(err)
	}
	if info, err := b.Info(layer); err != nil || fmt.Sprint(info.BuildInputs) != fmt.Sprint([]store.Path{deb.Path}) {
		t.Errorf("pulled layer: %+v, %v; want build inputs [%s]", info, err, deb.Path)
	}
	if b.IsValid(deb.Path) {
		t.Errorf("pulling the layer pulled its build input %s too", deb.Path)
	}

	// A record that adds a build input it was not signed with is refused, and nothing is registered.
	mutate(t, dir, layer, func(st *oci.Store, m *ocispec.Manifest) {
		var rec map[string]any
		json.Unmarshal(blob(t, st, m.Config), &rec)
		rec["build_inputs"] = []string{a.StoreDir() + "/" + deb.Path.String(), a.StoreDir() + "/" + dep.String()}
		nb, _ := json.Marshal(rec)
		m.Config = putBlob(t, st, cache.MediaRecord, nb)
	})
	c, _ := newSigned(t, "c-1")
	tc := trusting(t, c, ta)
	err = pull(t, c, tc, dir, layer)
	if err == nil || !strings.Contains(err.Error(), "signed build inputs") {
		t.Errorf("forged build inputs: got %v, want a refusal naming the signed build inputs", err)
	}
	if c.IsValid(layer) {
		t.Error("the layer with forged build inputs was registered")
	}

	// With the build input gone (gc frees it), a copy that asks for it says so.
	if err := a.AddRoot(ctx, "layer", layer); err != nil {
		t.Fatal(err)
	}
	a.Close()
	if _, err := a.GC(ctx, store.GCOptions{}); err != nil {
		t.Fatal(err)
	}
	if !a.IsValid(layer) || !a.IsValid(dep) || a.IsValid(deb.Path) {
		t.Fatalf("after gc: layer %v, dep %v, deb %v; want the build input alone freed", a.IsValid(layer), a.IsValid(dep), a.IsValid(deb.Path))
	}
	cc, _ := cache.Open("oci-layout:" + filepath.Join(t.TempDir(), "again"))
	if _, err := cache.Push(ctx, a, ta, cc, []store.Path{layer}, true); !errors.Is(err, store.ErrNotExist) || !strings.Contains(err.Error(), "gc freed it") {
		t.Errorf("push with a freed build input: %v, want ErrNotExist saying gc freed it", err)
	}
}

// TestPullProgress: found hears the cache that has the path asked for, once, before anything
// downloads; progress ends at the compressed bytes of every tree pulled, the references' included;
// a miss calls neither.
func TestPullProgress(t *testing.T) {
	a, ta := newSigned(t, "a-1")
	dep, top := twoPaths(t, a)
	dir := filepath.Join(t.TempDir(), "layout")
	c, err := cache.Open("oci-layout:" + dir)
	if err != nil {
		t.Fatal(err)
	}
	pushed, err := cache.Push(context.Background(), a, ta, c, []store.Path{top}, false)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := newSigned(t, "b-1")
	pl := &cache.Puller{Store: b, Trust: trusting(t, b, ta), Caches: []*cache.Cache{c}}

	var found []string
	var calls, done, expected int64
	ok, err := pl.Pull(context.Background(), top, func(name string) {
		if calls > 0 {
			t.Errorf("found after %d progress calls", calls)
		}
		found = append(found, name)
	}, func(d, e int64) {
		if d < done || e < expected || d > e {
			t.Errorf("progress went from %d of %d to %d of %d", done, expected, d, e)
		}
		calls, done, expected = calls+1, d, e
	})
	if !ok || err != nil {
		t.Fatalf("pull: %v, %v", ok, err)
	}
	if len(found) != 1 || found[0] != c.Name {
		t.Errorf("found %q, want %q once", found, c.Name)
	}
	if done != pushed.Bytes || expected != pushed.Bytes || len(pushed.Pushed) != 2 {
		t.Errorf("progress ended at %d of %d, want the %d bytes pushed of %s and %s", done, expected, pushed.Bytes, dep, top)
	}

	// A miss (a path in no cache) hears nothing.
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "only-here"), []byte("b's own"), 0o644)
	own, err := b.AddDir(context.Background(), src, "own", nil)
	if err != nil {
		t.Fatal(err)
	}
	other := own.Path
	b2, _ := newSigned(t, "c-1")
	pl.Store = b2
	ok, err = pl.Pull(context.Background(), other, func(string) { t.Error("found called on a miss") }, func(int64, int64) { t.Error("progress called on a miss") })
	if ok || err != nil {
		t.Errorf("pull of a path in no cache: %v, %v", ok, err)
	}
}
