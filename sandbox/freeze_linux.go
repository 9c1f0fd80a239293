package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Pausing a sandbox (Spec.Pausable) is the cgroup freezer's: the command and all it starts are in a
// freezer cgroup of their own (init is not: it keeps serving), which Freeze sets FROZEN. A frozen
// task ignores every signal, SIGKILL too on cgroup v1 (the unified hierarchy's freezer lets a fatal
// signal through), so a sandbox must never stay frozen once nobody can thaw it:
//   - its creator dies (a supervisor's kill -9): init gets the parent-death signal sigParentGone
//     instead of SIGKILL, kills the sandbox's processes and thaws their freezer through a descriptor
//     of it that it was given, then exits (armThaw);
//   - init is killed while the creator lives (a Bench's kill, ctx): the pid namespace's teardown
//     waits for the frozen tasks for ever, and the creator's Wait with it; Freeze's watcher thaws the
//     freezer as soon as init is exiting (watchFrozen), and Kill thaws it after its SIGKILL;
//   - both die: Sweep thaws a freezer whose creator is gone before it removes it.

// pausableSuffix ends the name of a Pausable sandbox's cgroup in the unified hierarchy, where every
// cgroup has cgroup.freeze: only those are Freeze's (their init holds the file, to thaw them).
const pausableSuffix = "p"

// freezeTimeout bounds Freeze's wait for every task to stop (v1 goes through FREEZING: a task in an
// uninterruptible sleep, say on a stuck NFS server, is frozen only once it wakes).
const freezeTimeout = 5 * time.Second

// Freeze stops every process of the running sandbox whose init's host pid is initPid (the command
// and all it started; init itself keeps running) and returns once all are frozen. Idempotent.
// ErrNoFreezer for a sandbox started without Pausable (or rootless), ErrNotRunning once its init is
// gone. If they are not all frozen within freezeTimeout it thaws them again and says which state it
// saw. Call it from the process that started the sandbox (the supervisor): its watcher, which thaws
// the sandbox should its init be killed while frozen, lives in the caller.
func Freeze(initPid int) error {
	dir, v2, err := freezerOf(initPid)
	if err != nil {
		return err
	}
	if err := freeze(dir, v2, freezeTimeout); err != nil {
		return fmt.Errorf("freeze sandbox %d: %w", initPid, err)
	}
	watchFrozen(initPid, dir, v2)
	return nil
}

// freeze freezes the freezer cgroup dir and waits, at most timeout, until all its tasks are frozen;
// after that it thaws it again.
func freeze(dir string, v2 bool, timeout time.Duration) error {
	file, value := freezerFile(v2, true)
	if err := os.WriteFile(filepath.Join(dir, file), []byte(value), 0); err != nil {
		return err
	}
	deadline := time.Now().Add(timeout)
	for wait := 20 * time.Microsecond; ; wait = min(2*wait, 5*time.Millisecond) {
		frozen, state, err := readFrozen(dir, v2)
		if err != nil {
			_ = thaw(dir, v2)
			return err
		}
		if frozen {
			return nil
		}
		if time.Now().After(deadline) {
			_ = thaw(dir, v2)
			return fmt.Errorf("%s still says %q after %v; thawed it again: a process of it may be in an uninterruptible sleep (ps -o pid,stat,wchan)",
				filepath.Join(dir, file), state, timeout)
		}
		time.Sleep(wait)
	}
}

// Thaw lets every process of the sandbox of init's host pid initPid run again. Idempotent.
func Thaw(initPid int) error {
	dir, v2, err := freezerOf(initPid)
	if err != nil {
		return err
	}
	if err := thaw(dir, v2); err != nil {
		return fmt.Errorf("thaw sandbox %d: %w", initPid, err)
	}
	return nil
}

// Frozen reports whether the sandbox of init's host pid initPid is frozen (all of it: v1's
// FREEZING, on the way, is not).
func Frozen(initPid int) (bool, error) {
	dir, v2, err := freezerOf(initPid)
	if err != nil {
		return false, err
	}
	frozen, _, err := readFrozen(dir, v2)
	return frozen, err
}

// Kill SIGKILLs the sandbox of init's host pid initPid: its init, which takes every process of the pid
// namespace with it, and, for a Pausable sandbox, thaws its freezer, so that a frozen one dies too
// whoever froze it (Freeze's watcher does it only in the process that called Freeze). Use it, not a
// bare kill of init, where a sandbox may be frozen.
func Kill(initPid int) error {
	dir, v2, ferr := freezerOf(initPid) // found from init's children: before they die
	if err := unix.Kill(initPid, unix.SIGKILL); err != nil {
		return fmt.Errorf("kill sandbox %d: %w", initPid, err)
	}
	if ferr == nil {
		// After the kill: the tasks, thawed, meet the SIGKILL of the pid namespace's end, and none
		// runs on in between.
		_ = thaw(dir, v2)
	}
	return nil
}

