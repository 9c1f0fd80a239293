package sandbox

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// cgroupRoot is where the cgroup hierarchies are mounted.
const cgroupRoot = "/sys/fs/cgroup"

// cgroupParent is the cgroup, in each hierarchy, under which every sandbox gets its own.
const cgroupParent = "toolshed"

// cgroup is one sandbox's cgroups. Only the command and what it starts are placed in them, not the
// sandbox's init (a Go program with several threads, which would eat into Pids, and could die if it
// could not start one): init starts the command stopped at its first instruction (ptrace), writes its
// pid into cgroup.procs, and lets it run. So the limits hold from the command's first instruction, and
// Pids is exactly the number of tasks the command may have.
//
// Each directory is held with flock(LOCK_EX) by the process that created it, for as long as the
// sandbox lives: Sweep removes only directories nobody holds. Creators take the parent directory with
// LOCK_SH while they create and lock theirs, and Sweep takes it with LOCK_EX, so Sweep never sees a
// directory between its mkdir and its lock.
type cgroup struct {
	dirs  []string   // created directories, removed last first
	locks []*os.File // each of dirs, flocked
	procs []*os.File // cgroup.procs of each, handed to init
	// freezer is the directory of the sandbox's freezer (Spec.Pausable; "" without), and freeze its
	// freezer.state (v1) or cgroup.freeze (v2), write-only, handed to init so that it can thaw the
	// sandbox should its parent die while it is frozen (see armThaw).
	freezer string
	freeze  *os.File
	v2      bool
}

// newCgroup creates the cgroups that enforce l and, with account, those that measure the command's
// use of cpu and memory (ReadUsage), and with pausable a freezer (Freeze); it returns nil when there
// is nothing to enforce, measure or freeze.
func newCgroup(l Limits, account, pausable bool) (*cgroup, error) {
	if l.MemoryBytes == 0 && l.Pids == 0 && !account && !pausable {
		return nil, nil
	}
	var id [8]byte
	if _, err := rand.Read(id[:]); err != nil {
		return nil, fmt.Errorf("name cgroup: %w", err)
	}
	name := hex.EncodeToString(id[:])
	c := &cgroup{}
	var err error
	if isCgroup2(l, account) {
		err = c.setup2(name, l, account, pausable)
	} else {
		err = c.setup1(name, l, account, pausable)
	}
	if err != nil {
		c.remove()
		return nil, err
	}
	return c, nil
}

// isCgroup2 reports whether the unified hierarchy is mounted at cgroupRoot with the controllers l needs.
// On hybrid hosts (this lab's) cgroup2 lives at /sys/fs/cgroup/unified without them, and v1 is used.
func isCgroup2(l Limits, account bool) bool {
	b, err := os.ReadFile(filepath.Join(cgroupRoot, "cgroup.controllers"))
	if err != nil {
		return false
	}
	have := strings.Fields(string(b))
	has := func(c string) bool {
		for _, h := range have {
			if h == c {
				return true
			}
		}
		return false
	}
	return (l.MemoryBytes == 0 && !account || has("memory")) && (l.Pids == 0 || has("pids"))
}

func (c *cgroup) setup1(name string, l Limits, account, pausable bool) error {
	type limit struct{ file, value string }
	type ctl struct {
		name   string
		limits []limit
	}
	var ctls []ctl
	if l.MemoryBytes > 0 {
		v := strconv.FormatInt(l.MemoryBytes, 10)
		// memsw (memory+swap) must not be below the memory limit, so it is written second; without it
		// the command could swap beyond its limit.
		ctls = append(ctls, ctl{"memory", []limit{{"memory.limit_in_bytes", v}, {"memory.memsw.limit_in_bytes", v}}})
	} else if account {
		ctls = append(ctls, ctl{"memory", nil})
	}
	if l.Pids > 0 {
		ctls = append(ctls, ctl{"pids", []limit{{"pids.max", strconv.FormatInt(l.Pids, 10)}}})
	}
	if account {
		// cpu time is counted by cpuacct in v1 (v2 counts it in every cgroup: cpu.stat).
		ctls = append(ctls, ctl{"cpuacct", nil})
	}
	if pausable {
		ctls = append(ctls, ctl{"freezer", nil})
	}
	for _, k := range ctls {
		parent := filepath.Join(cgroupRoot, k.name, cgroupParent)
		if err := os.Mkdir(parent, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return &SetupError{Op: "create cgroup", Path: parent, Err: unwrapErrno(err)}
		}
		dir, err := c.mkdir(parent, name)
		if err != nil {
			return err
		}
		for _, lim := range k.limits {
			p := filepath.Join(dir, lim.file)
			err := os.WriteFile(p, []byte(lim.value), 0)
			if errors.Is(err, os.ErrNotExist) && lim.file == "memory.memsw.limit_in_bytes" {
				continue // kernel without swap accounting
			}
			if err != nil {
				return &SetupError{Op: "set cgroup limit", Path: p, Err: unwrapErrno(err)}
			}
		}
		if err := c.openProcs(dir); err != nil {
			return err
		}
		if k.name == "freezer" {
			if err := c.openFreezer(dir, "freezer.state"); err != nil {
				return err
			}
		}
	}
	return nil
}

