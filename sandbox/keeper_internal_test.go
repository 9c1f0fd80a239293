package sandbox

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestKeeper: a kept user namespace is a bind in the keeper's mount namespace, not on the host's
// table, where the keeper is one mount (keep.mnt) that a new mount namespace does not copy; the
// namespace is found again (the same one), and it maps as asked: an idmapped clone shows a file of
// on-disk root as the mapping's host id.
func TestKeeper(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	base := uint32(idBase + (idSlots-1)*IDsPerSandbox) // the last slot's: no other test uses it
	m := idMapping{0, base, IDsPerSandbox}
	a, err := keptUserns(m, m)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := keptUserns(m, m)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	var sa, sb unix.Stat_t
	if err := unix.Fstat(int(a.Fd()), &sa); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fstat(int(b.Fd()), &sb); err != nil {
		t.Fatal(err)
	}
	if sa.Ino != sb.Ino || sa.Dev != sb.Dev {
		t.Errorf("two lookups gave two user namespaces (inodes %d and %d): it was made again", sa.Ino, sb.Ino)
	}

	under := func(mountinfo []byte) (points []string) {
		for _, l := range strings.Split(string(mountinfo), "\n") {
			if f := strings.Fields(l); len(f) > 4 && strings.HasPrefix(f[4], idDir+"/") {
				points = append(points, f[4])
			}
		}
		return points
	}
	host, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range under(host) {
		if p != keeperFile {
			t.Errorf("the host's mount table has %s: want only %s under %s", p, keeperFile, idDir)
		}
	}
	if got := under(host); len(got) != 1 {
		t.Errorf("mounts under %s on the host: %q, want %s once", idDir, got, keeperFile)
	}
	copied, err := exec.Command("unshare", "-m", "cat", "/proc/self/mountinfo").Output()
	if err != nil {
		t.Fatalf("unshare -m: %v", err)
	}
	if got := under(copied); len(got) != 0 {
		t.Errorf("a new mount namespace has %q: the keeper's bind was copied", got)
	}

	checkMaps(t, a, base)
}

// checkMaps checks that userns maps as a sandbox's slot at base must: through an idmapped clone, a
// file of on-disk root is base's.
func checkMaps(t *testing.T, userns *os.File, base uint32) {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "f"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	fd, e := cloneTree(dir, 0, unix.MOUNT_ATTR_RDONLY|noSuidDev, int(userns.Fd()))
	if e != nil {
		t.Fatal(e)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstatat(fd, "f", &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		t.Fatal(err)
	}
	if st.Uid != base || st.Gid != base {
		t.Errorf("through the idmapped clone, on-disk root's file is %d:%d, want %d:%d", st.Uid, st.Gid, base, base)
	}
}

// TestKeeperPlanted: whatever is found at keep.mnt that is not a keeper (a plain file, a symlink to
// this process's mount namespace, a directory, a bind of a network namespace, a bind of another mount
// namespace whose root is the host's tree) is not used: the kept user namespace still maps as its
// name says, keep.mnt is a keeper again, and nothing planted is left on the host's mount table.
func TestKeeperPlanted(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	base := uint32(idBase + (idSlots-1)*IDsPerSandbox)
	m := idMapping{0, base, IDsPerSandbox}
	if _, err := openKeeper(); err != nil { // idDir exists
		t.Fatal(err)
	}
	// Another mount namespace, newer than this one (the kernel refuses a bind of an older one), whose
	// root is the host's tree.
	other := exec.Command("unshare", "-m", "sleep", "60")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { other.Process.Kill(); other.Wait() }()
	otherNS := fmt.Sprintf("/proc/%d/ns/mnt", other.Process.Pid)
	for i := 0; i < 100; i++ { // until unshare has entered it
		a, _ := os.Readlink(otherNS)
		b, _ := os.Readlink("/proc/self/ns/mnt")
		if a != b {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	bind := func(src string) func() error {
		return func() error {
			if err := os.WriteFile(keeperFile, nil, 0o600); err != nil {
				return err
			}
			return unix.Mount(src, keeperFile, "", unix.MS_BIND, "")
		}
	}
	for _, plant := range []struct {
		name string
		do   func() error
	}{
		{"a plain file", func() error { return os.WriteFile(keeperFile, []byte("not a namespace"), 0o600) }},
		{"a symlink to this mount namespace", func() error { return os.Symlink("/proc/self/ns/mnt", keeperFile) }},
		{"a directory", func() error {
			if err := os.Mkdir(keeperFile, 0o700); err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(keeperFile, "userns-x"), nil, 0o600)
		}},
		{"a network namespace", bind("/proc/self/ns/net")},
		{"a mount namespace rooted in the host's tree", bind(otherNS)},
	} {
		t.Run(plant.name, func(t *testing.T) {
			// Away with the keeper: this process's handle, and the host's bind (other processes keep
			// theirs, which stay valid).
			theKeeper.Lock()
			if k := theKeeper.k; k != nil {
				k.ns.Close()
				k.root.Close()
				theKeeper.k = nil
			}
			theKeeper.Unlock()
			for unix.Unmount(keeperFile, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW) == nil {
			}
			if err := os.RemoveAll(keeperFile); err != nil {
				t.Fatal(err)
			}
			if err := plant.do(); err != nil {
				t.Fatalf("plant: %v", err)
			}

			u, err := keptUserns(m, m)
			if err != nil {
				t.Fatal(err)
			}
			defer u.Close()
			checkMaps(t, u, base)
			var now, other unix.Stat_t
			if err := unix.Stat(keeperFile, &now); err != nil {
				t.Fatal(err)
			}
			if err := unix.Stat(otherNS, &other); err != nil {
				t.Fatal(err)
			}
			if now.Ino == other.Ino {
				t.Errorf("keep.mnt is still the planted mount namespace")
			}
			k, err := checkKeeper()
			if err != nil {
				t.Fatalf("after the launch's lookup, keep.mnt is no keeper: %v", err)
			}
			k.ns.Close()
			k.root.Close()
			host, err := os.ReadFile("/proc/self/mountinfo")
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for _, l := range strings.Split(string(host), "\n") {
				if f := strings.Fields(l); len(f) > 4 && f[4] == keeperFile {
					n++
				}
			}
			if n != 1 {
				t.Errorf("%d mounts at %s on the host, want the keeper's alone", n, keeperFile)
			}
		})
	}
}

// TestOwnThreadSparesChildren: the threads onOwnThread ends are none that forked a live child, which
// Pdeathsig would kill with them (a sandbox's init).
func TestOwnThreadSparesChildren(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	k, err := openKeeper()
	if err != nil {
		t.Fatal(err)
	}
	var kids []*exec.Cmd
	defer func() {
		for _, c := range kids {
			c.Process.Kill()
			c.Wait()
		}
	}()
	for i := 0; i < 16; i++ { // from whatever threads the scheduler gives
		c := exec.Command("sleep", "60")
		c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: unix.SIGKILL}
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		kids = append(kids, c)
	}
	for i := 0; i < 64; i++ {
		if err := inMountNS(k.ns, func() error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(50 * time.Millisecond) // a signal sent is delivered by then
	for _, c := range kids {
		if err := c.Process.Signal(syscall.Signal(0)); err != nil {
			t.Fatalf("a child started with Pdeathsig died: %v", err)
		}
		var ws unix.WaitStatus
		if pid, _ := unix.Wait4(c.Process.Pid, &ws, unix.WNOHANG, nil); pid != 0 {
			t.Fatalf("a child started with Pdeathsig died: %v", ws)
		}
	}
}
