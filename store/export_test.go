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

// WriteBenchStore writes a store of paths for verify's benchmarks into s:
// "big" (4 paths, 1 GiB) or n small paths of the files of BenchmarkVerifyShapes,
// each signed by sign.
func WriteBenchStore(tb testing.TB, s *Store, big bool, n int, sign func(*PathInfo) ([]byte, error)) {
	shape := verifyShape{paths: n, sizes: shapeSmall.sizes}
	if big {
		shape = shapeBig
	}
	writeVerifyStore(tb, s, shape, sign)
}
