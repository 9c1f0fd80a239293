package builder

import (
	"os"
	"testing"

	"toolshed.dev/shed/sandbox"
)

func TestMain(m *testing.M) {
	sandbox.Init() // a build's init is this test binary, re-executed
	os.Exit(m.Run())
}
