package sandbox_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"toolshed.dev/shed/sandbox"
)

// TestDialPort: a server on the sandbox's loopback (127.0.0.1, or ::1 only) is reached from the host, a
// port nothing listens on
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
	spec := readOnlySpec(t, "sh", "-c", "httpd -f -p [::1]:8002 -h /etc & echo hello-from-bench | nc -l -p 8000; nc -l -p 8009 </dev/null; kill $!; echo done")
	var out, errb bytes.Buffer
	p, err := sandbox.Start(context.Background(), spec, sandbox.Stdio{Stdout: &out, Stderr: &errb})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Wait()
	ctx := context.Background()
	// The servers start as the sandbox does: each is dialled until it listens (5 s at most).
	dial := func(port int) (net.Conn, error) {
		for i := 0; ; i++ {
			c, err := sandbox.DialPort(ctx, p.Pid, port)
			if err == nil || !errors.Is(err, sandbox.ErrPortClosed) || i == 100 {
				return c, err
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	c, err := dial(8000)
	if err != nil {
		t.Fatalf("dial 8000: %v (stderr %q)", err, errb.String())
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	c.Close()
	if line != "hello-from-bench\n" {
		t.Errorf("read %q, %v", line, err)
	}
	// A server on ::1 only (a dev server bound to "localhost" may be).
	if c, err = dial(8002); err != nil {
		t.Fatalf("dial 8002 on ::1: %v (stderr %q)", err, errb.String())
	}
	fmt.Fprintf(c, "GET /nothing HTTP/1.0\r\n\r\n")
	line, err = bufio.NewReader(c).ReadString('\n')
	c.Close()
	if !strings.HasPrefix(line, "HTTP/1.") {
		t.Errorf("read %q, %v from ::1", line, err)
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
	// A connection to 8009 ends the sandbox.
	if c, err = dial(8009); err != nil {
		t.Fatalf("dial 8009: %v", err)
	}
	c.Close()
	if code, err := p.Wait(); err != nil || code != 0 || !strings.Contains(out.String(), "done") {
		t.Errorf("sandbox: %d %v %q %q", code, err, out.String(), errb.String())
	}
}
