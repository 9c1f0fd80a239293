package store

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrRepairDiffers marks a repair whose new bytes are not the registered ones: the path is left as
// it was, since what depends on it was built over, and signed with, the registered bytes.
var ErrRepairDiffers = errors.New("the rebuilt bytes differ from the registered ones")

// Repair puts back the registered bytes of the valid path p: build writes them at out (a rebuild,
// or a download from a cache), they are clamped to epoch as at registration, re-hashed, and swapped
// in atomically only if they hash to p's recorded content hash. The record, manifest and provenance
// stay as they are, so every path that refers to p stays valid. A Bench or build running over the
// damaged bytes keeps them: its mount holds the old directory, whose files must not vanish under
// it, so they are kept in tmp/ (a retired tree) until no process that held p before the exchange
// is alive, and gc removes them then. The next Bench gets the repaired bytes.
// It returns ErrRepairDiffers, naming the files that differ, when the bytes are not the same.
func (s *Store) Repair(ctx context.Context, p Path, epoch int64, build BuildFunc) error {
	if err := s.AddTempRoot(ctx, p); err != nil {
		return err
	}
	pl, err := lock(ctx, s.pathLockFile(p), unix.LOCK_EX)
	if err != nil {
		return err
	}
	defer pl.unlock()
	info, err := s.readInfo(ctx, p)
	if err != nil {
		return err
	}
	st, err := s.newStage(ctx)
	if err != nil {
		return err
	}
	defer st.remove()
	out := filepath.Join(st.dir, "out")
	if err := build(ctx, out); err != nil {
		return err
	}
	if epoch == 0 {
		epoch = DefaultEpoch
	}
	if err := ClampTimes(out, epoch); err != nil {
		return err
	}
	got, err := ScanTree(ctx, out)
	if err != nil {
		return err
	}
	if got.Hash() != info.ContentHash {
		err := fmt.Errorf("%w: %s", ErrRepairDiffers, p)
		if want, merr := s.Manifest(p); merr == nil {
			if diffs := DiffManifests(want, got); len(diffs) > 0 {
				err = fmt.Errorf("%w: %s: %d differences from the record, first %s", ErrRepairDiffers, p, len(diffs), diffs[0])
			}
		}
		return err
	}
	if s.LinkFilesOnce() {
		// A damaged file that was stored once is damaged in links/ too: linkTree finds its entry
		// does not hash and puts the repaired file in its place.
		if _, err := s.linkTree(ctx, out, got, true); err != nil {
			return err
		}
	}
	if err := SyncTree(out); err != nil {
		return err
	}
	failpointFor("repair-synced", p.Name())
	loc := s.Location(p)
	// Exchanged, not removed then renamed: at every instant the path has bytes on disk, so a crash
	// leaves either the damaged ones (a rerun repairs them) or the good ones, never none.
	err = unix.Renameat2(unix.AT_FDCWD, out, unix.AT_FDCWD, loc, unix.RENAME_EXCHANGE)
	if errors.Is(err, unix.ENOENT) {
		if _, lerr := os.Lstat(loc); errors.Is(lerr, fs.ErrNotExist) {
			err = os.Rename(out, loc) // missing on disk: nothing to exchange with
		}
	}
	if errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("put the repaired %s in place: the store's filesystem cannot exchange two directories atomically (renameat2 RENAME_EXCHANGE): %w", p, err)
	}
	if err != nil {
		return fmt.Errorf("put the repaired %s in place: %w", p, err)
	}
	if err := syncDir(filepath.Join(s.root, dirStore)); err != nil {
		return err
	}
	failpointFor("repair-exchanged", p.Name())
	// out now holds the damaged bytes. Whoever held p before the exchange may have them mounted.
	held, err := s.heldByOthers(p)
	if err != nil || held {
		retired := filepath.Join(s.root, dirTmp, retiredPrefix+randomSuffix()+"-"+p.String())
		if rerr := os.Rename(out, retired); rerr != nil {
			return fmt.Errorf("keep the damaged bytes of %s for the processes using them: %w", p, rerr)
		}
		return nil
	}
	return s.trash(out)
}

// retiredPrefix names a tree in tmp/ that a repair replaced while processes held it:
// retired-<random>-<path>. gc removes it once no live process holds the path.
const retiredPrefix = "retired-"

// retiredPath parses the path a retired tree's name was retired from.
func retiredPath(name string) (Path, bool) {
	rest, ok := strings.CutPrefix(name, retiredPrefix)
	if !ok || len(rest) < 17 || rest[16] != '-' {
		return Path{}, false
	}
	p, err := ParsePath(rest[17:])
	return p, err == nil
}
