package bench

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"toolshed.dev/shed/internal/hint"
	"toolshed.dev/shed/proxy"
	"toolshed.dev/shed/sandbox"
	"toolshed.dev/shed/store"
	"toolshed.dev/shed/upper"
)

// Branching: a Bench whose upper is on the store's uppers filesystem (package upper, Options.Disk)
// can be paused, snapshotted, forked and reset, each in milliseconds: a snapshot or a fork is a
// copy-on-write copy of its upper made at one instant (its processes frozen meanwhile), never a
// layer stacked on its lowers, so its lowers stay its Workshop's store paths however often it is
// branched. All of it is task state: the user's, on this machine, expiring, never a store path.

// RootName is the gc root that holds a paused Bench's layers (its runner's temporary roots may be
// gone: a restart), until the Bench is removed.
func RootName(id string) string { return "bench-" + id }

// UpperName is the name of Bench id's upper on the uppers filesystem.
func UpperName(id string) string { return "benches/" + id }

// Errors of branching.
var (
	// ErrNotBranchable is a Bench whose upper is in memory (`bench run`): only a created Bench's
	// upper is on the uppers filesystem.
	ErrNotBranchable = errors.New("the Bench's upper is in memory, not on the uppers filesystem")
	// ErrPaused is an operation that needs the Bench's processes running.
	ErrPaused = errors.New("the Bench is paused")
	// ErrNotPaused is a resume of a Bench that runs.
	ErrNotPaused = errors.New("the Bench is not paused")
)

func notBranchable(rec *Record) error {
	return hint.Wrap(fmt.Errorf("%w: bench %s (a `bench run` Bench's writes live and die in memory)", ErrNotBranchable, rec.Name),
		"create the Bench with `shed bench create` (bench.create, an E2B sandbox, MCP's bench_create): its upper is on disk and branches")
}

// paused is the error for an operation on paused Bench rec.
func paused(rec *Record) error {
	return hint.Wrap(fmt.Errorf("%w: bench %s (since %s)", ErrPaused, rec.Name, rec.Paused.Format(time.RFC3339)),
		"resume it first: `shed bench resume "+rec.Name+"` (E2B: connect)")
}

// Uppers opens the store's uppers filesystem (mounting it again after a reboot; making it the first time).
func Uppers(s *store.Store) (*upper.FS, error) {
	return upper.Open(s.Root(), upper.Options{Size: s.Config().UppersSize})
}

// HaveUppers says whether the store has an uppers filesystem at all, without making one.
func HaveUppers(s *store.Store) bool {
	for _, p := range []string{"uppers.img", "uppers"} {
		if _, err := os.Lstat(filepath.Join(s.Root(), p)); err == nil {
			return true
		}
	}
	return false
}

// updateRecord changes the stored record of the Bench in dir under its record lock: a Bench's
// record is written by its runner (start and end) and by whoever pauses or resumes it.
func updateRecord(dir string, change func(*Record) error) (*Record, error) {
	var out *Record
	err := withRecord(dir, func() error {
		var err error
		out, err = updateLocked(dir, change)
		return err
	})
	return out, err
}

// withRecord runs fn under the record lock of the Bench in dir: what freezes or thaws a Bench does
// it under this lock together with the record's change, so that a pause and a snapshot's freeze
// and thaw never interleave (a snapshot would thaw a Bench paused meanwhile).
func withRecord(dir string, fn func() error) error {
	lk, err := lockRecord(dir)
	if err != nil {
		return err
	}
	defer lk.Close()
	return fn()
}

// updateLocked is updateRecord for a caller that holds the record lock.
func updateLocked(dir string, change func(*Record) error) (*Record, error) {
	b, err := os.ReadFile(filepath.Join(dir, "bench.json"))
	if err != nil {
		return nil, err
	}
	var rec Record
	if err := json.Unmarshal(b, &rec); err != nil {
		return nil, fmt.Errorf("bench record %s: %w", dir, err)
	}
	if err := change(&rec); err != nil {
		return nil, err
	}
	return &rec, writeRecord(dir, &rec)
}

// lockRecord takes the record lock of the Bench in dir (apart from its runner's lock, held for its life).
func lockRecord(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, "record.lock"), os.O_CREATE|os.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, err
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
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

// Pause freezes every process of the running Bench nameOrID (the cgroup freezer: they stay in
// memory) and records it paused: should its runner end while it is paused (the supervisor stops, the
// host restarts), its processes are gone but its record and upper stay, and Resume launches it again
// over the same upper. The record is written without waiting for the disk (an fsync would be most of
// a pause): Durable, after the answer, makes it and the upper durable. Pausing a paused Bench is a
// no-op.
func Pause(s *store.Store, nameOrID string) (*Record, error) {
	rec, err := find(s, nameOrID)
	if err != nil {
		return nil, err
	}
	if !rec.Disk {
		return nil, notBranchable(rec)
	}
	if rec.Paused != nil {
		return rec, nil
	}
	if !rec.Running || rec.Pid <= 0 {
		return nil, fmt.Errorf("bench %s is not running", rec.Name)
	}
	var out *Record
	dir := filepath.Join(Dir(s), rec.ID)
	err = withRecord(dir, func() error {
		now := time.Now().UTC()
		var err error
		out, err = updateLocked(dir, func(r *Record) error {
			if r.Paused != nil {
				return errNothingToDo // paused meanwhile
			}
			if err := sandbox.Freeze(r.Pid); err != nil {
				return err
			}
			r.Paused = &now
			return nil
		})
		if err != nil && !errors.Is(err, errNothingToDo) {
			// Not recorded paused: it must not stay frozen.
			_ = sandbox.Thaw(rec.Pid)
		}
		return err
	})
	if errors.Is(err, errNothingToDo) {
		return find(s, rec.ID)
	}
	if err != nil {
		return nil, fmt.Errorf("pause bench %s: %w", rec.Name, err)
	}
	out.Running = true
	return out, nil
}

