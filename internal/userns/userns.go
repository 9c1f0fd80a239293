// Package userns runs shed without root. An ordinary user's shed re-executes itself as root of a user
// namespace of its own (U), with a mount namespace of its own, whose id 0 is the user and whose ids 1 to
// 65535 are the user's subordinate ids (/etc/subuid, /etc/subgid), mapped by Debian's setuid helpers
// newuidmap and newgidmap: podman's rootless mode, and the namespace the kernel lets an unprivileged
// user own. Inside U, shed has every capability over what U owns (the user's files, the store's files
// owned by the subordinate ids, new mount, pid, network namespaces) and none over the host. Everything
// that works on a store directly runs there, so the store's files keep Debian's owners as ids of U, and
// the sandbox package applies the same specs with what U allows (see docs/rootless.md).
//
// U is made once per shed process: the two helpers cost about 7 ms, so never once per sandbox.
package userns

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"os/user"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// IDs is how many uids (and gids) U maps: 0, the user, and 65535 subordinate ids, as many as a
// sandbox has (sandbox.IDsPerSandbox).
const IDs = 65536

// envWait is set in the environment of the re-executed shed, which then waits for its maps (Init).
const envWait = "_SHED_USERNS_WAIT"

// ErrNoSubIDs is returned when the user has fewer than IDs-1 subordinate uids or gids.
var ErrNoSubIDs = errors.New("not enough subordinate ids")

// ErrNoHelper is returned when newuidmap or newgidmap is not installed.
var ErrNoHelper = errors.New("newuidmap/newgidmap not found")

// Extent is one line of a uid_map or gid_map: ids Inside..Inside+Count-1 of the namespace are
// Outside.. of its parent.
type Extent struct{ Inside, Outside, Count uint32 }

// Active reports whether this process runs in a user namespace other than the host's initial one:
// shed re-executed by Enter, or run in a rootless container. Its uid 0 is then an ordinary user of the
// host: no trusted.* xattrs, no idmapped mounts of the host's file systems, no device nodes, no
// cgroups of the host's.
func Active() bool { return active() }

var active = sync.OnceValue(func() bool {
	m, err := ReadMap("/proc/self/uid_map")
	// The initial namespace maps every id to itself: one extent 0 0 4294967295.
	return err == nil && !(len(m) == 1 && m[0] == Extent{0, 0, 4294967295})
})

// ReadMap parses a uid_map or gid_map file.
func ReadMap(file string) ([]Extent, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var m []Extent
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var e Extent
		if _, err := fmt.Sscanf(line, "%d %d %d", &e.Inside, &e.Outside, &e.Count); err != nil {
			return nil, fmt.Errorf("%s: %q: %w", file, line, err)
		}
		m = append(m, e)
	}
	return m, nil
}

// Owner returns the host user whose shed this is: outside a user namespace, the process's own uid and
// gid; inside, the host ids that the namespace's 0 is.
func Owner() (uid, gid uint32) {
	return HostID("/proc/self/uid_map", uint32(os.Getuid())), HostID("/proc/self/gid_map", uint32(os.Getgid()))
}

// HostID is the id of the host (of the parent namespace) that id of this process's user namespace is,
// by the map in file (/proc/self/uid_map or gid_map); id itself outside a user namespace, or if the
// map does not say.
func HostID(file string, id uint32) uint32 {
	if !Active() {
		return id
	}
	m, err := ReadMap(file)
	if err != nil {
		return id
	}
	for _, e := range m {
		if id >= e.Inside && id-e.Inside < e.Count {
			return e.Outside + id - e.Inside
		}
	}
	return id
}

// OwnerName is the login name of Owner's uid, or the uid as a number.
func OwnerName() string {
	uid, _ := Owner()
	if u, err := user.LookupId(strconv.FormatUint(uint64(uid), 10)); err == nil {
		return u.Username
	}
	return strconv.FormatUint(uint64(uid), 10)
}

// Needed says whether this process must Enter before it works on a store: it is not root, and not
// in a user namespace already.
func Needed() bool { return os.Geteuid() != 0 && !Active() }

