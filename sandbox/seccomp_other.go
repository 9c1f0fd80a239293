//go:build linux && !amd64 && !arm64

package sandbox

// No filter is defined for this architecture: starting a sandbox fails (seccompFilter).
const (
	auditArch = 0
	abiBit    = 0
)

var archDeniedSyscalls []uintptr
