package store

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// fabricate writes n registered paths straight to disk and into db/meta.db,
// without the fsyncs of register (which would make setting up 10,000 paths
// take minutes). Path i references paths i-1 and i/2, so the graph has long
// chains and sharing. Each path is a directory with one file (bin/tool), or,
// with files, one file (as .debs and .drvs are): the 1M-path benchmark uses
// files so that its store fits a test machine (two inodes a path, not four).
func fabricate(tb testing.TB, s *Store, n int, files bool) []Path {
	tb.Helper()
	paths := make([]Path, n)
	for i := range n {
		p, err := MakePath("output", strconv.Itoa(i), s.StoreDir(), "synthetic-"+strconv.Itoa(i))
		if err != nil {
			tb.Fatal(err)
		}
		paths[i] = p
	}
	records := make([][]byte, n)
	// Every path has the same content (so one scan gives every manifest);
	// their names, and so their hash parts, differ.
	content := []byte("tool\n")
	write := func(loc string) error {
		if files {
			return os.WriteFile(loc, content, 0o755)
		}
		if err := os.MkdirAll(filepath.Join(loc, "bin"), 0o755); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(loc, "bin", "tool"), content, 0o755)
	}
	if err := write(s.Location(paths[0])); err != nil {
		tb.Fatal(err)
	}
	m, err := ScanTree(context.Background(), s.Location(paths[0]))
	if err != nil {
		tb.Fatal(err)
	}
	manifest := m.Encode()
	for _, p := range paths {
		if err := os.MkdirAll(s.shardDir(p), 0o700); err != nil {
			tb.Fatal(err)
		}
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 1)
	fail := func(err error) {
		select {
		case errs <- err:
		default:
		}
	}
	for range 2 * runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				p := paths[i]
				if i > 0 {
					if err := write(s.Location(p)); err != nil {
						fail(err)
						return
					}
				}
				info := &PathInfo{Path: p, ContentHash: m.Hash(), Size: m.Size(), Registered: time.Now(), References: []Path{}}
				if i > 0 {
					info.References = append(info.References, paths[i-1])
					if i/2 != i-1 {
						info.References = append(info.References, paths[i/2])
					}
				}
				records[i] = encodeInfo(info, false)
				if err := os.WriteFile(s.manifestFile(p), manifest, 0o600); err != nil {
					fail(err)
					return
				}
			}
		})
	}
	wg.Wait()
	select {
	case err := <-errs:
		tb.Fatal(err)
	default:
	}
	for start := 0; start < n; start += 50000 {
		err := s.withDB(context.Background(), true, func(b *bolt.Bucket) error {
			for i := start; i < min(start+50000, n); i++ {
				if err := b.Put([]byte(paths[i].HashPart()), records[i]); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			tb.Fatal(err)
		}
	}
	return paths
}

// benchGC collects a store of n paths. Paths reference their predecessor, so
// rooting path n/2 keeps paths 0..n/2 and gc deletes the other n/2-1. Besides
// the time of the whole gc it reports, per path of the store, what a dry run
// (deciding what is dead, nothing deleted) takes, the time per deleted path,
// and the peak heap of the gc (sampled every millisecond, above the heap
// before it): all of it, garbage not collected yet included, and what the
// last collection found live.
func benchGC(b *testing.B, n int, files bool) {
	ctx := context.Background()
	var decide, total time.Duration
	var peak, peakLive uint64
	for b.Loop() {
		b.StopTimer()
		s, err := Init(filepath.Join(b.TempDir(), "root"))
		if err != nil {
			b.Fatal(err)
		}
		paths := fabricate(b, s, n, files)
		if err := s.AddRoot(ctx, "half", paths[n/2]); err != nil {
			b.Fatal(err)
		}
		// On disk, as a store's paths are: removing a file whose blocks are
		// not written yet costs a hundredth of removing one that is, here.
		if err := SyncTree(s.Root()); err != nil {
			b.Fatal(err)
		}
		t0 := time.Now()
		if res, err := s.GC(ctx, GCOptions{DryRun: true}); err != nil || len(res.Deleted) != n/2-1 {
			b.Fatalf("dry run: %v, %d deleted", err, len(res.Deleted))
		}
		decide += time.Since(t0)
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		base := ms.HeapAlloc
		stop := make(chan struct{})
		sampled := make(chan [2]uint64)
		go func() {
			var max, maxLive uint64
			t := time.NewTicker(time.Millisecond)
			defer t.Stop()
			live := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
			for {
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				if ms.HeapAlloc > base && ms.HeapAlloc-base > max {
					max = ms.HeapAlloc - base
				}
				metrics.Read(live)
				if v := live[0].Value.Uint64(); v > base && v-base > maxLive {
					maxLive = v - base
				}
				select {
				case <-stop:
					sampled <- [2]uint64{max, maxLive}
					return
				case <-t.C:
				}
			}
		}()
		t0 = time.Now()
		b.StartTimer()
		res, err := s.GC(ctx, GCOptions{})
		b.StopTimer()
		total += time.Since(t0)
		close(stop)
		got := <-sampled
		peak, peakLive = max(peak, got[0]), max(peakLive, got[1])
		if err != nil {
			b.Fatal(err)
		}
		if len(res.Deleted) != n/2-1 {
			b.Fatalf("deleted %d, want %d", len(res.Deleted), n/2-1)
		}
		os.RemoveAll(s.Root())
		b.StartTimer()
	}
	b.ReportMetric(float64(decide.Milliseconds())/float64(b.N), "decide-ms")
	b.ReportMetric(float64(total.Microseconds())/float64(b.N)/float64(n/2-1), "µs/deleted")
	b.ReportMetric(float64(peak)/float64(n), "peak-heap-B/path")
	b.ReportMetric(float64(peakLive)/float64(n), "peak-live-B/path")
}

// scaleBench skips the benchmarks that make a store of more than 10,000 paths
// unless SHED_BENCH_SCALE is set (make bench-scale): making the store of
// 100,000 paths takes about a minute here, that of 1,000,000 ten.
func scaleBench(b *testing.B) {
	if os.Getenv("SHED_BENCH_SCALE") == "" {
		b.Skip("set SHED_BENCH_SCALE=1 (make bench-scale) to make a store this large")
	}
}

// BenchmarkGC10000 collects a store of 10,000 paths, each a directory with one
// file, deleting 4,999.
func BenchmarkGC10000(b *testing.B) { benchGC(b, 10000, false) }

// BenchmarkGC100000 is BenchmarkGC10000 at 100,000 paths (49,999 deleted).
func BenchmarkGC100000(b *testing.B) { scaleBench(b); benchGC(b, 100000, false) }

// BenchmarkGCFiles10000 and the next two are the scale series: stores of
// single-file paths at 10,000, 100,000 and 1,000,000 paths.
func BenchmarkGCFiles10000(b *testing.B)   { benchGC(b, 10000, true) }
func BenchmarkGCFiles100000(b *testing.B)  { scaleBench(b); benchGC(b, 100000, true) }
func BenchmarkGCFiles1000000(b *testing.B) { scaleBench(b); benchGC(b, 1000000, true) }

// BenchmarkGC10000NothingToDo is the cost of a gc that only loads the graph
// of 10,000 live paths and decides to keep them all.
func BenchmarkGC10000NothingToDo(b *testing.B) {
	ctx := context.Background()
	s, err := Init(filepath.Join(b.TempDir(), "root"))
	if err != nil {
		b.Fatal(err)
	}
	paths := fabricate(b, s, 10000, false)
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