// Init must be called first thing in main (after sandbox.Init): in the shed that Enter re-executed, it
// waits until the parent has written the maps, so that the process is root of U before anything runs.
// Elsewhere it returns at once.
func Init() {
	if os.Getenv(envWait) != "1" {
		return
	}
	os.Unsetenv(envWait)
	var st unix.Stat_t
	if unix.Fstat(3, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return // not Enter's child: an inherited variable means nothing
	}
	unix.CloseOnExec(3)
	conn := os.NewFile(3, "userns-sync")
	var b [1]byte
	if n, _ := conn.Read(b[:]); n != 1 || b[0] != 'g' {
		// The parent failed (it says why) or died: nothing ran yet.
		os.Exit(1)
	}
	// Only now are the maps written (Active reads them once).
	if !Active() {
		return
	}
	// The capabilities came through the exec as ambient ones (the maps did not exist yet); as root
	// of U the process has them anyway, and its children must not inherit them as ambient. Ambient
	// sets are per thread: every thread's (AllThreadsSyscall needs a binary without cgo).
	if _, _, e := syscall.AllThreadsSyscall(unix.SYS_PRCTL, unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0); e != 0 {
		_ = unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
	}
	// Mounts made later on the host (autofs, NFS) still show here; nothing made here reaches the
	// host (U's copy of its mounts cannot propagate back).
	_ = unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, "")
	// Watched from now on, before main catches them, so that a terminal's ^C is counted once.
	var watched []os.Signal
	for _, s := range forwardedSignals {
		if !signal.Ignored(s) {
			watched = append(watched, s)
		}
	}
	if len(watched) > 0 {
		direct := make(chan os.Signal, 8)
		signal.Notify(direct, watched...)
		r := &relay{unmatched: map[syscall.Signal][]time.Time{}, raised: map[syscall.Signal]int{}}
		go r.countDirect(direct)
		go r.forward(conn)
	}
}

// forwardedSignals are what the parent passes on: those shed stops on (SIGQUIT is left to each
// process: it ends both at once).
var forwardedSignals = []os.Signal{unix.SIGINT, unix.SIGTERM, unix.SIGHUP}

// relay raises in this process the signals the parent was sent, except the copy of one that came
// here directly too: a terminal's ^C reaches both processes of its process group, and shed takes a
// second ^C to mean "stop at once", so one press must stay one. Each signal that came directly
// absorbs one forwarded copy; a signal raised here is not counted as direct.
type relay struct {
	mu        sync.Mutex
	unmatched map[syscall.Signal][]time.Time // direct arrivals no forwarded copy has matched
	raised    map[syscall.Signal]int         // raised here, not yet seen on the direct channel
}

func (r *relay) countDirect(direct <-chan os.Signal) {
	for s := range direct {
		sig := s.(syscall.Signal)
		r.mu.Lock()
		if r.raised[sig] > 0 {
			r.raised[sig]--
		} else {
			r.unmatched[sig] = append(r.unmatched[sig], time.Now())
		}
		r.mu.Unlock()
	}
}

// matchWindow is how far apart the direct and the forwarded copy of one signal may arrive.
const matchWindow = 2 * time.Second

func (r *relay) forward(conn io.Reader) {
	var b [1]byte
	for {
		if n, err := conn.Read(b[:]); n != 1 || err != nil {
			return
		}
		sig := syscall.Signal(b[0])
		// The direct copy of a group's signal was sent at the same moment as the parent's: let it
		// be counted first.
		time.Sleep(200 * time.Millisecond)
		r.mu.Lock()
		var recent []time.Time
		for _, t := range r.unmatched[sig] {
			if time.Since(t) < matchWindow {
				recent = append(recent, t)
			}
		}
		matched := len(recent) > 0
		if matched {
			recent = recent[1:]
		} else {
			r.raised[sig]++
		}
		r.unmatched[sig] = recent
		r.mu.Unlock()
		if !matched {
			_ = unix.Kill(os.Getpid(), sig)
		}
	}
}

// Enter re-executes this binary, with the same arguments, environment and stdio, as root of a new
// user namespace and mount namespace, waits for it, and exits as it did. It returns only with an
// error, before anything ran: a user without subordinate ids, or newuidmap missing.
func Enter() error {
	uid, gid := os.Getuid(), os.Getgid()
	name := strconv.Itoa(uid)
	if u, err := user.LookupId(name); err == nil {
		name = u.Username
	}
	uids, err := subIDs("/etc/subuid", name, uid)
	if err != nil {
		return err
	}
	gids, err := subIDs("/etc/subgid", name, uid)
	if err != nil {
		return err
	}
	newuidmap, err1 := helper("newuidmap")
	newgidmap, err2 := helper("newgidmap")
	if err := errors.Join(err1, err2); err != nil {
		return err
	}
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("user namespace: socketpair: %w", err)
	}
	parentEnd, childEnd := os.NewFile(uintptr(pair[0]), "userns-sync"), os.NewFile(uintptr(pair[1]), "userns-sync")
	cmd := exec.Command("/proc/self/exe", os.Args[1:]...)
	cmd.Args[0] = os.Args[0]
	cmd.Env = append(os.Environ(), envWait+"=1")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.ExtraFiles = []*os.File{childEnd}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: unix.CLONE_NEWUSER | unix.CLONE_NEWNS,
		// The exec happens before the maps exist, as an unmapped uid, which would drop every
		// capability: ambient ones survive it.
		AmbientCaps: allCaps(),
		// shed dies with this process (kill -9 of the shed the user started).
		Pdeathsig: unix.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("user namespace: start shed in it: %w", err)
	}
	childEnd.Close()
	pid := strconv.Itoa(cmd.Process.Pid)
	for _, m := range []struct {
		helper string
		self   int
		sub    []Extent
	}{{newuidmap, uid, uids}, {newgidmap, gid, gids}} {
		args := []string{pid, "0", strconv.Itoa(m.self), "1"}
		for _, e := range m.sub {
			args = append(args, strconv.FormatUint(uint64(e.Inside), 10), strconv.FormatUint(uint64(e.Outside), 10), strconv.FormatUint(uint64(e.Count), 10))
		}
		if out, err := exec.Command(m.helper, args...).CombinedOutput(); err != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			return fmt.Errorf("user namespace: %s %s: %v: %s", m.helper, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
	}
	// Signals sent to this process alone (kill PID, timeout(1)) are forwarded; the child gets a
	// terminal's ^C itself, as a member of this process group.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, forwardedSignals...)
	if _, err := parentEnd.Write([]byte{'g'}); err != nil {
		_ = cmd.Process.Kill()
	}
	go func() {
		for s := range sigs {
			_, _ = parentEnd.Write([]byte{byte(s.(syscall.Signal))})
		}
	}()
	_ = cmd.Wait()
	ws := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if ws.Signaled() {
		// Die of the same signal, as the shell expects of shed.
		signal.Reset(ws.Signal())
		_ = unix.Kill(os.Getpid(), ws.Signal())
		time.Sleep(100 * time.Millisecond)
		os.Exit(128 + int(ws.Signal()))
	}
	os.Exit(ws.ExitStatus())
	return nil
}

