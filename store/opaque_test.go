package store_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"toolshed.dev/shed/store"
)

// opaqueTree makes a tree with one opaque directory, its mark named name.
func opaqueTree(t *testing.T, name string) *treeFixture {
	f := newFixture(t)
	f.chmod("", 0o755)
	f.file("opq/f", "f", 0o644)
	f.chmod("opq", 0o755)
	f.xattr("opq", name, []byte("y"))
	f.clamp()
	return f
}

// getXattr returns the value of name on p, or nil if p has none.
func getXattr(t *testing.T, p, name string) []byte {
	t.Helper()
	buf := make([]byte, 64)
	n, err := unix.Lgetxattr(p, name, buf)
	if errors.Is(err, unix.ENODATA) {
		return nil
	}
	if err != nil {
		t.Fatalf("get %s of %s: %v", name, p, err)
	}
	return buf[:n]
}

// TestOpaqueMarkNames: a rootless store keeps the opaque mark as
// user.overlay.opaque, root's as trusted.overlay.opaque; both are the same
// content, recorded as trusted.overlay.opaque.
func TestOpaqueMarkNames(t *testing.T) {
	requireRoot(t)
	for _, rootless := range []bool{false, true} {
		store.SetRootless(t, rootless)
		root := opaqueTree(t, "trusted.overlay.opaque").scan()
		user := opaqueTree(t, "user.overlay.opaque").scan()
		if diff := cmp.Diff(root, user); diff != "" {
			t.Errorf("rootless %v: manifests of the two names differ (-trusted +user):\n%s", rootless, diff)
		}
		if root.Hash() != user.Hash() {
			t.Errorf("rootless %v: content hash %s with trusted.overlay.opaque, %s with user.overlay.opaque", rootless, root.Hash(), user.Hash())
		}
		want := []store.Xattr{{Name: "trusted.overlay.opaque", Value: []byte("y")}}
		if diff := cmp.Diff(want, findEntry(t, user, "opq").Xattrs); diff != "" {
			t.Errorf("rootless %v: xattrs of opq (-want +got):\n%s", rootless, diff)
		}
	}

	// Both names (a tree made by hand): the one this process's overlays read wins.
	for _, tc := range []struct {
		rootless bool
		want     string
	}{{false, "t"}, {true, "u"}} {
		store.SetRootless(t, tc.rootless)
		f := opaqueTree(t, "trusted.overlay.opaque")
		f.xattr("opq", "trusted.overlay.opaque", []byte("t"))
		f.xattr("opq", "user.overlay.opaque", []byte("u"))
		want := []store.Xattr{{Name: "trusted.overlay.opaque", Value: []byte(tc.want)}}
		if diff := cmp.Diff(want, findEntry(t, f.scan(), "opq").Xattrs); diff != "" {
			t.Errorf("rootless %v, both names: xattrs of opq (-want +got):\n%s", tc.rootless, diff)
		}
	}
}

func TestOpaqueXattr(t *testing.T) {
	store.SetRootless(t, false)
	if got := store.OpaqueXattr(); got != "trusted.overlay.opaque" {
		t.Errorf("OpaqueXattr as root = %q, want trusted.overlay.opaque", got)
	}
	store.SetRootless(t, true)
	if got := store.OpaqueXattr(); got != "user.overlay.opaque" {
		t.Errorf("OpaqueXattr in a user namespace = %q, want user.overlay.opaque", got)
	}
}

// TestCopyTreeOpaqueName: a copy has the opaque mark under OpaqueXattr only,
// whichever name the source had, and the same manifest.
func TestCopyTreeOpaqueName(t *testing.T) {
	requireRoot(t)
	for _, tc := range []struct {
		rootless   bool
		src, other string
	}{
		{false, "user.overlay.opaque", "user.overlay.opaque"},
		{false, "trusted.overlay.opaque", "user.overlay.opaque"},
		{true, "trusted.overlay.opaque", "trusted.overlay.opaque"},
		{true, "user.overlay.opaque", "trusted.overlay.opaque"},
	} {
		store.SetRootless(t, tc.rootless)
		src := opaqueTree(t, tc.src)
		dst := filepath.Join(t.TempDir(), "copy")
		if err := store.CopyTree(context.Background(), src.root, dst); err != nil {
			t.Fatal(err)
		}
		got, err := store.ScanTree(context.Background(), dst)
		if err != nil {
			t.Fatal(err)
		}
		if want := src.scan(); got.Hash() != want.Hash() {
			t.Errorf("rootless %v, %s: the copy hashes differently:\n%s", tc.rootless, tc.src, store.DiffManifests(want, got))
		}
		if v := getXattr(t, dst+"/opq", store.OpaqueXattr()); string(v) != "y" {
			t.Errorf("rootless %v, %s: copy's %s = %q, want \"y\"", tc.rootless, tc.src, store.OpaqueXattr(), v)
		}
		if v := getXattr(t, dst+"/opq", tc.other); v != nil {
			t.Errorf("rootless %v, %s: copy has %s = %q, want none", tc.rootless, tc.src, tc.other, v)
		}
	}
}
