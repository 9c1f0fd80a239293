package tests

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"
)

// registry is Debian's docker-registry (CNCF distribution) on loopback,
// storing into dir.
type registry struct {
	dir, config string
	port        int
	cmd         *exec.Cmd
}

// registryConfig writes a config for a registry on 127.0.0.1:port storing in
// dir, with htpasswd auth if htpasswd is not "", and its access log on stdout
// if accessLog.
func registryConfig(t testing.TB, dir string, port int, htpasswd string, accessLog bool) string {
	t.Helper()
	access := "  accesslog:\n    disabled: true\n"
	if accessLog {
		access = ""
	}
	cfg := fmt.Sprintf("version: 0.1\nlog:\n  level: error\n%sstorage:\n  filesystem:\n    rootdirectory: %s\nhttp:\n  addr: 127.0.0.1:%d\n  secret: shed-tests\n", access, filepath.Join(dir, "data"), port)
	if htpasswd != "" {
		cfg += fmt.Sprintf("auth:\n  htpasswd:\n    realm: shed-tests\n    path: %s\n", htpasswd)
	}
	return writeFile(t, filepath.Join(dir, fmt.Sprintf("config-%d.yml", port)), cfg)
}

func startRegistry(t testing.TB, htpasswd string) *registry {
	t.Helper()
	return startRegistryWith(t, htpasswd, nil)
}

