package tests

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// rawClient is an unprivileged client that speaks the supervisor's protocol itself, as an attacker
// would: it sends the frame given as argv[1] (a JSON request; argv[2], if set, overrides the length
// header) with its stdin, stdout and stderr, and prints every line the daemon answers.
const rawClient = `import os, socket, struct, sys
body = sys.argv[1].encode()
n = int(sys.argv[2]) if len(sys.argv) > 2 else len(body)
s = socket.socket(socket.AF_UNIX)
s.connect(os.environ["SHED_SOCKET"])
stdin = 0
if os.environ.get("RAW_STDIN") == "silent-pipe":
    # A pipe whose write end outlives this client (a child holds it a minute) and is never written.
    stdin, held = os.pipe()
    if os.fork() == 0:
        import time
        null = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2, stdin, s.fileno()):
            os.dup2(null, fd) if fd < 3 else os.close(fd)
        time.sleep(60)
        os._exit(0)
    os.close(held)
socket.send_fds(s, [struct.pack(">I", n)], [stdin, 1, 2])
try:
    s.sendall(body)
except OSError as e:
    print("send:", e)
f = s.makefile("rb")
try:
    for line in f:
        print(line.decode().rstrip())
except OSError as e:
    print("recv:", e)
`

// raw runs rawClient as uid and returns what the daemon answered.
func raw(t *testing.T, sock string, uid int, body string, length ...int) string {
	t.Helper()
	return rawEnv(t, sock, uid, nil, body, length...)
}

// rawEnv is raw with variables for the client (RAW_STDIN).
func rawEnv(t *testing.T, sock string, uid int, env []string, body string, length ...int) string {
	t.Helper()
	args := []string{"-c", rawClient, body}
	for _, n := range length {
		if n > 0 {
			args = append(args, strconv.Itoa(n))
		}
	}
	cmd := exec.Command("/usr/bin/python3", args...)
	cmd.Env = append(append(os.Environ(), "SHED_SOCKET="+sock), env...)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("raw client: %v\n%s", err, out)
	}
	return string(out)
}

// authority is every file of the store's authority (records, proposals, trust, config, roots) with
// its content hash, and the valid store paths: what a refused request must leave as it was.
func authority(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, d := range []string{"workshops", "proposals", "trust", "roots", "meta", "config.toml"} {
		filepath.WalkDir(filepath.Join(root, d), func(p string, e fs.DirEntry, err error) error {
			if err != nil || e.IsDir() {
				return nil
			}
			b, err := os.ReadFile(p)
			if err == nil {
				out[p] = fmt.Sprintf("%x", sha256.Sum256(b))
			}
			return nil
		})
	}
	ents, _ := os.ReadDir(filepath.Join(root, "store"))
	for _, e := range ents {
		out["store/"+e.Name()] = "present"
	}
	return out
}

func sameAuthority(t *testing.T, what string, before, after map[string]string) {
	t.Helper()
	for k, v := range before {
		if after[k] != v {
			t.Errorf("%s: %s changed (%s -> %q)", what, k, v, after[k])
		}
	}
	for k := range after {
		if _, ok := before[k]; !ok {
			t.Errorf("%s: %s appeared", what, k)
		}
	}
}

