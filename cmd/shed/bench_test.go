package main

import (
	"io"
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkInstantiateWarm is `shed instantiate` of a three-layer recipe whose
// .drv files are already in the store (the common case), run in process.
func BenchmarkInstantiateWarm(b *testing.B) {
	dir := b.TempDir()
	root := filepath.Join(dir, "root")
	file := filepath.Join(dir, "workshop.toml")
	os.WriteFile(file, []byte(`name = "tools"
seed = "debian/bookworm"
[apt]
packages = ["jq", "curl", "python3-pip"]
[pip]
packages = ["attrs==23.1.0", "requests"]
`), 0o644)
	if code := run([]string{"shed", "--root", root, "init"}, io.Discard, os.Stderr); code != 0 {
		b.Fatal("init failed")
	}
	args := []string{"shed", "--root", root, "instantiate", file}
	if code := run(args, io.Discard, os.Stderr); code != 0 {
		b.Fatal("instantiate failed")
	}
	for b.Loop() {
		if code := run(args, io.Discard, os.Stderr); code != 0 {
			b.Fatal("instantiate failed")
		}
	}
}
