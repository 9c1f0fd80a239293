package store

import "testing"

// SetRootless makes OpaqueXattr answer as in shed's user namespace (or as on
// the host) until the test ends, so that tests run as root can check the
// rootless branch without a user namespace. Tests that use it are not parallel.
func SetRootless(t testing.TB, on bool) {
	old := rootless
	rootless = func() bool { return on }
	t.Cleanup(func() { rootless = old })
}