// allCaps is every capability the running kernel has.
func allCaps() []uintptr {
	last := 40 // CAP_CHECKPOINT_RESTORE, if the kernel does not say
	if b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap"); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			last = n
		}
	}
	caps := make([]uintptr, 0, last+1)
	for c := 0; c <= last; c++ {
		caps = append(caps, uintptr(c))
	}
	return caps
}

// helper finds newuidmap or newgidmap, which are setuid root, on PATH or in /usr/bin.
func helper(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	if p := "/usr/bin/" + name; unix.Access(p, unix.X_OK) == nil {
		return p, nil
	}
	return "", fmt.Errorf("%w: %s is not installed (Debian's package uidmap)", ErrNoHelper, name)
}

// SubIDError is a user without enough subordinate ids in file.
type SubIDError struct {
	File, User string
	Have       uint64
}

func (e *SubIDError) Error() string {
	return fmt.Sprintf("%s has %d subordinate ids in %s, and shed without root needs %d: its sandboxes have ids 0 to %d, and each is an id of the host",
		e.User, e.Have, e.File, IDs-1, IDs-1)
}

func (e *SubIDError) Unwrap() error { return ErrNoSubIDs }

// subIDs returns IDs-1 subordinate ids of the user from file (lines "name:start:count" or
// "uid:start:count"), as extents of U from id 1 on, taken from the user's ranges in file order.
func subIDs(file, name string, uid int) ([]Extent, error) {
	ranges, err := readRanges(file)
	if err != nil {
		return nil, err
	}
	var out []Extent
	next, have := uint32(1), uint64(0)
	for _, r := range ranges {
		if next >= IDs || r.owner != name && r.owner != strconv.Itoa(uid) || r.count == 0 {
			continue
		}
		have += r.count
		n := uint32(min(r.count, uint64(IDs-next)))
		out = append(out, Extent{Inside: next, Outside: uint32(r.start), Count: n})
		next += n
	}
	if next < IDs {
		return nil, &SubIDError{File: file, User: name, Have: have}
	}
	return out, nil
}

// subRange is a line of /etc/subuid or /etc/subgid: owner (a name or a uid), start, count.
type subRange struct {
	owner        string
	start, count uint64
}

// readRanges parses a subordinate id file, skipping lines that are not owner:start:count; a missing
// file has no ranges.
func readRanges(file string) ([]subRange, error) {
	b, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, fmt.Errorf("read %s: %w", file, err)
	}
	var out []subRange
	for _, line := range strings.Split(string(b), "\n") {
		parts := strings.Split(strings.TrimSpace(line), ":")
		if len(parts) != 3 {
			continue
		}
		start, err1 := strconv.ParseUint(parts[1], 10, 32)
		count, err2 := strconv.ParseUint(parts[2], 10, 32)
		if err1 == nil && err2 == nil {
			out = append(out, subRange{parts[0], start, count})
		}
	}
	return out, nil
}

// FreeRange is the first id of a range of IDs ids that no line of /etc/subuid or /etc/subgid
// overlaps, from 100000 on (useradd's SUB_UID_MIN on Debian): for the hint to a user who has none.
func FreeRange() uint64 { return freeRange("/etc/subuid", "/etc/subgid") }

func freeRange(files ...string) uint64 {
	lo := uint64(100000)
	for _, file := range files {
		ranges, _ := readRanges(file)
		for _, r := range ranges {
			lo = max(lo, r.start+r.count)
		}
	}
	return lo
}
