package tests

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The faces of a shared supervisor under attack (issue 23): a stranger on the E2B port and an agent
// on its propose socket each hold all they can; root, other users and keyed clients are answered
// meanwhile. Nothing here asserts a speed: each answer has a generous deadline.

// slowBodyAttack is a stranger with no key: until its stdin ends it keeps n connections open to the
// E2B port, each sending a Connect call's headers that promise a body, then a byte of body every
// 5 s; one that is answered or closed is replaced by a new one (at most 20 every 20 ms). It prints
// "sent" once the first n are, then how its connections ended ("unauthenticated": Connect's error,
// from the headers; another status; "closed"; "reset") and the longest any stayed unanswered, in
// seconds.
const slowBodyAttack = `
import json, select, socket, sys, time
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
head = (b"POST /process.Process/Start HTTP/1.1\r\nHost: e2b\r\nContent-Type: application/connect+json\r\n"
        b"Connect-Protocol-Version: 1\r\nE2b-Sandbox-Id: none\r\nContent-Length: 100000\r\n\r\n{")
def dial():
    s = socket.create_connection((host, port))
    try:
        s.sendall(head)
    except OSError:
        pass
    s.setblocking(False)
    return [s, time.time(), time.time()]
def ended(b):
    if not b:
        return "closed"
    if not b.startswith(b"HTTP/"):
        return "garbage"
    return "unauthenticated" if b'"unauthenticated"' in b else b.split(b" ")[1].decode()
live = [dial() for _ in range(n)]
print("sent", flush=True)
summary, longest = {}, 0.0
while not select.select([sys.stdin], [], [], 0)[0]:
    replaced = 0
    for c in list(live):
        s, opened, dripped = c
        try:
            res = ended(s.recv(4096))
        except BlockingIOError:
            res = None
        except ConnectionResetError:
            res = "reset"
        now = time.time()
        if res is None:
            longest = max(longest, now - opened)
            if now - dripped > 5:
                try:
                    s.send(b"x")
                except OSError:
                    pass
                c[2] = now
            continue
        summary[res] = summary.get(res, 0) + 1
        s.close()
        live.remove(c)
        if replaced < 20:
            live.append(dial())
            replaced += 1
    while len(live) < n and replaced < 20:
        live.append(dial())
        replaced += 1
    time.sleep(0.02)
summary["longest unanswered"] = round(longest, 1)
print(json.dumps(summary), flush=True)
`

