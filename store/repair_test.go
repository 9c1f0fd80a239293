package store_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"toolshed.dev/shed/store"
)

// Repair puts back exactly the registered bytes, over damaged or missing ones, and refuses others.
func TestRepair(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	dep := realizeFile(t, s, "dep", "d")
	p, err := store.MakePath("output", "tree", s.StoreDir(), "tree")
	if err != nil {
		t.Fatal(err)
	}
	good := func(ctx context.Context, out string) error {
		writeTree(t, out, map[string]string{"bin/tool": "#!/bin/sh\necho ok\n", "share/doc": "doc"})
		return nil
	}
	if _, _, err := s.Realize(ctx, p, store.AddOptions{References: []store.Path{dep}}, good); err != nil {
		t.Fatal(err)
	}
	top := realizeFile(t, s, "top", "t", p)
	before, _ := s.Info(p)

	tool := filepath.Join(s.Location(p), "bin", "tool")
	os.Chmod(tool, 0o755)
	if err := os.WriteFile(tool, []byte("#!/bin/sh\nexfiltrate\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	// Bytes that are not the registered ones are refused, and the path is left as it was.
	bad := func(ctx context.Context, out string) error {
		writeTree(t, out, map[string]string{"bin/tool": "#!/bin/sh\nother\n", "share/doc": "doc"})
		return nil
	}
	err = s.Repair(ctx, p, 0, bad)
	if !errors.Is(err, store.ErrRepairDiffers) || !strings.Contains(err.Error(), "bin/tool") {
		t.Fatalf("repair with other bytes: %v, want ErrRepairDiffers naming bin/tool", err)
	}
	if b, _ := os.ReadFile(tool); string(b) != "#!/bin/sh\nexfiltrate\n" {
		t.Fatalf("a refused repair changed the path: %q", b)
	}

	if err := s.Repair(ctx, p, 0, good); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(tool); string(b) != "#!/bin/sh\necho ok\n" {
		t.Errorf("after repair: %q", b)
	}
	after, err := s.Info(p)
	if err != nil || after.ContentHash != before.ContentHash || after.Registered != before.Registered {
		t.Errorf("repair changed the record: %+v, was %+v (%v)", after, before, err)
	}
	if !s.IsValid(top) {
		t.Error("the path that refers to the repaired one is no longer valid")
	}
	assertVerifies(t, s)

	// Missing on disk altogether.
	if err := os.RemoveAll(s.Location(p)); err != nil {
		t.Fatal(err)
	}
	if err := s.Repair(ctx, p, 0, good); err != nil {
		t.Fatal(err)
	}
	assertVerifies(t, s)
	if ents, _ := os.ReadDir(filepath.Join(s.Root(), "tmp")); len(ents) != 0 {
		t.Errorf("repair left staging behind: %v", ents)
	}

	// Only a registered path can be repaired.
	unknown, _ := store.MakePath("output", "unknown", s.StoreDir(), "unknown")
	if err := s.Repair(ctx, unknown, 0, good); !errors.Is(err, store.ErrNotExist) {
		t.Errorf("repair of an unregistered path: %v, want ErrNotExist", err)
	}
}
