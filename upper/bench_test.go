package upper

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// fill writes n bytes (files of 64 MiB, not zeros: nothing may be skipped as a hole) under dir and
// syncs them.
func fill(b testing.TB, dir string, n int64) {
	b.Helper()
	const file = 64 << 20
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(i*7 + i>>8)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	for i := int64(0); i*file < n; i++ {
		f, err := os.Create(filepath.Join(dir, fmt.Sprint("f", i)))
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close() // on a failure (the uppers must unmount)
		for w := int64(0); w < min(file, n-i*file); w += int64(len(buf)) {
			buf[0] = byte(w >> 20) // each MiB its own
			buf[1] = byte(i)
			if _, err := f.Write(buf); err != nil {
				b.Fatal(err)
			}
		}
		if err := f.Sync(); err != nil {
			b.Fatal(err)
		}
		f.Close()
	}
}

func names(prefix string, n int) []string {
	var s []string
	for i := range n {
		s = append(s, fmt.Sprintf("%s%d", prefix, i))
	}
	return s
}

// median runs fn n times and returns the median of its durations.
func median(n int, fn func() time.Duration) time.Duration {
	var d []time.Duration
	for range n {
		d = append(d, fn())
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return d[n/2]
}

var noQuotas = flag.Bool("upper.noquotas", false, "BenchmarkBranch without quotas (the baseline)")

// BenchmarkBranch: an upper of 1 GiB into 10 writable branches, and into one, beside the baseline, a
// `cp -a` of the same upper on the store root's filesystem (what copy mode does). The metric
// "x-cp" is how many times faster than that copy.
func BenchmarkBranch(b *testing.B) {
	needRoot(b)
	f, root := open(b, Options{Size: 3 << 30, noQuotas: *noQuotas})
	if err := f.Create("benches/src"); err != nil {
		b.Fatal(err)
	}
	// With quotas (-upper.noquotas: without), each upper charged to a user's group, as app does.
	charge := func(names ...string) {
		for _, n := range names {
			if f.Quotas() {
				if err := f.Charge(n, 1000); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	charge("benches/src")
	fill(b, filepath.Join(f.Dir("benches/src"), "upper/data"), 1<<30)
	plain := filepath.Join(root, "plain")
	fill(b, filepath.Join(plain, "src/upper/data"), 1<<30)
	cp := median(3, func() time.Duration {
		dst := filepath.Join(plain, "copy")
		unix.Sync() // each copy starts from a clean page cache's writeback, as a branch does
		start := time.Now()
		if out, err := exec.Command("cp", "-a", "--reflink=auto", filepath.Join(plain, "src"), dst).CombinedOutput(); err != nil {
			b.Fatalf("cp: %v: %s", err, out)
		}
		d := time.Since(start)
		os.RemoveAll(dst)
		return d
	})
	b.Logf("cp -a of 1 GiB on the store's filesystem: %v", cp)
	for _, n := range []int{1, 10} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			dsts := names("benches/b", n)
			var charging time.Duration
			for b.Loop() {
				if err := f.Branch("benches/src", dsts, false); err != nil {
					b.Fatal(err)
				}
				t0 := time.Now()
				charge(dsts...)
				charging += time.Since(t0)
				b.StopTimer()
				for _, d := range dsts {
					if err := f.Remove(d); err != nil {
						b.Fatal(err)
					}
				}
				f.reclaims.Wait()
				unix.Sync()
				b.StartTimer()
			}
			per := b.Elapsed() / time.Duration(b.N)
			b.ReportMetric(float64(cp)/float64(per), "x-cp")
			b.ReportMetric(float64(per)/1e6, "ms/branch")
			b.ReportMetric(float64(charging)/float64(b.N)/1e6, "ms/charges") // of those, Charge's
		})
	}
}

// BenchmarkOps: Create, a read-only snapshot, Remove of an upper of 64 MiB, Open when mounted, Open
// after an unmount.
func BenchmarkOps(b *testing.B) {
	needRoot(b)
	f, root := open(b, Options{})
	b.Run("Create", func(b *testing.B) {
		i := 0
		for b.Loop() {
			if err := f.Create(fmt.Sprint("benches/c", i)); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
	if err := f.Create("benches/src"); err != nil {
		b.Fatal(err)
	}
	fill(b, filepath.Join(f.Dir("benches/src"), "upper/data"), 64<<20)
	b.Run("Snapshot", func(b *testing.B) {
		i := 0
		for b.Loop() {
			if err := f.Branch("benches/src", []string{fmt.Sprint("snapshots/s", i)}, true); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
	b.Run("Remove", func(b *testing.B) {
		for b.Loop() {
			b.StopTimer()
			if err := f.Branch("benches/src", []string{"benches/r"}, false); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			if err := f.Remove("benches/r"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("OpenMounted", func(b *testing.B) {
		for b.Loop() {
			if _, err := Open(root, Options{}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("OpenUnmounted", func(b *testing.B) {
		dir := filepath.Join(root, dirName)
		for b.Loop() {
			b.StopTimer()
			unmount(b, dir)
			b.StartTimer()
			if _, err := Open(root, Options{}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkWrite: 256 MiB written and synced into the uppers, the image attached with direct I/O
// (the default) and without.
func BenchmarkWrite(b *testing.B) {
	needRoot(b)
	for _, buffered := range []bool{false, true} {
		b.Run(map[bool]string{false: "direct", true: "buffered"}[buffered], func(b *testing.B) {
			f, _ := open(b, Options{Size: 1 << 30, bufferedIO: buffered})
			if err := f.Create("benches/a"); err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				fill(b, filepath.Join(f.Dir("benches/a"), "upper/data"), 256<<20)
				b.StopTimer()
				if err := os.RemoveAll(filepath.Join(f.Dir("benches/a"), "upper/data")); err != nil {
					b.Fatal(err)
				}
				unix.Sync()
				b.StartTimer()
			}
			b.SetBytes(256 << 20)
		})
	}
}

// BenchmarkBranchFiles1000000: a snapshot, a writable branch and a Remove of an upper holding a
// million files (empty, 1000 a directory), which cost what they cost for an empty one on btrfs.
// `make bench-scale` runs it (SHED_BENCH_SCALE=1): making the files takes minutes.
func BenchmarkBranchFiles1000000(b *testing.B) {
	needRoot(b)
	if os.Getenv("SHED_BENCH_SCALE") == "" {
		b.Skip("making a million files takes minutes: SHED_BENCH_SCALE=1 (make bench-scale) runs it")
	}
	files := 1000000
	if n := os.Getenv("UPPER_FILES"); n != "" {
		fmt.Sscan(n, &files)
	}
	f, _ := open(b, Options{Size: max(1<<30, int64(files)*4096)})
	if err := f.Create("benches/src"); err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	up := filepath.Join(f.Dir("benches/src"), "upper")
	for d := 0; d < files/1000; d++ {
		dir := filepath.Join(up, fmt.Sprint(d))
		if err := os.Mkdir(dir, 0o755); err != nil {
			b.Fatal(err)
		}
		fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			b.Fatal(err)
		}
		for i := 0; i < 1000; i++ {
			w, err := unix.Openat(fd, fmt.Sprint(i), unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
			if err != nil {
				b.Fatal(err)
			}
			unix.Close(w)
		}
		unix.Close(fd)
	}
	b.Logf("made %d files in %v", files, time.Since(start))
	// The first snapshot commits what was written and not yet synced: in a running Bench, its cost
	// is that of the writes since the last commit, not of the files it holds. Flush does it before.
	if os.Getenv("UPPER_FLUSH") != "" {
		t0 := time.Now()
		if err := f.Flush(); err != nil {
			b.Fatal(err)
		}
		b.Logf("Flush of %d files just made: %v", files, time.Since(t0))
	}
	t0 := time.Now()
	if err := f.Branch("benches/src", []string{"snapshots/first"}, true); err != nil {
		b.Fatal(err)
	}
	b.Logf("first snapshot, of %d files just made: %v", files, time.Since(t0))
	for b.Loop() {
		t0 := time.Now()
		if err := f.Branch("benches/src", []string{"snapshots/s"}, true); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := f.Branch("benches/src", []string{"benches/b"}, false); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		for _, n := range []string{"snapshots/s", "benches/b"} {
			if err := f.Remove(n); err != nil {
				b.Fatal(err)
			}
		}
		t3 := time.Now()
		b.ReportMetric(float64(t1.Sub(t0))/1e6, "ms/snapshot")
		b.ReportMetric(float64(t2.Sub(t1))/1e6, "ms/branch")
		b.ReportMetric(float64(t3.Sub(t2))/2e6, "ms/remove")
		b.StopTimer()
		f.reclaims.Wait()
		b.StartTimer()
	}
}