// TestE2BUnderAttack is the reported attack on the E2B port: a local user with no key keeps 300
// connections open that send a Connect call's headers and a byte of body every 5 s. Each is refused
// from its headers (unauthenticated, its body never read) or at once past its peer's share (503):
// none holds a slot for long. Meanwhile /health, a keyed client's create, list and kill, and root's
// `shed bench ls` are answered.
func TestE2BUnderAttack(t *testing.T) {
	requireRoot(t)
	root := sharedRoot(t)
	addr := freeLoopback(t)
	sock, _ := daemonWith(t, root, "--e2b", addr)
	uid := nobodyUID(t)
	name := e2bRecord(t, sock) // the shared jq record (e2bShared)
	if r := via(t, sock, 0, "", "realize", name); r.code != 0 {
		t.Fatalf("realize: %s", r.stderr)
	}
	made := via(t, sock, 0, "", "--json", "agent", "key", "create", "nobody")
	var key struct{ Key string }
	if err := json.Unmarshal([]byte(made.stdout), &key); err != nil || key.Key == "" {
		t.Fatalf("agent key create: %v %s", err, made.stderr)
	}

	host, port, _ := strings.Cut(addr, ":")
	attack := exec.Command("/usr/bin/python3", "-c", slowBodyAttack, host, port, "300")
	attack.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	attack.Dir = "/"
	var stderr strings.Builder
	attack.Stderr = &stderr
	stop := must(attack.StdinPipe())
	out := must(attack.StdoutPipe())
	if err := attack.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { attack.Process.Kill(); attack.Wait() })
	lines := bufio.NewScanner(out)
	if !lines.Scan() || lines.Text() != "sent" {
		t.Fatalf("the attacker: %q %s", lines.Text(), stderr.String())
	}
	started := time.Now()

	// Answers are due long before the attack ends (held connections would hold it all along).
	client := &http.Client{Timeout: 20 * time.Second}
	call := func(method, path, body string) (int, string) {
		t.Helper()
		start := time.Now()
		req := must(http.NewRequest(method, "http://"+addr+path, strings.NewReader(body)))
		if path != "/health" {
			req.Header.Set("X-API-Key", key.Key)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Errorf("%s %s during the attack: %v", method, path, err)
			return 0, ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		t.Logf("%s %s during the attack: %s in %v", method, path, resp.Status, time.Since(start).Round(time.Millisecond))
		return resp.StatusCode, string(b)
	}
	if code, _ := call("GET", "/health", ""); code != http.StatusNoContent {
		t.Errorf("/health: %d", code)
	}
	code, body := call("POST", "/v2/sandboxes", `{"templateID":"`+name+`"}`)
	var sb struct{ SandboxID string }
	if json.Unmarshal([]byte(body), &sb); code != http.StatusCreated || sb.SandboxID == "" {
		t.Fatalf("a keyed create: %d %s", code, body)
	}
	if code, body := call("GET", "/v2/sandboxes", ""); code != http.StatusOK || !strings.Contains(body, sb.SandboxID) {
		t.Errorf("a keyed list: %d %s", code, body)
	}
	if r := viaWithin(t, 20*time.Second, sock, 0, "bench", "ls"); r.code != 0 || !strings.Contains(r.stdout, sb.SandboxID) {
		t.Errorf("root's bench ls: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if code, body := call("DELETE", "/sandboxes/"+sb.SandboxID, ""); code != http.StatusNoContent {
		t.Errorf("a keyed kill: %d %s", code, body)
	}
	// The attack goes on past the header timeout (5 s) and a body byte or two, then stops.
	time.Sleep(time.Until(started.Add(15 * time.Second)))
	stop.Close()

	if !lines.Scan() {
		t.Fatalf("the attacker gave no summary: %s", stderr.String())
	}
	var got map[string]float64
	if err := json.Unmarshal(lines.Bytes(), &got); err != nil {
		t.Fatalf("the attacker's summary %q: %v", lines.Text(), err)
	}
	t.Logf("the attacker's connections: %v", got)
	// Held, one would stay unanswered for the whole attack (15 s at least).
	if got["unauthenticated"] == 0 || got["200"]+got["401"]+got["garbage"] != 0 || got["longest unanswered"] > 10 {
		t.Errorf("the attacker's connections: %v, want each refused (unauthenticated from its headers, or 503, reset or closed past its peer's share), none held", got)
	}
}

// proposeFlood is an agent in a Bench: it opens up to n connections to its propose socket, never
// waiting for one (a full queue refuses at once), prints how many it holds, and holds them until
// its stdin ends. perl-base is in every Debian seed.
const proposeFlood = `
use strict; use warnings; use Socket; use Fcntl; use IO::Handle;
my $n = shift; my @held; my $refused = 0;
for (1 .. $n) {
	socket(my $s, AF_UNIX, SOCK_STREAM, 0) or last;
	fcntl($s, F_SETFL, fcntl($s, F_GETFL, 0) | O_NONBLOCK);
	if (connect($s, pack_sockaddr_un("/run/shed/propose.sock"))) { push @held, $s } else { $refused++ }
}
print "held ", scalar(@held), " refused $refused\n";
STDOUT->flush;
<STDIN>;
`

// TestProposeUnderAttack is the reported attack on a propose socket: an agent in nobody's Bench
// tries 19,000 connections to /run/shed/propose.sock and holds what it gets. The supervisor takes
// its Bench's share of them (the rest wait in the kernel's queue, or are refused when it is full);
// its descriptors stay where they were; root's `shed bench ls`, another user's command and the E2B
// port's /health are answered meanwhile; once the agent lets go, the socket answers it again.
func TestProposeUnderAttack(t *testing.T) {
	requireRoot(t)
	root := sharedRoot(t)
	addr := freeLoopback(t)
	sock, _ := daemonWith(t, root, "--e2b", addr)
	uid := nobodyUID(t)
	name := e2bRecord(t, sock) // the shared jq record (e2bShared)
	if r := via(t, sock, 0, "", "realize", name); r.code != 0 {
		t.Fatalf("realize: %s", r.stderr)
	}
	bench := "flooded-" + strconv.Itoa(os.Getpid())
	startVia(t, sock, uid, "bench", "run", "-f", name, "--name", bench, "--", "sleep", "1000")
	waitBench(t, root, bench)
	pid, _ := daemonPids.Load(sock)
	before := openFDsOf(t, pid.(int))

	attack := viaCmd(sock, uid, "bench", "exec", bench, "--", "sh", "-c", `ulimit -n 20000 2>/dev/null; exec perl -e "$0" 19000`, proposeFlood)
	stdin := must(attack.StdinPipe())
	out := must(attack.StdoutPipe())
	var stderr strings.Builder
	attack.Stderr = &stderr
	if err := attack.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); attack.Process.Kill(); attack.Wait() })
	lines := bufio.NewScanner(out)
	if !lines.Scan() || !strings.HasPrefix(lines.Text(), "held ") {
		t.Fatalf("the agent: %q %s", lines.Text(), stderr.String())
	}
	t.Logf("the agent: %s", lines.Text())
	var held, refused int
	fmt.Sscanf(lines.Text(), "held %d refused %d", &held, &refused)
	if held < 1000 {
		t.Errorf("the agent holds %d connections: too few to be an attack", held)
	}
	if now := openFDsOf(t, pid.(int)); now-before > 64 {
		t.Errorf("the agent's %d connections cost the supervisor %d descriptors (%d before)", held, now-before, before)
	} else {
		t.Logf("the supervisor's descriptors: %d before, %d during", before, now)
	}

	if r := viaWithin(t, 30*time.Second, sock, 0, "bench", "ls"); r.code != 0 || !strings.Contains(r.stdout, bench) {
		t.Errorf("root's bench ls: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := viaWithin(t, 30*time.Second, sock, 1, "workshop", "ls"); r.code != 0 || !strings.Contains(r.stdout, name) {
		t.Errorf("another user's workshop ls: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := viaWithin(t, 30*time.Second, sock, uid, "bench", "exec", bench, "--", "jq", "-n", "1+1"); r.code != 0 || r.stdout != "2\n" {
		t.Errorf("the Bench's owner's exec: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Get("http://" + addr + "/health")
	if err != nil || resp.StatusCode != http.StatusNoContent {
		t.Errorf("the E2B port's /health: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}

	// The agent lets go: its socket answers it again.
	stdin.Close()
	attack.Wait()
	r := viaWithin(t, 120*time.Second, sock, uid, "bench", "exec", bench, "--", "perl", "-e", proposeOnce)
	if !strings.HasPrefix(r.stdout, "HTTP/1.0 ") {
		t.Errorf("a proposal after the attack: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

// proposeOnce asks the propose socket once and prints the answer's status line.
const proposeOnce = `
use strict; use warnings; use Socket;
socket(my $s, AF_UNIX, SOCK_STREAM, 0) or die "socket: $!";
connect($s, pack_sockaddr_un("/run/shed/propose.sock")) or die "connect: $!";
syswrite($s, "POST /propose HTTP/1.0\r\nContent-Length: 0\r\n\r\n");
my $line = <$s>;
print $line;
`

// viaWithin is via, killed if it has not ended within d (a test failure: an answer is due).
func viaWithin(t *testing.T, d time.Duration, sock string, uid int, args ...string) result {
	t.Helper()
	cmd := viaCmd(sock, uid, args...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	timer := time.AfterFunc(d, func() { cmd.Process.Kill() })
	err := cmd.Wait()
	what := strings.Join(args, " ")
	if len(what) > 60 {
		what = what[:60] + "..."
	}
	if !timer.Stop() {
		t.Errorf("shed %s (uid %d): no answer within %v", what, uid, d)
	}
	t.Logf("shed %s (uid %d): answered in %v", what, uid, time.Since(start).Round(time.Millisecond))
	r := result{out.String(), errb.String(), 0}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	}
	return r
}

// openFDsOf counts the descriptors process pid has open.
func openFDsOf(t *testing.T, pid int) int {
	t.Helper()
	es, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}
