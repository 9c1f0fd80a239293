package tests

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

var hosts atomic.Int32

// testHostMu is held by the test that has the test host, from startTestHost to its end: two hosts
// at one address would answer for each other (TestBenchWork's pip index for TestSupervisorLoop's,
// seen in CI), and parallel tests use it.
var testHostMu sync.Mutex

// startTestHost makes a host outside this machine's network as far as a Bench
// can tell: a network namespace behind a veth pair, at 198.51.100.2
// (TEST-NET-2, on this machine only), serving www over HTTP on port 80, and
// returns its address. One test has it at a time (testHostMu).
func startTestHost(t *testing.T, www string) string {
	t.Helper()
	testHostMu.Lock()
	t.Cleanup(testHostMu.Unlock) // registered first: runs after the host's own cleanups
	removeStaleHosts()
	n := int(hosts.Add(1))
	ns := fmt.Sprintf("shedtest-%d-%d", os.Getpid(), n)
	veth := fmt.Sprintf("shv%d", (os.Getpid()*10+n)%100000)
	peer := fmt.Sprintf("shp%d", (os.Getpid()*10+n)%100000)
	script := fmt.Sprintf(`ip netns add %[1]s
ip link add %[2]s type veth peer name %[3]s
ip link set %[3]s netns %[1]s
ip addr add 198.51.100.1/30 dev %[2]s
ip link set %[2]s up
ip -n %[1]s addr add 198.51.100.2/30 dev %[3]s
ip -n %[1]s link set %[3]s up
ip -n %[1]s link set lo up`, ns, veth, peer)
	if out, err := exec.Command("sh", "-ec", script).CombinedOutput(); err != nil {
		t.Fatalf("make the test host: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		exec.Command("ip", "netns", "del", ns).Run()
		exec.Command("ip", "link", "del", veth).Run()
	})
	server := exec.Command("ip", "netns", "exec", ns, "python3", "-m", "http.server", "80", "--bind", "198.51.100.2", "-d", www)
	server.SysProcAttr = dieWithTests()
	if err := server.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Process.Kill(); server.Wait() })
	for i := 0; i < 100; i++ {
		if resp, err := http.Get("http://198.51.100.2/"); err == nil {
			resp.Body.Close()
			return "198.51.100.2"
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("the test host does not answer")
	return ""
}

// removeStaleHosts removes the test hosts of test processes that are gone: a run killed before its
// cleanup (a test timeout) leaves its namespace, whose veth would answer for 198.51.100.2 instead of
// the new one. Deleting a namespace nothing runs in takes its veth pair with it.
func removeStaleHosts() {
	out, _ := exec.Command("ip", "netns", "list").Output()
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		var pid, n int
		if len(f) == 0 {
			continue
		}
		if _, err := fmt.Sscanf(f[0], "shedtest-%d-%d", &pid, &n); err == nil && syscall.Kill(pid, 0) == syscall.ESRCH {
			exec.Command("ip", "netns", "del", f[0]).Run()
		}
	}
}

// dieWithTests makes a helper process (a server, a daemon) die with the test binary, also when a
// timeout kills it before its cleanups run.
func dieWithTests() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