// startRegistryWith is startRegistry with its access log written to access (nil: none, its
// errors on stderr; else its errors, each a 404 of a probe before a push, dropped).
func startRegistryWith(t testing.TB, htpasswd string, access io.Writer) *registry {
	t.Helper()
	if _, err := exec.LookPath("docker-registry"); err != nil {
		t.Fatalf("Debian's docker-registry is needed (apt-get install docker-registry): %v", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	r := &registry{dir: t.TempDir(), port: port}
	r.config = registryConfig(t, r.dir, port, htpasswd, access != nil)
	r.cmd = exec.Command("docker-registry", "serve", r.config)
	r.cmd.SysProcAttr = dieWithTests()
	r.cmd.Stdout, r.cmd.Stderr = os.Stderr, os.Stderr
	if access != nil {
		r.cmd.Stdout, r.cmd.Stderr = access, io.Discard
	}
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.stop)
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/v2/", port))
		if err == nil {
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the registry did not come up: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return r
}

func (r *registry) stop() {
	if r.cmd != nil && r.cmd.Process != nil {
		r.cmd.Process.Kill()
		r.cmd.Wait()
		r.cmd = nil
	}
}

func (r *registry) url(repo string) string { return fmt.Sprintf("oci://127.0.0.1:%d/%s", r.port, repo) }

// isolated runs script under sh in a new network namespace whose only
// network is its loopback, with the registry's data served from inside it:
// the only thing the script can reach is the registry.
func (r *registry) isolated(t *testing.T, script string) (string, error) {
	t.Helper()
	full := fmt.Sprintf(`set -e
ip link set lo up
docker-registry serve %s >/dev/null 2>&1 &
reg=$!
trap 'kill $reg' EXIT
for i in $(seq 200); do (echo > /dev/tcp/127.0.0.1/%d) 2>/dev/null && break; sleep 0.05; done
%s`, r.config, r.port, script)
	out, err := exec.Command("unshare", "--net", "--fork", "bash", "-c", full).CombinedOutput()
	return string(out), err
}

// TestCachePrewarm is CI pre-warming, end to end, with two stores on one
// machine: the first realizes a Workshop and pushes it to a registry; the
// second, with no network but the registry, substitutes everything, verifies
// every signature and launches a Bench; a third that does not trust the first
// one's key gets nothing and says why.
func TestCachePrewarm(t *testing.T) {
	parallel(t) // see parallelTests in main_test.go
	requireRoot(t)
	a := sharedRoot(t)
	file, _ := benchWorkshop(t)
	reg := startRegistry(t, "")
	r := mustShed(t, a, "--json", "copy", "--to", reg.url("shed/cache"), file)
	if !strings.Contains(r.stdout, `"pushed"`) {
		t.Fatalf("copy: %s", r.stdout)
	}
	keyA := strings.TrimSpace(mustShed(t, a, "key", "export").stdout)
	reg.stop()

	b := newRoot(t)
	mustShed(t, b, "key", "trust", keyA)
	shedB := fmt.Sprintf("%s --root %s", shedBin, b)
	out, err := reg.isolated(t, fmt.Sprintf(`
%[1]s --json realize --offline --substituter %[2]s %[3]s
%[1]s store verify --check-contents
%[1]s bench run --offline -f %[3]s -- jq -n '1+41'
`, shedB, reg.url("shed/cache"), file))
	if err != nil || !strings.Contains(out, `"substituted"`) || !strings.Contains(out, "0 problems") || !strings.HasSuffix(strings.TrimSpace(out), "42") {
		t.Fatalf("substitute in an isolated network: %v\n%s", err, out)
	}

	// A store that does not trust the key: refused, nothing registered.
	c := newRoot(t)
	shedC := fmt.Sprintf("%s --root %s", shedBin, c)
	out, err = reg.isolated(t, fmt.Sprintf("%s realize --offline --substituter %s %s", shedC, reg.url("shed/cache"), file))
	if err == nil || !strings.Contains(out, "not signed by a trusted key") || !strings.Contains(out, "shed: hint:") {
		t.Fatalf("untrusted key: %v\n%s", err, out)
	}
	// Its own .drv files are all it holds.
	for _, line := range strings.Split(strings.TrimSpace(mustShed(t, c, "store", "ls").stdout), "\n") {
		if f := strings.Fields(line); len(f) > 0 && !strings.HasSuffix(f[0], ".drv") {
			t.Errorf("the untrusting store registered a path from the cache: %s", line)
		}
	}
}

// TestCacheCredentials: registry credentials come from the environment at
// run time and reach no derivation, store path, log or provenance.
func TestCacheCredentials(t *testing.T) {
	parallel(t) // see parallelTests in main_test.go
	requireRoot(t)
	a := sharedRoot(t)
	file, _ := benchWorkshop(t)
	canary := "canary-" + strings.Repeat("7", 20)
	hash, err := bcrypt.GenerateFromPassword([]byte(canary), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	htpasswd := writeFile(t, filepath.Join(t.TempDir(), "htpasswd"), "shed:"+string(hash)+"\n")
	reg := startRegistry(t, htpasswd)
	env := []string{"SHED_REGISTRY_USERNAME=shed", "SHED_REGISTRY_PASSWORD=" + canary}

	if r := shed(t, a, nil, "copy", "--to", reg.url("private"), file); r.code != 1 || !strings.Contains(r.stderr, "the registry refused access") || !strings.Contains(r.stderr, "SHED_REGISTRY_USERNAME") {
		t.Errorf("push without credentials: exit %d\n%s", r.code, r.stderr)
	}
	if r := shed(t, a, env, "copy", "--to", reg.url("private"), file); r.code != 0 {
		t.Fatalf("push with credentials: %s", r.stderr)
	}
	b := newRoot(t)
	mustShed(t, b, "key", "trust", strings.TrimSpace(mustShed(t, a, "key", "export").stdout))
	r := shed(t, b, env, "realize", "--substituter", reg.url("private"), file)
	if r.code != 0 {
		t.Fatalf("pull with credentials: %s", r.stderr)
	}
	// In a log: a line as the substitution starts, one as it ends (the paths it brought, their size,
	// the bytes downloaded), and the summary's count and size are the same; nothing of a terminal's
	// status.
	cacheRE := regexp.QuoteMeta(reg.url("private"))
	start := regexp.MustCompile(`(?m)^shed: substituting apt-jq \(layer\) from ` + cacheRE + `\.\.\.$`)
	end := regexp.MustCompile(`(?m)^shed: substituted apt-jq \(layer\) from ` + cacheRE + `: (\d+) paths, (\S+ \S+) in \S+ m?s \(\S+ \S+ downloaded\)$`)
	summary := regexp.MustCompile(`(?m)^shed: realized bench-jq in \S+ m?s: substituted (\d+) paths \((\S+ \S+)\)$`)
	if m, s := end.FindStringSubmatch(r.stderr), summary.FindStringSubmatch(r.stderr); !start.MatchString(r.stderr) || m == nil || s == nil ||
		m[1] != s[1] || m[2] != s[2] || m[1] == "1" {
		t.Errorf("the substitution's lines and the summary (the seed, the .debs and the layer substituted):\n%s", r.stderr)
	}
	if strings.ContainsAny(r.stderr, "\x1b⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏") {
		t.Errorf("a status drawn in a log:\n%q", r.stderr)
	}
	for _, root := range []string{a, b} {
		if out, _ := exec.Command("grep", "-rl", canary, root).Output(); len(out) > 0 {
			t.Errorf("the registry password is in the store:\n%s", out)
		}
	}
}

// TestUpperNeverExported: a kept Bench's upper layer cannot be copied to a
// cache nor added to the store (from where it could be).
func TestUpperNeverExported(t *testing.T) {
	parallel(t) // see parallelTests in main_test.go
	requireRoot(t)
	root := sharedRoot(t)
	file, _ := benchWorkshop(t)
	mustShed(t, root, "bench", "run", "--keep", "--name", "kept-upper", "-f", file, "--", "sh", "-c", "echo secret > /root/s")
	defer shed(t, root, nil, "bench", "rm", "kept-upper")
	uppers, _ := filepath.Glob(filepath.Join(root, "benches", "*", "upper"))
	if len(uppers) == 0 {
		t.Fatal("no kept upper")
	}
	dir := filepath.Join(t.TempDir(), "layout")
	for _, args := range [][]string{
		{"copy", "--to", "oci-layout:" + dir, uppers[0]},
		{"store", "add", uppers[0]},
		{"store", "add", filepath.Join(uppers[0], "root")},
	} {
		if r := shed(t, root, nil, args...); r.code != 2 || !strings.Contains(r.stderr, "upper layer") {
			t.Errorf("shed %s: exit %d, want 2 and an error about the upper layer\n%s", strings.Join(args, " "), r.code, r.stderr)
		}
	}
}
