package records

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"toolshed.dev/shed/internal/atomicfile"
)

// Tags name versions of a record, as E2B's template tags name builds: "name:tag" is the version the
// tag names. They are kept beside the versions (tags.json), each change one atomic write under the
// record's lock; a version's own files never change for them.

// DefaultTag names a record's current version whatever tags.json says (E2B's "default").
const DefaultTag = "default"

var tagRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`) })

// IsTag reports whether s could be a tag.
func IsTag(s string) bool { return tagRE().MatchString(s) }

// Tag is one tag: the version it names, and since when.
type Tag struct {
	Version int       `json:"version"`
	Time    time.Time `json:"time"`
}

func (rs *Workshops) tagsFile(name string) string {
	return filepath.Join(rs.nameDir(name), "tags.json")
}

// Tags returns name's tags, DefaultTag among them (the current version).
func (rs *Workshops) Tags(name string) (map[string]Tag, error) {
	cur, err := rs.Current(name)
	if err != nil {
		return nil, err
	}
	tags := map[string]Tag{}
	b, err := os.ReadFile(rs.tagsFile(name))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	if len(b) > 0 {
		if err := json.Unmarshal(b, &tags); err != nil {
			return nil, fmt.Errorf("record %s: tags.json: %v", name, err)
		}
	}
	tags[DefaultTag] = Tag{Version: cur.N, Time: cur.Time}
	return tags, nil
}

// Resolve returns the version that name's tag names.
func (rs *Workshops) Resolve(name, tag string) (*Version, error) {
	tags, err := rs.Tags(name)
	if err != nil {
		return nil, err
	}
	t, ok := tags[tag]
	if !ok {
		return nil, fmt.Errorf("%w: %s has no tag %q", ErrNoRecord, name, tag)
	}
	return rs.Get(name, t.Version)
}

// SetTags makes each of tags name version n of name (0: the current one), and removes the tags of
// remove. DefaultTag is always the current version's and cannot be set or removed.
func (rs *Workshops) SetTags(name string, n int, tags, remove []string) (int, error) {
	for _, t := range append(slices.Clone(tags), remove...) {
		if !IsTag(t) {
			return 0, fmt.Errorf("tag %q: lowercase letters, digits, '.', '_' and '-'", t)
		}
		if t == DefaultTag {
			return 0, fmt.Errorf("tag %q names the current version always", t)
		}
	}
	unlock, err := rs.lock(name)
	if err != nil {
		return 0, err
	}
	defer unlock()
	if n == 0 {
		cur, err := rs.Current(name)
		if err != nil {
			return 0, err
		}
		n = cur.N
	}
	v, err := rs.Get(name, n)
	if err != nil {
		return 0, err
	}
	all, err := rs.Tags(name)
	if err != nil {
		return 0, err
	}
	delete(all, DefaultTag)
	for _, t := range remove {
		delete(all, t)
	}
	now := time.Now().UTC().Truncate(time.Second)
	for _, t := range tags {
		all[t] = Tag{Version: v.N, Time: now}
	}
	b, err := json.MarshalIndent(all, "", "  ")
	if err != nil {
		return 0, err
	}
	return v.N, atomicfile.WriteFile(rs.tagsFile(name), append(b, '\n'), 0o644)
}

// Remove retires a record: it no longer launches nor lists, and its versions move to
// workshops/.removed/NAME-TIME, kept (what Benches and the audit log named stays readable).
func (rs *Workshops) Remove(name string) error {
	unlock, err := rs.lock(name)
	if err != nil {
		return err
	}
	defer unlock()
	if _, err := rs.Current(name); err != nil {
		return err
	}
	gone := filepath.Join(rs.dir, ".removed")
	if err := atomicfile.MkdirAll(gone, 0o700); err != nil {
		return err
	}
	if err := os.Rename(rs.nameDir(name), filepath.Join(gone, name+"-"+strconv.FormatInt(time.Now().UnixNano(), 10))); err != nil {
		return fmt.Errorf("remove record %s: %w", name, err)
	}
	return atomicfile.SyncDir(rs.dir)
}

// lock takes name's record lock (the one Add and Allow take).
func (rs *Workshops) lock(name string) (func(), error) {
	if !IsName(name) {
		return nil, fmt.Errorf("%w: %q", ErrNoRecord, name)
	}
	if err := atomicfile.MkdirAll(rs.dir, 0o700); err != nil {
		return nil, err
	}
	lk, err := os.OpenFile(rs.nameDir(name)+".lock", os.O_CREATE|os.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(lk.Fd()), unix.LOCK_EX); err != nil {
		lk.Close()
		return nil, err
	}
	return func() { lk.Close() }, nil
}
