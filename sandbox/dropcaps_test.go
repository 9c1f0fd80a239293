package sandbox_test

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"syscall"
	"testing"
	"time"

	"toolshed.dev/shed/internal/ptytest"
	"toolshed.dev/shed/sandbox"
)

// TestDropCaps checks, as uid 0 of the sandbox, each thing DropCaps must take away, and that without
// DropCaps the same check succeeds (so that each check can fail).
func TestDropCaps(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	checks := []struct {
		name, script string
		dropOnly     bool // not checked without DropCaps
	}{
		{"mount", `mount -t tmpfs none /tmp`, false},
		{"mknod block device", `mknod /tmp/sda b 8 0`, false},
		{"mknod char device", `mknod /tmp/mem c 1 1`, false},
		{"raw socket", `/run/probe rawsock | grep -q ': ok$'`, false},
		{"ptrace init", `/run/probe ptrace 1 | grep -q ': ok$'`, false},
		{"take the descriptors of init", `/run/probe getfd 1 | grep -q '^getfd: [1-9]'`, false},
		{"read the descriptors of init", `readlink /proc/1/fd/0`, false},
		{"become another uid", `/run/probe setuid | grep -q ': ok$'`, false},
		{"chown a file to another uid and back", `touch /tmp/f && chown 1234 /tmp/f && chmod 600 /tmp/f && chown 0 /tmp/f`, false},
		{"set the hostname", `hostname other`, false},
		{"bring lo down", `ip link set lo down`, false},
		// uid 0 writes most sysctls by file permission alone: DropCaps makes /proc/sys read-only. (Opened
		// for writing, nothing written; not "test -w": busybox says yes to root without asking.)
		{"write a global sysctl", `: >> /proc/sys/kernel/core_pattern`, false},
		{"write IRQ affinity", `: >> /proc/irq/default_smp_affinity`, false},
		{"remount /proc/sys", `mount -o remount,rw /proc/sys`, true},
		{"unmount /proc/sys", `umount -l /proc/sys`, true},
	}
	var script strings.Builder
	for _, c := range checks {
		fmt.Fprintf(&script, "if ( %s ) >/dev/null 2>&1; then echo '%s: allowed'; else echo '%s: refused'; fi\n", c.script, c.name, c.name)
	}
	spec := readOnlySpec(t, "sh", "-c", script.String())
	spec.Binds = []sandbox.Bind{probeBind(t)}
	for _, drop := range []bool{true, false} {
		spec.DropCaps = drop
		r := run(t, spec)
		for _, c := range checks {
			want := c.name + ": refused"
			if !drop {
				if c.dropOnly {
					continue
				}
				want = c.name + ": allowed"
			}
			if !strings.Contains(r.stdout, want+"\n") {
				t.Errorf("DropCaps %v: want %q in:\n%s%s", drop, want, r.stdout, r.stderr)
			}
		}
	}
}

// TestNoControllingTerminal runs a sandbox on a terminal that is its caller's controlling terminal: the
// command must not have it as its own, so that (without CAP_SYS_ADMIN) it cannot push input into it
// with TIOCSTI, which the caller's shell would run once the sandbox ends.
func TestNoControllingTerminal(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	ptmx, pts := ptytest.Open(t, 24, 80)
	cmd := helperCmd(t, "tty")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = pts, pts, pts
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pts.Close()
	var out bytes.Buffer
	copied := make(chan struct{})
	go func() { io.Copy(&out, ptmx); close(copied) }() // ends with EIO once the last holder of pts exits
	if err := cmd.Wait(); err != nil {
		t.Fatalf("helper: %v (output %q)", err, out.String())
	}
	select {
	case <-copied:
	case <-time.After(5 * time.Second):
		t.Fatal("terminal output did not end")
	}
	got := strings.ReplaceAll(out.String(), "\r", "")
	if !strings.Contains(got, "tiocsti: operation not permitted\n") || !strings.Contains(got, "tty_nr=0\n") {
		t.Errorf("got %q, want TIOCSTI refused and no controlling terminal (tty_nr 0)", got)
	}
}
