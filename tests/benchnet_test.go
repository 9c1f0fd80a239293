package tests

import (
	"path/filepath"
	"strings"
	"testing"
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
	www := t.TempDir()
	writeFile(t, filepath.Join(www, "hello.txt"), "hello from the test host\n")
	startTestHost(t, www)

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
