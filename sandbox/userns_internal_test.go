package sandbox

import (
	"os"
	"runtime"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// The costs a user namespace adds to a launch, each against what it replaces, in one process
// (docs/benchmarks.md): a slot of ids, the kept namespace, an idmapped clone of a layer, the seccomp
// filter, and the command's fork into a user and mount namespace of its own.

func BenchmarkIDSlot(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	for b.Loop() {
		r, err := acquireIDs()
		if err != nil {
			b.Fatal(err)
		}
		r.record(os.Getpid())
		r.release()
	}
}

func BenchmarkUsernsOpen(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	m := idMapping{0, idBase, IDsPerSandbox}
	for b.Loop() {
		f, err := keptUserns(m, m)
		if err != nil {
			b.Fatal(err)
		}
		f.Close()
	}
}

func BenchmarkSeccompFilter(b *testing.B) {
	for b.Loop() {
		if _, err := seccompFilter(false); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCloneTree(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	dir := b.TempDir()
	m := idMapping{0, idBase, IDsPerSandbox}
	ns, err := keptUserns(m, m)
	if err != nil {
		b.Fatal(err)
	}
	defer ns.Close()
	for _, c := range []struct {
		name   string
		userns int
	}{{"plain", -1}, {"idmapped", int(ns.Fd())}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				fd, e := cloneTree(dir, 0, unix.MOUNT_ATTR_RDONLY|noSuidDev, c.userns)
				if e != nil {
					b.Fatal(e)
				}
				unix.Close(fd)
			}
		})
	}
}

// BenchmarkForkCommand is init's fork and exec of the command (/bin/true), to its exit: as before
// user namespaces (a vfork), and as now (a fork into a new user and mount namespace, its maps
// written by the parent).
func BenchmarkForkCommand(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	one := []idMapping{{0, idBase, IDsPerSandbox}}
	cfg := &initConfig{IDBase: idBase, UIDMap: one, GIDMap: one}
	for _, c := range []struct {
		name string
		sys  func() *syscall.SysProcAttr
	}{
		{"plain", func() *syscall.SysProcAttr { return &syscall.SysProcAttr{} }},
		{"userns", func() *syscall.SysProcAttr { return commandAttr(cfg, 0, 0) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				pid, err := syscall.ForkExec("/bin/true", []string{"true"}, &syscall.ProcAttr{Sys: c.sys()})
				if err != nil {
					b.Fatal(err)
				}
				var ws syscall.WaitStatus
				syscall.Wait4(pid, &ws, 0, nil)
			}
		})
	}
}

// BenchmarkForkFiltered is BenchmarkForkCommand/userns from a thread under the sandbox's seccomp
// filter, whose clone into a new user namespace init's user notification lets through.
func BenchmarkForkFiltered(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	one := []idMapping{{0, idBase, IDsPerSandbox}}
	cfg := &initConfig{IDBase: idBase, UIDMap: one, GIDMap: one}
	done := make(chan error)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine, filter and all
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			done <- err
			return
		}
		filter, err := seccompProgram(false)
		if err != nil {
			done <- err
			return
		}
		listener, err := loadSeccomp(filter)
		if err != nil {
			done <- err
			return
		}
		defer unix.Close(listener)
		go notifyNamespaces(listener, unix.Gettid())
		for b.Loop() {
			pid, err := syscall.ForkExec("/bin/true", []string{"true"}, &syscall.ProcAttr{Sys: commandAttr(cfg, 0, 0)})
			if err != nil {
				done <- err
				return
			}
			var ws syscall.WaitStatus
			syscall.Wait4(pid, &ws, 0, nil)
		}
		done <- nil
	}()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}
