// Command probe is run inside test sandboxes (built static by the tests, bind-mounted in): each mode
// tries one thing the sandbox should or should not allow and prints "ok" or the error.
package main

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"unsafe"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: probe rawsock | ptrace PID | setuid | tiocsti | connect PATH... | getfd PID")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "rawsock":
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP)
		report("rawsock", err)
		if err == nil {
			unix.Close(fd)
		}
	case "ptrace":
		pid, _ := strconv.Atoi(os.Args[2])
		// PTRACE_SEIZE does not stop the tracee; exiting detaches it.
		_, _, e := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_SEIZE, uintptr(pid), 0, 0, 0, 0)
		report("ptrace", errno(e))
	case "setuid":
		report("setuid", unix.Setuid(1234))
	case "tiocsti":
		c := byte('\n')
		_, _, e := unix.Syscall(unix.SYS_IOCTL, 0, unix.TIOCSTI, uintptr(unsafe.Pointer(&c)))
		report("tiocsti", errno(e))
	case "connect":
		for _, p := range os.Args[2:] {
			c, err := net.Dial("unix", p)
			if err != nil {
				fmt.Printf("connect %s: %v\n", p, err)
				continue
			}
			b := make([]byte, 512)
			n, _ := c.Read(b)
			fmt.Printf("connect %s: connected, read %q\n", p, b[:n])
			c.Close()
		}
	case "getfd":
		pid, _ := strconv.Atoi(os.Args[2])
		pfd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			report("pidfd_open", err)
			return
		}
		got := 0
		var last error
		for fd := 0; fd < 64; fd++ {
			nfd, err := unix.PidfdGetfd(pfd, fd, 0)
			if err == nil {
				got++
				unix.Close(nfd)
			} else if err != unix.EBADF {
				last = err
			}
		}
		fmt.Printf("getfd: %d descriptors, last error %v\n", got, last)
	default:
		fmt.Fprintln(os.Stderr, "unknown mode", os.Args[1])
		os.Exit(2)
	}
}

func errno(e unix.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

func report(what string, err error) {
	if err != nil {
		fmt.Printf("%s: %v\n", what, err)
		return
	}
	fmt.Printf("%s: ok\n", what)
}