func (c *cgroup) setup2(name string, l Limits, account, pausable bool) error {
	c.v2 = true
	var ctls []string
	if l.MemoryBytes > 0 || account {
		ctls = append(ctls, "+memory")
	}
	if l.Pids > 0 {
		ctls = append(ctls, "+pids")
	}
	enable := []byte(strings.Join(ctls, " "))
	parent := filepath.Join(cgroupRoot, cgroupParent)
	if err := os.Mkdir(parent, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return &SetupError{Op: "create cgroup", Path: parent, Err: unwrapErrno(err)}
	}
	for _, d := range []string{cgroupRoot, parent} {
		if len(ctls) == 0 {
			break // a freezer only: cgroup.freeze is in every cgroup of the unified hierarchy
		}
		p := filepath.Join(d, "cgroup.subtree_control")
		if err := os.WriteFile(p, enable, 0); err != nil {
			return &SetupError{Op: "enable cgroup controllers", Path: p, Err: unwrapErrno(err)}
		}
	}
	if pausable {
		// Every cgroup of the unified hierarchy has cgroup.freeze: the name tells Freeze that this
		// one's creator made it a freezer, and that init holds it to thaw (see pausableSuffix).
		name += pausableSuffix
	}
	dir, err := c.mkdir(parent, name)
	if err != nil {
		return err
	}
	if pausable {
		if err := c.openFreezer(dir, "cgroup.freeze"); err != nil {
			return err
		}
	}
	var limits [][2]string
	if l.MemoryBytes > 0 {
		limits = append(limits, [2]string{"memory.max", strconv.FormatInt(l.MemoryBytes, 10)}, [2]string{"memory.swap.max", "0"})
	}
	if l.Pids > 0 {
		limits = append(limits, [2]string{"pids.max", strconv.FormatInt(l.Pids, 10)})
	}
	for _, lim := range limits {
		p := filepath.Join(dir, lim[0])
		err := os.WriteFile(p, []byte(lim[1]), 0)
		if errors.Is(err, os.ErrNotExist) && lim[0] == "memory.swap.max" {
			continue
		}
		if err != nil {
			return &SetupError{Op: "set cgroup limit", Path: p, Err: unwrapErrno(err)}
		}
	}
	return c.openProcs(dir)
}

// mkdir creates and locks the sandbox's directory under parent (see cgroup).
func (c *cgroup) mkdir(parent, name string) (string, error) {
	pl, err := lockDir(parent, unix.LOCK_SH)
	if err != nil {
		return "", &SetupError{Op: "create cgroup", Path: parent, Detail: "lock", Err: unwrapErrno(err)}
	}
	defer pl.Close()
	dir := filepath.Join(parent, name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", &SetupError{Op: "create cgroup", Path: dir, Err: unwrapErrno(err)}
	}
	c.dirs = append(c.dirs, dir)
	l, err := lockDir(dir, unix.LOCK_EX|unix.LOCK_NB)
	if err != nil {
		return "", &SetupError{Op: "create cgroup", Path: dir, Detail: "lock", Err: unwrapErrno(err)}
	}
	c.locks = append(c.locks, l)
	return dir, nil
}

