package tests

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// pipStatic writes the test wheels as a static PEP 503 index (simple/NAME/,
// files/) for a plain HTTP server, and returns its directory.
func pipStatic(t *testing.T) string {
	t.Helper()
	www := t.TempDir()
	projects := map[string][]string{}
	for name, path := range pipWheels(t) {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(www, "files", name), string(b))
		sum := sha256.Sum256(b)
		proj := pep503(strings.SplitN(name, "-", 2)[0])
		projects[proj] = append(projects[proj], fmt.Sprintf(`<a href="/files/%s#sha256=%s">%s</a><br>`, name, hex.EncodeToString(sum[:]), name))
	}
	for proj, links := range projects {
		writeFile(t, filepath.Join(www, "simple", proj, "index.html"), "<!DOCTYPE html><html><body>\n"+strings.Join(links, "\n")+"\n</body></html>\n")
	}
	return www
}

// daemon starts `shed daemon` for root with its socket in a directory every
// user can reach, and returns the socket.
func daemon(t testing.TB, root string) string {
	t.Helper()
	sock, _ := daemonWith(t, root)
	return sock
}

// daemonSeq numbers the test daemons of this process: each has a socket directory of its own.
var daemonSeq atomic.Int64

// daemonWith starts a supervisor for root with more flags, and returns its socket and the file its
// log (stdout and stderr) goes to.
func daemonWith(t testing.TB, root string, flags ...string) (string, string) {
	t.Helper()
	return daemonEnv(t, root, nil, flags...)
}

// daemonEnv is daemonWith with env added to the supervisor's environment (SSL_CERT_FILE: the roots
// a brokered Bench's proxy verifies servers with).
func daemonEnv(t testing.TB, root string, env []string, flags ...string) (string, string) {
	t.Helper()
	dir := fmt.Sprintf("/run/shed-test-%d-%d", os.Getpid(), daemonSeq.Add(1))
	sock := filepath.Join(dir, "shed.sock")
	t.Cleanup(func() { os.RemoveAll(dir) })
	if b, err := os.ReadFile(filepath.Join(root, "config.toml")); err == nil && !strings.Contains(string(b), "uppers_size") {
		smallUppers(t, root)
	}
	cmd := exec.Command(shedBin, append([]string{"--root", root, "daemon", "--socket", sock}, flags...)...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.SysProcAttr = dieWithTests()
	logPath := filepath.Join(t.TempDir(), "daemon.log")
	log, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	log.Close()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
		if root != shared.root { // the shared store's stay mounted for the other tests' supervisors (TestMain)
			unmountUppers(root)
		}
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("daemon log:\n%s", b)
		}
	})
	for i := 0; i < 200; i++ {
		if fi, err := os.Stat(sock); err == nil && fi.Mode()&os.ModeSocket != 0 {
			daemonPids.Store(sock, cmd.Process.Pid)
			return sock, logPath
		}
		time.Sleep(20 * time.Millisecond)
	}
	b, _ := os.ReadFile(logPath)
	t.Fatalf("the daemon did not listen:\n%s", b)
	return "", ""
}

// daemonPids maps a test daemon's socket to its pid.
var daemonPids sync.Map

// viaCmd is shed through the supervisor at sock (no store of its own), as uid if it is not 0.
func viaCmd(sock string, uid int, args ...string) *exec.Cmd {
	cmd := exec.Command(shedBin, args...)
	cmd.Env = append(os.Environ(), "SHED_SOCKET="+sock, "SHED_ROOT=/nonexistent")
	if uid != 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
		cmd.Dir = "/"
	}
	return cmd
}

