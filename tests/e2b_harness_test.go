package tests

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"
)

// e2bShared is what the E2B tests (e2b_*_test.go) share, made once per run on first use and gone
// with the shared store: the jq Workshop record nobody may launch (recording it locks it, resolving
// its packages in the seed, and its first Bench realizes it: seconds each, once instead of per test).
// What a test checks stays its own: its supervisor (an E2B server lists, gets and kills only the
// sandboxes it made, so no test's list or page shows another's; the crash test kills its own), its
// API key (the audit entries it counts are its key's) and its sandboxes. No test changes the record
// (none promotes), and its sandboxes' ids are random, so sharing it orders nothing.
var e2bShared struct {
	once sync.Once
	name string
	err  error
}

// e2bRecord returns the name of the shared jq record on the shared store, recording it through sock
// (the calling test's supervisor of that store) the first time.
func e2bRecord(t *testing.T, sock string) string {
	t.Helper()
	e2bShared.once.Do(func() {
		dir, err := os.MkdirTemp("", "shed-e2e-e2b-")
		if err != nil {
			e2bShared.err = err
			return
		}
		defer os.RemoveAll(dir) // the record holds its own copy of the recipe and lock
		name := "e2b-jq-" + strconv.Itoa(os.Getpid())
		f := filepath.Join(dir, "workshop.toml")
		if err := os.WriteFile(f, []byte(agentRecipe(name)), 0o644); err != nil {
			e2bShared.err = err
			return
		}
		start := time.Now()
		if out, err := viaCmd(sock, 0, "workshop", "add", "--allow", "nobody", f).CombinedOutput(); err != nil {
			e2bShared.err = fmt.Errorf("workshop add: %v\n%s", err, out)
			return
		}
		t.Logf("recorded %s, shared by the E2B tests, in %v", name, time.Since(start).Round(time.Millisecond))
		e2bShared.name = name
	})
	if e2bShared.err != nil {
		t.Fatal(e2bShared.err)
	}
	return e2bShared.name
}

// npmShared: each npm project is checked (and installed if missing) once per run, and made readable
// to everyone once: a chmod -R of node_modules per test costs seconds on a busy machine.
var npmShared sync.Map // name+pkg+version -> *npmOnce

type npmOnce struct {
	once sync.Once
	err  error
}

// npmInstall is npmPackage's work, once per run for each name, pkg and version.
func npmInstall(name, pkg, version string) (string, error) {
	v, _ := npmShared.LoadOrStore(name+"\x00"+pkg+"\x00"+version, &npmOnce{})
	o := v.(*npmOnce)
	dir := filepath.Join(npmCache, name)
	o.once.Do(func() { o.err = npmInstallNow(dir, pkg, version) })
	return dir, o.err
}

// npmInstallNow installs pkg at version in dir unless it is there, and opens npmCache to everyone.
func npmInstallNow(dir, pkg, version string) error {
	if !npmInstalled(dir, pkg, version) {
		os.MkdirAll(dir, 0o755)
		cmd := exec.Command("npm", "install", "--no-audit", "--no-fund", "--loglevel=error", pkg+"@"+version)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("npm install %s@%s: %v\n%s", pkg, version, err, out)
		}
	}
	if out, err := exec.Command("chmod", "-R", "a+rX", npmCache).CombinedOutput(); err != nil {
		return fmt.Errorf("chmod: %v %s", err, out)
	}
	return nil
}