// lockDir opens dir and flocks it with how.
func lockDir(dir string, how int) (*os.File, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	for {
		err = unix.Flock(int(f.Fd()), how)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

func (c *cgroup) openProcs(dir string) error {
	p := filepath.Join(dir, "cgroup.procs")
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		return &SetupError{Op: "open cgroup", Path: p, Err: unwrapErrno(err)}
	}
	c.procs = append(c.procs, f)
	return nil
}

func (c *cgroup) openFreezer(dir, file string) error {
	p := filepath.Join(dir, file)
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		return &SetupError{Op: "open cgroup", Path: p, Err: unwrapErrno(err)}
	}
	c.freezer, c.freeze = dir, f
	return nil
}

// closeFiles closes the parent's copies once init has its own.
func (c *cgroup) closeFiles() {
	for _, f := range c.procs {
		f.Close()
	}
	c.procs = nil
	if c.freeze != nil {
		c.freeze.Close()
		c.freeze = nil
	}
}

// oomKills is how many tasks the kernel's OOM killer killed in the memory cgroup for hitting its
// limit (v1 memory.oom_control, v2 memory.events: their "oom_kill" line, Linux 4.13 and later).
func (c *cgroup) oomKills() int {
	if c == nil {
		return 0
	}
	n := 0
	for _, d := range c.dirs {
		for _, f := range []string{"memory.oom_control", "memory.events"} {
			b, err := os.ReadFile(filepath.Join(d, f))
			if err != nil {
				continue
			}
			for _, line := range strings.Split(string(b), "\n") {
				if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
					k, _ := strconv.Atoi(strings.TrimSpace(v))
					n += k
				}
			}
		}
	}
	return n
}

// remove deletes the cgroups. Called after every process in them is dead; a cgroup can stay busy for a
// moment after its last task is reaped, so EBUSY is retried briefly.
func (c *cgroup) remove() error {
	if c == nil {
		return nil
	}
	c.closeFiles()
	if c.freezer != "" {
		// A task left frozen could neither die nor leave its cgroups.
		_ = thaw(c.freezer, c.v2)
	}
	var first error
	for i := len(c.dirs) - 1; i >= 0; i-- {
		var err error
		for try := 0; try < 100; try++ {
			if err = unix.Rmdir(c.dirs[i]); err != unix.EBUSY {
				break
			}
			time.Sleep(time.Millisecond)
		}
		if err != nil && err != unix.ENOENT && first == nil {
			first = fmt.Errorf("remove cgroup %s: %w", c.dirs[i], err)
		}
	}
	for _, l := range c.locks {
		l.Close()
	}
	c.dirs, c.locks = nil, nil
	return first
}

// Sweep removes what sandboxes of dead processes left behind: their cgroup directories (toolshed/<id> in
// the v1 memory, pids, cpuacct and freezer hierarchies and in the unified one). A process SIGKILLed
// before its Wait leaves them, empty: its sandbox died with it (Pdeathsig), but nothing removed them.
// Sweep keeps a directory whose creator is alive (it holds a lock on it, see cgroup) and one that
// still has tasks; it thaws a freezer whose creator is gone first, so that nothing stays frozen (on v1
// a frozen task ignores even SIGKILL), and its tasks, killed with their init, can die.
// Control sockets are the caller's: Sweep does not touch them. It returns how many directories it
// removed, and every error it met (it goes on past them).
func Sweep() (removed int, err error) {
	var errs []error
	for _, parent := range []string{
		filepath.Join(cgroupRoot, "freezer", cgroupParent), // first: its thaw lets the others empty
		filepath.Join(cgroupRoot, "memory", cgroupParent),
		filepath.Join(cgroupRoot, "pids", cgroupParent),
		filepath.Join(cgroupRoot, "cpuacct", cgroupParent),
		filepath.Join(cgroupRoot, cgroupParent),
	} {
		n, err := sweepParent(parent)
		removed += n
		if err != nil {
			errs = append(errs, err)
		}
	}
	return removed, errors.Join(errs...)
}

