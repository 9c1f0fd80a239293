package sandbox_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"toolshed.dev/shed/sandbox"
)

// TestPrestart: an init started before its spec runs it as Start would, with every kind of
// descriptor sent after its start: 230 bind trees (more than one frame of SCM_RIGHTS), a cgroup's
// files, a control socket.
func TestPrestart(t *testing.T) {
	requireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out, errb bytes.Buffer
	pd, err := sandbox.Prestart(ctx, sandbox.Stdio{Stdout: &out, Stderr: &errb})
	if err != nil {
		t.Fatal(err)
	}
	defer pd.Close()
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "f"), []byte("x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	spec := readOnlySpec(t, "sh", "-c", `cat /tmp/b0/f /tmp/b229/f; grep -c ' /tmp/b' /proc/mounts; grep -c :/toolshed/ /proc/self/cgroup`)
	for i := range 230 {
		spec.Binds = append(spec.Binds, sandbox.Bind{Source: src, Target: fmt.Sprintf("/tmp/b%d", i)})
	}
	spec.Limits.Pids = 16
	spec.Control = filepath.Join(t.TempDir(), "control.sock")
	time.Sleep(50 * time.Millisecond) // init is waiting by now, not still starting
	p, err := pd.Start(spec)
	if err != nil {
		t.Fatalf("start: %v (stderr %q)", err, errb.String())
	}
	if code, err := p.Wait(); code != 0 || err != nil {
		t.Fatalf("exit %d, %v (stderr %q)", code, err, errb.String())
	}
	if got := out.String(); got != "x\nx\n230\n1\n" {
		t.Errorf("got %q, want both binds read, 230 bind mounts and one cgroup (pids)", got)
	}
	if _, err := pd.Start(spec); err == nil || !strings.Contains(err.Error(), "already used") {
		t.Errorf("a second Start: %v, want refused", err)
	}
}

// TestPrestartEnds: a pending init that is closed, or given a spec that is not valid, is gone when
// the call returns.
func TestPrestartEnds(t *testing.T) {
	requireRoot(t)
	gone := func(pd *sandbox.Pending) {
		t.Helper()
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pd.Pid)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("init %d still exists: %v", pd.Pid, err)
		}
	}
	pd, err := sandbox.Prestart(context.Background(), sandbox.Stdio{})
	if err != nil {
		t.Fatal(err)
	}
	pd.Close()
	gone(pd)
	pd.Close() // again: nothing

	pd, err = sandbox.Prestart(context.Background(), sandbox.Stdio{})
	if err != nil {
		t.Fatal(err)
	}
	var specErr *sandbox.SpecError
	if _, err := pd.Start(&sandbox.Spec{}); !errors.As(err, &specErr) {
		t.Errorf("an empty spec: %v, want a *SpecError", err)
	}
	gone(pd)

	// An init that died while it waited: Start says so, and leaves nothing.
	pd, err = sandbox.Prestart(context.Background(), sandbox.Stdio{})
	if err != nil {
		t.Fatal(err)
	}
	syscall.Kill(pd.Pid, syscall.SIGKILL)
	spec := readOnlySpec(t, "true")
	spec.Binds = []sandbox.Bind{{Source: t.TempDir(), Target: "/tmp/b"}}
	var setupErr *sandbox.SetupError
	if _, err := pd.Start(spec); !errors.As(err, &setupErr) {
		t.Errorf("start of a dead init: %v, want a *SetupError", err)
	}
	gone(pd)
}