// freezerOf finds the freezer cgroup of the sandbox of init's host pid initPid from a command init
// runs (as commandCgroup does): the v1 freezer hierarchy's, or a Pausable one of the unified.
func freezerOf(initPid int) (dir string, v2 bool, err error) {
	if rootless() {
		return "", false, ErrNoFreezer
	}
	cg := commandCgroup(initPid)
	if cg == "" {
		if _, err := os.Stat("/proc/" + strconv.Itoa(initPid)); errors.Is(err, os.ErrNotExist) {
			return "", false, fmt.Errorf("sandbox of init %d: %w", initPid, ErrNotRunning)
		}
	}
	for _, line := range strings.Split(cg, "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 || !strings.HasPrefix(parts[2], "/"+cgroupParent+"/") || strings.Contains(parts[2], "..") {
			continue
		}
		switch {
		case slices.Contains(strings.Split(parts[1], ","), "freezer"):
			return filepath.Join(cgroupRoot, "freezer", parts[2]), false, nil
		case parts[0] == "0" && parts[1] == "" && strings.HasSuffix(parts[2], pausableSuffix):
			return filepath.Join(cgroupRoot, parts[2]), true, nil
		}
	}
	return "", false, ErrNoFreezer
}

// freezerFile is the file that freezes or thaws a freezer cgroup and what to write to it.
func freezerFile(v2, frozen bool) (file, value string) {
	switch {
	case v2 && frozen:
		return "cgroup.freeze", "1"
	case v2:
		return "cgroup.freeze", "0"
	case frozen:
		return "freezer.state", "FROZEN"
	default:
		return "freezer.state", "THAWED"
	}
}

func thaw(dir string, v2 bool) error {
	file, value := freezerFile(v2, false)
	return os.WriteFile(filepath.Join(dir, file), []byte(value), 0)
}

// readFrozen reads whether the freezer dir has frozen all its tasks, and the state it says.
func readFrozen(dir string, v2 bool) (bool, string, error) {
	if v2 {
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.events"))
		if err != nil {
			return false, "", err
		}
		n := parseFlat(string(b))["frozen"]
		return n == 1, "frozen " + strconv.FormatInt(n, 10), nil
	}
	b, err := os.ReadFile(filepath.Join(dir, "freezer.state"))
	if err != nil {
		return false, "", err
	}
	state := strings.TrimSpace(string(b))
	return state == "FROZEN", state, nil
}

// thawOrphan thaws dir if it is a freezer (Sweep: its creator is gone); it reports whether it was.
func thawOrphan(dir string) bool {
	for _, v2 := range []bool{false, true} {
		if v2 && !strings.HasSuffix(dir, pausableSuffix) {
			continue
		}
		if frozen, state, err := readFrozen(dir, v2); err == nil && (frozen || state != "THAWED" && state != "frozen 0") {
			_ = thaw(dir, v2)
			return true
		}
	}
	return false
}

// watching holds the freezer directories that a watchFrozen goroutine watches.
var watching sync.Map

// watchFrozen thaws the freezer dir as soon as the sandbox's init is exiting while it is frozen: init
// killed (SIGKILL by pid, as a Bench's kill does, or ctx) takes its pid namespace with it, and the
// kernel waits for every task of it to die, which a frozen one never does; the creator's Wait would
// wait for ever too. It polls init's flags while the freezer stays frozen (one small read each time).
func watchFrozen(initPid int, dir string, v2 bool) {
	if _, busy := watching.LoadOrStore(dir, true); busy {
		return
	}
	go func() {
		for {
			watchUntilThawed(initPid, dir, v2)
			watching.Delete(dir)
			// A Freeze between the last read and the Delete found this watcher busy and left the
			// watch to it: go on if the sandbox is frozen again.
			if frozen, _, err := readFrozen(dir, v2); err != nil || !frozen {
				return
			}
			if _, busy := watching.LoadOrStore(dir, true); busy {
				return
			}
		}
	}()
}

// watchUntilThawed returns once the freezer dir is thawed (or gone), thawing it itself if the
// sandbox's init is exiting first.
func watchUntilThawed(initPid int, dir string, v2 bool) {
	for {
		time.Sleep(20 * time.Millisecond)
		if frozen, state, err := readFrozen(dir, v2); err != nil || !frozen && state != "FREEZING" {
			return
		}
		if exiting(initPid) {
			_ = thaw(dir, v2)
			return
		}
	}
}

// pfExiting is the kernel's PF_EXITING task flag: the task is in exit.
const pfExiting = 0x4

// exiting reports whether the process pid is exiting or gone (its flags in /proc/PID/stat).
func exiting(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if errors.Is(err, os.ErrNotExist) {
		return true
	}
	if err != nil {
		return false
	}
	// "pid (comm) state ppid pgrp session tty_nr tpgid flags ...": comm may hold spaces and parens.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 7 {
		return false
	}
	if f[0] == "Z" || f[0] == "X" {
		return true
	}
	flags, err := strconv.ParseUint(f[6], 10, 64)
	return err == nil && flags&pfExiting != 0
}

// sigParentGone is init's parent-death signal in a Pausable sandbox: a catchable one, unlike the
// SIGKILL of the others, so that init can thaw the sandbox before it dies (armThaw).
const sigParentGone = unix.SIGUSR2
