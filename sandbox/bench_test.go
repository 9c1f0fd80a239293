package sandbox_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"toolshed.dev/shed/sandbox"
)

// BenchmarkRunTrue is a warm launch of /bin/true: a busybox root of 2 lowers with an upper, end to end
// (Run returns after the whole sandbox is gone). Compare with BenchmarkFloor in the same run.
func BenchmarkRunTrue(b *testing.B) {
	requireRoot(b)
	spec, _ := writableSpec(b, "/bin/true")
	ctx := context.Background()
	if _, err := sandbox.Run(ctx, spec, sandbox.Stdio{}); err != nil { // warm the sealed copy
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		code, err := sandbox.Run(ctx, spec, sandbox.Stdio{})
		if err != nil || code != 0 {
			b.Fatalf("run: code %d, %v", code, err)
		}
	}
}

// BenchmarkFloor runs testdata/floor.c (a copy of shared/bench/floor.c), the bare C floor for the same
// launch: namespaces, tmpfs upper, overlay of the same 2 lowers, /proc, /dev, /tmp, chroot, exec.
func BenchmarkFloor(b *testing.B) {
	requireRoot(b)
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		b.Fatal("gcc not found: apt-get install gcc")
	}
	dir := b.TempDir()
	floor := filepath.Join(dir, "floor")
	if out, err := exec.Command(gcc, "-O2", "-o", floor, "testdata/floor.c").CombinedOutput(); err != nil {
		b.Fatalf("compile floor.c: %v\n%s", err, out)
	}
	work := filepath.Join(dir, "work")
	if err := os.Mkdir(work, 0o755); err != nil {
		b.Fatal(err)
	}
	lowers := busyboxLowers(b)
	// floor takes overlay's order, top first.
	arg := lowers[1] + ":" + lowers[0]
	b.ResetTimer()
	for b.Loop() {
		if out, err := exec.Command(floor, work, arg, "/bin/true").CombinedOutput(); err != nil {
			b.Fatalf("floor: %v\n%s", err, strings.TrimSpace(string(out)))
		}
	}
}

var _ = time.Second
