package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"toolshed.dev/shed/internal/lines"
	"toolshed.dev/shed/internal/userns"
)

// Every sandbox runs in user namespaces that map its ids 0..IDsPerSandbox-1 to a range of host ids that
// no other live sandbox has (podman's per-container ranges, Nix's auto-allocate-uids, systemd-nspawn's
// --private-users=pick). Root inside is then an unprivileged host id: it owns the sandbox's files and
// nothing of the host's.
const (
	// idBase is the first host id of the pool: above the subordinate ids useradd hands out (up to
	// 600100000 by Debian's login.defs) and systemd-nspawn's picks (up to 0x6FFFFFFF), below systemd's
	// foreign range (0x7FFE0000).
	idBase = 0x70000000
	// idSlots is how many sandboxes can run at once on a host.
	idSlots = 512
)

// idDir holds one lock file per slot and the user namespaces kept for idmapped mounts. Root's only.
const idDir = "/run/toolshed/ids"

// idRange is the slot of host ids a sandbox holds from Prestart until every process of it is gone.
type idRange struct {
	slot int
	base uint32
	lock *os.File // flock-held for the sandbox's life; records the init that uses the slot
	// uid and gid are the maps of the sandbox's user namespaces (the command's), from its ids to
	// this process's: base.. as one extent, or without root the ids of U as U maps them.
	uid, gid []idMapping
}

// ErrNoIDs is returned when every slot of host ids is held by a live sandbox.
var ErrNoIDs = errors.New("no free range of host ids for a sandbox")

// checkHost checks, once per process, what every sandbox needs of the host: a kernel recent enough, and
// a pool of ids that no user of this host has.
var checkHost = sync.OnceValue(func() error {
	if err := checkKernel(); err != nil {
		return err
	}
	if rootless() {
		return nil // the pool is root's; this process has the ids of its user namespace
	}
	return checkPool()
})

// rootless reports whether this process runs in a user namespace other than the host's (shed without
// root, in the namespace userns.Enter made). There it is root over the ids that namespace maps and
// nothing else: every sandbox has those ids, 0 to IDsPerSandbox-1 as they are (there is no pool of
// host ids to give each its own), the layers are mounted without an idmap (the kernel refuses one on
// a file system of the host's), the overlay keeps its marks in user.overlay.* xattrs (trusted.* are
// the host's), /dev's nodes are binds of the host's (no mknod), and there are no cgroups.
func rootless() bool { return userns.Active() }

// rootlessIDs is every sandbox's range without root: ids 0..IDsPerSandbox-1 of this user namespace.
// The command's user namespace maps them to themselves in as many extents as this namespace has (an
// extent may not span two of the parent's), so that its root is the user, and its other ids the
// user's subordinate ids, as the store's files have them.
func rootlessIDs() (*idRange, error) {
	r := &idRange{}
	for _, m := range []struct {
		file string
		out  *[]idMapping
	}{{"/proc/self/uid_map", &r.uid}, {"/proc/self/gid_map", &r.gid}} {
		ext, err := userns.ReadMap(m.file)
		if err != nil {
			return nil, fmt.Errorf("sandbox ids: %w", err)
		}
		next := uint32(0)
		for _, e := range ext {
			if e.Inside != next || next >= IDsPerSandbox {
				continue
			}
			n := min(e.Count, IDsPerSandbox-next)
			*m.out = append(*m.out, idMapping{next, next, n})
			next += n
		}
		if next < IDsPerSandbox {
			return nil, fmt.Errorf("sandbox ids: this user namespace maps %d ids from 0 on (%s), and a sandbox has 0 to %d: run shed as root of a user namespace with %d ids (as shed without root makes itself, from the user's subordinate ids)", next, m.file, IDsPerSandbox-1, IDsPerSandbox)
		}
	}
	return r, nil
}

// minKernel is the first Linux that takes overlay layers from detached (idmapped) mounts, by descriptor
// (layers by descriptor came in 6.13, detached mounts as layers and O_PATH descriptors in 6.15).
var minKernel = [2]int{6, 15}

func checkKernel() error {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return err
	}
	release := unix.ByteSliceToString(u.Release[:])
	var major, minor int
	if _, err := fmt.Sscanf(release, "%d.%d", &major, &minor); err != nil {
		return fmt.Errorf("kernel release %q: %w", release, err)
	}
	if major < minKernel[0] || major == minKernel[0] && minor < minKernel[1] {
		return fmt.Errorf("sandboxes need Linux %d.%d or later (overlay layers from detached idmapped mounts); this is %s", minKernel[0], minKernel[1], release)
	}
	return nil
}

