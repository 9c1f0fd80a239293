package store_test

import (
	"context"
	"crypto/rand"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"toolshed.dev/shed/store"
	"toolshed.dev/shed/trust"
)

// BenchmarkVerifyContents re-hashes a store holding one 256 MB path of 512
// files (a mid-sized layer), reporting MB/s. Its baseline, in the same run, is
// reading the same files and throwing the bytes away: "verify at disk speed"
// means the ratio of the two is close to 1.
func BenchmarkVerifyContents(b *testing.B) {
	ctx := context.Background()
	s, err := store.Init(filepath.Join(b.TempDir(), "root"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	src := b.TempDir()
	buf := make([]byte, 512<<10)
	var total int64
	for i := range 512 {
		rand.Read(buf)
		if err := os.WriteFile(filepath.Join(src, "f"+strconv.Itoa(i)), buf, 0o644); err != nil {
			b.Fatal(err)
		}
		total += int64(len(buf))
	}
	info, err := s.AddDir(ctx, src, "layer", nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("baseline-read", func(b *testing.B) {
		b.SetBytes(total)
		for b.Loop() {
			ents, _ := os.ReadDir(s.Location(info.Path))
			var wg sync.WaitGroup
			work := make(chan string)
			for range runtime.GOMAXPROCS(0) {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for name := range work {
						f, err := os.Open(name)
						if err != nil {
							b.Error(err)
							continue
						}
						io.Copy(io.Discard, f)
						f.Close()
					}
				}()
			}
			for _, e := range ents {
				work <- filepath.Join(s.Location(info.Path), e.Name())
			}
			close(work)
			wg.Wait()
		}
	})
	b.Run("verify", func(b *testing.B) {
		b.SetBytes(total)
		for b.Loop() {
			res, err := s.Verify(ctx, store.VerifyOptions{CheckContents: true})
			if err != nil || len(res.Problems) > 0 {
				b.Fatal(err, res.Problems)
			}
		}
	})
}

// TestWriteBenchStore writes a store for scripts/bench-verify.sh, signed with
// a key of its own as `shed init` would make it, when SHED_BENCH_STORE names
// a directory that does not exist yet; SHED_BENCH_SHAPE is "big" (4 paths,
// 1 GiB) or a number of small paths. It is skipped otherwise.
func TestWriteBenchStore(t *testing.T) {
	root := os.Getenv("SHED_BENCH_STORE")
	if root == "" {
		t.Skip("SHED_BENCH_STORE is not set")
	}
	shape := os.Getenv("SHED_BENCH_SHAPE")
	n, err := strconv.Atoi(shape)
	if shape != "big" && (err != nil || n <= 0) {
		t.Fatalf("SHED_BENCH_SHAPE=%q, want big or a number of paths", shape)
	}
	s, err := store.Init(root)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	key, _, err := trust.OpenKeys(root).Ensure("bench-verify-1")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	store.WriteBenchStore(t, s, shape == "big", n, func(info *store.PathInfo) ([]byte, error) {
		return trust.Sign(key, trust.New(s.StoreDir(), info, nil, "bench", key.Public(), now))
	})
}