// TestSupervisorBypasses: the ways past the old argv-matching supervisor, each tried again by a real
// unprivileged client (nobody) through a real daemon. Each must be refused and leave the store's
// paths, roots, keys, trust state and records exactly as they were.
func TestSupervisorBypasses(t *testing.T) {
	requireRoot(t)
	root := sharedRoot(t)
	file, _ := benchWorkshop(t)
	sock := daemon(t, root)
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.Atoi(nobody.Uid)
	for d := filepath.Dir(shedBin); d != "/"; d = filepath.Dir(d) {
		if fi, err := os.Stat(d); err == nil && fi.Mode().Perm()&0o001 == 0 {
			os.Chmod(d, fi.Mode().Perm()|0o011)
		}
	}
	// Two records: nobody may use the first, not the second.
	mine, other := "mine-"+strconv.Itoa(os.Getpid()), "other-"+strconv.Itoa(os.Getpid())
	text := string(must(os.ReadFile(file)))
	for _, n := range []string{mine, other} {
		f := writeFile(t, filepath.Join(t.TempDir(), "workshop.toml"), strings.Replace(text, `name = "bench-jq"`, fmt.Sprintf("name = %q", n), 1))
		if r := via(t, sock, 0, "", "workshop", "add", f); r.code != 0 {
			t.Fatalf("workshop add: %s", r.stderr)
		}
	}
	if r := via(t, sock, 0, "", "workshop", "allow", mine, "nobody"); r.code != 0 {
		t.Fatal(r.stderr)
	}
	if r := via(t, sock, 0, "", "realize", other); r.code != 0 {
		t.Fatal(r.stderr)
	}
	roots := string(must(os.ReadFile(filepath.Join(root, "roots", other))))
	// A root-only file, and a link to it in a directory nobody controls.
	canary := "canary-" + strconv.Itoa(os.Getpid())
	secret := writeFile(t, filepath.Join(t.TempDir(), "secret"), canary+"\n")
	os.Chmod(secret, 0o600)
	planted := filepath.Join(t.TempDir(), "planted")
	os.MkdirAll(planted, 0o777)
	os.Symlink(secret, filepath.Join(planted, "config.toml"))
	os.Chown(planted, uid, uid)

	before := authority(t, root)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--", "gc"}, ""},
		{[]string{"--", "key", "trust", "evil-1:" + strings.Repeat("A", 43) + "="}, ""},
		{[]string{"--", "workshop", "promote", "0123456789abcdef"}, ""},
		{[]string{"--", "root", "rm", other}, ""},
		{[]string{"gc"}, "for operators"},
		{[]string{"key", "trust", "evil-1:" + strings.Repeat("A", 43) + "="}, "for operators"},
		{[]string{"root", "rm", other}, "for operators"},
		{[]string{"workshop", "promote", "0123456789abcdef"}, "for operators"},
		{[]string{"bench", "run", "-f", mine, "-grant", "/etc:/x:ro", "--", "true"}, "grants are for operators"},
		{[]string{"bench", "run", "-f", mine, "-grant=/etc:/x:ro", "--", "true"}, "grants are for operators"},
		{[]string{"realize", "-substituter", "oci://127.0.0.1:1/x", mine}, "substituters are for operators"},
		{[]string{"realize", "-substituter=oci://127.0.0.1:1/x", mine}, "substituters are for operators"},
		// The old check took the first -f; the CLI the last. Now the request holds one value.
		{[]string{"bench", "run", "-f", mine, "-f", other, "--", "cat", "/etc/hostname"}, "may not use Workshop " + other},
		{[]string{"bench", "run", "-f=" + mine, "--file", other, "--", "true"}, "two forms of the same flag"},
		{[]string{"realize", "/etc/shadow"}, "not a Workshop record"},
		{[]string{"why", other, "/usr/bin/jq"}, "may not use Workshop " + other},
		{[]string{"diff", mine, "/etc/shadow"}, "not a Workshop record"},
		// A --root on the command line works on that store directly, as nobody: the daemon is not
		// asked, and nothing reads the planted link as root.
		{[]string{"realize", mine, "-root=" + planted}, ""},
		{[]string{"-root", planted, "store", "ls"}, ""},
	} {
		r := via(t, sock, uid, "", c.args...)
		if r.code == 0 || !strings.Contains(r.stderr, c.want) || strings.Contains(r.stdout+r.stderr, canary) {
			t.Errorf("nobody: shed %s: exit %d, want refused with %q\n%s%s", strings.Join(c.args, " "), r.code, c.want, r.stdout, r.stderr)
		}
	}
	// Requests written by hand, past any CLI: unknown operations and fields, a store root, another
	// protocol, truncated and huge frames. Each gets one error; the daemon stays up.
	for _, c := range []struct {
		body   string
		length int
		want   string
	}{
		{`{"protocol":1,"op":"no-such-command"}`, 0, `"unknown_operation"`},
		{`{"protocol":1,"op":"gc"}`, 0, `"denied"`},
		{`{"protocol":1,"op":"realize","request":{"workshop":"` + mine + `","root":"` + planted + `"}}`, 0, `unknown field \"root\"`},
		{`{"protocol":1,"op":"realize","root":"` + planted + `","request":{"workshop":"` + mine + `"}}`, 0, `unknown field \"root\"`},
		{`{"protocol":1,"op":"bench.run","request":{"workshop":"` + mine + `","argv":["true"],"grants":["/etc:/x:ro"]}}`, 0, `"denied"`},
		{`{"protocol":1,"op":"bench.run","request":{"workshop":"` + mine + `","argv":["true"],"Grants":["/etc:/x:ro"]}}`, 0, `"denied"`},
		{`{"protocol":1,"op":"workshop.ls","op":"gc"}`, 0, `"denied"`},
		{`{"protocol":1,"op":"bench.run","request":{"workshop":"` + other + `","argv":["true"]}}`, 0, `"denied"`},
		{`{"protocol":0,"op":"gc"}`, 0, `"bad_request"`},
		{`{"protocol":1,"op":"gc"`, 0, `"bad_request"`},
		{`{"protocol":1,"op":"gc"}`, 1 << 30, `"bad_request"`},
	} {
		out := raw(t, sock, uid, c.body, c.length)
		if !strings.Contains(out, c.want) || strings.Contains(out, `"result"`) {
			t.Errorf("nobody: %s: got %s, want %s", c.body, out, c.want)
		}
	}
	sameAuthority(t, "after nobody's requests", before, authority(t, root))
	if got := string(must(os.ReadFile(filepath.Join(root, "roots", other)))); got != roots {
		t.Errorf("the root of %s changed", other)
	}
	// Still up, and still serving what nobody may do.
	if r := via(t, sock, uid, "", "workshop", "ls"); r.code != 0 || !strings.Contains(r.stdout, mine) {
		t.Errorf("the daemon after the bypasses: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := via(t, sock, uid, "", "bench", "run", "-f", mine, "--", "jq", "-n", "1+1"); r.code != 0 || r.stdout != "2\n" {
		t.Errorf("nobody's allowed Bench: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

// TestSupervisorPaths: through the daemon, every file an operation reads is the caller's: a relative
// recipe, its lock (`shed why`), and the recipe a Bench was launched with, which its record keeps
// absolute, so a proposal from anywhere finds it.
func TestSupervisorPaths(t *testing.T) {
	requireRoot(t)
	root := sharedRoot(t)
	file, _ := benchWorkshop(t)
	sock := daemon(t, root)
	dir := filepath.Dir(file)
	in := func(dir string, args ...string) result {
		t.Helper()
		cmd := viaCmd(sock, 0, args...)
		cmd.Dir = dir
		var out, errb strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		r := result{out.String(), errb.String(), 0}
		if ee, ok := err.(*exec.ExitError); ok {
			r.code = ee.ExitCode()
		}
		return r
	}
	if r := in(dir, "why", "workshop.toml", "/usr/bin/jq"); r.code != 0 || !strings.Contains(r.stdout, "package:  jq ") {
		t.Errorf("why, relative, through the daemon: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	name := "paths-" + strconv.Itoa(os.Getpid())
	if r := in(dir, "bench", "run", "--keep", "--name", name, "-f", "workshop.toml", "--", "true"); r.code != 0 {
		t.Fatalf("bench run --keep: exit %d\n%s", r.code, r.stderr)
	}
	t.Cleanup(func() { in("/", "bench", "rm", name) })
	r := in("/", "--json", "bench", "ls")
	var benches []struct{ Name, Workshop string }
	json.Unmarshal([]byte(r.stdout), &benches)
	found := false
	for _, b := range benches {
		if b.Name == name {
			found = true
			if b.Workshop != file {
				t.Errorf("the Bench's record keeps %q, want %q", b.Workshop, file)
			}
		}
	}
	if !found {
		t.Errorf("bench ls lacks %s:\n%s%s", name, r.stdout, r.stderr)
	}
	// It installed nothing: the proposal is refused for that, having read the recipe from /.
	if r := in("/", "bench", "propose", name); r.code == 0 || !strings.Contains(r.stderr, "installed nothing") {
		t.Errorf("propose from /: exit %d, want 'installed nothing'\n%s%s", r.code, r.stdout, r.stderr)
	}
}

// TestConcurrentLock: two realizes of one unlocked recipe at once both lock it, both succeed, and
// agree on the lock (one fixed temporary name made one of them fail).
func TestConcurrentLock(t *testing.T) {
	parallel(t) // see parallelTests in main_test.go
	requireRoot(t)
	root := sharedRoot(t)
	dir := t.TempDir()
	file := writeFile(t, filepath.Join(dir, "workshop.toml"), `name = "twice"
seed = "debian/bookworm"
[apt]
packages = ["jq"]
`)
	var wg sync.WaitGroup
	res := make([]result, 2)
	for i := range res {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i] = shed(t, root, nil, "--json", "realize", file)
		}()
	}
	wg.Wait()
	var layers []string
	for i, r := range res {
		if r.code != 0 {
			t.Fatalf("realize %d: exit %d\n%s", i, r.code, r.stderr)
		}
		var j realizeJSON
		if err := json.Unmarshal([]byte(r.stdout), &j); err != nil {
			t.Fatal(err)
		}
		layers = append(layers, strings.Join(j.Layers, " "))
	}
	if layers[0] != layers[1] {
		t.Errorf("two realizes of one recipe got different layers:\n%s\n%s", layers[0], layers[1])
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 2 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("the recipe's directory holds %v, want the recipe and its lock only", names)
	}
	if r := shed(t, root, nil, "--json", "lock", file); r.code != 0 || !strings.Contains(r.stdout, `"changed": false`) {
		t.Errorf("the lock written does not match the recipe: %s%s", r.stdout, r.stderr)
	}
}

// procCount is how many threads and descriptors process pid has.
func procCount(t *testing.T, pid int) (threads, fds int) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			threads, _ = strconv.Atoi(strings.TrimSpace(v))
		}
	}
	ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	return threads, len(ents)
}