// via runs shed through the supervisor at sock (no --root), as uid if it is
// not 0.
func via(t testing.TB, sock string, uid int, stdin string, args ...string) result {
	t.Helper()
	cmd := viaCmd(sock, uid, args...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := result{out.String(), errb.String(), 0}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return r
}

// proposeFromInside is what an agent in a Bench runs to propose: a POST to the propose socket, whose
// answer (the proposal and its diff) it prints.
const proposeFromInside = `python3 - <<'PY'
import socket
s = socket.socket(socket.AF_UNIX)
s.connect("/run/shed/propose.sock")
s.sendall(b"POST /propose HTTP/1.0\r\nContent-Length: 0\r\n\r\n")
resp = b""
while True:
    b = s.recv(65536)
    if not b:
        break
    resp += b
print(resp.decode())
PY
`

// promote confirms a proposal as a human would: at a terminal (script(1)),
// typing yes.
func promote(t *testing.T, sock, id string) (string, error) {
	t.Helper()
	// No pager: the person reads the diff as it is printed (TestPromotePager pages it).
	cmd := exec.Command("script", "-qec", fmt.Sprintf("SHED_PAGER=cat SHED_SOCKET=%s %s workshop promote %s", sock, shedBin, id), "/dev/null")
	cmd.Stdin = strings.NewReader("yes\n")
	out, err := cmd.CombinedOutput()
	return strings.ReplaceAll(string(out), "\r", ""), err
}

// TestSupervisorLoop is the whole loop of the seed texts, through the
// supervisor: an operator records a Workshop; a Bench installs a package with
// apt and one with pip through its proxy, leaves debris and a secret, and
// proposes from inside; the human reads the diff and confirms at a terminal;
// the promoted Workshop's Bench has both packages, offline, and nothing of the
// first Bench's files.
func TestSupervisorLoop(t *testing.T) {
	parallel(t) // see parallelTests in main_test.go
	requireRoot(t)
	root := sharedRoot(t)
	host := startTestHost(t, pipStatic(t))
	sock := daemon(t, root)
	file := writeFile(t, filepath.Join(t.TempDir(), "workshop.toml"), fmt.Sprintf(`name = "loop"
seed = "debian/bookworm"
[apt]
packages = ["python3-pip"]
[pip]
index = "http://%s/simple/"
[network]
profile = "debian"
allow = ["%s"]
`, host, host))
	if r := via(t, sock, 0, "", "workshop", "add", file); r.code != 0 {
		t.Fatalf("workshop add: %s", r.stderr)
	}
	canary := "secret-canary-" + strconv.Itoa(os.Getpid())
	agent := fmt.Sprintf(`set -e
apt-get -qq update >/dev/null
apt-get -qq install -y --no-install-recommends jq >/dev/null
PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q --root-user-action=ignore --index-url http://%s/simple/ --trusted-host %s shedtest-gamma
echo %s > /root/secret.txt
mkdir -p /root/.cache/junk /var/log/agent && echo debris > /var/log/agent/debris.log
python3 - <<'PY'
import socket
s = socket.socket(socket.AF_UNIX)
s.connect("/run/shed/propose.sock")
s.sendall(b"POST /promote HTTP/1.0\r\nContent-Length: 0\r\n\r\n")
print("promote:", s.recv(100).decode().split("\r\n")[0])
PY
%s`, host, host, canary, proposeFromInside)
	r := via(t, sock, 0, "", "bench", "run", "-f", "loop", "--name", "agent", "--", "sh", "-c", agent)
	if r.code != 0 {
		t.Fatalf("the agent's Bench: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	if !strings.Contains(r.stdout, "promote: HTTP/1.0 403") {
		t.Errorf("the propose socket served something else than /propose:\n%s", r.stdout)
	}
	m := regexp.MustCompile(`proposal ([0-9a-f]{16}) for Workshop loop, version 1`).FindStringSubmatch(r.stdout)
	if m == nil {
		t.Fatalf("no proposal in the agent's output:\n%s\n%s", r.stdout, r.stderr)
	}
	id := m[1]
	for _, want := range []string{`"jq=1.6`, `"shedtest-gamma==1.0"`, "+name = 'shedtest-gamma'"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("the proposal's diff lacks %s:\n%s", want, r.stdout)
		}
	}
	for _, bad := range []string{canary, "secret.txt", "debris"} {
		if strings.Contains(r.stdout, bad) {
			t.Errorf("the proposal carries %q from the Bench:\n%s", bad, r.stdout)
		}
	}
	if out, _ := exec.Command("grep", "-rl", canary, filepath.Join(root, "proposals"), filepath.Join(root, "workshops")).Output(); len(out) > 0 {
		t.Errorf("the Bench's secret reached the records:\n%s", out)
	}

	// Without a terminal, no promotion.
	if r := via(t, sock, 0, "yes\n", "workshop", "promote", id); r.code == 0 || !strings.Contains(r.stderr, "terminal") {
		t.Errorf("promotion without a terminal: exit %d\n%s", r.code, r.stderr)
	}
	out, err := promote(t, sock, id)
	if err != nil || !strings.Contains(out, "promoted loop version 2") || !strings.Contains(out, "Type yes to confirm") {
		t.Fatalf("promote: %v\n%s", err, out)
	}
	// The confirmation is single-use, and a used proposal is refused before its diff is shown or a
	// confirmation asked for.
	if out, err := promote(t, sock, id); err == nil || !strings.Contains(out, "already promoted") ||
		strings.Contains(out, "Type yes") || strings.Contains(out, "+++ b/workshop.toml") {
		t.Errorf("replayed promotion: %v\n%s", err, out)
	}
	// A clean Bench of the promoted Workshop has both packages, with no network at all.
	cmd := exec.Command("unshare", "--net", shedBin, "--root", root, "bench", "run", "--offline", "-f", "loop", "--",
		"sh", "-c", "jq --version; python3 -c 'import shedtest_gamma; print(shedtest_gamma.hello())'; ls -A /root; ls /var/log/agent 2>&1 || true")
	b, err := cmd.CombinedOutput()
	got := string(b)
	if err != nil || !strings.Contains(got, "jq-1.6") || !strings.Contains(got, "gamma") || strings.Contains(got, "secret.txt") || strings.Contains(got, "debris") {
		t.Errorf("the promoted Workshop's Bench: %v\n%s", err, got)
	}
	if r := mustShed(t, root, "workshop", "log", "loop"); !strings.Contains(r.stdout, "promoted proposal "+id) {
		t.Errorf("workshop log:\n%s", r.stdout)
	}
	// The audit log has the loop: who recorded, launched and promoted, the Bench's start, end and
	// network, the agent's proposal, the promotion's diff hash; and its chain verifies.
	r = mustShed(t, root, "--json", "audit", "--bench", "agent")
	var entries []struct {
		User, Role, Event, Bench, Workshop, Dest, Detail string
		DiffSHA256                                       string `json:"diff_sha256"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &entries); err != nil {
		t.Fatalf("audit --json: %v\n%s", err, r.stdout)
	}
	seen := map[string]bool{}
	for _, e := range entries {
		seen[e.Event+" "+e.Role] = true
		if e.Event == "net.allowed" && strings.HasPrefix(e.Dest, host) {
			seen["the test host"] = true
		}
	}
	for _, want := range []string{"bench.run operator", "bench.start operator", "bench.end operator", "net.allowed operator", "bench.propose agent", "the test host"} {
		if !seen[want] {
			t.Errorf("the audit log of bench agent lacks %q: %v", want, seen)
		}
	}
	r = mustShed(t, root, "--json", "audit")
	if !strings.Contains(r.stdout, `"event": "workshop.promote"`) || !strings.Contains(r.stdout, `"diff_sha256": "`) || strings.Contains(r.stdout, canary) {
		t.Errorf("the audit log lacks the promotion and its diff hash, or has the canary:\n%.3000s", r.stdout)
	}
	mustShed(t, root, "audit", "verify")
}

// TestSupervisorRoles: who may do what is decided by the caller's uid, and an
// agent in a Bench reaches neither the supervisor nor the store.
func TestSupervisorRoles(t *testing.T) {
	parallel(t) // see parallelTests in main_test.go
	requireRoot(t)
	root := sharedRoot(t)
	file, _ := benchWorkshop(t)
	sock := daemon(t, root)
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.Atoi(nobody.Uid)
	// nobody must be able to run the test binary.
	for d := filepath.Dir(shedBin); d != "/"; d = filepath.Dir(d) {
		if fi, err := os.Stat(d); err == nil && fi.Mode().Perm()&0o001 == 0 {
			os.Chmod(d, fi.Mode().Perm()|0o011)
		}
	}
	name := "roles-" + strconv.Itoa(os.Getpid())
	recipeFile := writeFile(t, filepath.Join(t.TempDir(), "workshop.toml"), strings.Replace(string(must(os.ReadFile(file))), `name = "bench-jq"`, fmt.Sprintf("name = %q", name), 1))
	if r := via(t, sock, 0, "", "workshop", "add", recipeFile); r.code != 0 {
		t.Fatalf("workshop add: %s", r.stderr)
	}
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"workshop", "ls"}, 0, name},
		{[]string{"workshop", "add", recipeFile}, 2, "for operators"},
		{[]string{"gc"}, 2, "for operators"},
		{[]string{"key", "trust", "x:AAAA"}, 2, "for operators"},
		{[]string{"bench", "run", "-f", name, "--", "true"}, 2, "may not use Workshop"},
		{[]string{"--root", root, "store", "ls"}, 1, ""}, // directly: the store is root's
	} {
		r := via(t, sock, uid, "", c.args...)
		if r.code != c.code || !strings.Contains(r.stdout+r.stderr, c.want) {
			t.Errorf("nobody: shed %s: exit %d, want %d with %q\n%s%s", strings.Join(c.args, " "), r.code, c.code, c.want, r.stdout, r.stderr)
		}
	}
	if r := via(t, sock, 0, "", "workshop", "allow", name, "nobody"); r.code != 0 {
		t.Fatalf("workshop allow: %s", r.stderr)
	}
	r := via(t, sock, uid, "", "bench", "run", "-f", name, "--", "sh", "-c", fmt.Sprintf(
		"jq -n 1+1; ls %s 2>&1 || true; ls %s 2>&1 || true; ls /run/shed",
		filepath.Dir(sock), filepath.Join(root, "trust")))
	if r.code != 0 || !strings.HasPrefix(r.stdout, "2\n") || !strings.Contains(r.stdout, "No such file") || strings.Contains(r.stdout, "signing.sec") || strings.Contains(r.stdout, "shed.sock") {
		t.Errorf("nobody's Bench: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := via(t, sock, uid, "", "bench", "run", "-f", name, "--grant", "/etc:/x:ro", "--", "true"); r.code != 2 || !strings.Contains(r.stderr, "grants are for operators") {
		t.Errorf("nobody with --grant: exit %d\n%s", r.code, r.stderr)
	}

	// A user acts on the Benches they launched, and sees no other.
	theirs := startVia(t, sock, uid, "bench", "run", "-f", name, "--name", "nobodys", "--", "sleep", "1013")
	ours := startVia(t, sock, 0, "bench", "run", "-f", name, "--name", "roots", "--", "sleep", "1014")
	waitBench(t, root, "nobodys")
	waitBench(t, root, "roots")
	if r := via(t, sock, uid, "", "bench", "ls"); r.code != 0 || !strings.Contains(r.stdout, "nobodys") || strings.Contains(r.stdout, "roots") {
		t.Errorf("nobody: bench ls: exit %d, want nobodys listed and not roots\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := via(t, sock, 0, "", "bench", "ls"); !strings.Contains(r.stdout, "nobodys") || !strings.Contains(r.stdout, "roots") {
		t.Errorf("root: bench ls lacks a Bench:\n%s%s", r.stdout, r.stderr)
	}
	if r := via(t, sock, uid, "", "bench", "exec", "nobodys", "--", "jq", "-n", "2+2"); r.code != 0 || r.stdout != "4\n" {
		t.Errorf("nobody: exec in its own Bench: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := via(t, sock, uid, "", "bench", "logs", "nobodys"); r.code != 0 {
		t.Errorf("nobody: logs of its own Bench: exit %d\n%s", r.code, r.stderr)
	}
	for _, args := range [][]string{{"bench", "exec", "roots", "--", "true"}, {"bench", "logs", "roots"}, {"bench", "rm", "roots"}, {"bench", "propose", "roots"}} {
		if r := via(t, sock, uid, "", args...); r.code != 2 || !strings.Contains(r.stderr, "of yours") {
			t.Errorf("nobody: shed %s: exit %d, want 2, refused\n%s%s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
		}
	}
	if r := via(t, sock, uid, "", "bench", "rm", "nobodys"); r.code != 0 {
		t.Errorf("nobody: rm its own Bench: exit %d\n%s", r.code, r.stderr)
	}
	theirs.Wait()
	if r := via(t, sock, 0, "", "bench", "ls"); strings.Contains(r.stdout, "nobodys") || !strings.Contains(r.stdout, "roots") {
		t.Errorf("after nobody's rm: want only roots listed\n%s%s", r.stdout, r.stderr)
	}
	if r := via(t, sock, 0, "", "bench", "rm", "roots"); r.code != 0 {
		t.Errorf("root: rm: exit %d\n%s", r.code, r.stderr)
	}
	ours.Wait()
}

// startVia starts shed through the supervisor at sock as uid, without waiting for it; the test kills
// it at the end if it is still running.
func startVia(t *testing.T, sock string, uid int, args ...string) *exec.Cmd {
	t.Helper()
	cmd := viaCmd(sock, uid, args...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestSupervisorClientDir: through the supervisor, an operator's relative
// paths, and the default ./workshop.toml, are the client's, not the
// supervisor's.
func TestSupervisorClientDir(t *testing.T) {
	parallel(t) // see parallelTests in main_test.go
	requireRoot(t)
	root := sharedRoot(t)
	file, _ := benchWorkshop(t)
	sock := daemon(t, root)
	dir := filepath.Dir(file)
	writeFile(t, filepath.Join(dir, "stuff", "note"), "a file to add\n")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"recipe", "check"}, ""},
		{[]string{"realize", "--offline"}, "-apt-jq\n"},
		{[]string{"bench", "run", "--offline", "--", "jq", "-n", "3"}, "3\n"},
		{[]string{"store", "add", "stuff"}, "-stuff\n"},
	} {
		cmd := viaCmd(sock, 0, c.args...)
		cmd.Dir = dir
		out, err := cmd.Output()
		if err != nil || !strings.HasSuffix(string(out), c.want) {
			var stderr []byte
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = ee.Stderr
			}
			t.Errorf("shed %s in %s: %v, want output ending %q\n%s%s", strings.Join(c.args, " "), dir, err, c.want, out, stderr)
		}
	}
}
