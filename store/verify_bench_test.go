package store_test

import (
	"context"
	"crypto/rand"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"toolshed.dev/shed/store"
)

// BenchmarkVerifyContents re-hashes a store holding one 256 MB path of 512
// files (a mid-sized layer), reporting MB/s.
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
	if _, err := s.AddDir(ctx, src, "layer", nil); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(total)
	for b.Loop() {
		res, err := s.Verify(ctx, store.VerifyOptions{CheckContents: true})
		if err != nil || len(res.Problems) > 0 {
			b.Fatal(err, res.Problems)
		}
	}
}
