package tests

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestBenchNetworkProfile: a Bench reaches what its recipe allows, through the
// proxy, and nothing else. The allowed destination is a test host the test
// makes: a network namespace behind a veth pair, at 198.51.100.2 (TEST-NET-2,
// on this machine only), serving HTTP.
func TestBenchNetworkProfile(t *testing.T) {
	requireRoot(t)
	root := sharedRoot(t)
	dir := t.TempDir()
	file := writeFile(t, filepath.Join(dir, "workshop.toml"), `name = "net-bench"
seed = "debian/bookworm"
[apt]
packages = ["curl"]
[network]
allow = ["198.51.100.2"]
`)
	realize(t, root, file)
	ns := "shedtest-" + fmt.Sprint(os.Getpid())
	sh := func(script string) {
		t.Helper()
		if out, err := exec.Command("sh", "-ec", script).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", script, err, out)
		}
	}
	sh(fmt.Sprintf(`ip netns add %[1]s
ip link add shv%[2]d type veth peer name shp%[2]d
ip link set shp%[2]d netns %[1]s
ip addr add 198.51.100.1/30 dev shv%[2]d
ip link set shv%[2]d up
ip -n %[1]s addr add 198.51.100.2/30 dev shp%[2]d
ip -n %[1]s link set shp%[2]d up
ip -n %[1]s link set lo up`, ns, os.Getpid()%10000))
	defer exec.Command("ip", "netns", "del", ns).Run()
	defer exec.Command("ip", "link", "del", fmt.Sprintf("shv%d", os.Getpid()%10000)).Run()
	www := t.TempDir()
	writeFile(t, filepath.Join(www, "hello.txt"), "hello from the test host\n")
	server := exec.Command("ip", "netns", "exec", ns, "python3", "-m", "http.server", "80", "--bind", "198.51.100.2", "-d", www)
	if err := server.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { server.Process.Kill(); server.Wait() }()
	for i := 0; i < 50; i++ {
		if resp, err := http.Get("http://198.51.100.2/hello.txt"); err == nil {
			resp.Body.Close()
			break
		}
		time.Sleep(100 * time.Millisecond)
	}

	r := mustShed(t, root, "bench", "run", "-f", file, "--keep", "--name", "netcheck", "--", "sh", "-c",
		`curl -sS http://198.51.100.2/hello.txt; curl -s -o /dev/null -w "%{http_code}\n" http://198.51.100.2:8000/; curl -s -o /dev/null -w "%{http_code}\n" http://example.org/; curl -s --noproxy '*' -m 3 http://198.51.100.2/hello.txt || echo direct-refused`)
	want := "hello from the test host\n403\n403\ndirect-refused\n"
	if r.stdout != want {
		t.Errorf("through the proxy: got %q, want %q", r.stdout, want)
	}
	logs := mustShed(t, root, "bench", "logs", "netcheck").stdout
	for _, w := range []string{`"host":"198.51.100.2","port":80,"allowed":true`, `"host":"198.51.100.2","port":8000,"allowed":false`, `"host":"example.org","port":80,"allowed":false`} {
		if !strings.Contains(logs, w) {
			t.Errorf("bench logs lack %s:\n%s", w, logs)
		}
	}
	mustShed(t, root, "bench", "rm", "netcheck")
	// --net none narrows the profile to loopback only.
	r = shed(t, root, nil, "bench", "run", "-f", file, "--net", "none", "--", "curl", "-sS", "-m", "3", "http://198.51.100.2/hello.txt")
	if r.code == 0 {
		t.Errorf("--net none reached the test host: %s", r.stdout)
	}
}