// TestPrestartLateStdio: an init started with no stdio (a warm pool's) gives the command the stdio set
// after its start: a reader through a pipe, a file, and one writer for stdout and stderr; and stdio
// is refused twice, or for an init started with its own.
func TestPrestartLateStdio(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name  string
		stdio func(t *testing.T, out *bytes.Buffer) (sandbox.Stdio, func() string)
	}{
		{"pipes", func(t *testing.T, out *bytes.Buffer) (sandbox.Stdio, func() string) {
			return sandbox.Stdio{Stdin: strings.NewReader("in\n"), Stdout: out, Stderr: out}, out.String
		}},
		{"files", func(t *testing.T, _ *bytes.Buffer) (sandbox.Stdio, func() string) {
			in, err := os.CreateTemp(t.TempDir(), "in")
			if err != nil {
				t.Fatal(err)
			}
			in.WriteString("in\n")
			in.Seek(0, 0)
			f, err := os.Create(filepath.Join(t.TempDir(), "out"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { in.Close(); f.Close() })
			return sandbox.Stdio{Stdin: in, Stdout: f, Stderr: f}, func() string {
				b, _ := os.ReadFile(f.Name())
				return string(b)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pd, err := sandbox.Prestart(ctx, sandbox.Stdio{})
			if err != nil {
				t.Fatal(err)
			}
			defer pd.Close()
			var out bytes.Buffer
			stdio, got := tc.stdio(t, &out)
			if err := pd.SetStdio(stdio); err != nil {
				t.Fatal(err)
			}
			if err := pd.SetStdio(stdio); err == nil {
				t.Error("stdio given twice")
			}
			p, err := pd.Start(readOnlySpec(t, "sh", "-c", `read x; echo "out $x"; echo "err $x" >&2; sleep 0.1 & exit 3`))
			if err != nil {
				t.Fatal(err)
			}
			if code, err := p.Wait(); code != 3 || err != nil {
				t.Fatalf("exit %d, %v", code, err)
			}
			if g := got(); g != "out in\nerr in\n" {
				t.Errorf("the command wrote %q, want its stdout and stderr in order", g)
			}
		})
	}
	var out bytes.Buffer
	pd, err := sandbox.Prestart(ctx, sandbox.Stdio{Stdout: &out})
	if err != nil {
		t.Fatal(err)
	}
	defer pd.Close()
	if err := pd.SetStdio(sandbox.Stdio{Stdout: &out}); err == nil {
		t.Error("stdio given to an init started with its own")
	}
}

// TestPrestartEarly: a waiting init has made what no spec changes (docs/sandbox.md, init's step 1)
// before its spec comes: its mount namespace has the boot id's staging tmpfs on the host's /proc and
// its network namespace has lo up, while the host's mount table has neither. The Bench it runs then
// has them: its own boot id, lo up, and a /proc of its pid namespace.
func TestPrestartEarly(t *testing.T) {
	requireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out, errb bytes.Buffer
	pd, err := sandbox.Prestart(ctx, sandbox.Stdio{Stdout: &out, Stderr: &errb})
	if err != nil {
		t.Fatal(err)
	}
	defer pd.Close()
	staged := func(pid string) bool {
		b, err := os.ReadFile("/proc/" + pid + "/mountinfo")
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) > 8 && f[4] == "/proc" && slices.Contains(f[6:], "tmpfs") {
				return true
			}
		}
		return false
	}
	pid := fmt.Sprint(pd.Pid)
	deadline := time.Now().Add(10 * time.Second)
	for !staged(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("init %s has no staging tmpfs on /proc 10 s after its start: its early setup waits for the spec", pid)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if staged("self") {
		t.Fatal("the host's mount table has a tmpfs on /proc: init's mounts propagated")
	}
	lo, err := os.ReadFile("/proc/" + pid + "/net/dev") // the network namespace of init, not of this test
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(lo), "lo:") {
		t.Fatalf("init's network namespace has no lo: %q", lo)
	}
	flags, err := exec.Command("nsenter", "-t", pid, "-n", "cat", "/sys/class/net/lo/flags").Output()
	if err != nil {
		t.Fatalf("nsenter into init's network namespace: %v", err)
	}
	if v, err := strconv.ParseUint(strings.TrimSpace(string(flags)), 0, 32); err != nil || v&syscall.IFF_UP == 0 {
		t.Errorf("lo's flags in the waiting init's network namespace: %q, want IFF_UP", flags)
	}
	host, err := os.ReadFile(sandbox.BootIDPath)
	if err != nil {
		t.Fatal(err)
	}
	// No /sys in a sandbox: lo's flags through SIOCGIFFLAGS are ip's; /proc/net/dev lists it.
	spec := readOnlySpec(t, "sh", "-c", `cat /proc/sys/kernel/random/boot_id; grep -c lo: /proc/net/dev; grep -c . /proc/net/dev`)
	p, err := pd.Start(spec)
	if err != nil {
		t.Fatalf("start: %v (stderr %q)", err, errb.String())
	}
	if code, err := p.Wait(); code != 0 || err != nil {
		t.Fatalf("exit %d, %v (stderr %q)", code, err, errb.String())
	}
	got := strings.Fields(out.String())
	if len(got) != 3 || got[0] == strings.TrimSpace(string(host)) || len(got[0]) != 36 || got[1] != "1" || got[2] != "3" {
		t.Errorf("got %q, want a boot id of its own (the host's is %q), and lo the only interface (two header lines)", got, host)
	}
}
