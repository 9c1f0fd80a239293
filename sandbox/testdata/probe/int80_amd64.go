package main

import (
	"errors"
	"runtime/debug"

	"golang.org/x/sys/unix"
)

func int80(nr uintptr) uintptr

// errNoABI says that the kernel has no i386 ABI at all (ia32_emulation off, or built without it):
// int $0x80 then faults (SIGSEGV) before any filter is asked.
var errNoABI = errors.New("no i386 ABI in this kernel")

// int80Getpid calls getpid (20 in the i386 table) through int $0x80.
func int80Getpid() (e error) {
	// The fault comes as a panic, not the runtime's crash.
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if recover() != nil {
			e = errNoABI
		}
	}()
	r := int64(int80(20))
	if r < 0 && r > -4096 {
		return unix.Errno(-r)
	}
	return nil
}
