//go:build !amd64

package main

import "golang.org/x/sys/unix"

// int80Getpid: there is no second ABI to try on this architecture.
func int80Getpid() error { return unix.ENOSYS }
