package sandbox_test

import (
	"bytes"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"toolshed.dev/shed/internal/ptytest"
	"toolshed.dev/shed/sandbox"
)

// TestConfined tries, as root of the sandbox, each way out that a user namespace, the seccomp filter
// and the namespaces must close, and each one fails. Where the same try can be run on the host (as
// root, or in a namespace of its own there), it is, and succeeds: so each check can fail.
func TestConfined(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	// A key of the caller's: in its session keyring and in root's user keyring. Keyrings belong to
	// uids, not namespaces, and a process inherits its parent's session keyring.
	const secret = "shed-confine-secret"
	for _, ring := range []int{unix.KEY_SPEC_SESSION_KEYRING, unix.KEY_SPEC_USER_KEYRING} {
		id, err := unix.AddKey("user", secret, []byte("hunter2"), ring)
		if err != nil {
			t.Fatalf("add a key to the test's keyring: %v", err)
		}
		defer unix.KeyctlInt(unix.KEYCTL_INVALIDATE, id, 0, 0, 0)
	}
	checks := []struct {
		name, script string
		host         string // how the host runs it to succeed ("" = as is; "-" = not run on the host)
	}{
		{"mknod a block device", `mknod /tmp/sda b 8 0`, ""},
		{"mknod a char device", `mknod /tmp/mem c 1 1`, ""},
		{"raw socket", `/run/probe rawsock | grep -q ': ok$'`, ""},
		{"ptrace init", `/run/probe ptrace 1 | grep -q ': ok$'`, "-"},
		{"take the descriptors of init", `/run/probe getfd 1 | grep -q '^getfd: [1-9]'`, "-"},
		{"read the descriptors of init", `readlink /proc/1/fd/0`, "-"},
		{"set the hostname", `hostname other`, "unshare -u"},
		{"bring lo down", `ip link set lo down`, "unshare -n"},
		// Opened for writing, nothing written; not "test -w", which busybox answers yes to root.
		{"write a global sysctl", `: >> /proc/sys/kernel/core_pattern`, ""},
		{"write IRQ affinity", `: >> /proc/irq/default_smp_affinity`, ""},
		{"read a key of the caller", `/run/probe keysearch ` + secret + ` | grep -q found`, ""},
		{"bpf", `/run/probe syscall bpf | grep -qv 'operation not permitted'`, ""},
		{"perf_event_open", `/run/probe syscall perf_event_open | grep -qv 'operation not permitted'`, ""},
		{"userfaultfd", `/run/probe syscall userfaultfd | grep -qv 'operation not permitted'`, ""},
		{"open_by_handle_at", `/run/probe syscall open_by_handle_at | grep -qv 'operation not permitted'`, ""},
		{"io_uring_setup", `/run/probe syscall io_uring_setup | grep -qv 'operation not permitted'`, ""},
		{"init_module", `/run/probe syscall init_module | grep -qv 'operation not permitted'`, ""},
		{"kexec_file_load", `/run/probe syscall kexec_file_load | grep -qv 'operation not permitted'`, ""},
		{"the i386 ABI", `/run/probe syscall i386 | grep -q ': ok$'`, ""},
		// A user, network or cgroup namespace of its own, where it would have the capabilities the
		// host's user namespace keeps (netfilter, tc, xfrm through netlink).
		{"make a user namespace", `unshare -U true`, ""},
		{"make a network namespace", `unshare -n true`, ""},
		{"make a cgroup namespace", `unshare -C true`, ""},
		{"make them at once", `unshare -U -n -m true`, ""},
		{"clone3, whose flags no filter reads", `/run/probe syscall clone3 | grep -qv 'function not implemented'`, ""},
		// This kernel has no x32 ABI: the host gets ENOSYS too, so only the sandbox's answer is checked.
		{"the x32 ABI", `/run/probe syscall x32 | grep -qv 'function not implemented'`, "-"},
	}
	// A kernel without the i386 ABI (ia32_emulation off) faults on int $0x80 before any filter is
	// asked, on the host as in a sandbox: there is nothing to refuse, and the check cannot tell.
	if out, _ := exec.Command(probeBind(t).Source, "syscall", "i386").Output(); strings.Contains(string(out), "no i386 ABI") {
		t.Logf("this kernel has no i386 ABI: the check of it cannot fail here (%s)", strings.TrimSpace(string(out)))
		for i := range checks {
			if checks[i].name == "the i386 ABI" {
				checks[i].host = "-"
			}
		}
	}
	var script strings.Builder
	for _, c := range checks {
		fmt.Fprintf(&script, "if ( %s ) >/dev/null 2>&1; then echo '%s: allowed'; else echo '%s: refused'; fi\n", c.script, c.name, c.name)
	}
	spec := readOnlySpec(t, "sh", "-c", script.String())
	spec.Binds = []sandbox.Bind{probeBind(t)}
	r := run(t, spec)
	for _, c := range checks {
		if !strings.Contains(r.stdout, c.name+": refused\n") {
			t.Errorf("%s: want refused in:\n%s%s", c.name, r.stdout, r.stderr)
		}
	}
	// What a package manager needs over its own files is there, and the namespaces that give nothing of
	// the host's.
	for _, ok := range []string{
		`unshare -m true && unshare -p -f true && unshare -u true && unshare -i true`,
		`touch /tmp/f && chown 1234:5678 /tmp/f && chmod 4755 /tmp/f && test -u /tmp/f && stat -c %u:%g /tmp/f | grep -qx 1234:5678`,
		`/run/probe setuid | grep -q ': ok$'`,
	} {
		if r := run(t, readOnlySpecWith(t, ok, probeBind(t))); r.code != 0 {
			t.Errorf("%s: exit %d, want 0 (%s)", ok, r.code, r.stderr)
		}
	}
	// The host, as root, where the check allows it: each try works there.
	probe := probeBind(t).Source
	dir := t.TempDir()
	for _, c := range checks {
		if c.host == "-" {
			continue
		}
		line := strings.ReplaceAll(strings.ReplaceAll(c.script, "/tmp/", dir+"/"), "/run/probe", probe)
		args := append(strings.Fields(c.host), "sh", "-c", line)
		cmd := exec.Command(args[0], args[1:]...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("%s on the host: %v (%s): the check cannot tell", c.name, err, out)
		}
	}
}

// readOnlySpecWith is readOnlySpec running script, with binds.
func readOnlySpecWith(t *testing.T, script string, binds ...sandbox.Bind) *sandbox.Spec {
	spec := readOnlySpec(t, "sh", "-c", script)
	spec.Binds = binds
	return spec
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
