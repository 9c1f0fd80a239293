// Command shed-init is a sandbox's init: the first process of every Bench and build, which sets up the
// sandbox from the spec shed sends it, starts the command and reaps what it leaves. shed starts it;
// run by hand it does nothing.
//
// It is a program of its own so that a launch starts a binary that links only package sandbox (a few
// MB) instead of a second copy of shed, whose libraries' initialization and size would be paid on
// every launch (docs/benchmarks.md).
package main

import (
	"fmt"
	"os"

	"toolshed.dev/shed/sandbox"
)

func main() {
	sandbox.Init()
	fmt.Fprintln(os.Stderr, "shed-init: this is the init of shed's sandboxes, which shed starts; it is not run by hand")
	os.Exit(2)
}