// errNothingToDo ends a change that finds it made already.
var errNothingToDo = errors.New("nothing to do")

// Thaw resumes a paused Bench whose processes are frozen in memory (its runner lives): they go on
// where they stopped. A paused Bench whose runner ended has none: it is launched again over its
// upper (Options.Resume), which Thaw reports as ErrNoRunner.
func Thaw(s *store.Store, nameOrID string) (*Record, error) {
	rec, err := find(s, nameOrID)
	if err != nil {
		return nil, err
	}
	if rec.Paused == nil {
		return rec, fmt.Errorf("%w: bench %s", ErrNotPaused, rec.Name)
	}
	if !rec.Running {
		return rec, fmt.Errorf("%w: bench %s", ErrNoRunner, rec.Name)
	}
	out, err := updateRecord(filepath.Join(Dir(s), rec.ID), func(r *Record) error {
		if err := sandbox.Thaw(r.Pid); err != nil {
			return err
		}
		r.Paused = nil
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("resume bench %s: %w", rec.Name, err)
	}
	out.Running = true
	return out, nil
}

// RecipeOf is the recipe a Bench on the uppers filesystem was launched from, as it was: the copy
// beside its state (with its lock).
func RecipeOf(s *store.Store, rec *Record) string {
	return filepath.Join(Dir(s), rec.ID, "workshop.toml")
}

// WaitEnded waits (at most limit) until the runner of Bench id has ended (a cold pause's, after Park).
func WaitEnded(s *store.Store, id string, limit time.Duration) {
	waitStopped(filepath.Join(Dir(s), id), limit)
}

// RecordOnTimeout writes what the end of Bench id's lifetime does into its record.
func RecordOnTimeout(s *store.Store, id, v string) error {
	_, err := updateRecord(filepath.Join(Dir(s), id), func(r *Record) error {
		r.OnTimeout = v
		return nil
	})
	return err
}

// RecordNetwork writes the network rules f (nil: none) of Bench id into its record, for its
// launches again (SetNetwork changes the live ones).
func RecordNetwork(s *store.Store, id string, f *proxy.Filter) error {
	_, err := updateRecord(filepath.Join(Dir(s), id), func(r *Record) error {
		r.NetAllow, r.NetDeny = nil, nil
		if f != nil {
			r.NetAllow, r.NetDeny = f.Allow, f.Deny
		}
		return nil
	})
	return err
}

// Park stops the running Bench rec's processes but keeps it, paused, with its record and upper: its
// runner, seeing it end paused, keeps its state (a reset, which then launches it again over another
// upper). It does not wait for the runner.
func Park(s *store.Store, rec *Record) error {
	if !rec.Disk {
		return notBranchable(rec)
	}
	now := time.Now().UTC()
	if _, err := updateRecord(filepath.Join(Dir(s), rec.ID), func(r *Record) error {
		if r.Paused == nil {
			r.Paused = &now
		}
		return nil
	}); err != nil {
		return err
	}
	if rec.Running && rec.Pid > 0 {
		kill(rec.Pid)
	}
	return nil
}

// Durable writes to disk what a pause left in memory: the store's filesystem (the record) and the
// uppers' (the upper's files).
func Durable(storeRoot string, f *upper.FS) error {
	d, err := os.Open(storeRoot)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := unix.Syncfs(int(d.Fd())); err != nil {
		return err
	}
	return f.Flush()
}

// ErrBusy is a launch again of a Bench whose runner is still there (it runs, or is being resumed).
var ErrBusy = errors.New("the Bench runs, or is being resumed")

// ErrNoRunner is a paused Bench whose processes are gone (its runner ended while it was paused).
var ErrNoRunner = errors.New("the paused Bench's processes are gone; it is launched again over its upper")

// Branch makes a copy-on-write copy of the Bench rec's upper, as of now, under each of dsts on f
// (names: UpperName of new Benches, or SnapshotUpper), read-only if readonly: its processes are
// frozen for the moment it takes (a paused Bench's already are), so what a process wrote before the
// call is in every copy, and nothing is half written.
func Branch(s *store.Store, f *upper.FS, rec *Record, dsts []string, readonly bool) error {
	if !rec.Disk {
		return notBranchable(rec)
	}
	// What it wrote so far is committed while it runs: the snapshot then commits only what it
	// writes meanwhile, and the freeze lasts milliseconds, not the writing of its files.
	if err := f.Flush(); err != nil {
		return err
	}
	dir := filepath.Join(Dir(s), rec.ID)
	return withRecord(dir, func() error {
		// As it is now, under the lock a pause takes: one paused is frozen already and stays so.
		cur := readEntry(Dir(s), rec.ID)
		if cur != nil && cur.Running && cur.Paused == nil && cur.Pid > 0 {
			if err := sandbox.Freeze(cur.Pid); err != nil {
				return fmt.Errorf("bench %s: freeze: %w", rec.Name, err)
			}
			defer sandbox.Thaw(cur.Pid)
		}
		return f.Branch(UpperName(rec.ID), dsts, readonly)
	})
}

// kill stops the running Bench whose init is pid: thawed first, since a frozen process does not
// die of SIGKILL (cgroup v1) and the pid namespace would never end.
func kill(pid int) { _ = sandbox.Kill(pid) }
