//go:build shed_lean

package main

// shed-cli is built lean (the tag shed_lean, as `make build` does): the commands whose libraries
// only shed-serve links (serve.go) are handed, as main finds them (served), to shed-serve beside it,
// argv and environment unchanged, as the small shed hands its own to shed-cli. Their definitions
// are here too, for help, completion and the docs.

import (
	"os"

	"github.com/urfave/cli/v2"
)

const lean = true

// The actions, for a command line main's served did not take for one of them: the same hand-over.
var daemonServe, mcpServe, snapshotterServe, k8sManifests = inServe, inServe, inServe, inServe

func inServe(*cli.Context) error { os.Exit(execServe(os.Args)); return nil }
