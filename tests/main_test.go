package tests

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
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
	// As `make build` builds it (see BUILDFLAGS and LEANFLAGS there): shed is the small front
	// (cmd/shed-front), with the CLI built lean (shed-cli), the CLI whole with the servers
	// (shed-serve) and the Bench's init beside it.
	for _, b := range [][]string{
		{"-tags", "urfave_cli_no_docs", "-o", filepath.Join(dir, "shed-serve"), "../cmd/shed"},
		{"-tags", "urfave_cli_no_docs,shed_lean", "-o", dir + "/", "../cmd/shed", "../cmd/shed-init", "../cmd/shed-front"},
	} {
		build := exec.Command("go", append([]string{"build"}, b...)...)
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err = build.Run(); err != nil {
			break
		}
	}
	if err == nil {
		err = os.Rename(shedBin, filepath.Join(dir, "shed-cli"))
	}
	if err == nil {
		err = os.Rename(filepath.Join(dir, "shed-front"), shedBin)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "build shed:", err)
		os.Exit(1)
	}
	// A step's status line shows after SHED_PROGRESS_DELAY (a second by default): the tests of what a
	// terminal shows (progress_test.go) would otherwise depend on a build or a substitution lasting
	// over a second, which on a fast machine they do not. Every shed and supervisor of the tests
	// inherits it.
	os.Setenv("SHED_PROGRESS_DELAY", "100ms")
	flag.Parse()
	slotsFromFlags()
	code := m.Run()
	os.RemoveAll(dir)
	os.RemoveAll(fmt.Sprintf("/run/shed-test-%d-via", os.Getpid()))
	if seedCache.dir != "" {
		os.RemoveAll(filepath.Dir(seedCache.dir))
	}
	if shared.root != "" {
		unmountUppers(shared.root)
		os.RemoveAll(filepath.Dir(shared.root))
	}
	os.Exit(code)
}

// result is one run of shed.
type result struct {
	stdout, stderr string
	code           int
}

// viaDaemon says how these tests reach shed: on each store directly (--root, the default), or with
// SHED_TEST_VIA=daemon through a supervisor of each store, as a local operator would (.ci/run runs
// the package both ways). The tests are the same: only shedCmd differs.
var viaDaemon = os.Getenv("SHED_TEST_VIA") == "daemon"

// shedCmd is the command for shed on root with args: `shed --root ROOT ARGS`, or, via the daemon,
// `shed ARGS` with SHED_SOCKET pointing at root's supervisor (started on first use).
func shedCmd(t testing.TB, root string, args ...string) *exec.Cmd {
	t.Helper()
	return shedCmdEnv(t, root, nil, args...)
}

// shedCmdEnv is shedCmd with variables added to shed's environment. Via the daemon they are the
// supervisor's (registry credentials, failpoints: the process that does the work reads them), so
// such a command goes to a supervisor started with them.
func shedCmdEnv(t testing.TB, root string, env []string, args ...string) *exec.Cmd {
	t.Helper()
	if viaDaemon && !direct(args) {
		cmd := exec.Command(shedBin, args...)
		cmd.Env = append(os.Environ(), "SHED_SOCKET="+daemonFor(t, root, env), "SHED_ROOT=/nonexistent")
		return cmd
	}
	cmd := exec.Command(shedBin, append([]string{"--root", root}, args...)...)
	cmd.Env = append(append(os.Environ(), "SHED_SOCKET=none"), env...)
	return cmd
}

// direct: init makes the store a supervisor serves, so it always works on the store itself.
func direct(args []string) bool {
	for _, a := range args {
		if !strings.HasPrefix(a, "-") {
			return a == "init"
		}
	}
	return false
}

// daemons are the supervisors of the stores the tests use via the daemon.
var daemons struct {
	sync.Mutex
	n     int
	socks map[string]string
}

// daemonFor returns the socket of root's supervisor with env, starting one if none runs. A test's
// own store's supervisor stops with the test, and so does one with variables of its own; the shared
// store's lives as long as the tests.
func daemonFor(t testing.TB, root string, env []string) string {
	t.Helper()
	daemons.Lock()
	defer daemons.Unlock()
	key := strings.Join(append([]string{root}, env...), "\x00")
	if sock, ok := daemons.socks[key]; ok {
		return sock
	}
	if daemons.socks == nil {
		daemons.socks = map[string]string{}
	}
	daemons.n++
	dir := fmt.Sprintf("/run/shed-test-%d-via", os.Getpid())
	sock := filepath.Join(dir, fmt.Sprintf("%d.sock", daemons.n))
	cmd := exec.Command(shedBin, "--root", root, "daemon", "--socket", sock)
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = dieWithTests()
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		if fi, err := os.Stat(sock); err == nil && fi.Mode()&os.ModeSocket != 0 {
			break
		}
		if i == 500 {
			t.Fatalf("the supervisor of %s did not listen:\n%s", root, log.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	daemons.socks[key] = sock
	daemonPids.Store(sock, cmd.Process.Pid)
	if root != shared.root || len(env) > 0 {
		t.Cleanup(func() {
			daemons.Lock()
			delete(daemons.socks, key)
			daemons.Unlock()
			cmd.Process.Signal(syscall.SIGTERM)
			cmd.Wait()
			if t.Failed() {
				t.Logf("supervisor log:\n%s", log.String())
			}
		})
	}
	return sock
}

// shed runs the binary on root with args; env adds variables.
func shed(t testing.TB, root string, env []string, args ...string) result {
	t.Helper()
	return runResult(t, shedCmdEnv(t, root, env, args...))
}

// runResult runs cmd and returns its output and exit code (-9 if SIGKILL ended it); a command that
// could not run at all fails the test.
func runResult(t testing.TB, cmd *exec.Cmd) result {
	t.Helper()
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
		t.Fatalf("run %s: %v", cmd.Path, err)
	}
	return r
}

// mustShed runs shed and fails the test unless it exits 0.
func mustShed(t testing.TB, root string, args ...string) result {
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

func realize(t testing.TB, root, recipe string, extra ...string) realizeJSON {
	t.Helper()
	r := mustShed(t, root, append(append([]string{"--json", "realize"}, extra...), recipe)...)
	var j realizeJSON
	if err := json.Unmarshal([]byte(r.stdout), &j); err != nil {
		t.Fatalf("realize --json: %v\n%s", err, r.stdout)
	}
	return j
}

func newRoot(t testing.TB) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), "root")
	mustShed(t, root, "init")
	smallUppers(t, root)
	t.Cleanup(func() { unmountUppers(root) })
	return root
}

