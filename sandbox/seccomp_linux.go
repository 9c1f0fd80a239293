package sandbox

import (
	"errors"
	"fmt"
	"slices"
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

// keyringSyscalls are refused without root: there the sandbox's root is the user's own uid on the
// host, and a key is its owner's by uid whatever the namespace: key serials are global, so a Bench
// could link the user's keyring (found in /proc/keys) into its own and read the user's keys. As root
// the sandbox's uid owns no key but its own.
var keyringSyscalls = []uintptr{unix.SYS_KEYCTL, unix.SYS_ADD_KEY, unix.SYS_REQUEST_KEY}

// nsFlags are the namespaces a sandbox may not make. Root of its own user namespace could otherwise make
// a user or network namespace that it owns, and in it reach what the host's user namespace keeps to
// itself: netfilter, traffic control and xfrm over netlink (where most user-namespace kernel exploits of
// recent years are), a cgroup2 view of the host. Mount, pid, uts and ipc namespaces stay allowed
// (mmdebstrap makes a mount namespace).
const nsFlags = unix.CLONE_NEWUSER | unix.CLONE_NEWNET | unix.CLONE_NEWCGROUP

// seccompFilter assembles the filter: check the ABI, refuse each denied call, refuse clone3 (its flags
// are behind a pointer, which a filter cannot read: ENOSYS, after which glibc uses clone, as with
// Docker's profile), refuse unshare with nsFlags, and hand clone with nsFlags to init (user
// notification): init itself forks every command into a new user namespace from the filtered thread,
// and allows that for its own thread only (notifyNamespaces).
func seccompFilter(rootless bool) ([]bpf.RawInstruction, error) {
	if auditArch == 0 {
		return nil, errors.New("no seccomp filter for this architecture")
	}
	const (
		offNr   = 0 // struct seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6]
		offArch = 4
		offArg0 = 16 // the low half on a little-endian machine (amd64, arm64)
	)
	var a filterAsm
	a.op(bpf.LoadAbsolute{Off: offArch, Size: 4})
	a.jump(bpf.JumpNotEqual, auditArch, "wrong abi")
	a.op(bpf.LoadAbsolute{Off: offNr, Size: 4})
	a.jump(bpf.JumpBitsSet, abiBit, "wrong abi")
	denied := deniedSyscalls
	if rootless {
		denied = append(slices.Clip(denied), keyringSyscalls...)
	}
	for _, nr := range denied {
		a.jump(bpf.JumpEqual, uint32(nr), "deny")
	}
	a.jump(bpf.JumpEqual, unix.SYS_CLONE3, "wrong abi")
	a.jump(bpf.JumpEqual, unix.SYS_UNSHARE, "unshare")
	a.jump(bpf.JumpEqual, unix.SYS_CLONE, "clone")
	a.op(bpf.RetConstant{Val: unix.SECCOMP_RET_ALLOW})
	a.label("unshare")
	a.op(bpf.LoadAbsolute{Off: offArg0, Size: 4})
	a.jump(bpf.JumpBitsSet, nsFlags, "deny")
	a.op(bpf.RetConstant{Val: unix.SECCOMP_RET_ALLOW})
	a.label("clone")
	a.op(bpf.LoadAbsolute{Off: offArg0, Size: 4})
	a.jump(bpf.JumpBitsSet, nsFlags, "notify")
	a.op(bpf.RetConstant{Val: unix.SECCOMP_RET_ALLOW})
	a.label("notify")
	a.op(bpf.RetConstant{Val: unix.SECCOMP_RET_USER_NOTIF})
	a.label("deny")
	a.op(bpf.RetConstant{Val: unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)})
	a.label("wrong abi")
	a.op(bpf.RetConstant{Val: unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)})
	prog, err := a.resolve()
	if err != nil {
		return nil, err
	}
	return bpf.Assemble(prog)
}

// filterAsm is a classic BPF program with forward jumps to labels, resolved at the end.
type filterAsm struct {
	prog   []bpf.Instruction
	jumps  map[int]string // instruction index -> label it jumps to when true
	labels map[string]int
}

func (a *filterAsm) op(i bpf.Instruction) { a.prog = append(a.prog, i) }

