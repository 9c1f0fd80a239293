//go:build shed_lean

package main

// shed-cli is built lean (the tag shed_lean, as `make build` does): the commands whose libraries
// only shed-serve links (serve.go) hand their command line, unchanged, to shed-serve beside it, as
// the small shed hands its own to shed-cli.

import (
	"fmt"
	"os"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"toolshed.dev/shed/internal/sibling"
)

// ServeName is the file name of the CLI built whole, with the servers.
const ServeName = "shed-serve"

var daemonServe, mcpServe, snapshotterServe, k8sManifests = inServe, inServe, inServe, inServe

// inServe replaces this process with shed-serve, with the same argv and environment: its flags
// were parsed here as they will be there, so a bad one is said before the exec.
func inServe(c *cli.Context) error {
	p, err := sibling.Find(ServeName)
	if err == nil {
		err = unix.Exec(p, os.Args, os.Environ())
	}
	return withHint(exitFailure, fmt.Errorf("%s runs in %s: %w", c.Command.HelpName, ServeName, err),
		"install shed again (`make install`): shed-cli runs shed-serve for the servers and the Kubernetes objects")
}
