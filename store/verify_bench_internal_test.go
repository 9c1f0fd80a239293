package store

import (
	"bytes"
	"context"
	bolt "go.etcd.io/bbolt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/zeebo/blake3"
)

// A verifyShape is a store to verify: paths, each of files of these sizes.
type verifyShape struct {
	paths int
	sizes []int // the files of each path, bin/f0, bin/f1, ...
}

// The two shapes of issue 15: a few big paths (1 GiB) and many small ones.
// The benchmark uses 10,000 small paths to stay short; scripts/bench-verify.sh
// runs the 100,000 of the issue through the CLI (TestWriteBenchStore).
var (
	shapeBig   = verifyShape{paths: 4, sizes: []int{128 << 20, 128 << 20}}
	shapeSmall = verifyShape{paths: 10000, sizes: []int{1 << 10, 3 << 10}}
)

// writeVerifyStore writes shape's paths straight into s, registered, without
// the fsyncs of register, and returns the files it wrote. Every file's bytes
// differ (a seeded random stream), so no two paths have the same content.
// sign, if not nil, makes each path's provenance. It is apart from fabricate
// (gc's graph) on purpose: only verify reads it.
func writeVerifyStore(tb testing.TB, s *Store, shape verifyShape, sign func(*PathInfo) ([]byte, error)) []string {
	tb.Helper()
	r := rand.New(rand.NewPCG(15, uint64(shape.paths)))
	largest := 0
	for _, n := range shape.sizes {
		largest = max(largest, n)
	}
	data := make([]byte, largest)
	var files []string
	records := map[string][]byte{}
	for i := range shape.paths {
		p, err := MakePath("output", "verify-"+strconv.Itoa(i), s.StoreDir(), "verify-"+strconv.Itoa(i))
		if err != nil {
			tb.Fatal(err)
		}
		dir := s.Location(p)
		if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
			tb.Fatal(err)
		}
		for k, n := range shape.sizes {
			for j := 0; j+8 <= n; j += 8 {
				v := r.Uint64()
				data[j], data[j+1], data[j+2], data[j+3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
				data[j+4], data[j+5], data[j+6], data[j+7] = byte(v>>32), byte(v>>40), byte(v>>48), byte(v>>56)
			}
			f := filepath.Join(dir, "bin", "f"+strconv.Itoa(k))
			if err := os.WriteFile(f, data[:n], 0o755); err != nil {
				tb.Fatal(err)
			}
			files = append(files, f)
		}
		m, err := ScanTree(context.Background(), dir)
		if err != nil {
			tb.Fatal(err)
		}
		info := &PathInfo{Path: p, ContentHash: m.Hash(), Size: m.Size(), Registered: time.Now(), References: []Path{}}
		if err := os.MkdirAll(s.shardDir(p), 0o700); err != nil {
			tb.Fatal(err)
		}
		if err := os.WriteFile(s.manifestFile(p), m.Encode(), 0o600); err != nil {
			tb.Fatal(err)
		}
		if sign != nil {
			prov, err := sign(info)
			if err != nil {
				tb.Fatal(err)
			}
			if err := os.WriteFile(s.provenanceFile(p), prov, 0o600); err != nil {
				tb.Fatal(err)
			}
		}
		records[p.HashPart()] = encodeInfo(info, sign != nil)
	}
	// The records in one commit, as fabricate writes them.
	err := s.withDB(context.Background(), true, func(b *bolt.Bucket) error {
		for k, v := range records {
			if err := b.Put([]byte(k), v); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	return files
}

// BenchmarkVerifyShapes verifies the contents of a store of each shape and,
// in the same run, hashes the same files without a manifest: "b3sum" is the
// b3sum command (b3sum --num-threads 2, file names on its command line; skipped
// if it is not installed), "hash-only" is this package's BLAKE3 in 2 workers
// reading each file whole. The ratio of verify to either is the figure.
// Reported: MB/s and, for verify, B/op divided by paths (B/path).
func BenchmarkVerifyShapes(b *testing.B) {
	for _, c := range []struct {
		name  string
		shape verifyShape
	}{{"big", shapeBig}, {"small", shapeSmall}} {
		b.Run(c.name, func(b *testing.B) {
			s, err := Init(filepath.Join(b.TempDir(), "root"))
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			files := writeVerifyStore(b, s, c.shape, nil)
			var total int64
			for _, n := range c.shape.sizes {
				total += int64(n) * int64(c.shape.paths)
			}
			b.Run("verify", func(b *testing.B) {
				b.SetBytes(total)
				b.ReportAllocs()
				var m0, m1 runtime.MemStats
				runtime.ReadMemStats(&m0)
				n := 0
				for b.Loop() {
					res, err := s.Verify(context.Background(), VerifyOptions{CheckContents: true})
					if err != nil || len(res.Problems) > 0 || res.Checked != c.shape.paths {
						b.Fatal(err, res)
					}
					n++
				}
				runtime.ReadMemStats(&m1)
				b.ReportMetric(float64(m1.TotalAlloc-m0.TotalAlloc)/float64(n)/float64(c.shape.paths), "B/path")
			})
			b.Run("hash-only", func(b *testing.B) {
				b.SetBytes(total)
				for b.Loop() {
					hashFiles(b, files)
				}
			})
			b.Run("b3sum", func(b *testing.B) {
				if _, err := exec.LookPath("b3sum"); err != nil {
					b.Skip("b3sum is not installed (apt-get install b3sum)")
				}
				b.SetBytes(total)
				for b.Loop() {
					// xargs's batches: one b3sum per 5,000 names.
					for i := 0; i < len(files); i += 5000 {
						args := append([]string{"--num-threads", "2"}, files[i:min(i+5000, len(files))]...)
						cmd := exec.Command("b3sum", args...)
						var errb bytes.Buffer
						cmd.Stdout, cmd.Stderr = nil, &errb
						if err := cmd.Run(); err != nil {
							b.Fatal(err, errb.String())
						}
					}
				}
			})
		})
	}
}

// hashFiles hashes files in 2 workers, each file read whole: the least a
// content check of the same bytes costs in Go.
func hashFiles(b *testing.B, files []string) {
	work := make(chan string, 64)
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			h := blake3.New()
			buf := make([]byte, 1<<20)
			for name := range work {
				f, err := os.Open(name)
				if err != nil {
					b.Error(err)
					continue
				}
				h.Reset()
				for {
					k, _ := f.Read(buf)
					if k == 0 {
						break
					}
					h.Write(buf[:k])
				}
				f.Close()
				h.Sum(nil)
			}
		})
	}
	for _, f := range files {
		work <- f
	}
	close(work)
	wg.Wait()
}
