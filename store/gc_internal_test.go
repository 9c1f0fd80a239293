package store

import (
	"context"
	"path/filepath"
	"testing"
)

// TestDeadInOrderReferrersFirst: in the order gc unregisters dead paths, every
// dead path comes after all the dead paths that refer to it, so any prefix
// (a batch, a --max-freed stop, a crash) leaves no valid path with a
// reference gone; and gc then deletes exactly the dead ones.
func TestDeadInOrderReferrersFirst(t *testing.T) {
	ctx := context.Background()
	s, err := Init(filepath.Join(t.TempDir(), "root"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	paths := fabricate(t, s, 3000, true)
	if err := s.AddRoot(ctx, "some", paths[1000]); err != nil {
		t.Fatal(err)
	}
	g, err := s.loadGraph(ctx)
	if err != nil {
		t.Fatal(err)
	}
	live, _, err := s.liveSet(g)
	if err != nil {
		t.Fatal(err)
	}
	order := g.deadInOrder(live)
	if len(order) != 3000-1001 {
		t.Fatalf("%d dead, want %d", len(order), 3000-1001)
	}
	pos := map[int32]int{}
	for i, id := range order {
		pos[id] = i
	}
	for _, id := range order {
		for _, r := range g.refsOf(id) {
			if live[r] {
				continue
			}
			if pos[r] < pos[id] {
				t.Fatalf("%s comes before its referrer %s", g.paths[r], g.paths[id])
			}
		}
	}
	res, err := s.GC(ctx, GCOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Deleted) != len(order) {
		t.Errorf("gc deleted %d, want %d", len(res.Deleted), len(order))
	}
	for i, p := range paths {
		if valid := s.IsValid(p); valid != (i <= 1000) {
			t.Errorf("%s valid=%v after gc", p, valid)
		}
	}
	if files, _ := filepath.Glob(filepath.Join(s.Root(), dirDB, "*", "*")); len(files) != 1001 {
		t.Errorf("db/ holds %d manifests after gc, want 1001", len(files))
	}
}