func sweepParent(parent string) (int, error) {
	// LOCK_EX waits for Starts that are creating their directory here, and holds off new ones.
	pl, err := lockDir(parent, unix.LOCK_EX)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("sweep cgroups: lock %s: %w", parent, err)
	}
	defer pl.Close()
	ents, err := os.ReadDir(parent)
	if err != nil {
		return 0, fmt.Errorf("sweep cgroups: %w", err)
	}
	n := 0
	var errs []error
	for _, e := range ents {
		if !e.IsDir() || !isCgroupName(e.Name()) {
			continue
		}
		ok, err := sweepDir(filepath.Join(parent, e.Name()))
		if ok {
			n++
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return n, errors.Join(errs...)
}

// sweepDir removes one sandbox's cgroup directory if nobody holds it and it has no tasks.
func sweepDir(dir string) (bool, error) {
	l, err := lockDir(dir, unix.LOCK_EX|unix.LOCK_NB)
	switch {
	case err == unix.EWOULDBLOCK || errors.Is(err, os.ErrNotExist):
		return false, nil // its creator is alive, or it is gone
	case err != nil:
		return false, fmt.Errorf("sweep cgroup %s: %w", dir, err)
	}
	defer l.Close()
	if thawOrphan(dir) {
		// Its tasks, SIGKILLed with their init but frozen, die now: give them a moment.
		for try := 0; try < 100 && hasTasks(dir); try++ {
			time.Sleep(time.Millisecond)
		}
	}
	procs, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	switch {
	case errors.Is(err, os.ErrNotExist):
		return false, nil // not a cgroup
	case err != nil:
		return false, fmt.Errorf("sweep cgroup %s: %w", dir, err)
	case len(strings.TrimSpace(string(procs))) > 0:
		return false, nil
	}
	switch err := unix.Rmdir(dir); err {
	case nil:
		return true, nil
	case unix.EBUSY, unix.ENOENT: // a task or a child cgroup appeared, or someone else removed it
		return false, nil
	default:
		return false, fmt.Errorf("sweep cgroup %s: %w", dir, err)
	}
}

// hasTasks reports whether the cgroup dir has a task (or cannot be read).
func hasTasks(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	return err != nil || len(strings.TrimSpace(string(b))) > 0
}

// isCgroupName reports whether name is one that newCgroup makes: 16 lowercase hex digits, and
// pausableSuffix for a Pausable sandbox's in the unified hierarchy.
func isCgroupName(name string) bool {
	name = strings.TrimSuffix(name, pausableSuffix)
	if len(name) != 16 {
		return false
	}
	for _, c := range []byte(name) {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// unwrapErrno returns the errno inside an *os.PathError, so that a SetupError carries the bare cause.
func unwrapErrno(err error) error {
	var errno unix.Errno
	if errors.As(err, &errno) {
		return errno
	}
	return err
}

// MemoryCgroup is the memory cgroup a sandbox put its commands in, found from its init's host pid:
// for a command Exec'd into a running sandbox, to tell whether the OOM killer killed part of it
// (OOMKills before and after) and at what limit. "" when the sandbox has no memory limit (or no
// command running to find it by).
func MemoryCgroup(initPid int) string {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", initPid))
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		for _, child := range strings.Fields(string(b)) {
			cg, err := os.ReadFile("/proc/" + child + "/cgroup")
			if err != nil {
				continue
			}
			// v1 "N:memory:/toolshed/NAME", v2 "0::/toolshed/NAME".
			for _, line := range strings.Split(string(cg), "\n") {
				parts := strings.SplitN(line, ":", 3)
				if len(parts) != 3 || !strings.HasPrefix(parts[2], "/"+cgroupParent+"/") {
					continue
				}
				switch {
				case slices.Contains(strings.Split(parts[1], ","), "memory"):
					return filepath.Join(cgroupRoot, "memory", parts[2])
				case parts[0] == "0" && parts[1] == "":
					if _, err := os.Stat(filepath.Join(cgroupRoot, parts[2], "memory.max")); err == nil {
						return filepath.Join(cgroupRoot, parts[2])
					}
				}
			}
		}
	}
	return ""
}

// OOMKills is how many tasks the OOM killer killed in the memory cgroup dir, and its limit in bytes.
func OOMKills(dir string) (kills int, limit int64) {
	if dir == "" {
		return 0, 0
	}
	c := &cgroup{dirs: []string{dir}}
	for _, f := range []string{"memory.limit_in_bytes", "memory.max"} {
		if b, err := os.ReadFile(filepath.Join(dir, f)); err == nil {
			limit, _ = strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
			break
		}
	}
	return c.oomKills(), limit
}
