package tests

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// shedBin is the shed binary these tests run, built once, as a user runs it.
var shedBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "shed-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	shedBin = filepath.Join(dir, "shed")
	// As `make build` builds it (see BUILDFLAGS there).
	build := exec.Command("go", "build", "-tags", "urfave_cli_no_docs", "-o", shedBin, "../cmd/shed")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build shed:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	if shared.root != "" {
		os.RemoveAll(filepath.Dir(shared.root))
	}
	os.Exit(code)
}

// result is one run of shed.
type result struct {
	stdout, stderr string
	code           int
}

// shed runs the binary on root with args; env adds variables.
func shed(t *testing.T, root string, env []string, args ...string) result {
	t.Helper()
	cmd := exec.Command(shedBin, append([]string{"--root", root}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := result{out.String(), errb.String(), 0}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		r.code = ee.ExitCode()
		if ee.ProcessState.String() == "signal: killed" {
			r.code = -9
		}
	} else if err != nil {
		t.Fatalf("run shed: %v", err)
	}
	return r
}

// mustShed runs shed and fails the test unless it exits 0.
func mustShed(t *testing.T, root string, args ...string) result {
	t.Helper()
	r := shed(t, root, nil, args...)
	if r.code != 0 {
		t.Fatalf("shed %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return r
}

// realizeJSON is `shed --json realize`'s output.
type realizeJSON struct {
	Workshop     string   `json:"workshop"`
	Layers       []string `json:"layers"`
	Built        []string `json:"built"`
	Fetched      []string `json:"fetched"`
	FetchedBytes int64    `json:"fetched_bytes"`
}

func realize(t *testing.T, root, recipe string, extra ...string) realizeJSON {
	t.Helper()
	r := mustShed(t, root, append(append([]string{"--json", "realize"}, extra...), recipe)...)
	var j realizeJSON
	if err := json.Unmarshal([]byte(r.stdout), &j); err != nil {
		t.Fatalf("realize --json: %v\n%s", err, r.stdout)
	}
	return j
}

func newRoot(t *testing.T) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), "root")
	mustShed(t, root, "init")
	return root
}

// shared is one store for the tests that only need a Debian seed to exist:
// building a seed takes half a minute, so it is built once per run.
var shared struct {
	once sync.Once
	root string
	err  error
}

func sharedRoot(t *testing.T) string {
	t.Helper()
	shared.once.Do(func() {
		dir, err := os.MkdirTemp("", "shed-e2e-store-")
		if err != nil {
			shared.err = err
			return
		}
		shared.root = filepath.Join(dir, "root")
		out, err := exec.Command(shedBin, "--root", shared.root, "init").CombinedOutput()
		if err != nil {
			shared.err = fmt.Errorf("init: %v %s", err, out)
		}
	})
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared.root
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(name, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return name
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: builds run in namespaces and keep Debian's owners (CI runs as root)")
	}
}