func (a *filterAsm) jump(cond bpf.JumpTest, val uint32, label string) {
	if a.jumps == nil {
		a.jumps = map[int]string{}
	}
	a.jumps[len(a.prog)] = label
	a.prog = append(a.prog, bpf.JumpIf{Cond: cond, Val: val})
}

func (a *filterAsm) label(name string) {
	if a.labels == nil {
		a.labels = map[string]int{}
	}
	a.labels[name] = len(a.prog)
}

func (a *filterAsm) resolve() ([]bpf.Instruction, error) {
	for at, label := range a.jumps {
		target, ok := a.labels[label]
		skip := target - at - 1
		if !ok || skip < 0 || skip > 255 {
			return nil, fmt.Errorf("seccomp filter: jump from %d to %q (%d) does not fit", at, label, target)
		}
		j := a.prog[at].(bpf.JumpIf)
		j.SkipTrue = uint8(skip)
		a.prog[at] = j
	}
	return a.prog, nil
}

// loadSeccomp installs the filter on the calling thread (init's locked thread), from which every
// command is forked, and returns the listener of its user notifications. It needs no_new_privs (set
// before) unless the caller has CAP_SYS_ADMIN.
func loadSeccomp(filters []unix.SockFilter) (int, error) {
	if len(filters) == 0 {
		return -1, errors.New("no seccomp filter to load")
	}
	prog := unix.SockFprog{Len: uint16(len(filters)), Filter: &filters[0]}
	fd, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_NEW_LISTENER, uintptr(unsafe.Pointer(&prog)))
	if e != 0 {
		return -1, e
	}
	// Every command's fork waits for notifyNamespaces, on another thread, to answer. Synchronous
	// wake-ups (Linux 6.6) hand the CPU to that thread and back instead of queueing each wake-up behind
	// whatever else runs: on a loaded host the fork took twice as long without (BenchmarkForkFiltered).
	// The answers are the same either way, so a kernel that refuses the flag only loses the speed.
	_, _, _ = unix.Syscall(unix.SYS_IOCTL, fd, unix.SECCOMP_IOCTL_NOTIF_SET_FLAGS, unix.SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP)
	return int(fd), nil
}

// seccompProgram is seccompFilter as the kernel takes it.
func seccompProgram(rootless bool) ([]unix.SockFilter, error) {
	raw, err := seccompFilter(rootless)
	if err != nil {
		return nil, err
	}
	filters := make([]unix.SockFilter, len(raw))
	for i, r := range raw {
		filters[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	return filters, nil
}

// seccompNotif and seccompNotifResp are the kernel's struct seccomp_notif and seccomp_notif_resp.
type seccompNotif struct {
	ID    uint64
	Pid   uint32
	Flags uint32
	Data  [64]byte // struct seccomp_data
}

type seccompNotifResp struct {
	ID    uint64
	Val   int64
	Error int32
	Flags uint32
}

// notifyNamespaces answers the filter's notifications, a clone asking for a namespace in nsFlags: it
// lets the call go on when it is init's own (the thread tid, which forks the commands; a thread id
// cannot be had by another live thread of the pid namespace), and refuses it (EPERM) for everyone
// else: the sandbox's processes inherit the filter, and so the listener. It returns when the
// listener is closed, or init exits.
func notifyNamespaces(listener, tid int) {
	for {
		var n seccompNotif
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(listener), unix.SECCOMP_IOCTL_NOTIF_RECV, uintptr(unsafe.Pointer(&n))); e != 0 {
			if e == unix.EINTR || e == unix.ENOENT {
				continue
			}
			return
		}
		r := seccompNotifResp{ID: n.ID, Error: -int32(unix.EPERM)}
		if int(n.Pid) == tid {
			r.Error, r.Flags = 0, unix.SECCOMP_USER_NOTIF_FLAG_CONTINUE
		}
		// ENOENT: the caller is gone (killed) meanwhile.
		_, _, _ = unix.Syscall(unix.SYS_IOCTL, uintptr(listener), unix.SECCOMP_IOCTL_NOTIF_SEND, uintptr(unsafe.Pointer(&r)))
	}
}
