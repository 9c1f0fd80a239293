package sandbox_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"toolshed.dev/shed/sandbox"
)

func tmpfsSpec(t testing.TB, argv ...string) *sandbox.Spec {
	t.Helper()
	return &sandbox.Spec{
		Root: sandbox.Root{Lowers: busyboxLowers(t), UpperTmpfs: true},
		Argv: argv,
		Env:  []string{"PATH=/bin", "HOME=/root"},
	}
}

func TestTmpfsUpper(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	var id [8]byte
	rand.Read(id[:])
	name := "shed-tmpfs-upper-" + hex.EncodeToString(id[:])
	lowersBefore := treeOf(t, busyboxLowers(t)...)

	// The command writes the file in several places, deletes a lower file, then waits: the host is
	// searched while the sandbox lives, and after.
	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdinW.Close()
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer outR.Close()
	script := `for d in / /etc /root /bin; do echo data > $d/` + name + ` || exit 1; done
		mkdir -p /var/lib/x && echo data > /var/lib/x/` + name + ` && rm /etc/lowerfile && echo written; read x; exit 0`
	p, err := sandbox.Start(context.Background(), tmpfsSpec(t, "sh", "-c", script), sandbox.Stdio{Stdin: stdinR, Stdout: outW, Stderr: outW})
	stdinR.Close()
	outW.Close()
	if err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(outR)
	if !lines.Scan() || lines.Text() != "written" {
		t.Fatalf("got %q, want written", lines.Text())
	}
	// The tmpfs is not attached anywhere, not even in the sandbox's own mount namespace: only the
	// overlay and the executor's own mounts are there (the boot id's file is on a tmpfs of its own).
	mi, err := os.ReadFile("/proc/" + strconv.Itoa(p.Pid) + "/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var points []string
	devs := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(mi)), "\n") {
		f := strings.Fields(l)
		points = append(points, f[4])
		devs[f[4]] = f[2]
	}
	for p, d := range devs {
		if p != sandbox.BootIDPath && d == devs[sandbox.BootIDPath] {
			t.Errorf("the boot id's file system (%s) is also mounted at %s", d, p)
		}
	}
	// (In the order of the mounts' making: /proc is made before the root, see setup.)
	slices.Sort(points)
	if want := []string{"/", "/dev", "/dev/pts", "/dev/shm", "/proc", sandbox.BootIDPath, "/run", "/tmp"}; !slices.Equal(points, want) {
		t.Errorf("sandbox's mount points: got %q, want %q", points, want)
	}
	searchHost := func(when string) {
		for _, dir := range []string{os.TempDir(), "/tmp", "/var/tmp", "/dev/shm", "/run"} {
			filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
				if err == nil && d.Name() == name {
					t.Errorf("%s: the sandbox's file is on the host at %s", when, p)
				}
				return nil
			})
		}
	}
	searchHost("while running")
	stdinW.Close()
	if code, err := p.Wait(); err != nil || code != 0 {
		t.Fatalf("got %d, %v", code, err)
	}
	searchHost("after")
	if after := treeOf(t, busyboxLowers(t)...); !slices.Equal(after, lowersBefore) {
		t.Errorf("the lowers changed:\nbefore %q\nafter  %q", lowersBefore, after)
	}
	// Each sandbox starts from the lowers again.
	r := run(t, tmpfsSpec(t, "sh", "-c", "ls /etc/"+name+" /"+name+" 2>&1; cat /etc/lowerfile"))
	if !strings.Contains(r.stdout, "No such file") || !strings.Contains(r.stdout, "delete me") {
		t.Errorf("second sandbox: got %q, want the first one's writes gone", r.stdout)
	}
}

// treeOf lists every path under dirs with its size.
func treeOf(t testing.TB, dirs ...string) []string {
	t.Helper()
	var all []string
	for _, d := range dirs {
		err := filepath.WalkDir(d, func(p string, e fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			info, err := e.Info()
			if err != nil {
				return err
			}
			all = append(all, p+" "+strconv.FormatInt(info.Size(), 10))
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return all
}

func TestTmpfsUpperSize(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	// (dd, not head: busybox's head reports any failed write as EIO.)
	script := `dd if=/dev/zero of=/root/half bs=512k count=1 2>/dev/null && echo half-ok; dd if=/dev/zero of=/root/big bs=1M count=2 && echo big-ok`
	spec := tmpfsSpec(t, "sh", "-c", script)
	spec.Root.UpperSize = 1 << 20
	r := run(t, spec)
	if !strings.Contains(r.stdout, "half-ok") || strings.Contains(r.stdout, "big-ok") || !strings.Contains(r.stderr, "No space left on device") {
		t.Errorf("1 MiB upper: got %q %q, want 512 KiB written and 2 MiB refused with ENOSPC", r.stdout, r.stderr)
	}
	// Without a size the same writes succeed: the test can tell.
	spec.Root.UpperSize = 0
	if r := run(t, spec); !strings.Contains(r.stdout, "big-ok") {
		t.Errorf("default size: got %q %q, want both written", r.stdout, r.stderr)
	}
}

func TestTmpfsUpperSingleLower(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	// One lower with a tmpfs upper is a writable overlay, not a read-only bind.
	spec := tmpfsSpec(t, "sh", "-c", "echo x > /etc/new && cat /etc/new /etc/which && grep ' / ' /proc/mounts")
	spec.Root.Lowers = busyboxLowers(t)[:1]
	r := run(t, spec)
	if !strings.HasPrefix(r.stdout, "x\nbottom\noverlay / overlay rw,nosuid,nodev") {
		t.Errorf("got %q %q", r.stdout, r.stderr)
	}
}
