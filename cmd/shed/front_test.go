package main

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// fakeSupervisor listens on a socket, takes each request frame (closing the descriptors that come
// with it), passes it on requests and answers with reply's lines.
type fakeSupervisor struct {
	sock     string
	requests chan []byte
	closed   chan struct{} // a held request's connection closed by its client
	mu       sync.Mutex
	reply    []string
}

func startFakeSupervisor(t *testing.T) *fakeSupervisor {
	t.Helper()
	f := &fakeSupervisor{sock: filepath.Join(t.TempDir(), "shed.sock"), requests: make(chan []byte, 16), closed: make(chan struct{}, 16)}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: f.sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.AcceptUnix()
			if err != nil {
				return
			}
			f.serve(c)
		}
	}()
	return f
}

func (f *fakeSupervisor) serve(c *net.UnixConn) {
	defer c.Close()
	var hdr [4]byte
	oob := make([]byte, unix.CmsgSpace(3*4))
	n, oobn, _, _, err := c.ReadMsgUnix(hdr[:], oob)
	if err != nil || n != 4 {
		return
	}
	if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
		for _, m := range msgs {
			fds, _ := unix.ParseUnixRights(&m)
			for _, fd := range fds {
				unix.Close(fd)
			}
		}
	}
	body := make([]byte, binary.BigEndian.Uint32(hdr[:]))
	if _, err := io.ReadFull(c, body); err != nil {
		return
	}
	f.requests <- body
	f.mu.Lock()
	reply := f.reply
	f.mu.Unlock()
	if reply == nil { // hold it: answer nothing until the client closes the connection
		_, _ = io.Copy(io.Discard, c)
		f.closed <- struct{}{}
		return
	}
	for _, line := range reply {
		if _, err := c.Write([]byte(line + "\n")); err != nil {
			return
		}
	}
}

func (f *fakeSupervisor) answer(lines ...string) {
	f.mu.Lock()
	f.reply = lines
	f.mu.Unlock()
}

// request is the frame a run sent, or nil for none.
func (f *fakeSupervisor) request() []byte {
	select {
	case b := <-f.requests:
		return b
	default:
		return nil
	}
}

// buildFront builds cmd/shed-front as DIR/shed, with a stand-in for the whole CLI beside it that
// prints its argv, so that a test sees what the front hands over.
func buildFront(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	build := exec.Command("go", "build", "-o", filepath.Join(dir, "shed"), "../shed-front")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build shed-front: %v\n%s", err, out)
	}
	stub := "#!/bin/sh\nprintf shed-cli; for a in \"$@\"; do printf ' [%s]' \"$a\"; done; echo\nexit 99\n"
	if err := os.WriteFile(filepath.Join(dir, "shed-cli"), []byte(stub), 0o755); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, "shed")
}

// outcome is what a run printed and its exit code, and the request frame it sent.
type outcome struct {
	stdout, stderr string
	exit           int
	request        string
}

