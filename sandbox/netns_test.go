package sandbox_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"toolshed.dev/shed/sandbox"
)

// TestDialPort: a server on the sandbox's loopback is reached from the host, a port nothing listens on
// there is ErrPortClosed (even when the host's loopback has it), and a pid in the host's own network
// namespace or a bad port is refused.
func TestDialPort(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	host, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	hostPort := host.Addr().(*net.TCPAddr).Port
	spec := readOnlySpec(t, "sh", "-c", "echo hello-from-bench | nc -l -p 8000; echo done")
	var out, errb bytes.Buffer
	p, err := sandbox.Start(context.Background(), spec, sandbox.Stdio{Stdout: &out, Stderr: &errb})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Wait()
	ctx := context.Background()
	var c net.Conn
	for i := 0; ; i++ {
		c, err = sandbox.DialPort(ctx, p.Pid, 8000)
		if err == nil || !errors.Is(err, sandbox.ErrPortClosed) || i == 100 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("dial 8000: %v (stderr %q)", err, errb.String())
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	c.Close()
	if line != "hello-from-bench\n" {
		t.Errorf("read %q, %v", line, err)
	}
	if _, err := sandbox.DialPort(ctx, p.Pid, hostPort); !errors.Is(err, sandbox.ErrPortClosed) {
		t.Errorf("the host's port %d through the sandbox: %v, want ErrPortClosed", hostPort, err)
	}
	for _, port := range []int{0, -1, 65536} {
		if _, err := sandbox.DialPort(ctx, p.Pid, port); err == nil || !strings.Contains(err.Error(), "1 to 65535") {
			t.Errorf("port %d: %v", port, err)
		}
	}
	if _, err := sandbox.DialPort(ctx, os.Getpid(), hostPort); err == nil || !strings.Contains(err.Error(), "host's network namespace") {
		t.Errorf("the host's namespace: %v", err)
	}
	if code, err := p.Wait(); err != nil || code != 0 || !strings.Contains(out.String(), "done") {
		t.Errorf("sandbox: %d %v %q %q", code, err, out.String(), errb.String())
	}
}
