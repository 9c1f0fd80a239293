package api

import (
	"encoding/json"
	"log/slog"
	"net"
	"os"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"toolshed.dev/shed/app"
)

// dialAs connects to sock as uid: the kernel records the thread's effective uid as the peer's, so
// the thread takes uid for the connect alone (its filesystem uid stays root's, to reach the test's
// private directory).
func dialAs(t *testing.T, uid int, sock string) *net.UnixConn {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	keep := ^uintptr(0) // -1: unchanged
	if _, _, e := syscall.RawSyscall(syscall.SYS_SETRESUID, keep, uintptr(uid), keep); e != 0 {
		t.Fatal(e)
	}
	syscall.RawSyscall(syscall.SYS_SETFSUID, 0, 0, 0)
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: sock, Net: "unix"})
	if _, _, e := syscall.RawSyscall(syscall.SYS_SETRESUID, keep, 0, keep); e != 0 {
		panic(e) // this thread must not go back to the runtime as another user
	}
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// call sends a request on c and reads the daemon's messages until it closes.
func call(t *testing.T, c *net.UnixConn, op string, io []int) []Message {
	t.Helper()
	defer c.Close()
	body, _ := json.Marshal(Request{Protocol: Protocol, Op: op})
	_, _, _ = c.WriteMsgUnix(frame(body), unix.UnixRights(io...), nil)
	c.Write(body)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var out []Message
	dec := json.NewDecoder(c)
	for {
		var m Message
		if err := dec.Decode(&m); err != nil {
			return out
		}
		out = append(out, m)
	}
}

// TestServerFlood: a user opens two thousand connections and sends nothing. Its share is admitted
// and cut by the read timeout; every other connection is refused as busy at once, never left
// waiting: root and another user are answered meanwhile, and the daemon holds no more than the
// share of descriptors for it.
func TestServerFlood(t *testing.T) {
	sock, srv := startServerWith(t, nil, func(srv *Server) { srv.MaxConns, srv.MaxPerUser = 16, 4 })
	io := devnull(t)
	others := func() {
		t.Helper()
		if ms := call(t, dialAs(t, 0, sock), "store.verify", io); len(ms) != 1 || ms[0].Result == nil {
			t.Errorf("root: %+v", ms)
		}
		if ms := call(t, dialAs(t, 4242, sock), "workshop.ls", io); len(ms) != 1 || ms[0].Result == nil {
			t.Errorf("another user: %v", ms)
		}
	}
	others() // what their requests leave open for a while is in the baseline
	time.Sleep(time.Second)
	before := openFDs(t)
	const n = 2000
	conns := make([]*net.UnixConn, n)
	for i := range conns {
		conns[i] = dialAs(t, 65534, sock)
	}
	// The refusals come at once; the admitted wait for their request.
	var wg sync.WaitGroup
	var mu sync.Mutex
	answers := map[app.Code]int{}
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			c.SetReadDeadline(time.Now().Add(30 * time.Second))
			var m Message
			err := json.NewDecoder(c).Decode(&m)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				answers["no answer"]++
			case m.Error != nil:
				answers[m.Error.Code]++
			}
		}()
	}
	time.Sleep(100 * time.Millisecond)
	// The attacker's n, and at most its share on the daemon's side.
	if extra := openFDs(t) - before - n; extra > srv.MaxPerUser+8 {
		t.Errorf("%d idle connections of one user cost the daemon %d descriptors", n, extra)
	}
	others() // during the flood
	wg.Wait()
	// Each admitted connection is cut after the read timeout, and the next admitted: a few shares'
	// worth while the flood connects, each share at most at once.
	if cut := answers[app.CodeBadRequest]; answers[app.CodeBusy]+cut != n || cut < srv.MaxPerUser || cut > n/10 {
		t.Errorf("the flood's answers: %v, want most busy at once and a few shares cut by the read timeout", answers)
	}
	waitFDs(t, before)
}

// TestOutOfDescriptors: when accept fails for want of descriptors, a client is told so at once
// (busy) instead of waiting in the kernel's queue; the daemon serves again when they are back.
func TestOutOfDescriptors(t *testing.T) {
	sock, _ := startServerWith(t, nil, func(srv *Server) {
		srv.Log = slog.New(slog.NewTextHandler(tw{t}, nil))
	})
	io := devnull(t)
	if ms := call(t, dialAs(t, 0, sock), "store.verify", io); len(ms) != 1 || ms[0].Result == nil {
		t.Fatalf("root before: %+v", ms) // and the daemon serves, its reserve made
	}
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	// The client's socket is made first; then every descriptor below a lowered limit is taken.
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	low := rl
	low.Cur = uint64(openFDs(t) + 32)
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	var fill []*os.File
	restore := func() {
		for _, f := range fill {
			f.Close()
		}
		fill = nil
		unix.Setrlimit(unix.RLIMIT_NOFILE, &rl)
	}
	defer restore()
	for {
		f, err := os.Open(os.DevNull)
		if err != nil {
			break
		}
		fill = append(fill, f)
	}
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: sock}); err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "client")
	defer f.Close()
	f.SetReadDeadline(time.Now().Add(10 * time.Second))
	var m Message
	err = json.NewDecoder(f).Decode(&m)
	restore()
	if err != nil || m.Error == nil || m.Error.Code != app.CodeBusy {
		t.Fatalf("a client while the daemon is out of descriptors: %+v %v, want busy at once", m, err)
	}
	t.Logf("%s", m.Error.Message)
	if ms := call(t, dialAs(t, 0, sock), "store.verify", io); len(ms) != 1 || ms[0].Result == nil {
		t.Errorf("root after: %v", ms)
	}
}

type tw struct{ t *testing.T }

func (w tw) Write(b []byte) (int, error) { w.t.Logf("%s", b); return len(b), nil }
