package bench

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"toolshed.dev/shed/internal/atomicfile"
	"toolshed.dev/shed/internal/hint"
	"toolshed.dev/shed/recipe"
	"toolshed.dev/shed/store"
	"toolshed.dev/shed/upper"
)

// Snapshot is a Bench's files sealed at one instant: a read-only copy-on-write copy of its upper on
// the uppers filesystem (SnapshotUpper), and what a Bench of it needs beside (its Workshop's recipe
// and lock as they were, copied beside the record, and the layers they gave). A Bench launched
// from it has the same lowers and a writable branch of it as its upper. Task state: its owner's,
// on this machine, until it is removed or expires; never a store path, never shared or promoted.
type Snapshot struct {
	ID       string       `json:"id"`
	Name     string       `json:"name,omitempty"` // its owner's name for it: the newest snapshot of that name has it
	Owner    string       `json:"owner,omitempty"`
	Bench    string       `json:"bench"`    // the name of the Bench it was taken of
	BenchID  string       `json:"bench_id"` // and its id
	Workshop string       `json:"workshop"` // the Bench's Workshop (its recipe file when taken; the copy is Recipe)
	Layers   []store.Path `json:"layers"`
	Created  time.Time    `json:"created"`
	Expires  time.Time    `json:"expires"`
	// Recipe is the recipe file copied beside the record (with its lock): what a Bench of the
	// snapshot is launched from (computed, never stored).
	Recipe string `json:"-"`
}

// SnapshotUpper is the name of snapshot id's upper on the uppers filesystem.
func SnapshotUpper(id string) string { return "snapshots/" + id }

// SnapshotsDir is where a store's snapshot records are.
func SnapshotsDir(s *store.Store) string { return filepath.Join(s.Root(), "snapshots") }

// ErrNoSnapshot is an id or name that names no snapshot (of the caller's).
var ErrNoSnapshot = errors.New("no such snapshot")

// ErrPromoteSnapshot is the refusal of every attempt to make task state more than that.
var ErrPromoteSnapshot = errors.New("a snapshot is task state: it is never promoted, exported or shared")

