package tests

import (
	"net"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestDaemonBusyE2BPort: a supervisor whose --e2b port another program holds says so before it
// says it is on, and its hint names a port that is free, not the busy one, and port 0.
func TestDaemonBusyE2BPort(t *testing.T) {
	requireRoot(t)
	root := newRoot(t)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	cmd := exec.Command(shedBin, "--root", root, "daemon", "--socket", filepath.Join(t.TempDir(), "s.sock"), "--e2b", busy.Addr().String())
	cmd.SysProcAttr = dieWithTests()
	done := make(chan result, 1)
	go func() { done <- runResult(t, cmd) }()
	var r result
	select {
	case r = <-done:
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("the supervisor started on a busy --e2b port")
	}
	m := regexp.MustCompile(`--e2b (127\.0\.0\.1:[0-9]+)`).FindAllStringSubmatch(r.stderr, -1)
	if r.code != 1 || !strings.Contains(r.stderr, "address already in use") || strings.Contains(r.stderr, "supervisor on") ||
		len(m) < 2 || m[1][1] == busy.Addr().String() || !strings.Contains(r.stderr, "--e2b 127.0.0.1:0") {
		t.Fatalf("a busy --e2b port: exit %d, want 1, the port in use, and a hint naming another port and port 0:\n%s", r.code, r.stderr)
	}
	if l, err := net.Listen("tcp", m[1][1]); err != nil {
		t.Errorf("the port the hint names, %s, is not free: %v", m[1][1], err)
	} else {
		l.Close()
	}
}
