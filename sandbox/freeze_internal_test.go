package sandbox

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestFreezeFiles drives freeze, readFrozen and thaw on a freezer of each hierarchy the host has: v1's
// freezer and the unified one's cgroup.freeze (on this hybrid host, at /sys/fs/cgroup/unified, which
// has no controllers but does freeze). A sleep in it stops (its state in /proc says so) and goes on.
func TestFreezeFiles(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (cgroups)")
	}
	roots := map[bool]string{}
	if fileExists("/sys/fs/cgroup/freezer/cgroup.procs") {
		roots[false] = "/sys/fs/cgroup/freezer"
	}
	for _, r := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
		if fileExists(filepath.Join(r, "cgroup.controllers")) {
			roots[true] = r
			break
		}
	}
	for v2, root := range roots {
		t.Run(map[bool]string{false: "v1", true: "v2"}[v2], func(t *testing.T) {
			var id [8]byte
			rand.Read(id[:])
			parent := filepath.Join(root, "toolshed-test")
			if err := os.MkdirAll(parent, 0o755); err != nil {
				t.Fatal(err)
			}
			defer os.Remove(parent) // once empty; another run's may hold it
			dir := filepath.Join(parent, hex.EncodeToString(id[:])+pausableSuffix)
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			defer os.Remove(dir)
			sleep := exec.Command("sleep", "1000")
			if err := sleep.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() {
				_ = thaw(dir, v2)
				sleep.Process.Kill()
				sleep.Wait()
			}()
			if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(sleep.Process.Pid)), 0); err != nil {
				t.Fatal(err)
			}
			if err := freeze(dir, v2, 5*time.Second); err != nil {
				t.Fatal(err)
			}
			if frozen, state, err := readFrozen(dir, v2); err != nil || !frozen {
				t.Fatalf("after freeze: %v %q %v, want frozen", frozen, state, err)
			}
			if !thawOrphan(dir) {
				t.Error("thawOrphan did not take a frozen freezer for one")
			}
			if frozen, state, err := readFrozen(dir, v2); err != nil || frozen {
				t.Fatalf("after thawOrphan: %v %q %v, want thawed", frozen, state, err)
			}
			if thawOrphan(dir) {
				t.Error("thawOrphan thawed a thawed freezer")
			}
		})
	}
	if len(roots) == 0 {
		t.Skip("no freezer hierarchy")
	}
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// TestExiting reads the flags of a live process, and of a zombie.
func TestExiting(t *testing.T) {
	if exiting(os.Getpid()) {
		t.Error("this process is exiting, says exiting")
	}
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(readStat(cmd.Process.Pid), ") Z "); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("true did not end: %s", readStat(cmd.Process.Pid))
		}
	}
	if !exiting(cmd.Process.Pid) {
		t.Errorf("a zombie is not exiting, says exiting (%s)", readStat(cmd.Process.Pid))
	}
}

func readStat(pid int) string {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	return string(b)
}
