package sandbox_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	"toolshed.dev/shed/sandbox"
)

// The launch benchmarks: read them as ratios, BenchmarkRunTrue/X against BenchmarkFloor/Y, in one run.
//
//	busybox               the brief's case: busybox root of 2 lowers, upper in a temp dir (on disk)
//	busybox-tmpfs-upper   same with the upper on a tmpfs of the caller's, as the floor has it
//	tmpfs-upper-internal  same with Root.UpperTmpfs: the tmpfs is init's own
//	bench-profile         tmpfs-upper-internal with a Control socket, as Benches run
//	bench-pausable        bench-profile, Pausable: its freezer cgroup's mkdir and rmdir
//	glibc-tmpfs-upper     /usr/bin/true of the host (dynamic, like Debian's) in a third lower
//
// Each iteration is a whole launch: Run returns after every process of the sandbox is gone.

func BenchmarkRunTrue(b *testing.B) {
	requireRoot(b)
	for _, c := range []struct {
		name          string
		glibc         bool
		tmpfsUpper    bool
		internalTmpfs bool
		bench         bool
		pausable      bool
	}{
		{"busybox", false, false, false, false, false},
		{"busybox-tmpfs-upper", false, true, false, false, false},
		{"tmpfs-upper-internal", false, false, true, false, false},
		{"bench-profile", false, false, true, true, false},
		{"bench-pausable", false, false, true, true, true},
		{"glibc-tmpfs-upper", true, true, false, false, false},
	} {
		b.Run(c.name, func(b *testing.B) {
			lowers, argv := busyboxLowers(b), "/bin/true"
			if c.glibc {
				lowers, argv = append(lowers, glibcLower(b)), "/usr/bin/true"
			}
			dir := b.TempDir()
			if c.tmpfsUpper {
				dir = tmpfsDir(b)
			}
			upper, work := filepath.Join(dir, "upper"), filepath.Join(dir, "work")
			for _, d := range []string{upper, work} {
				if err := os.Mkdir(d, 0o755); err != nil {
					b.Fatal(err)
				}
			}
			spec := &sandbox.Spec{Root: sandbox.Root{Lowers: lowers, Upper: upper, Work: work}, Argv: []string{argv}}
			if c.internalTmpfs {
				spec.Root = sandbox.Root{Lowers: lowers, UpperTmpfs: true}
			}
			if c.bench {
				spec.Control = filepath.Join(b.TempDir(), "control.sock")
			}
			spec.Pausable = c.pausable
			ctx := context.Background()
			// The first Start of a process makes the sealed handle of the binary (BenchmarkSealedSelf).
			if code, err := sandbox.Run(ctx, spec, sandbox.Stdio{}); err != nil || code != 0 {
				b.Fatalf("run: code %d, %v", code, err)
			}
			b.ResetTimer()
			for b.Loop() {
				if code, err := sandbox.Run(ctx, spec, sandbox.Stdio{}); err != nil || code != 0 {
					b.Fatalf("run: code %d, %v", code, err)
				}
			}
		})
	}
}

// BenchmarkFloor runs testdata/floor.c (a copy of shared/bench/floor.c), the bare C floor of the same
// launch: namespaces, a tmpfs upper, an overlay of the same lowers, /proc, /dev, /tmp, chroot, exec.
func BenchmarkFloor(b *testing.B) {
	requireRoot(b)
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		b.Fatal("gcc not found: apt-get install gcc")
	}
	floor := filepath.Join(b.TempDir(), "floor")
	if out, err := exec.Command(gcc, "-O2", "-o", floor, "testdata/floor.c").CombinedOutput(); err != nil {
		b.Fatalf("compile floor.c: %v\n%s", err, out)
	}
	for _, c := range []struct {
		name  string
		glibc bool
	}{{"busybox", false}, {"glibc", true}} {
		b.Run(c.name, func(b *testing.B) {
			lowers, argv := busyboxLowers(b), "/bin/true"
			if c.glibc {
				lowers, argv = append(lowers, glibcLower(b)), "/usr/bin/true"
			}
			// floor takes overlay's order, top first.
			var top []string
			for i := len(lowers) - 1; i >= 0; i-- {
				top = append(top, lowers[i])
			}
			work := b.TempDir()
			for b.Loop() {
				if out, err := exec.Command(floor, work, strings.Join(top, ":"), argv).CombinedOutput(); err != nil {
					b.Fatalf("floor: %v\n%s", err, out)
				}
			}
		})
	}
}

// tmpfsDir returns a fresh directory on a tmpfs mounted for the benchmark.
func tmpfsDir(b *testing.B) string {
	d := b.TempDir()
	if err := unix.Mount("tmpfs", d, "tmpfs", 0, "size=64m"); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { unix.Unmount(d, unix.MNT_DETACH) })
	return d
}

// glibcLower returns a lower holding the host's /usr/bin/true with its dynamic loader and libraries,
// at their paths, so that launching it costs what it costs on a Debian root.
func glibcLower(b *testing.B) string {
	b.Helper()
	dir := b.TempDir()
	out, err := exec.Command("ldd", "/usr/bin/true").Output()
	if err != nil {
		b.Fatalf("ldd /usr/bin/true: %v", err)
	}
	files := []string{"/usr/bin/true"}
	for _, f := range strings.Fields(string(out)) {
		if strings.HasPrefix(f, "/") {
			files = append(files, f)
		}
	}
	for _, f := range files {
		real, err := filepath.EvalSymlinks(f)
		if err != nil {
			b.Fatal(err)
		}
		data, err := os.ReadFile(real)
		if err != nil {
			b.Fatal(err)
		}
		dst := filepath.Join(dir, f)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(dst, data, 0o755); err != nil {
			b.Fatal(err)
		}
	}
	return dir
}

// BenchmarkExec is one Exec of /bin/true into a running sandbox (bench-profile): connect, send, fork and
// exec by init, reap, answer.
func BenchmarkExec(b *testing.B) {
	requireRoot(b)
	spec := &sandbox.Spec{
		Root:    sandbox.Root{Lowers: busyboxLowers(b), UpperTmpfs: true},
		Argv:    []string{"/bin/sleep", "1000"},
		Control: filepath.Join(b.TempDir(), "control.sock"),
	}
	ctx, cancel := context.WithCancel(context.Background())
	p, err := sandbox.Start(ctx, spec, sandbox.Stdio{})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Wait()
	defer cancel()
	req := sandbox.ExecRequest{Argv: []string{"/bin/true"}}
	for b.Loop() {
		if code, err := sandbox.Exec(ctx, spec.Control, req, sandbox.Stdio{}); err != nil || code != 0 {
			b.Fatalf("exec: code %d, %v", code, err)
		}
	}
}
