package store

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// legacyStore makes a store as shed kept it before db/meta.db: records as
// meta/<hash>.json, manifests and provenance beside them. Its paths: a file,
// a directory that references it and has provenance, and one whose record
// does not parse.
func legacyStore(t *testing.T) (root string, infos []*PathInfo, broken Path) {
	t.Helper()
	ctx := context.Background()
	root = filepath.Join(t.TempDir(), "root")
	s, err := Init(root)
	if err != nil {
		t.Fatal(err)
	}
	dep, err := s.AddText(ctx, "dep.drv", []byte("dep"), nil)
	if err != nil {
		t.Fatal(err)
	}
	s.SetAttestor(func(info *PathInfo, _ any) ([]byte, error) { return []byte("signed " + info.Path.String()), nil })
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "tool"), []byte("tool"), 0o755)
	top, err := s.AddDir(ctx, src, "top", []Path{dep.Path})
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(src, "tool"), []byte("other"), 0o755)
	bad, err := s.AddDir(ctx, src, "broken", nil)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	meta := filepath.Join(root, dirLegacyMeta)
	if err := os.Mkdir(meta, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, info := range []*PathInfo{dep, top, bad} {
		b, err := json.MarshalIndent(legacyRecord{1, *info}, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if info == bad {
			b = b[:len(b)/2] // cut short by hand
		}
		hp := info.Path.HashPart()
		os.WriteFile(filepath.Join(meta, hp+".json"), b, 0o600)
		for _, ext := range []string{".manifest", ".provenance"} {
			os.Rename(filepath.Join(s.shardDir(info.Path), hp+ext), filepath.Join(meta, hp+ext))
		}
	}
	if err := os.RemoveAll(filepath.Join(root, dirDB)); err != nil {
		t.Fatal(err)
	}
	return root, []*PathInfo{dep, top}, bad.Path
}

func TestOpenMigratesLegacyRecords(t *testing.T) {
	root, want, broken := legacyStore(t)
	// A crash in an earlier migration, after moving one manifest into db/.
	if err := os.MkdirAll(filepath.Join(root, dirDB, want[0].Path.HashPart()[:dbShardLen]), 0o700); err != nil {
		t.Fatal(err)
	}
	hp := want[0].Path.HashPart()
	if err := os.Rename(filepath.Join(root, dirLegacyMeta, hp+".manifest"), filepath.Join(root, dirDB, hp[:dbShardLen], hp+".manifest")); err != nil {
		t.Fatal(err)
	}
	s, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := os.Lstat(filepath.Join(root, dirLegacyMeta)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("meta/ is still there after the migration: %v", err)
	}
	for _, w := range want {
		got, err := s.Info(w.Path)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(w, got, cmp.AllowUnexported(Path{})); diff != "" {
			t.Errorf("record of %s after the migration (-before +after):\n%s", w.Path, diff)
		}
	}
	if prov, err := s.Provenance(want[1].Path); err != nil || string(prov) != "signed "+want[1].Path.String() {
		t.Errorf("provenance of %s: %q, %v", want[1].Path, prov, err)
	}
	res, err := s.Verify(context.Background(), VerifyOptions{CheckContents: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Problems) != 1 || !strings.Contains(res.Problems[0].What, "unreadable record "+broken.HashPart()) {
		t.Errorf("verify after the migration: %v, want the broken record alone", res.Problems)
	}
	// gc keeps the bytes of a record it cannot read, and deletes the rest
	// (nothing is rooted), provenance included.
	gres, err := s.GC(context.Background(), GCOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(gres.Deleted) != 2 {
		t.Errorf("gc deleted %v, want the two readable paths", gres.Deleted)
	}
	if _, err := os.Lstat(s.Location(broken)); err != nil {
		t.Errorf("gc removed the bytes of the unreadable record: %v", err)
	}
	if _, err := os.Lstat(s.provenanceFile(want[1].Path)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("gc left the provenance of %s: %v", want[1].Path, err)
	}
	// Open again: nothing left to migrate.
	s2, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	s2.Close()
}

// TestRecordRoundTrip: the binary record decodes to what was encoded, and a
// record cut anywhere is refused, not misread.
func TestRecordRoundTrip(t *testing.T) {
	s, err := Init(filepath.Join(t.TempDir(), "root"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	a, _ := MakePath("output", "a", s.StoreDir(), "a")
	b, _ := MakePath("output", "b", s.StoreDir(), "b.drv")
	c, _ := MakePath("output", "c", s.StoreDir(), "c.deb")
	info := &PathInfo{Path: a, Deriver: b, References: []Path{a, c}, BuildInputs: []Path{c}, ContentHash: Sum([]byte("x")),
		Size: 1 << 40, CA: "fixed:sha256:00"}
	for _, prov := range []bool{false, true} {
		enc := encodeInfo(info, prov)
		got, gotProv, err := decodeInfo(enc)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(info, got, cmp.AllowUnexported(Path{})); diff != "" || gotProv != prov {
			t.Errorf("round trip (-want +got):\n%s (provenance %v, want %v)", diff, gotProv, prov)
		}
		for i := range len(enc) {
			if _, _, err := decodeInfo(enc[:i]); err == nil {
				t.Errorf("a record cut at %d of %d bytes decoded", i, len(enc))
			}
		}
	}
}
