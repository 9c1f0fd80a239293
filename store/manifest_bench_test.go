package store_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"toolshed.dev/shed/store"
)

// makeBenchTree writes n files of mixed sizes, like a package tree: mostly
// small files and a few large ones, about total bytes in all.
func makeBenchTree(b *testing.B, dir string, n int, total int64) int64 {
	b.Helper()
	r := rand.New(rand.NewPCG(1, 2))
	big := n / 20
	smallBytes := int64(n-big) * 8 << 10 // small files average 8 KiB
	bigSize := (total - smallBytes) / int64(big)
	data := make([]byte, bigSize+16<<10)
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	var sum int64
	for i := range n {
		size := int64(r.IntN(16 << 10))
		if i%20 == 0 {
			size = bigSize
		}
		p := filepath.Join(dir, fmt.Sprintf("d%02d", i%50), fmt.Sprintf("f%04d", i))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			b.Fatal(err)
		}
		off := r.IntN(16 << 10)
		if err := os.WriteFile(p, data[off:int64(off)+size], 0o644); err != nil {
			b.Fatal(err)
		}
		sum += size
	}
	return sum
}

// BenchmarkScanTree measures ScanTree over 2,000 files, about 200 MB, read
// from the page cache: this is the hashing rate, the ceiling for disk reads.
func BenchmarkScanTree(b *testing.B) {
	dir := b.TempDir()
	size := makeBenchTree(b, dir, 2000, 200<<20)
	b.SetBytes(size)
	b.ResetTimer()
	for b.Loop() {
		if _, err := store.ScanTree(context.Background(), dir); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkHashLargeFile measures ScanTree of one 256 MiB file, which one
// worker hashes alone.
func BenchmarkHashLargeFile(b *testing.B) {
	p := filepath.Join(b.TempDir(), "big")
	data := make([]byte, 256<<20)
	r := rand.New(rand.NewPCG(3, 4))
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	if err := os.WriteFile(p, data, 0o644); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	for b.Loop() {
		if _, err := store.ScanTree(context.Background(), p); err != nil {
			b.Fatal(err)
		}
	}
}