// TestFront runs the small shed (cmd/shed-front) and the whole CLI on the same command lines against
// the same fake supervisor: where the front takes a command line, its request frame, output and exit
// code must be the whole CLI's; every other command line it must hand to the whole CLI unchanged.
func TestFront(t *testing.T) {
	front := buildFront(t)
	sup := startFakeSupervisor(t)
	t.Setenv("SHED_SOCKET", sup.sock)
	t.Setenv("TERM", "xterm-test")

	whole := func(args []string) outcome {
		var stdout, stderr bytes.Buffer
		code := run(append([]string{"shed"}, args...), &stdout, &stderr)
		return outcome{stdout.String(), stderr.String(), code, string(sup.request())}
	}
	small := func(args []string) (outcome, bool) {
		cmd := exec.Command(front, args...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		o := outcome{stdout.String(), stderr.String(), code, string(sup.request())}
		if code == 99 && strings.HasPrefix(o.stdout, "shed-cli") {
			// Handed over: with its argv unchanged.
			want := "shed-cli"
			for _, a := range args {
				want += " [" + a + "]"
			}
			if o.stdout != want+"\n" || o.request != "" {
				t.Errorf("%q: handed over as %q (request %q), want %q", args, o.stdout, o.request, want)
			}
			return o, false
		}
		return o, true
	}

	ok := `{"result":{"exit":0}}`
	replies := map[string][]string{
		"ok":       {`{"notice":{"kind":"info","message":"realizing"}}`, `{"notice":{"kind":"warning","message":"a warning"}}`, ok},
		"exit":     {`{"result":{"exit":3}}`},
		"oom":      {`{"result":{"exit":137,"oom_killed":true,"memory_bytes":536870912,"no_space":"/home: no space"}}`},
		"oom-host": {`{"result":{"exit":137,"oom_killed":true}}`},
		"timeout":  {`{"result":{"exit":124,"timed_out":true}}`},
		"error":    {`{"notice":{"kind":"info","message":"x"}}`, `{"error":{"code":"not_found","message":"no Bench \"b\"","hint":"shed bench ls lists them"}}`},
		"usage":    {`{"error":{"code":"usage","message":"bad <grant> & more"}}`},
		"nocmd":    {`{"error":{"code":"no_command","message":"exec nope","hint":"add it"}}`},
		"eof":      {`{"notice":{"kind":"info","message":"x"}}`},
		"empty":    {`{}`},
		"badres":   {`{"result":"no"}`},
		"badexit":  {`{"result":{"exit":"0"}}`},
	}
	// Every error code, for its exit code (and one the CLI does not know).
	for _, code := range []string{"failed", "usage", "invalid", "problems", "denied", "not_found", "conflict", "bad_request",
		"unknown_operation", "busy", "no_command", "internal", "new_code"} {
		replies["code-"+code] = []string{`{"error":{"code":"` + code + `","message":"m"}}`}
	}
	every := slices.Sorted(func(yield func(string) bool) {
		for k := range replies {
			if !yield(k) {
				return
			}
		}
	})

	for _, tc := range []struct {
		args    []string
		handled bool // the front takes it
		replies []string
	}{
		{[]string{"bench", "run", "--offline", "-f", "w.toml", "--", "/bin/true"}, true, every},
		{[]string{"bench", "exec", "b", "--", "true"}, true, every},
		{[]string{"bench", "exec", "--timeout", "30s", "b", "--", "sleep", "60"}, true, []string{"timeout", "ok"}},
		{[]string{"--json", "bench", "run", "--", "true"}, true, every},
		{[]string{"bench", "run", "--json", "-f", "w.toml", "--verbose", "--", "true", "--json"}, true, []string{"ok", "error"}},
		{[]string{"-verbose", "bench", "run", "true", "-x", "--json"}, true, []string{"ok"}},
		{[]string{"bench", "run", "-f=w.toml", "--net=none", "--keep", "--name", "n1", "-u", "dev", "-t", "--metrics", "--verify", "--grant", "/a:/b:ro", "--grant=/c", "--substituter", "oci-layout:/x", "--", "sh", "-c", "x"}, true, []string{"ok"}},
		{[]string{"bench", "run", "--file", "", "--", "true"}, true, []string{"ok"}},
		{[]string{"bench", "run", "--", "--", "true"}, true, []string{"ok"}},
		{[]string{"bench", "run", "-", "true"}, true, []string{"ok"}},
		{[]string{"bench", "exec", "-t", "-w", "/tmp", "-u", "root", "--env", "A=1", "--env=B=2", "b", "true", "--", "x"}, true, []string{"ok"}},
		{[]string{"bench", "exec", "--", "b", "true"}, true, []string{"ok"}},
		{[]string{"bench", "exec", "--timeout", " 2m ", "b", "--", "true"}, true, []string{"timeout"}},
		// The whole CLI's: errors of its parser, flags the front does not know, other commands.
		{[]string{"bench", "run"}, false, nil},
		{[]string{"bench", "run", "-f", "w.toml", "--"}, false, nil},
		{[]string{"bench", "run", "-f"}, false, nil},
		{[]string{"bench", "run", "--bogus", "--", "true"}, false, nil},
		{[]string{"bench", "run", "--help"}, false, nil},
		{[]string{"bench", "run", "-h", "--", "true"}, false, nil},
		{[]string{"bench", "run", "--memory", "1G", "--", "true"}, false, []string{"ok"}},
		{[]string{"bench", "run", "--pids", "10", "--", "true"}, false, []string{"ok"}},
		{[]string{"bench", "run", "--offline=true", "--", "true"}, false, []string{"ok"}},
		{[]string{"bench", "run", "-f", "a", "-f", "b", "--", "true"}, false, []string{"ok"}},
		{[]string{"bench", "run", "--grant", "/a,/b", "--", "true"}, false, []string{"ok"}},
		{[]string{"bench", "run", "--grant", " /a", "--", "true"}, false, []string{"ok"}},
		{[]string{"bench", "run", "---f", "w", "--", "true"}, false, nil},
		{[]string{"bench", "run", "-tk", "--", "true"}, false, nil},
		{[]string{"bench", "run", "-t", "--tty", "--", "true"}, false, nil},
		{[]string{"bench", "run", "-t", "-t", "--", "true"}, true, []string{"ok"}},
		{[]string{"bench", "exec", "-e", "A=1", "--env", "B=2", "b", "true"}, false, nil},
		{[]string{"bench", "exec", "-e", "A=1", "-e", "B=2", "b", "true"}, true, []string{"ok"}},
		{[]string{"bench", "run", "--", "true", "--generate-bash-completion"}, false, nil},
		{[]string{"--root", "/nonexistent", "bench", "run", "--", "true"}, false, nil},
		{[]string{"bench", "run", "--root=/nonexistent", "--", "true"}, false, nil},
		{[]string{"bench", "exec", "b"}, false, nil},
		{[]string{"bench", "exec", "b", "--"}, false, nil},
		{[]string{"bench", "exec", "--timeout", "30", "b", "--", "true"}, false, nil},
		{[]string{"bench", "exec", "--timeout", "1500ms", "b", "--", "true"}, false, nil},
		{[]string{"bench", "exec", "--timeout", "", "b", "--", "true"}, true, []string{"ok"}},
		{[]string{"bench", "shell"}, false, []string{"ok"}},
		{[]string{"bench", "ls"}, false, []string{`{"result":{"benches":[]}}`}},
		{[]string{"bench", "help", "run"}, false, nil},
		{[]string{"help", "bench", "run"}, false, nil},
		{[]string{"--version"}, false, nil},
		{[]string{}, false, nil},
		{[]string{"__complete", "bench", "run", ""}, false, nil},
		{[]string{"bench"}, false, nil},
	} {
		rs := tc.replies
		if len(rs) == 0 {
			rs = []string{"ok"}
		}
		for _, r := range rs {
			sup.answer(replies[r]...)
			if replies[r] == nil {
				sup.answer(r)
			}
			w := whole(tc.args)
			f, handled := small(tc.args)
			if handled != tc.handled {
				t.Errorf("%q: the front took it: %v, want %v (%+v)", tc.args, handled, tc.handled, f)
				continue
			}
			if !handled {
				continue
			}
			if w.request == "" {
				t.Errorf("%q: the whole CLI sent no request, the front did: %s", tc.args, f.request)
			}
			if f != w {
				t.Errorf("%q, reply %s:\n front %+v\n whole %+v", tc.args, r, f, w)
			}
		}
	}

	// Without a supervisor, everything is the whole CLI's.
	for _, sock := range []string{"none", filepath.Join(t.TempDir(), "absent.sock")} {
		t.Setenv("SHED_SOCKET", sock)
		if _, handled := small([]string{"bench", "run", "--", "true"}); handled {
			t.Errorf("SHED_SOCKET=%s: the front took bench run", sock)
		}
	}
}

// TestFrontInterrupted: a signal while the supervisor works cancels the request (the connection
// closes) and both programs say so alike, exit 128+N.
func TestFrontInterrupted(t *testing.T) {
	front := buildFront(t)
	sup := startFakeSupervisor(t)
	t.Setenv("SHED_SOCKET", sup.sock)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	sup.answer() // hold
	var got []string
	for _, path := range []string{self, front} { // the test binary is the whole CLI as "shed" (TestMain)
		for _, args := range [][]string{{"bench", "run", "--", "true"}, {"--json", "bench", "exec", "b", "--", "true"}} {
			cmd := exec.Command(path, args...)
			cmd.Args[0] = "shed"
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			<-sup.requests
			if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
				t.Fatal(err)
			}
			<-sup.closed
			err := cmd.Wait()
			ee, ok := err.(*exec.ExitError)
			if !ok || ee.ExitCode() != 130 {
				t.Errorf("%s %q: %v, want exit 130; stderr %s", path, args, err, stderr.String())
			}
			got = append(got, stdout.String()+stderr.String())
		}
	}
	if len(got) == 4 && (got[0] != got[2] || got[1] != got[3]) {
		t.Errorf("interrupted: the whole CLI says\n%s%s the front\n%s%s", got[0], got[1], got[2], got[3])
	}
	if len(got) == 4 && !strings.Contains(got[0], "interrupted (SIGINT)") {
		t.Errorf("interrupted: %q", got[0])
	}
}

