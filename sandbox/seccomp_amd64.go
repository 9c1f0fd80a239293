package sandbox

import "golang.org/x/sys/unix"

// auditArch is the ABI this binary's system calls come with; abiBit marks the x32 ABI's.
const (
	auditArch = unix.AUDIT_ARCH_X86_64
	abiBit    = 0x40000000 // __X32_SYSCALL_BIT
)

// archDeniedSyscalls are the denied calls that only this architecture has: port I/O, and old
// interfaces nothing uses any more.
var archDeniedSyscalls = []uintptr{
	unix.SYS_IOPL, unix.SYS_IOPERM, unix.SYS__SYSCTL, unix.SYS_USELIB, unix.SYS_USTAT, unix.SYS_SYSFS,
	unix.SYS_CREATE_MODULE, unix.SYS_GET_KERNEL_SYMS, unix.SYS_QUERY_MODULE, unix.SYS_NFSSERVCTL,
}
