package cache_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
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
	if _, err := cache.Push(context.Background(), s, ts, c, paths); err != nil {
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
	ok, err := pl.Pull(context.Background(), p)
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
	r, err := cache.Push(context.Background(), a, ta, c, []store.Path{top})
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
