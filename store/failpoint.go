package store

import (
	"os"
	"sync"
	"syscall"
)

// FailpointEnv names the environment variable that arms a failpoint: when it
// holds the name of a step, the process kills itself with SIGKILL on reaching
// that step. The crash tests use it to prove that a crash at any step leaves
// a valid store; it costs one string comparison when unset.
const FailpointEnv = "SHED_FAILPOINT"

// Failpoints lists the steps of adding a path and of gc, in order.
var Failpoints = []string{
	"add-staged", "add-clamped", "add-scanned", "add-synced", "add-renamed",
	"add-manifest-written", "add-registered",
	"gc-unregistered", "gc-trashed",
}

var armed = sync.OnceValue(func() string { return os.Getenv(FailpointEnv) })

func failpoint(name string) {
	if armed() == name {
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is delivered before we get here
	}
}