// TestSupervisorHeldDescriptors: a user who hands the daemon descriptors it never makes ready (a
// terminal's stdin that is a pipe held open and silent) costs the daemon nothing once each request
// is over: its threads and descriptors come back to what they were. And an agent that puts a FIFO
// where dpkg's status was cannot hang a proposal.
func TestSupervisorHeldDescriptors(t *testing.T) {
	requireRoot(t)
	root := sharedRoot(t)
	file, _ := benchWorkshop(t)
	sock := daemon(t, root)
	pidv, _ := daemonPids.Load(sock)
	pid := pidv.(int)
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.Atoi(nobody.Uid)
	for d := filepath.Dir(shedBin); d != "/"; d = filepath.Dir(d) {
		if fi, err := os.Stat(d); err == nil && fi.Mode().Perm()&0o001 == 0 {
			os.Chmod(d, fi.Mode().Perm()|0o011)
		}
	}
	name := "held-" + strconv.Itoa(os.Getpid())
	f := writeFile(t, filepath.Join(t.TempDir(), "workshop.toml"), strings.Replace(string(must(os.ReadFile(file))), `name = "bench-jq"`, fmt.Sprintf("name = %q", name), 1))
	if r := via(t, sock, 0, "", "workshop", "add", "--allow", "nobody", f); r.code != 0 {
		t.Fatal(r.stderr)
	}
	startVia(t, sock, uid, "bench", "run", "-f", name, "--name", name, "--", "sleep", "1021")
	waitBench(t, root, name)
	// One request to settle what the daemon keeps (its first Bench's goroutines, caches).
	exec1 := `{"protocol":1,"op":"bench.exec","request":{"bench":"` + name + `","argv":["true"],"tty":true}}`
	rawEnv(t, sock, uid, []string{"RAW_STDIN=silent-pipe"}, exec1)
	time.Sleep(300 * time.Millisecond)
	threads0, fds0 := procCount(t, pid)
	for range 30 {
		if out := rawEnv(t, sock, uid, []string{"RAW_STDIN=silent-pipe"}, exec1); !strings.Contains(out, `"exit":0`) {
			t.Fatalf("exec with a silent stdin: %s", out)
		}
	}
	// A leaked copy holds its descriptor, and a thread blocked in read(2): the descriptors must come
	// back exactly; the Go runtime keeps idle threads, so a few more of those are no leak (thirty
	// leaked copies would be thirty).
	var threads, fds int
	for range 50 {
		if threads, fds = procCount(t, pid); threads <= threads0+10 && fds <= fds0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if threads > threads0+10 || fds > fds0 {
		t.Errorf("after 30 requests with a silent stdin the daemon has %d threads and %d descriptors, %d and %d before", threads, fds, threads0, fds0)
	}

	// A FIFO in place of dpkg's status, in a kept Bench: the proposal is refused, at once.
	fifo := "fifo-" + strconv.Itoa(os.Getpid())
	if r := via(t, sock, 0, "", "bench", "run", "--keep", "--name", fifo, "-f", name, "--", "sh", "-c",
		"rm /var/lib/dpkg/status && mkfifo /var/lib/dpkg/status"); r.code != 0 {
		t.Fatalf("the FIFO's Bench: exit %d\n%s", r.code, r.stderr)
	}
	t.Cleanup(func() { via(t, sock, 0, "", "bench", "rm", fifo) })
	start := time.Now()
	cmd := viaCmd(sock, 0, "bench", "propose", fifo)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	timer := time.AfterFunc(60*time.Second, func() { cmd.Process.Kill() })
	err = cmd.Run()
	timer.Stop()
	if err == nil || !strings.Contains(stderr.String(), "not a regular file") || time.Since(start) > 30*time.Second {
		t.Errorf("propose from a Bench with a FIFO for dpkg's status: %v after %v\n%s", err, time.Since(start), stderr.String())
	}
}