// snapshotNameRE is a snapshot's name: as a Bench's.
var snapshotNameRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`) })

// CheckSnapshotName refuses a name a snapshot cannot have.
func CheckSnapshotName(name string) error {
	if !snapshotNameRE().MatchString(name) {
		return hint.Wrap(fmt.Errorf("snapshot name %.80q: use 1 to 63 lowercase letters, digits, '.', '_' and '-', starting with a letter or digit", name), "")
	}
	return nil
}

// NewSnapshotID is a fresh snapshot id, for TakeSnapshot: made first, so that whoever counts a user's
// snapshots (the supervisor's --user-snapshots) can tell this one's record once it is written.
func NewSnapshotID() string { return randomID() }

// TakeSnapshot seals the files of the Bench rec as they are now (its processes frozen for the
// moment it takes) as the snapshot id (NewSnapshotID's) named name (may be "") of owner's, which
// expires after ttl. The recipe the Bench was launched from is copied beside it, with its lock.
func TakeSnapshot(s *store.Store, f *upper.FS, rec *Record, id, name, owner string, ttl time.Duration) (*Snapshot, error) {
	if name != "" {
		if err := CheckSnapshotName(name); err != nil {
			return nil, err
		}
	}
	dir := filepath.Join(SnapshotsDir(s), id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			_ = f.Remove(SnapshotUpper(id))
			os.RemoveAll(dir)
		}
	}()
	if err := copyRecipe(RecipeOf(s, rec), dir, true); err != nil {
		return nil, err
	}
	if err := Branch(s, f, rec, []string{SnapshotUpper(id)}, true); err != nil {
		return nil, err
	}
	now := time.Now().UTC()
	snap := &Snapshot{ID: id, Name: name, Owner: owner, Bench: rec.Name, BenchID: rec.ID, Workshop: rec.Workshop,
		Layers: rec.Layers, Created: now, Expires: now.Add(ttl)}
	if err := writeSnapshot(dir, snap); err != nil {
		return nil, err
	}
	ok = true
	snap.Recipe = filepath.Join(dir, "workshop.toml")
	return snap, nil
}

// copyRecipe copies a recipe file and its lock (if any) into dir as workshop.toml and workshop.lock,
// durably or not.
func copyRecipe(file, dir string, durable bool) error {
	for _, c := range [][2]string{{file, "workshop.toml"}, {recipe.LockFile(file), "workshop.lock"}} {
		b, err := os.ReadFile(c[0])
		if errors.Is(err, os.ErrNotExist) && c[1] == "workshop.lock" {
			continue
		}
		if err != nil {
			return fmt.Errorf("copy the recipe beside the Bench's state: %w", err)
		}
		write := os.WriteFile
		if durable {
			write = atomicfile.WriteFile
		}
		if err := write(filepath.Join(dir, c[1]), b, 0o600); err != nil {
			return err
		}
	}
	return nil
}

func writeSnapshot(dir string, snap *Snapshot) error {
	b, err := json.MarshalIndent(snap, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(filepath.Join(dir, "snapshot.json"), b, 0o600)
}

// Snapshots lists a store's snapshots, oldest first (every owner's: the caller filters).
func Snapshots(s *store.Store) ([]*Snapshot, error) {
	ents, err := os.ReadDir(SnapshotsDir(s))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	var out []*Snapshot
	for _, e := range ents {
		if snap := readSnapshot(s, e.Name()); snap != nil {
			out = append(out, snap)
		}
	}
	slices.SortFunc(out, func(a, b *Snapshot) int {
		if c := a.Created.Compare(b.Created); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	// A name is the newest snapshot's of its owner's that has it.
	newest := map[[2]string]*Snapshot{}
	for _, snap := range out {
		if snap.Name != "" {
			if old := newest[[2]string{snap.Owner, snap.Name}]; old != nil {
				old.Name = ""
			}
			newest[[2]string{snap.Owner, snap.Name}] = snap
		}
	}
	return out, nil
}

func readSnapshot(s *store.Store, id string) *Snapshot {
	if !idRE().MatchString(id) {
		return nil
	}
	dir := filepath.Join(SnapshotsDir(s), id)
	b, err := os.ReadFile(filepath.Join(dir, "snapshot.json"))
	if err != nil {
		return nil // being made, or debris of one that failed
	}
	var snap Snapshot
	if json.Unmarshal(b, &snap) != nil || snap.ID != id {
		return nil
	}
	snap.Recipe = filepath.Join(dir, "workshop.toml")
	return &snap
}

// FindSnapshot is owner's snapshot of id or name (owner "": anyone's, for an operator).
func FindSnapshot(s *store.Store, owner, idOrName string) (*Snapshot, error) {
	all, err := Snapshots(s)
	if err != nil {
		return nil, err
	}
	for _, snap := range all {
		if (snap.ID == idOrName || (snap.Name != "" && snap.Name == idOrName)) && (owner == "" || snap.Owner == owner) {
			return snap, nil
		}
	}
	return nil, hint.Wrap(fmt.Errorf("%w: %.80q", ErrNoSnapshot, idOrName), "`shed snapshot ls` lists yours")
}

// RemoveSnapshot deletes snapshot snap (its record, recipe copy and upper). Benches launched from it
// are unaffected: each has its own branch of it.
func RemoveSnapshot(s *store.Store, f *upper.FS, snap *Snapshot) error {
	dir := filepath.Join(SnapshotsDir(s), snap.ID)
	// The record goes first: a crash after it leaves an upper no record names, which the next
	// SweepSnapshots removes, never a record whose upper is gone.
	if err := os.Remove(filepath.Join(dir, "snapshot.json")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := f.Remove(SnapshotUpper(snap.ID)); err != nil {
		return err
	}
	return os.RemoveAll(dir)
}

// SweepSnapshots removes the snapshots expired at now, and the debris of snapshots whose making
// was cut short (no record: after a minute, so as not to race one being made). It returns how many.
func SweepSnapshots(s *store.Store, f *upper.FS, now time.Time) (int, error) {
	n := 0
	all, err := Snapshots(s)
	if err != nil {
		return 0, err
	}
	var errs []error
	named := map[string]bool{}
	for _, snap := range all {
		named[snap.ID] = true
		if now.After(snap.Expires) {
			if err := RemoveSnapshot(s, f, snap); err != nil {
				errs = append(errs, err)
			} else {
				n++
			}
		}
	}
	ents, _ := os.ReadDir(SnapshotsDir(s))
	for _, e := range ents {
		if named[e.Name()] {
			continue
		}
		var st unix.Stat_t
		if unix.Lstat(filepath.Join(SnapshotsDir(s), e.Name()), &st) == nil && now.Sub(time.Unix(st.Mtim.Unix())) < time.Minute {
			continue
		}
		if err := f.Remove(SnapshotUpper(e.Name())); err != nil {
			errs = append(errs, err)
			continue
		}
		os.RemoveAll(filepath.Join(SnapshotsDir(s), e.Name()))
		n++
	}
	if m, err := f.SweepParts("snapshots", time.Minute); err != nil {
		errs = append(errs, err)
	} else {
		n += m
	}
	ups, err := f.List("snapshots")
	if err != nil {
		return n, errors.Join(append(errs, err)...)
	}
	for _, id := range ups {
		if _, err := os.Lstat(filepath.Join(SnapshotsDir(s), id)); errors.Is(err, os.ErrNotExist) {
			if f.Remove(SnapshotUpper(id)) == nil {
				n++
			}
		}
	}
	return n, errors.Join(errs...)
}
