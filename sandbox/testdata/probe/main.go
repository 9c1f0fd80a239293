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
		fmt.Fprintln(os.Stderr, "usage: probe rawsock | ptrace PID | setuid | tiocsti | connect PATH... | squat ADDR | getfd PID | syscall NAME | keysearch DESC")
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
	case "squat":
		// Listen where a sandbox's control socket would be, and tell what a client sent.
		ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: os.Args[2], Net: "unix"})
		if err != nil {
			report("listen", err)
			return
		}
		fmt.Println("listening")
		c, err := ln.AcceptUnix()
		if err != nil {
			report("accept", err)
			return
		}
		var n, fds int
		b, oob := make([]byte, 4096), make([]byte, unix.CmsgSpace(16*4))
		for {
			k, oobn, _, _, err := c.ReadMsgUnix(b, oob)
			n += k
			if msgs, perr := unix.ParseSocketControlMessage(oob[:oobn]); perr == nil {
				for _, m := range msgs {
					got, _ := unix.ParseUnixRights(&m)
					fds += len(got)
				}
			}
			if err != nil || k == 0 {
				break
			}
		}
		fmt.Printf("squat: got %d bytes and %d descriptors\n", n, fds)
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
	case "syscall":
		// Each call is made with arguments the kernel refuses (EFAULT, EINVAL, EBADF) or that do
		// nothing, so that run on the host it does no harm and says the call is there; in a sandbox
		// the seccomp filter answers first, with EPERM (ENOSYS for another ABI).
		name := os.Args[2]
		var e unix.Errno
		switch name {
		case "bpf":
			_, _, e = unix.Syscall(unix.SYS_BPF, unix.BPF_PROG_LOAD, 0, 0)
		case "perf_event_open":
			_, _, e = unix.Syscall6(unix.SYS_PERF_EVENT_OPEN, 0, 0, ^uintptr(0), ^uintptr(0), 0, 0)
		case "userfaultfd":
			var fd uintptr
			fd, _, e = unix.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC, 0, 0)
			if e == 0 {
				unix.Close(int(fd))
			}
		case "open_by_handle_at":
			_, _, e = unix.Syscall(unix.SYS_OPEN_BY_HANDLE_AT, ^uintptr(0), 0, 0)
		case "io_uring_setup":
			_, _, e = unix.Syscall(unix.SYS_IO_URING_SETUP, 1, 0, 0)
		case "init_module":
			_, _, e = unix.Syscall(unix.SYS_INIT_MODULE, 0, 0, 0)
		case "kexec_file_load":
			_, _, e = unix.Syscall6(unix.SYS_KEXEC_FILE_LOAD, ^uintptr(0), ^uintptr(0), 0, 0, 0, 0)
		case "clone3":
			// An invalid size: the kernel refuses it (EINVAL), so nothing is cloned on the host.
			_, _, e = unix.Syscall(unix.SYS_CLONE3, 0, 0, 0)
		case "x32":
			// getpid through the x32 ABI's number.
			_, _, e = unix.Syscall(unix.SYS_GETPID|0x40000000, 0, 0, 0)
		case "i386":
			report(name, int80Getpid())
			return
		default:
			fmt.Fprintln(os.Stderr, "unknown syscall", name)
			os.Exit(2)
		}
		report(name, errno(e))
	case "keysearch":
		// A user key of that description, in the session keyring or the user keyring.
		id, err := unix.KeyctlSearch(unix.KEY_SPEC_SESSION_KEYRING, "user", os.Args[2], 0)
		if err != nil {
			id, err = unix.KeyctlSearch(unix.KEY_SPEC_USER_KEYRING, "user", os.Args[2], 0)
		}
		if err == nil {
			b := make([]byte, 256)
			n, rerr := unix.KeyctlBuffer(unix.KEYCTL_READ, id, b, 0)
			if rerr == nil {
				fmt.Printf("keysearch: found %q\n", b[:min(n, len(b))])
				return
			}
			err = rerr
		}
		report("keysearch", err)
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