// acquireIDs takes a free slot. A slot is free when no process holds its lock and the init recorded in
// it is gone: a shed killed by SIGKILL drops the lock a moment before the kernel kills its sandbox, and
// the sandbox's init disappears only once every process of its pid namespace has.
func acquireIDs() (*idRange, error) {
	if err := checkHost(); err != nil {
		return nil, err
	}
	if rootless() {
		return rootlessIDs()
	}
	// /run/toolshed is also the supervisor's socket directory, which every user reaches (0755); the
	// ids are root's alone.
	if err := os.MkdirAll(filepath.Dir(idDir), 0o755); err != nil {
		return nil, fmt.Errorf("sandbox ids: %w", err)
	}
	if err := os.Mkdir(idDir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("sandbox ids: %w", err)
	}
	// Whoever controls this directory decides which sandboxes share ids: it must be root's alone.
	var st unix.Stat_t
	if err := unix.Lstat(idDir, &st); err != nil {
		return nil, fmt.Errorf("sandbox ids: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR || st.Uid != 0 || st.Mode&0o077 != 0 {
		return nil, fmt.Errorf("sandbox ids: %s must be a directory of root's, mode 0700 (it is %o, uid %d): remove it, and shed makes it again", idDir, st.Mode, st.Uid)
	}
	// The lowest free slot: as few slots (and kept namespaces, see userns) as sandboxes have ever
	// run at once.
	for slot := range idSlots {
		f, err := os.OpenFile(filepath.Join(idDir, strconv.Itoa(slot)+".lock"), os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
		if err != nil {
			return nil, fmt.Errorf("sandbox ids: %w", err)
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			continue
		}
		if initAlive(f) {
			f.Close()
			continue
		}
		base := idBase + uint32(slot)*IDsPerSandbox
		one := []idMapping{{0, base, IDsPerSandbox}}
		return &idRange{slot: slot, base: base, lock: f, uid: one, gid: one}, nil
	}
	return nil, fmt.Errorf("%w: all %d are in use (%s/N.lock, held by running sandboxes); wait for some to end", ErrNoIDs, idSlots, idDir)
}

// mapping is the range as one line of a uid_map: the sandbox's 0.. are host base...
func (r *idRange) mapping() idMapping { return idMapping{0, r.base, IDsPerSandbox} }

// sysMaps is the command's uid or gid map as exec wants it.
func sysMaps(m []idMapping) []syscall.SysProcIDMap {
	out := make([]syscall.SysProcIDMap, len(m))
	for i, e := range m {
		out[i] = syscall.SysProcIDMap{ContainerID: int(e.Inside), HostID: int(e.Outside), Size: int(e.Count)}
	}
	return out
}

// record writes the init that uses the slot (its pid and start time), for the next taker to check:
// without it, a slot could be taken again while the processes of a killed shed's sandbox are dying.
func (r *idRange) record(pid int) error {
	if r.lock == nil {
		return nil // without root: no pool
	}
	start, err := startTime(pid)
	if err == nil {
		if err = r.lock.Truncate(0); err == nil {
			_, err = r.lock.WriteAt([]byte(fmt.Sprintf("%d %d\n", pid, start)), 0)
		}
	}
	if err != nil {
		return fmt.Errorf("sandbox ids: record the init of slot %d: %w", r.slot, err)
	}
	return nil
}

// release gives the slot back: call it once every process of the sandbox is dead.
func (r *idRange) release() {
	if r == nil || r.lock == nil {
		return
	}
	_ = r.lock.Truncate(0)
	r.lock.Close()
	r.lock = nil
}

// initAlive reports whether the init recorded in a slot's lock file still exists.
func initAlive(f *os.File) bool {
	var b [64]byte
	n, _ := f.ReadAt(b[:], 0)
	var pid int
	var start uint64
	if _, err := fmt.Sscanf(string(b[:n]), "%d %d", &pid, &start); err != nil {
		return false
	}
	now, err := startTime(pid)
	return err == nil && now == start
}

// startTime is field 22 of /proc/PID/stat: with the pid, it names one process for good.
func startTime(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name (field 2) is in parentheses and may hold spaces: count from the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, errors.New("malformed stat")
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return 0, errors.New("malformed stat")
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// checkPool refuses a pool that overlaps ids this host gives to users or their subordinate ranges.
func checkPool() error {
	lo, hi := uint64(idBase), uint64(idBase)+idSlots*IDsPerSandbox
	for _, f := range []string{"/etc/subuid", "/etc/subgid"} {
		if err := eachLine(f, func(line string) error {
			parts := strings.Split(line, ":")
			if len(parts) != 3 {
				return nil
			}
			start, err1 := strconv.ParseUint(parts[1], 10, 32)
			count, err2 := strconv.ParseUint(parts[2], 10, 32)
			if err1 != nil || err2 != nil || start+count <= lo || start >= hi {
				return nil
			}
			return fmt.Errorf("sandbox ids %d-%d overlap %s line %q: move that range below %d", lo, hi-1, f, line, lo)
		}); err != nil {
			return err
		}
	}
	for _, f := range []string{"/etc/passwd", "/etc/group"} {
		if err := eachLine(f, func(line string) error {
			parts := strings.Split(line, ":")
			if len(parts) < 3 {
				return nil
			}
			if id, err := strconv.ParseUint(parts[2], 10, 32); err == nil && id >= lo && id < hi {
				return fmt.Errorf("sandbox ids %d-%d include id %d of %s (%s): give it an id below %d", lo, hi-1, id, f, parts[0], lo)
			}
			return nil
		}); err != nil {
			return err
		}
	}
	return nil
}

func eachLine(file string, fn func(string) error) error {
	f, err := os.Open(file)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	defer f.Close()
	// A line over 64 KiB (a big group's members) is cut, not the end: the ids come first on a line.
	return lines.Each(f, 64<<10, func(b []byte, _ bool) error {
		if line := strings.TrimSpace(string(b)); line != "" && !strings.HasPrefix(line, "#") {
			return fn(line)
		}
		return nil
	})
}

// idMapping is one line of a user namespace's uid_map or gid_map: inside id, outside id, count.
type idMapping struct{ Inside, Outside, Count uint32 }

func (m idMapping) String() string { return fmt.Sprintf("%d-%d-%d", m.Inside, m.Outside, m.Count) }

// keptUserns returns a descriptor of a user namespace with these maps, for idmapped mounts (the kernel
// copies the maps into the mount: the namespace is not needed after). Making one needs a process that
// enters it; that costs about a millisecond, so each one is made once and kept, as a bind mount of its
// nsfs file under idDir (as ip-netns keeps network namespaces), until the host reboots: one per slot
// ever used (slots are taken lowest first, so as many as sandboxes ever ran at once), and one per
// slot and owner of a grant mapped to its owner (IDsOwner).
func keptUserns(uid, gid idMapping) (*os.File, error) {
	file := filepath.Join(idDir, "userns-u"+uid.String()+"-g"+gid.String())
	if f, err := openUserns(file); err == nil {
		return f, nil
	}
	// Made under a lock, so that two processes do not mount two namespaces on one file.
	lk, err := lockDir(idDir, unix.LOCK_EX)
	if err != nil {
		return nil, fmt.Errorf("sandbox ids: %w", err)
	}
	defer lk.Close()
	if f, err := openUserns(file); err == nil {
		return f, nil
	}
	if err := keepUserns(file, uid, gid); err != nil {
		return nil, fmt.Errorf("make user namespace %s: %w", filepath.Base(file), err)
	}
	return openUserns(file)
}

// openUserns opens a kept user namespace, refusing anything that is not one (a plain file left by a
// crash between creating the mount point and mounting on it).
func openUserns(file string) (*os.File, error) {
	f, err := os.OpenFile(file, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &sfs); err != nil || sfs.Type != unix.NSFS_MAGIC {
		f.Close()
		return nil, fmt.Errorf("%s is not a namespace (%v)", file, err)
	}
	if t, err := unix.IoctlRetInt(int(f.Fd()), unix.NS_GET_NSTYPE); err != nil || t != unix.CLONE_NEWUSER {
		f.Close()
		return nil, fmt.Errorf("%s is not a user namespace (%v)", file, err)
	}
	return f, nil
}

// keepUserns makes a user namespace with the given maps and bind-mounts it on file. The process that
// makes it is started stopped (ptrace, at its execve) and never runs: it only carries the namespace
// until the mount holds it.
func keepUserns(file string, uid, gid idMapping) error {
	runtime.LockOSThread() // the tracer is this thread
	defer runtime.UnlockOSThread()
	sys := &syscall.SysProcAttr{
		Cloneflags:  unix.CLONE_NEWUSER,
		Ptrace:      true,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: int(uid.Inside), HostID: int(uid.Outside), Size: int(uid.Count)}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: int(gid.Inside), HostID: int(gid.Outside), Size: int(gid.Count)}},
		// The namespace is only for idmapped mounts; nothing ever runs in it.
		GidMappingsEnableSetgroups: false,
		Pdeathsig:                  unix.SIGKILL,
	}
	pid, err := syscall.ForkExec("/proc/self/exe", []string{"shed-userns-holder"}, &syscall.ProcAttr{Sys: sys})
	if err != nil {
		return err
	}
	ws, err := waitPid(pid)
	if err != nil {
		return err
	}
	if !ws.Stopped() { // it exited, and is reaped: its pid may be another process's already
		return fmt.Errorf("holder did not stop (status %#x)", ws)
	}
	defer func() {
		_ = unix.Kill(pid, unix.SIGKILL)
		_, _ = waitPid(pid)
	}()
	tree, err := unix.OpenTree(unix.AT_FDCWD, fmt.Sprintf("/proc/%d/ns/user", pid), unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return fmt.Errorf("open_tree: %w", err)
	}
	defer unix.Close(tree)
	_ = os.Remove(file)
	mp, err := os.OpenFile(file, os.O_CREATE|os.O_EXCL|os.O_WRONLY|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	mp.Close()
	if err := unix.MoveMount(tree, "", unix.AT_FDCWD, file, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		os.Remove(file)
		return fmt.Errorf("move_mount: %w", err)
	}
	return nil
}

// IsSandboxID reports whether a host id is one of the sandboxes' (a process in some sandbox, as the
// host sees it): the supervisor takes a caller with such an id for an agent.
func IsSandboxID(id uint32) bool { return id >= idBase && id < idBase+idSlots*IDsPerSandbox }
