package main

import "golang.org/x/sys/unix"

func int80(nr uintptr) uintptr

// int80Getpid calls getpid (20 in the i386 table) through int $0x80.
func int80Getpid() unix.Errno {
	r := int64(int80(20))
	if r < 0 && r > -4096 {
		return unix.Errno(-r)
	}
	return 0
}
