package snapshotter

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	"toolshed.dev/shed/cache"
)

// paths is a node's store as the snapshotter sees it: the paths it has, and the roots held. The
// store itself, substitution and signatures are tests/containerd_test.go's (a real store, a real
// containerd); this is the snapshotter's own bookkeeping.
type paths struct {
	dir   string
	have  map[string]string // full name -> diff ID
	roots map[string]string // root name -> full name
}

func (p *paths) Layer(ctx context.Context, full string) error {
	if _, ok := p.have[full]; !ok {
		return errors.New("not in this node's store")
	}
	return nil
}

func (p *paths) Dir(full string) (string, error) {
	if _, ok := p.have[full]; !ok {
		return "", os.ErrNotExist
	}
	return filepath.Join(p.dir, filepath.Base(full)), nil
}

func (p *paths) DiffID(ctx context.Context, full string) (string, error) { return p.have[full], nil }

func (p *paths) Content(full string) (string, error) { return "blake3:" + p.have[full], nil }

func (p *paths) Hold(ctx context.Context, name, full string) error {
	p.roots[name] = full
	return nil
}

func (p *paths) Release(name string) error {
	delete(p.roots, name)
	return nil
}

func (p *paths) Held(prefix string) ([]string, error) {
	var out []string
	for n := range p.roots {
		if strings.HasPrefix(n, prefix) {
			out = append(out, n)
		}
	}
	return out, nil
}

func digestOf(s string) string {
	h := sha256.Sum256([]byte(s))
	return "sha256:" + hex.EncodeToString(h[:])
}

func open(t *testing.T) (*Snapshotter, *paths) {
	t.Helper()
	p := &paths{dir: "/store", have: map[string]string{
		"/var/lib/toolshed/store/aaaa-seed": digestOf("seed"),
		"/var/lib/toolshed/store/bbbb-jq":   digestOf("jq"),
	}, roots: map[string]string{}}
	return openOn(t, p), p
}

// openOn opens a snapshotter of its own (its own records) on the store p.
func openOn(t *testing.T, p *paths) *Snapshotter {
	t.Helper()
	sn, err := Open(p, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sn.Close() })
	return sn
}

func code(err error) codes.Code { return status.Code(err) }

// prepareLayer is the unpacker's Prepare of an image layer that names a store path.
func prepareLayer(sn *Snapshotter, key, parent, ref, full string) error {
	_, err := sn.Prepare(context.Background(), &snapshotsapi.PrepareSnapshotRequest{Key: key, Parent: parent,
		Labels: map[string]string{refLabel: ref, cache.SnapshotPathLabel: full}})
	return err
}

func TestStoreLayers(t *testing.T) {
	sn, p := open(t)
	ctx := context.Background()
	seed, jq := "/var/lib/toolshed/store/aaaa-seed", "/var/lib/toolshed/store/bbbb-jq"
	c1 := chainID("", digestOf("seed"))
	c2 := chainID(c1, digestOf("jq"))
	if err := prepareLayer(sn, "extract-1", "", c1, seed); code(err) != codes.AlreadyExists {
		t.Fatalf("prepare of the seed's layer: %v, want AlreadyExists", err)
	}
	if err := prepareLayer(sn, "extract-2", c1, c2, jq); code(err) != codes.AlreadyExists {
		t.Fatalf("prepare of jq's layer: %v, want AlreadyExists", err)
	}
	if len(p.roots) != 2 {
		t.Errorf("roots held: %v, want one per store path's snapshot", p.roots)
	}
	// Cleanup keeps the roots its records name.
	if _, err := sn.Cleanup(ctx, &snapshotsapi.CleanupRequest{}); err != nil || len(p.roots) != 2 {
		t.Errorf("roots after a cleanup: %v %v", p.roots, err)
	}
	// A layer whose chain does not match the path it names: refused, nothing recorded or held.
	if err := prepareLayer(sn, "extract-3", c1, chainID(c1, digestOf("other")), jq); code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "does not match") {
		t.Errorf("a lying layer: %v", err)
	}
	if err := prepareLayer(sn, "extract-4", "", digestOf("x"), "/var/lib/toolshed/store/cccc-missing"); code(err) != codes.FailedPrecondition {
		t.Errorf("a missing path: %v", err)
	}
	if len(p.roots) != 2 {
		t.Errorf("roots after refusals: %v", p.roots)
	}
	// A container over both: one overlay, nearest lower first, an upper of its own.
	resp, err := sn.Prepare(ctx, &snapshotsapi.PrepareSnapshotRequest{Key: "container", Parent: c2})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Mounts) != 1 || resp.Mounts[0].Type != "overlay" || !slices.Contains(resp.Mounts[0].Options, "lowerdir=/store/bbbb-jq:/store/aaaa-seed") {
		t.Errorf("mounts: %v", resp.Mounts)
	}
	// The parent of a snapshot cannot go before it; the container's goes, then the layers'.
	if _, err := sn.Remove(ctx, &snapshotsapi.RemoveSnapshotRequest{Key: c2}); code(err) != codes.FailedPrecondition {
		t.Errorf("remove of a parent: %v", err)
	}
	for _, k := range []string{"container", c2, c1} {
		if _, err := sn.Remove(ctx, &snapshotsapi.RemoveSnapshotRequest{Key: k}); err != nil {
			t.Fatalf("remove %s: %v", k, err)
		}
	}
	if len(p.roots) != 0 {
		t.Errorf("roots after every snapshot is gone: %v", p.roots)
	}
	// A key never prepared.
	if _, err := sn.Mounts(ctx, &snapshotsapi.MountsRequest{Key: "never"}); code(err) != codes.NotFound {
		t.Errorf("mounts of a key never prepared: %v", err)
	}
}

