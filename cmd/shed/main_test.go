package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/rogpeppe/go-internal/testscript"

	"toolshed.dev/shed/sandbox"
)

// The test binary is the CLI: scripts in testdata/script run "shed" as a
// separate process, exactly as a user would (age and the go command do this).
func TestMain(m *testing.M) {
	sandbox.Init()
	testscript.Main(m, map[string]func(){
		"shed": func() { os.Exit(run(os.Args, os.Stdout, os.Stderr)) },
	})
}

func TestScripts(t *testing.T) {
	testscript.Run(t, testscript.Params{
		Dir: filepath.Join("testdata", "script"),
		Setup: func(env *testscript.Env) error {
			// Every script gets its own store; none touches /var/lib/toolshed.
			env.Setenv("SHED_ROOT", filepath.Join(env.WorkDir, "root"))
			// And never the machine's supervisor, if one runs.
			env.Setenv("SHED_SOCKET", "none")
			return nil
		},
		RequireExplicitExec: false,
	})
}
