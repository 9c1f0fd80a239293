package sandbox_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"toolshed.dev/shed/sandbox"
)

// controlled is a running sandbox with a control socket, whose main command waits for its stdin to close.
type controlled struct {
	p       *sandbox.Process
	control string
	stdin   *os.File
}

// startPiped starts spec with its stdin and its combined stdout and stderr on pipes; the cleanup
// closes stdin and waits (Wait may also be called by the test).
func startPiped(t *testing.T, spec *sandbox.Spec) (p *sandbox.Process, out *bufio.Scanner, stdin *os.File) {
	t.Helper()
	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	p, err = sandbox.Start(context.Background(), spec, sandbox.Stdio{Stdin: stdinR, Stdout: outW, Stderr: outW})
	stdinR.Close()
	outW.Close()
	if err != nil {
		stdinW.Close()
		outR.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdinW.Close()
		p.Wait()
		outR.Close()
	})
	return p, bufio.NewScanner(outR), stdinW
}

// startControlled starts spec, whose command must print "ready" and then wait on stdin, with a control
// socket in a fresh directory.
func startControlled(t *testing.T, spec *sandbox.Spec) *controlled {
	t.Helper()
	spec.Control = filepath.Join(t.TempDir(), "control.sock")
	p, lines, stdin := startPiped(t, spec)
	if !lines.Scan() || lines.Text() != "ready" {
		t.Fatalf("got %q, want ready", lines.Text())
	}
	go func() {
		for lines.Scan() {
			t.Logf("main command: %s", lines.Text())
		}
	}()
	return &controlled{p: p, control: spec.Control, stdin: stdin}
}

type execResult struct {
	code           int
	stdout, stderr string
	err            error
}

func execIn(c *controlled, req sandbox.ExecRequest, stdin string) execResult {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out, errb bytes.Buffer
	code, err := sandbox.Exec(ctx, c.control, req, sandbox.Stdio{Stdin: strings.NewReader(stdin), Stdout: &out, Stderr: &errb})
	return execResult{code, out.String(), errb.String(), err}
}

func sh(script string) sandbox.ExecRequest {
	return sandbox.ExecRequest{Argv: []string{"sh", "-c", script}, Env: []string{"PATH=/bin"}}
}