func TestUnpackedLayers(t *testing.T) {
	sn, p := open(t)
	ctx := context.Background()
	resp, err := sn.Prepare(ctx, &snapshotsapi.PrepareSnapshotRequest{Key: "extract-1"})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Mounts) != 1 || resp.Mounts[0].Type != "bind" {
		t.Fatalf("the bottom layer's mounts: %v", resp.Mounts)
	}
	if err := os.WriteFile(filepath.Join(resp.Mounts[0].Source, "pause"), []byte("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := sn.Commit(ctx, &snapshotsapi.CommitSnapshotRequest{Key: "extract-1", Name: "layer"}); err != nil {
		t.Fatal(err)
	}
	if _, err := sn.Mounts(ctx, &snapshotsapi.MountsRequest{Key: "extract-1"}); code(err) != codes.NotFound {
		t.Errorf("the active key after its commit: %v", err)
	}
	u, err := sn.Usage(ctx, &snapshotsapi.UsageRequest{Key: "layer"})
	if err != nil || u.Size != 1 {
		t.Errorf("usage: %v %v", u, err)
	}
	v, err := sn.View(ctx, &snapshotsapi.ViewSnapshotRequest{Key: "view", Parent: "layer"})
	if err != nil || len(v.Mounts) != 1 || !slices.Contains(v.Mounts[0].Options, "ro") {
		t.Fatalf("view: %v %v", v, err)
	}
	// Labels: one changed by its field path, the rest kept.
	if _, err := sn.Update(ctx, &snapshotsapi.UpdateSnapshotRequest{Info: &snapshotsapi.Info{Name: "layer", Labels: map[string]string{"a": "1"}},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"labels.a"}}}); err != nil {
		t.Fatal(err)
	}
	st, err := sn.Stat(ctx, &snapshotsapi.StatSnapshotRequest{Key: "layer"})
	if err != nil || st.Info.Labels["a"] != "1" || st.Info.Kind != snapshotsapi.Kind_COMMITTED {
		t.Errorf("stat after update: %v %v", st, err)
	}
	// What a crash between a record's removal and its directory's leaves, Cleanup removes: the
	// directory, and a root no record names.
	orphan := filepath.Join(sn.Dir, "snapshots", "999", "fs")
	os.MkdirAll(orphan, 0o755)
	p.roots[sn.rootPrefix()+"998"] = "/var/lib/toolshed/store/aaaa-seed"
	if _, err := sn.Cleanup(ctx, &snapshotsapi.CleanupRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(orphan); !os.IsNotExist(err) {
		t.Errorf("cleanup left %s", orphan)
	}
	if len(p.roots) != 0 {
		t.Errorf("cleanup left roots: %v", p.roots)
	}
	if _, err := os.Stat(filepath.Join(sn.Dir, "snapshots", "1", "fs", "pause")); err != nil {
		t.Errorf("cleanup removed a recorded layer: %v", err)
	}
}

// A store layer over a layer containerd unpacked: the parent's chain is the one containerd named it
// for (its metadata names the backend's snapshot "NS/N/CHAIN"), not its name.
func TestStoreLayerOverUnpacked(t *testing.T) {
	sn, _ := open(t)
	ctx := context.Background()
	plain := digestOf("plain layer")
	if _, err := sn.Prepare(ctx, &snapshotsapi.PrepareSnapshotRequest{Key: "k8s.io/1/extract-1", Labels: map[string]string{refLabel: plain}}); err != nil {
		t.Fatal(err)
	}
	if _, err := sn.Commit(ctx, &snapshotsapi.CommitSnapshotRequest{Key: "k8s.io/1/extract-1", Name: "k8s.io/2/" + plain}); err != nil {
		t.Fatal(err)
	}
	ref := chainID(plain, digestOf("jq"))
	if err := prepareLayer(sn, "k8s.io/3/extract-2", "k8s.io/2/"+plain, ref, "/var/lib/toolshed/store/bbbb-jq"); code(err) != codes.AlreadyExists {
		t.Fatalf("a store layer over an unpacked one: %v", err)
	}
	// Without the label, the name's last part.
	if got := chainOf("k8s.io/9/"+plain, &record{}); got != plain {
		t.Errorf("chainOf: %s", got)
	}
}

// Two snapshotters on one store (two containerds on a node): each holds and cleans up its own roots.
func TestTwoSnapshottersOneStore(t *testing.T) {
	a, p := open(t)
	b := openOn(t, p)
	seed := "/var/lib/toolshed/store/aaaa-seed"
	c1 := chainID("", digestOf("seed"))
	for _, sn := range []*Snapshotter{a, b} {
		if err := prepareLayer(sn, "extract", "", c1, seed); code(err) != codes.AlreadyExists {
			t.Fatal(err)
		}
	}
	if len(p.roots) != 2 {
		t.Fatalf("roots: %v, want one each", p.roots)
	}
	if _, err := b.Cleanup(context.Background(), &snapshotsapi.CleanupRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Remove(context.Background(), &snapshotsapi.RemoveSnapshotRequest{Key: c1}); err != nil {
		t.Fatal(err)
	}
	if len(p.roots) != 1 {
		t.Fatalf("after b's cleanup and removal: %v, want a's root kept", p.roots)
	}
	for name := range p.roots {
		if !strings.HasPrefix(name, a.rootPrefix()) {
			t.Errorf("the root left is not a's: %s", name)
		}
	}
}
