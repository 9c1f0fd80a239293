package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/urfave/cli/v2"

	"toolshed.dev/shed/builder"
	"toolshed.dev/shed/recipe"
	"toolshed.dev/shed/store"
)

// newBuilder makes a builder for the store, with progress on stderr and, with
// --verbose, build output too.
func newBuilder(c *cli.Context, s *store.Store, offline bool) *builder.Builder {
	b := &builder.Builder{Store: s, Log: logger(c), Offline: offline}
	if !c.Bool("json") || c.Bool("verbose") {
		b.Progress = builder.NewTerminalProgress(c.App.ErrWriter)
	}
	if c.Bool("verbose") {
		b.BuildOutput = c.App.ErrWriter
	}
	return b
}

// lockedPlan loads the recipe's lock, re-resolving it when it is missing or no
// longer matches the recipe (and saying so), and compiles the recipe with it.
func lockedPlan(c *cli.Context, s *store.Store, r *recipe.Recipe, offline bool) (*recipe.Plan, *recipe.Lock, error) {
	lockFile := recipe.LockFile(r.File)
	lock, err := recipe.LoadLock(lockFile)
	reason := ""
	switch {
	case errors.Is(err, recipe.ErrNoLock):
		reason = lockFile + " does not exist"
	case err != nil:
		return nil, nil, err
	default:
		ok, err := lock.Matches(r)
		if err != nil {
			return nil, nil, err
		}
		if !ok {
			reason = lockFile + " no longer matches " + r.File
		}
	}
	if reason != "" {
		if offline {
			return nil, nil, withHint(exitFailure, fmt.Errorf("cannot lock offline: %s", reason),
				"run `shed lock` once with network, and commit the lock beside the recipe")
		}
		fmt.Fprintf(c.App.ErrWriter, "shed: locking: %s; resolving %s\n", reason, r.File)
		lock, err = newBuilder(c, s, false).Lock(c.Context, r, builder.LockOptions{})
		if err != nil {
			return nil, nil, err
		}
		if err := writeLock(lockFile, lock); err != nil {
			return nil, nil, err
		}
		fmt.Fprintf(c.App.ErrWriter, "shed: wrote %s (%d packages)\n", lockFile, len(lock.Apt))
	}
	plan, err := recipe.Compile(r, lock, s.StoreDir())
	if err != nil {
		return nil, nil, err
	}
	return plan, lock, nil
}

func writeLock(file string, lock *recipe.Lock) error {
	b, err := lock.Encode()
	if err != nil {
		return err
	}
	tmp := file + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return fmt.Errorf("write lock: %w", err)
	}
	if err := os.Rename(tmp, file); err != nil {
		return fmt.Errorf("write lock: %w", err)
	}
	return nil
}