// TestExec is not parallel: it makes cgroups, which the limits tests count.
func TestExec(t *testing.T) {
	requireRoot(t)
	spec := tmpfsSpec(t, "sh", "-c", "echo from-main > /tmp/shared; echo ready; read x; exit 0")
	spec.Limits.Pids = 64
	c := startControlled(t, spec)

	var st unix.Stat_t
	if err := unix.Lstat(c.control, &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK || st.Mode&0o777 != 0o600 {
		t.Errorf("control socket: mode %o, want a socket with mode 0600", st.Mode)
	}

	// Same pid namespace (init is pid 1, the command is not), same files, same cgroup and restrictions
	// (a user namespace of the sandbox's ids, where it has every capability; no_new_privs; seccomp);
	// a session of its own without a terminal.
	r := execIn(c, sh(`echo $$; tr '\0' ' ' < /proc/1/cmdline; echo; cat /tmp/shared; grep -c /toolshed/ /proc/self/cgroup
		grep -E '^(CapEff|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status; echo "sid=$(cut -d' ' -f6 /proc/self/stat) tty=$(cut -d' ' -f7 /proc/self/stat)"
		tr -s ' ' < /proc/self/uid_map`), "")
	if r.err != nil || r.code != 0 {
		t.Fatalf("got %d, %v (stderr %q)", r.code, r.err, r.stderr)
	}
	lines := strings.Split(r.stdout, "\n")
	if pid, err := strconv.Atoi(lines[0]); err != nil || pid <= 1 {
		t.Errorf("exec'd pid %q, want > 1 in the sandbox's pid namespace", lines[0])
	}
	for _, want := range []string{"\nshed-sandbox-init \n", "\nfrom-main\n", "CapEff:\t000001ffffffffff\n",
		"NoNewPrivs:\t1\n", "Seccomp:\t2\n", fmt.Sprintf("sid=%s tty=0\n", lines[0])} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("missing %q in:\n%s", want, r.stdout)
		}
	}
	if m := regexp.MustCompile(`(?m)^ 0 (\d+) 65536$`).FindStringSubmatch(r.stdout); m == nil {
		t.Errorf("uid_map: want 0 mapped to a range of 65536 host ids:\n%s", r.stdout)
	} else if base, _ := strconv.ParseUint(m[1], 10, 32); base < 0x70000000 {
		t.Errorf("uid_map: the sandbox's root is host uid %d, want one of the sandbox range", base)
	}
	if n := lines[3]; n == "0" {
		t.Errorf("the exec'd command is in no /toolshed/ cgroup:\n%s", r.stdout)
	}

	for _, tc := range []struct {
		script string
		want   int
	}{{"exit 0", 0}, {"exit 7", 7}, {"kill -9 $$", 137}} {
		if r := execIn(c, sh(tc.script), ""); r.err != nil || r.code != tc.want {
			t.Errorf("%s: got %d, %v, want %d", tc.script, r.code, r.err, tc.want)
		}
	}
	if r := execIn(c, sh("cat; echo err >&2"), "hello\nworld\n"); r.stdout != "hello\nworld\n" || r.stderr != "err\n" {
		t.Errorf("stdio: got %q %q", r.stdout, r.stderr)
	}
	req := sandbox.ExecRequest{Argv: []string{"/bin/sh", "-c", "id -u; id -g; id -G; pwd"}, Dir: "/etc", UID: 1234, GID: 5678}
	if r := execIn(c, req, ""); r.stdout != "1234\n5678\n5678\n/etc\n" {
		t.Errorf("credentials, dir: got %q %q %v", r.stdout, r.stderr, r.err)
	}
	if r := execIn(c, sandbox.ExecRequest{Argv: []string{"/bin/env"}, Env: []string{"A=1", "B=two words"}}, ""); r.stdout != "A=1\nB=two words\n" {
		t.Errorf("env: got %q %q %v, want exactly the request's", r.stdout, r.stderr, r.err)
	}
	// An *os.File is passed as is, and stdout and stderr may be the same writer.
	f, err := os.Create(filepath.Join(t.TempDir(), "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if code, err := sandbox.Exec(context.Background(), c.control, sh("echo out; echo err >&2"), sandbox.Stdio{Stdout: f, Stderr: f}); err != nil || code != 0 {
		t.Errorf("file stdio: %d, %v", code, err)
	}
	if b, _ := os.ReadFile(f.Name()); string(b) != "out\nerr\n" {
		t.Errorf("file stdio: got %q", b)
	}
	var both bytes.Buffer
	if _, err := sandbox.Exec(context.Background(), c.control, sh("echo out; echo err >&2"), sandbox.Stdio{Stdout: &both, Stderr: &both}); err != nil || both.String() != "out\nerr\n" {
		t.Errorf("one writer for both: got %q, %v", both.String(), err)
	}
	// Start failures come back as SetupErrors; invalid requests are refused before connecting.
	r = execIn(c, sandbox.ExecRequest{Argv: []string{"no-such-command"}, Env: []string{"PATH=/bin"}}, "")
	wantSetupError(t, r.err, "exec", "no-such-command", unix.ENOENT)
	r = execIn(c, sandbox.ExecRequest{Argv: []string{"/bin/true"}, Dir: "/nonexistent"}, "")
	wantSetupError(t, r.err, "chdir", "/nonexistent", unix.ENOENT)
	var se *sandbox.SpecError
	if r := execIn(c, sandbox.ExecRequest{Argv: []string{"bin/sh"}}, ""); !errors.As(r.err, &se) || se.Field != "argv[0]" {
		t.Errorf("invalid request: got %v, want a SpecError on argv[0]", r.err)
	}

	// Several at once.
	errs := make(chan error, 8)
	for i := range 8 {
		go func() {
			r := execIn(c, sh(fmt.Sprintf("echo %d", i)), "")
			if r.err == nil && r.stdout != fmt.Sprintf("%d\n", i) {
				r.err = fmt.Errorf("exec %d: got %q", i, r.stdout)
			}
			errs <- r.err
		}()
	}
	for range 8 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}

	// When the main command exits, the sandbox ends: the socket no longer accepts (a connection made
	// while init exits ends without an answer), and Wait removes it.
	c.stdin.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		r := execIn(c, sh("true"), "")
		if r.err != nil && !errors.Is(r.err, sandbox.ErrNotRunning) {
			t.Fatalf("exec after the main command exited: got %v, want ErrNotRunning", r.err)
		}
		if r.err != nil && strings.Contains(r.err.Error(), "connection refused") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("exec after the main command exited: got %d, %v, want connection refused", r.code, r.err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if code, err := c.p.Wait(); err != nil || code != 0 {
		t.Fatalf("wait: %d, %v", code, err)
	}
	if _, err := os.Lstat(c.control); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("control socket after Wait: %v, want it removed", err)
	}
	r = execIn(c, sh("true"), "")
	if !errors.Is(r.err, sandbox.ErrNotRunning) || !strings.Contains(r.err.Error(), "sandbox is not running") {
		t.Errorf("after Wait: got %v, want ErrNotRunning", r.err)
	}
}

