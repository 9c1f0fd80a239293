package store

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// fabricate writes n registered paths straight to disk, without the fsyncs of
// register (which would make setting up 10,000 paths take minutes). Path i
// references paths i-1 and i/2, so the graph has long chains and sharing.
// Every 100th path gets a named root: about half the store stays live.
func fabricate(tb testing.TB, s *Store, n int) []Path {
	tb.Helper()
	paths := make([]Path, n)
	for i := range n {
		p, err := MakePath("output", strconv.Itoa(i), s.StoreDir(), "synthetic-"+strconv.Itoa(i))
		if err != nil {
			tb.Fatal(err)
		}
		paths[i] = p
		dir := s.Location(p)
		if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
			tb.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "bin", "tool"), []byte(fmt.Sprint("tool ", i)), 0o755); err != nil {
			tb.Fatal(err)
		}
		m, err := ScanTree(context.Background(), dir)
		if err != nil {
			tb.Fatal(err)
		}
		info := &PathInfo{Path: p, ContentHash: m.Hash(), Size: m.Size(), Registered: time.Now(), References: []Path{}}
		if i > 0 {
			info.References = append(info.References, paths[i-1])
			if i/2 != i-1 {
				info.References = append(info.References, paths[i/2])
			}
		}
		b, _ := encodeInfo(info)
		if err := os.WriteFile(s.manifestFile(p), m.Encode(), 0o600); err != nil {
			tb.Fatal(err)
		}
		if err := os.WriteFile(s.metaFile(p), b, 0o600); err != nil {
			tb.Fatal(err)
		}
	}
	return paths
}

// BenchmarkGC10000 collects a store of 10,000 paths. Paths reference their
// predecessor, so rooting path 5000 keeps paths 0..5000 and gc deletes the
// other 4,999 (each a directory with one file).
func BenchmarkGC10000(b *testing.B) {
	ctx := context.Background()
	for b.Loop() {
		b.StopTimer()
		s, err := Init(filepath.Join(b.TempDir(), "root"))
		if err != nil {
			b.Fatal(err)
		}
		paths := fabricate(b, s, 10000)
		if err := s.AddRoot(ctx, "half", paths[5000]); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		res, err := s.GC(ctx, GCOptions{})
		if err != nil {
			b.Fatal(err)
		}
		if len(res.Deleted) != 4999 {
			b.Fatalf("deleted %d, want 4999", len(res.Deleted))
		}
	}
}

// BenchmarkGC10000NothingToDo is the cost of a gc that only loads the graph
// of 10,000 live paths and decides to keep them all.
func BenchmarkGC10000NothingToDo(b *testing.B) {
	ctx := context.Background()
	s, err := Init(filepath.Join(b.TempDir(), "root"))
	if err != nil {
		b.Fatal(err)
	}
	paths := fabricate(b, s, 10000)
	if err := s.AddRoot(ctx, "all", paths[len(paths)-1]); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		res, err := s.GC(ctx, GCOptions{})
		if err != nil {
			b.Fatal(err)
		}
		if len(res.Deleted) != 0 {
			b.Fatalf("deleted %d", len(res.Deleted))
		}
	}
}
