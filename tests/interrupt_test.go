package tests

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestInterrupt: SIGINT, SIGTERM and SIGHUP while a layer builds end shed with "interrupted" and the
// shell's exit code for the signal (130, 143, 129), never a build's failure; no staging directory
// and no sandbox process is left; the store verifies; and the next run finishes, from the files the
// interrupted one fetched.
func TestInterrupt(t *testing.T) {
	requireRoot(t)
	// Run under nohup, the tests pass SIGHUP ignored to every shed they start, and shed keeps a signal
	// it was started with ignored (as it must). Caught here, it is the default again in children.
	if signal.Ignored(syscall.SIGHUP) {
		signal.Notify(make(chan os.Signal, 1), syscall.SIGHUP)
	}
	root := sharedRoot(t)
	for i, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP} {
		// A layer of its own each time (the packages differ), locked first: the signal comes while it
		// builds.
		// (No other test installs these: a layer another test built would be a cache hit.)
		pkgs := []string{`"units"`, `"dc"`, `"pv"`, `"ed"`}[:2+i]
		file := writeFile(t, filepath.Join(t.TempDir(), "workshop.toml"), fmt.Sprintf("name = \"intr-%d-%d\"\nseed = \"debian/bookworm\"\n[apt]\npackages = [%s]\n",
			os.Getpid(), i, strings.Join(pkgs, ", ")))
		mustShed(t, root, "lock", file)
		top := 0
		if viaDaemon {
			top = daemonPidFor(t, root)
		}
		before := running(top) // the supervisor's own (its warm pool), not the run's
		cmd := shedCmd(t, root, "realize", file)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Wait for the layer's build: apt-get or dpkg under shed (the lock was made; fetching is shed's
		// own). Through the daemon, the supervisor builds: its descendants are watched.
		if !viaDaemon {
			top = cmd.Process.Pid
		}
		deadline := time.Now().Add(2 * time.Minute)
		var during map[int]string
		for {
			during = running(top)
			building := false
			for _, comm := range during {
				building = building || comm == "apt-get" || comm == "dpkg"
			}
			if building {
				break
			}
			if time.Now().After(deadline) {
				cmd.Process.Kill()
				t.Fatalf("%v: no build started in 2 minutes:\n%s", sig, stderr.String())
			}
			time.Sleep(5 * time.Millisecond)
		}
		sent := time.Now()
		cmd.Process.Signal(sig)
		err := cmd.Wait()
		took := time.Since(sent)
		code := cmd.ProcessState.ExitCode()
		if code != 128+int(sig) || !strings.Contains(stderr.String(), "shed: error: interrupted") || strings.Contains(stderr.String(), "build failed") {
			t.Errorf("%v during a build: exit %d (%v), want %d and \"interrupted\":\n%s", sig, code, err, 128+int(sig), stderr.String())
		}
		t.Logf("%v: shed ended %v after the signal", sig, took.Round(time.Millisecond))
		// Within a second, every process of the build is gone, and so is its staging.
		deadline = time.Now().Add(time.Second)
		for {
			var left []string
			for pid, comm := range during {
				if _, old := before[pid]; alive(pid) && !old {
					left = append(left, fmt.Sprintf("%d %s", pid, comm))
				}
			}
			stages, _ := filepath.Glob(filepath.Join(root, "tmp", "stage-*"))
			if len(left) == 0 && len(stages) == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("%v: a second after the signal, processes %v and staging %v are left", sig, left, stages)
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if r := mustShed(t, root, "store", "verify"); !strings.Contains(r.stdout, " 0 problems") {
			t.Errorf("%v: store verify after the interrupt:\n%s", sig, r.stdout)
		}
		// The rerun finishes, fetches nothing again, and says when the build starts and ends.
		r := mustShed(t, root, "--json", "realize", file)
		var again realizeJSON
		if err := json.Unmarshal([]byte(r.stdout), &again); err != nil {
			t.Fatalf("realize --json: %v\n%s", err, r.stdout)
		}
		if len(again.Layers) != 2 || len(again.Fetched) != 0 || len(again.Built) != 1 {
			t.Errorf("%v: the rerun: %+v, want the two layers, the layer built, nothing fetched again", sig, again)
		}
		if !strings.Contains(r.stderr, "shed: building ") || !strings.Contains(r.stderr, "shed: built ") {
			t.Errorf("%v: the rerun's build did not say when it started and ended:\n%s", sig, r.stderr)
		}
	}
}

// running maps pid's live descendants to their command names.
func running(pid int) map[int]string {
	out := map[int]string{}
	for _, d := range descendants(pid)[1:] {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", d)); err == nil {
			out[d] = strings.TrimSpace(string(b))
		}
	}
	return out
}

func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	j := strings.LastIndexByte(s, ')')
	return j > 0 && !strings.HasPrefix(strings.TrimSpace(s[j+1:]), "Z")
}

// daemonPidFor is the pid of the supervisor the tests run for root (through the daemon).
func daemonPidFor(t *testing.T, root string) int {
	t.Helper()
	pid, ok := daemonPids.Load(daemonFor(t, root, nil))
	if !ok {
		t.Fatal("no supervisor for the store")
	}
	return pid.(int)
}