// smallUppers gives a test's store a small uppers' image (config uppers_size): its default is
// preallocated from the disk's free space, and the tests make many stores.
func smallUppers(t testing.TB, root string) {
	f, err := os.OpenFile(filepath.Join(root, "config.toml"), os.O_APPEND|os.O_WRONLY, 0)
	if err == nil {
		_, err = f.WriteString("uppers_size = 536870912\n")
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		t.Fatal(err)
	}
}

// unmountUppers detaches the uppers' filesystem a test's store may have mounted (its supervisor
// unmounts it when it stops; one killed, or a CLI that removed a paused Bench, leaves it), so
// that its temporary directory can go.
func unmountUppers(root string) {
	_ = syscall.Unmount(filepath.Join(root, "uppers"), syscall.MNT_DETACH)
}

// parallelTests: the heavy tests (builds, installs, seeds from the mirror) that change no state
// another test reads run in parallel (parallel(t), longest first: tests/parallel_test.go), after
// the others (go test runs a package's parallel tests once its sequential ones are done). They may share the shared store's paths, whose per-path
// locks make concurrent realizes safe, and they must not gc it, change its keys, config or roots
// but their own Workshops', count its processes or mounts, or use a fixed port or host path that
// another test uses. Tests that do any of these (TestRealizeJq's and TestLocalRepository's gc,
// TestSupervisorBypasses's before-and-after snapshot of the store, TestBenchGCAndCleanup's mount
// and process counts, TestBenchGrants's count of inits left, TestBenchNetworkProfile's test host,
// TestInterrupt's timings) stay sequential.

// shared is one store for the tests that only need a Debian seed to exist:
// building a seed takes half a minute, so it is built once per run.
var shared struct {
	once sync.Once
	root string
	err  error
}

func sharedRoot(t testing.TB) string {
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
			return
		}
		shared.err = os.WriteFile(filepath.Join(shared.root, "config.toml"), append(must(os.ReadFile(filepath.Join(shared.root, "config.toml"))), "uppers_size = 536870912\n"...), 0o600)
	})
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared.root
}

// seedCache is the shared store's Debian seed exported once per run to an OCI layout, with the
// shared store's public key: a fresh store that trusts the key substitutes the seed (about 8 s)
// instead of building it from the mirror (about 45 s). It is for the tests whose subject is not the
// seed; TestReproducibleFromEmptyStores and the README's tests build theirs.
var seedCache struct {
	once     sync.Once
	dir, key string
	err      error
}

// seededRoot is a new store whose substituters setting holds seedCache.
func seededRoot(t *testing.T) string {
	t.Helper()
	root := newRoot(t)
	useSeedCache(t, root)
	return root
}

// useSeedCache makes root's store trust seedCache's key and substitute from it.
func useSeedCache(t *testing.T, root string) {
	t.Helper()
	seedCache.once.Do(func() {
		a := sharedRoot(t)
		file := writeFile(t, filepath.Join(t.TempDir(), "workshop.toml"), jqRecipe)
		r := shed(t, a, nil, "--json", "realize", file)
		var j realizeJSON
		if err := json.Unmarshal([]byte(r.stdout), &j); r.code != 0 || err != nil || len(j.Layers) == 0 {
			seedCache.err = fmt.Errorf("realize the seed: exit %d %v\n%s", r.code, err, r.stderr)
			return
		}
		dir, err := os.MkdirTemp("", "shed-e2e-seed-")
		if err != nil {
			seedCache.err = err
			return
		}
		seedCache.dir = filepath.Join(dir, "layout")
		if r := shed(t, a, nil, "export", "--oci", seedCache.dir, j.Layers[0]); r.code != 0 {
			seedCache.err = fmt.Errorf("export the seed: %s", r.stderr)
			return
		}
		seedCache.key = strings.TrimSpace(shed(t, a, nil, "key", "export").stdout)
	})
	if seedCache.err != nil {
		t.Fatal(seedCache.err)
	}
	mustShed(t, root, "key", "trust", seedCache.key)
	cfg := filepath.Join(root, "config.toml")
	b, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg, append(b, fmt.Sprintf("substituters = [%q]\n", "oci-layout:"+seedCache.dir)...), 0o600); err != nil {
		t.Fatal(err)
	}
}

func writeFile(t testing.TB, name, content string) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(name, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return name
}

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: builds run in namespaces and keep Debian's owners (CI runs as root)")
	}
}