func TestExecEndsWithSandbox(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	c := startControlled(t, readOnlySpec(t, "sh", "-c", "echo ready; read x; exit 0"))
	// Cancelling Exec kills its command.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := sandbox.Exec(ctx, c.control, sandbox.ExecRequest{Argv: []string{"/bin/sleep", "1002"}}, sandbox.Stdio{Stdout: &bytes.Buffer{}})
		done <- err
	}()
	cancelled := findProcess(t, "/bin/sleep\x001002\x00", 5*time.Second)
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled exec: got %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("cancelled exec did not return")
	}
	waitGone(t, cancelled, "/bin/sleep\x001002\x00")

	// An exec'd command dies with the sandbox, and its Exec says so.
	go func() {
		_, err := sandbox.Exec(context.Background(), c.control, sandbox.ExecRequest{Argv: []string{"/bin/sleep", "1001"}}, sandbox.Stdio{})
		done <- err
	}()
	pid := findProcess(t, "/bin/sleep\x001001\x00", 5*time.Second)
	c.stdin.Close()
	if code, err := c.p.Wait(); err != nil || code != 0 {
		t.Fatalf("wait: %d, %v", code, err)
	}
	waitGone(t, pid, "/bin/sleep\x001001\x00")
	select {
	case err := <-done:
		if !errors.Is(err, sandbox.ErrNotRunning) {
			t.Errorf("exec whose sandbox ended: got %v, want ErrNotRunning", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("exec did not return when its sandbox ended")
	}
}

// waitGone waits until host pid no longer runs cmdline.
func waitGone(t *testing.T, pid int, cmdline string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err != nil || string(b) != cmdline {
			return
		}
	}
	t.Errorf("%q (host pid %d) still runs", cmdline, pid)
}

func TestExecNotFromInside(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	dir := t.TempDir()
	control := filepath.Join(dir, "control.sock")
	// Validate refuses a control socket that a bind would show inside.
	spec := readOnlySpec(t, "true")
	spec.Control = control
	spec.Binds = []sandbox.Bind{{Source: dir, Target: "/run/ctl"}}
	var se *sandbox.SpecError
	if err := spec.Validate(); !errors.As(err, &se) || se.Field != "control" {
		t.Errorf("control inside a bind source: got %v, want a SpecError on control", err)
	}
	// A bind by descriptor cannot be checked: the command sees the socket. Its mode (0600, the host
	// root's) keeps the sandbox's root out; opened to all, init refuses a peer in its pid namespace.
	script := `ls /proc/self/fd | tr '\n' ' '; echo; test -e ` + control + ` && echo host-path-visible
		/run/probe connect /run/ctl/control.sock /proc/1/fd/*; echo ready; read x
		/run/probe connect /run/ctl/control.sock; echo ready; read x; exit 0`
	spec = readOnlySpec(t, "sh", "-c", script)
	spec.Binds = []sandbox.Bind{{SourceFD: openBeneath(t, filepath.Dir(dir), filepath.Base(dir)), Target: "/run/ctl"}, probeBind(t)}
	spec.Control = control
	var out bytes.Buffer
	p, lines, stdinW := startPiped(t, spec)
	untilReady := func() string {
		var b strings.Builder
		for lines.Scan() && lines.Text() != "ready" {
			b.WriteString(lines.Text() + "\n")
		}
		out.WriteString(b.String())
		return b.String()
	}
	first := untilReady()
	if err := os.Chmod(control, 0o666); err != nil {
		t.Fatal(err)
	}
	stdinW.Write([]byte("\n"))
	second := untilReady()
	// The host can exec meanwhile: the refusals were for the peer, not a broken socket.
	var o bytes.Buffer
	if code, err := sandbox.Exec(context.Background(), control, sandbox.ExecRequest{Argv: []string{"/bin/echo", "host"}}, sandbox.Stdio{Stdout: &o}); err != nil || code != 0 || o.String() != "host\n" {
		t.Errorf("exec from the host: %d, %v, %q", code, err, o.String())
	}
	stdinW.Close()
	if code, err := p.Wait(); err != nil || code != 0 {
		t.Fatalf("%d, %v:\n%s", code, err, out.String())
	}
	if !strings.HasPrefix(first, "0 1 2 3 \n") {
		t.Errorf("the command's descriptors: got %q, want 0 1 2 and ls's own", strings.SplitN(first, "\n", 2)[0])
	}
	if strings.Contains(first, "host-path-visible") {
		t.Errorf("the control socket is visible at its host path")
	}
	if !strings.Contains(first, "/run/ctl/control.sock: connect: permission denied") {
		t.Errorf("mode 0600: the sandbox's root connected:\n%s", first)
	}
	if !regexp.MustCompile(`connect /proc/1/fd/[^:]*: [^\n]*permission denied`).MatchString(first) || strings.Count(first, "connected") != 0 {
		t.Errorf("init's descriptors are reachable:\n%s", first)
	}
	if !strings.Contains(second, "refused: peer uid") || strings.Contains(second, `"Code"`) {
		t.Errorf("mode 0666: init did not refuse a peer inside:\n%s", second)
	}
	t.Logf("%s", out.String())
}

