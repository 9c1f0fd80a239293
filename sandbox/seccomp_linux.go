package sandbox

import (
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// The seccomp filter of every sandbox: a deny list of system calls that a build or a Bench has no use
// for and that reach the kernel as a whole rather than the sandbox's own namespaces (docs/sandbox.md
// lists them and why). The user namespace already makes most of them fail; the filter refuses them
// before the kernel looks, so a bug behind one of them is not reachable from a sandbox. Refused calls
// fail with EPERM, as Docker's default profile does, so programs that probe for them go on.
//
// Calls of another ABI than this binary's (i386 through int 0x80, x32) would reach the same kernel
// code under other numbers: they are all refused (ENOSYS).
var deniedSyscalls = append([]uintptr{
	// Extending or replacing the kernel.
	unix.SYS_INIT_MODULE, unix.SYS_FINIT_MODULE, unix.SYS_DELETE_MODULE,
	unix.SYS_KEXEC_LOAD, unix.SYS_KEXEC_FILE_LOAD,
	// Programs and probes run by the kernel itself.
	unix.SYS_BPF, unix.SYS_PERF_EVENT_OPEN,
	// Pausing the kernel on a page fault: the classic helper for kernel races.
	unix.SYS_USERFAULTFD,
	// Opening any inode of a file system by handle, around every directory's permissions (shocker).
	unix.SYS_OPEN_BY_HANDLE_AT,
	// A second system call interface, with a history of escapes; nothing a build needs.
	unix.SYS_IO_URING_SETUP, unix.SYS_IO_URING_ENTER, unix.SYS_IO_URING_REGISTER,
	// The machine's state: clock, swap, reboot, accounting, quotas, the kernel log.
	unix.SYS_REBOOT, unix.SYS_SWAPON, unix.SYS_SWAPOFF, unix.SYS_ACCT,
	unix.SYS_SETTIMEOFDAY, unix.SYS_CLOCK_SETTIME, unix.SYS_CLOCK_ADJTIME, unix.SYS_ADJTIMEX,
	unix.SYS_QUOTACTL, unix.SYS_QUOTACTL_FD, unix.SYS_SYSLOG, unix.SYS_VHANGUP,
	unix.SYS_LOOKUP_DCOOKIE,
}, archDeniedSyscalls...)

// seccompFilter assembles the filter: check the ABI, then each denied number.
func seccompFilter() ([]bpf.RawInstruction, error) {
	if auditArch == 0 {
		return nil, errors.New("no seccomp filter for this architecture")
	}
	const (
		offNr   = 0 // struct seccomp_data: int nr; u32 arch; ...
		offArch = 4
	)
	n := len(deniedSyscalls)
	// Layout: 0 load arch, 1 check it, 2 load nr, 3 check the x32 bit, 4..4+n-1 the deny list,
	// then allow, deny (EPERM), wrong ABI (ENOSYS).
	allow := 4 + n
	deny, wrongABI := allow+1, allow+2
	prog := []bpf.Instruction{
		bpf.LoadAbsolute{Off: offArch, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: auditArch, SkipTrue: uint8(wrongABI - 2)},
		bpf.LoadAbsolute{Off: offNr, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: abiBit, SkipTrue: uint8(wrongABI - 4)},
	}
	for i, nr := range deniedSyscalls {
		pc := 4 + i
		prog = append(prog, bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(nr), SkipTrue: uint8(deny - pc - 1)})
	}
	prog = append(prog,
		bpf.RetConstant{Val: unix.SECCOMP_RET_ALLOW},
		bpf.RetConstant{Val: unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)},
		bpf.RetConstant{Val: unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)},
	)
	if wrongABI-2 > 255 {
		return nil, fmt.Errorf("seccomp filter: %d denied calls do not fit one jump", n)
	}
	return bpf.Assemble(prog)
}

// loadSeccomp installs the filter on the calling thread (init's locked thread), from which every
// command is forked. It needs no_new_privs (set before) unless the caller has CAP_SYS_ADMIN.
func loadSeccomp() error {
	raw, err := seccompFilter()
	if err != nil {
		return err
	}
	filters := make([]unix.SockFilter, len(raw))
	for i, r := range raw {
		filters[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	prog := unix.SockFprog{Len: uint16(len(filters)), Filter: &filters[0]}
	if _, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&prog))); e != 0 {
		return e
	}
	return nil
}
