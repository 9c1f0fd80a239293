package sandbox

import "golang.org/x/sys/unix"

// auditArch is the ABI this binary's system calls come with; arm64 has no second 64-bit ABI.
const (
	auditArch = unix.AUDIT_ARCH_AARCH64
	abiBit    = 0
)

// archDeniedSyscalls are the denied calls that only this architecture has.
var archDeniedSyscalls = []uintptr{unix.SYS_NFSSERVCTL}
