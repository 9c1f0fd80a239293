package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestLeanLinksNoServer: shed-cli (this package built with the tag shed_lean) runs every launch and
// realize on a store, and pays the package initialization of everything it links; the servers'
// libraries are shed-serve's only (serve.go). An import that brings one back fails here, naming it.
func TestLeanLinksNoServer(t *testing.T) {
	out, err := exec.Command("go", "list", "-tags", "urfave_cli_no_docs,shed_lean", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 100 {
		t.Fatalf("go list listed %d packages: %q", len(deps), deps)
	}
	for _, d := range deps {
		for _, server := range []string{"k8s.io/", "sigs.k8s.io/", "google.golang.org/grpc", "github.com/containerd/",
			"github.com/modelcontextprotocol/", "connectrpc.com/", "toolshed.dev/shed/e2b", "toolshed.dev/shed/mcp",
			"toolshed.dev/shed/snapshotter", "toolshed.dev/shed/k8s"} {
			if strings.HasPrefix(d, server) {
				t.Errorf("shed-cli links %s: a server's library (only shed-serve may, in serve.go)", d)
			}
		}
	}
}

// TestServedWord: main hands a command line to shed-serve by its command word, the first that is
// not a global flag (--root takes a value); what follows the word, a Bench's command included, is
// not read.
func TestServedWord(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"shed", "daemon"}, "daemon"},
		{[]string{"shed", "--root", "/srv/shed", "k8s", "manifests"}, "k8s"},
		{[]string{"shed", "--json", "--root=/srv", "mcp"}, "mcp"},
		{[]string{"shed", "-root", "daemon", "bench", "run"}, "bench"}, // a store called daemon
		{[]string{"shed", "bench", "run", "--", "daemon"}, "bench"},
		{[]string{"shed", "workshop", "ls", "--json"}, "workshop"},
		{[]string{"shed", "--verbose"}, ""},
		{[]string{"shed"}, ""},
	} {
		if got := commandWord(c.args); got != c.want {
			t.Errorf("commandWord(%q) = %q, want %q", c.args, got, c.want)
		}
	}
}
