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