func TestExecPeerUID(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	c := startControlled(t, readOnlySpec(t, "sh", "-c", "echo ready; read x; exit 0"))
	for _, d := range []string{filepath.Dir(c.control), filepath.Dir(filepath.Dir(c.control))} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	asNobody := func() string {
		cmd := exec.Command(probeBind(t).Source, "connect", c.control)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("probe as nobody: %v\n%s", err, out)
		}
		return string(out)
	}
	if got := asNobody(); !strings.Contains(got, "permission denied") {
		t.Errorf("mode 0600: got %q, want connect refused to another uid", got)
	}
	if err := os.Chmod(c.control, 0o666); err != nil {
		t.Fatal(err)
	}
	if got := asNobody(); !strings.Contains(got, "refused: peer uid 65534 is not the sandbox creator's 0") {
		t.Errorf("mode 0666: got %q, want init to refuse uid 65534", got)
	}
}

func TestExecNoSandbox(t *testing.T) {
	_, err := sandbox.Exec(context.Background(), filepath.Join(t.TempDir(), "none.sock"), sandbox.ExecRequest{Argv: []string{"true"}}, sandbox.Stdio{})
	if !errors.Is(err, sandbox.ErrNotRunning) {
		t.Errorf("got %v, want ErrNotRunning", err)
	}
}

// TestExecServerUID: Exec talks only to a control socket of its own uid. Another user who binds the
// name (an abstract one, anyone's once its sandbox has ended) gets neither the request nor stdio.
func TestExecServerUID(t *testing.T) {
	requireRoot(t)
	addr := fmt.Sprintf("@toolshed-test-squat-%d", os.Getpid())
	cmd := exec.Command(probeBind(t).Source, "squat", addr)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	sc := bufio.NewScanner(out)
	if !sc.Scan() || sc.Text() != "listening" {
		t.Fatalf("squatter: %q", sc.Text())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second) // a squatter never answers
	defer cancel()
	_, err = sandbox.Exec(ctx, addr, sandbox.ExecRequest{Argv: []string{"true"}}, sandbox.Stdio{Stdin: os.Stdin})
	if !errors.Is(err, unix.EPERM) || !strings.Contains(err.Error(), "not a sandbox of this user") {
		t.Errorf("got %v, want EPERM: not a sandbox of this user", err)
	}
	if !sc.Scan() || sc.Text() != "squat: got 0 bytes and 0 descriptors" {
		t.Errorf("squatter: %q", sc.Text())
	}
	cmd.Wait()
}

// TestExecSignal: a signal sent through Stdio.Signal reaches the command's process, which may catch
// it (a SIGTERM handled is an exit of the handler's choosing, not a kill).
func TestExecSignal(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	c := startControlled(t, readOnlySpec(t, "sh", "-c", "echo ready; read x; exit 0"))
	sigs := make(chan syscall.Signal, 1)
	ready := make(chan struct{})
	var out bytes.Buffer
	w := &notifyWriter{w: &out, want: "ready", seen: ready}
	done := make(chan execResult, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		code, err := sandbox.Exec(ctx, c.control, sh(`trap 'echo caught; exit 7' TERM; echo ready; while :; do sleep 0.05; done`),
			sandbox.Stdio{Stdout: w, Signal: sigs})
		done <- execResult{code: code, err: err}
	}()
	select {
	case <-ready:
	case <-time.After(10 * time.Second):
		t.Fatal("the command did not start")
	}
	sigs <- syscall.SIGTERM
	r := <-done
	if r.err != nil || r.code != 7 || !strings.Contains(out.String(), "caught") {
		t.Errorf("SIGTERM: exit %d, %v, output %q; want the trap's exit 7 and its output", r.code, r.err, out.String())
	}
}

// notifyWriter closes seen once what it was written contains want.
type notifyWriter struct {
	mu   sync.Mutex
	w    *bytes.Buffer
	want string
	seen chan struct{}
	done bool
}

func (n *notifyWriter) Write(b []byte) (int, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.w.Write(b)
	if !n.done && strings.Contains(n.w.String(), n.want) {
		n.done = true
		close(n.seen)
	}
	return len(b), nil
}
