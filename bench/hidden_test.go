package bench_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"toolshed.dev/shed/bench"
	"toolshed.dev/shed/recipe"
	"toolshed.dev/shed/sandbox"
	"toolshed.dev/shed/store"
)

// scanAsNobody is what another user reads of every process: its mount table, argv, name, cgroups and
// environment (readable only for its own processes), and the host's unix sockets.
const scanAsNobody = `for f in /proc/[0-9]*/mountinfo /proc/[0-9]*/mounts /proc/[0-9]*/cmdline /proc/[0-9]*/comm /proc/[0-9]*/cgroup /proc/[0-9]*/environ /proc/net/unix; do
	echo "== $f"; tr '\0' ' ' < "$f"; echo
done 2>/dev/null`

// TestBenchIDsHidden: while Benches run (one with a tmpfs upper, one kept, one on the uppers
// filesystem as a created Bench's, each with a proxy, a propose socket and cgroups), another user (nobody) who reads every /proc/PID/mountinfo, mounts,
// cmdline, comm, cgroup and environ and /proc/net/unix finds no Bench's id or name; reading them, it
// does see the Benches' mount tables. The propose socket still serves the Bench, through its bind.
func TestBenchIDsHidden(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: sandboxes (CI runs as root)")
	}
	// nobody must reach the store's directory to find nothing there: the store is root's (0700).
	s, err := store.Init(filepath.Join(t.TempDir(), "root"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	layer := busyboxLayer(t, s)
	// On disk: a Bench on the uppers filesystem keeps a copy of its recipe.
	text := []byte("name = \"quiet\"\nseed = \"debian/bookworm\"\n[network]\nallow = [\"example.com\"]\n")
	file := filepath.Join(t.TempDir(), "workshop.toml")
	if err := os.WriteFile(file, text, 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := recipe.Parse(file, text, recipe.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type running struct {
		rec *bench.Record
		out string // its command's output
	}
	var benches []running
	ended := make(chan error, 3)
	disk, err := bench.Uppers(s)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Unmount(filepath.Join(s.Root(), "uppers"), syscall.MNT_DETACH) })
	for i, mode := range []string{"tmpfs", "keep", "disk"} {
		started := make(chan *bench.Record, 1)
		out := filepath.Join(t.TempDir(), "out")
		f, err := os.Create(out)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		go func() {
			o := bench.Options{Keep: mode == "keep"}
			if mode == "disk" {
				o.Disk = disk
			}
			_, err := bench.Run(ctx, s, r, []store.Path{layer}, bench.Options{
				Name: fmt.Sprintf("quiet-bench-%d", i), Keep: o.Keep, Disk: o.Disk,
				Limits:  sandbox.Limits{Pids: 64}, // cgroups of its own
				Argv:    []string{"/bin/sh", "-c", "stat -c '%a %u' /run/shed/propose.sock; exec sleep 1000"},
				Stdio:   sandbox.Stdio{Stdout: f},
				Propose: func(context.Context, string) (string, error) { return "proposed\n", nil },
				Started: func(rec *bench.Record) { started <- rec },
			})
			ended <- err
		}()
		select {
		case rec := <-started:
			benches = append(benches, running{rec, out})
		case err := <-ended:
			t.Fatalf("bench %d: %v", i, err)
		}
	}

	cmd := exec.Command("/bin/sh", "-c", scanAsNobody)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	seen, err := cmd.Output()
	if err != nil {
		t.Fatalf("scan as nobody: %v", err)
	}
	for _, b := range benches {
		for _, secret := range []string{b.rec.ID, b.rec.Name} {
			for _, line := range strings.Split(string(seen), "\n") {
				if strings.Contains(line, secret) {
					t.Errorf("nobody reads %q of Bench %s: %s", secret, b.rec.Name, line)
				}
			}
		}
		// The scan is not blind: nobody read the Bench's init's mount table, with its propose socket.
		mi := fmt.Sprintf("== /proc/%d/mountinfo\n", b.rec.Pid)
		i := strings.Index(string(seen), mi)
		if i < 0 || !strings.Contains(strings.SplitN(string(seen[i+len(mi):]), "==", 2)[0], " /run/shed/propose.sock ") {
			t.Errorf("nobody did not read the mount table of Bench %s's init (pid %d)", b.rec.Name, b.rec.Pid)
		}

		// The socket serves the Bench: its owner is the Bench's root, and a POST through its bind
		// (from the host, through the init's root) is answered.
		var got []byte
		for deadline := time.Now().Add(10 * time.Second); len(got) == 0 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			got, _ = os.ReadFile(b.out)
		}
		if string(got) != "600 0\n" {
			t.Errorf("Bench %s: its propose socket: %q, want mode 600 and its root's", b.rec.Name, got)
		}
		c := http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", fmt.Sprintf("/proc/%d/root%s", b.rec.Pid, bench.ProposeSocket))
		}}}
		resp, err := c.Post("http://bench/propose", "", nil)
		if err != nil {
			t.Fatalf("Bench %s: propose: %v", b.rec.Name, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(body) != "proposed\n" {
			t.Errorf("Bench %s: propose answered %s %q", b.rec.Name, resp.Status, body)
		}
	}
	cancel()
	for range benches {
		<-ended
	}
}