// TestFrontNotRoot: for a user other than root with SHED_SOCKET unset, the front takes a command to
// the default socket where the whole CLI does, when the user has no store of their own ($SHED_ROOT,
// $XDG_DATA_HOME/toolshed, ~/.local/share/toolshed), and hands it over where the user has one. Both run
// as nobody in a mount namespace whose /run/toolshed is the fake supervisor's.
func TestFrontNotRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: runs shed as nobody beside a supervisor at the default socket, in a mount namespace")
	}
	for _, tool := range []string{"unshare", "setpriv"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s: %v", tool, err)
		}
	}
	open := func(p string) { // nobody reaches p
		t.Helper()
		for d := p; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
			if err := os.Chmod(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	front := buildFront(t)
	open(filepath.Dir(front))
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	whole := filepath.Join(t.TempDir(), "shed") // the test binary is the whole CLI as "shed" (TestMain)
	if out, err := exec.Command("install", "-m", "0755", self, whole).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	open(filepath.Dir(whole))
	sup := startFakeSupervisor(t)
	open(filepath.Dir(sup.sock))
	if err := os.Chmod(sup.sock, 0o666); err != nil {
		t.Fatal(err)
	}
	sup.answer(`{"result":{"exit":0}}`)
	base := t.TempDir()
	open(base)
	store := func(dir string) string { // an initialized store's marker (store.Initialized)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "config.toml"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	bare, owner := filepath.Join(base, "bare"), filepath.Join(base, "owner")
	store(filepath.Join(owner, ".local", "share", "toolshed"))
	xdg := filepath.Join(base, "xdg")
	store(filepath.Join(xdg, "toolshed"))
	own := store(filepath.Join(base, "own"))
	asNobody := func(bin string, env []string) (outcome, bool) {
		t.Helper()
		cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c",
			`mount -t tmpfs tmpfs /run && mkdir /run/toolshed && mount --bind "$1" /run/toolshed && shift && exec setpriv --reuid=65534 --regid=65534 --clear-groups -- "$@"`,
			"sh", filepath.Dir(sup.sock), bin, "bench", "run", "--", "true")
		cmd.Env = append([]string{"PATH=/usr/bin:/bin", "TERM=xterm-test"}, env...)
		cmd.Dir = base
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		o := outcome{stdout.String(), stderr.String(), code, string(sup.request())}
		return o, !(code == 99 && strings.HasPrefix(o.stdout, "shed-cli"))
	}
	for _, tc := range []struct {
		env     []string
		handled bool
	}{
		{[]string{"HOME=" + bare}, true},
		{[]string{"HOME=" + bare, "XDG_DATA_HOME=relative"}, true},
		{[]string{"HOME=" + owner}, false},
		{[]string{"HOME=" + bare, "XDG_DATA_HOME=" + xdg}, false},
		{[]string{"HOME=" + owner, "XDG_DATA_HOME=" + filepath.Join(base, "none")}, true},
		{[]string{"HOME=" + bare, "SHED_ROOT=" + own}, false},
		{[]string{"HOME=" + owner, "SHED_ROOT=" + filepath.Join(base, "none")}, true},
		{[]string{"HOME=" + owner, "SHED_SOCKET=/run/toolshed/shed.sock"}, true},
	} {
		w, _ := asNobody(whole, tc.env)
		f, handled := asNobody(front, tc.env)
		if handled != tc.handled {
			t.Errorf("%q: the front took it: %v, want %v\n front %+v\n whole %+v", tc.env, handled, tc.handled, f, w)
			continue
		}
		if handled && (w.request == "" || f != w) {
			t.Errorf("%q:\n front %+v\n whole %+v", tc.env, f, w)
		}
		if !handled && w.request != "" {
			t.Errorf("%q: the whole CLI sent %s, the front handed the command over", tc.env, w.request)
		}
	}
}
