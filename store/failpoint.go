package store

import (
	"os"
	"path"
	"strings"
	"sync"
	"syscall"
)

// FailpointEnv names the environment variable that arms a failpoint: when it
// holds the name of a step, the process kills itself with SIGKILL on reaching
// that step. "STEP@PATTERN" arms it only for paths whose name matches PATTERN
// (path.Match syntax, e.g. "add-renamed@apt-*" for layers, "@*.deb" for
// fetches). The crash tests use it to prove that a crash at any step leaves a
// valid store; it costs one string comparison when unset.
const FailpointEnv = "SHED_FAILPOINT"

// Failpoints lists the steps of adding a path, of gc and of a repair, in order.
var Failpoints = []string{
	"add-staged", "add-clamped", "add-scanned", "add-linked", "add-synced", "add-renamed",
	"add-manifest-written", "add-provenance-written", "add-registered",
	"gc-unregistered", "gc-trashed",
	"repair-synced", "repair-exchanged",
}

var armed = sync.OnceValue(func() string { return os.Getenv(FailpointEnv) })

func failpoint(name string) { failpointFor(name, "") }

// failpointFor is failpoint for a step of adding the path named pathName.
func failpointFor(name, pathName string) {
	a := armed()
	if a == "" {
		return
	}
	step, pattern, scoped := strings.Cut(a, "@")
	if step != name {
		return
	}
	if scoped {
		if ok, _ := path.Match(pattern, pathName); !ok {
			return
		}
	}
	syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // the signal is delivered before we get here
}
