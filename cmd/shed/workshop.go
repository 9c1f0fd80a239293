package main

import (
	"errors"
	"fmt"
	"os"
	"toolshed.dev/shed/records"

	"github.com/urfave/cli/v2"

	"toolshed.dev/shed/builder"
	"toolshed.dev/shed/cache"
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

// workshop is a realized Workshop: its recipe, the store it is in, its plan
// and what realizing it did.
type workshop struct {
	r    *recipe.Recipe
	s    *store.Store
	plan *recipe.Plan
	b    *builder.Builder
	res  *builder.Result
}

// realizeWorkshop loads the recipe in file, opens the store, locks if needed,
// realizes every path and roots the Workshop under its name: what `realize`
// and `bench run` both start with. The caller closes w.s.
func realizeWorkshop(c *cli.Context, file string, offline bool) (*workshop, error) {
	r, err := loadRecipeFile(c, file)
	if err != nil {
		return nil, err
	}
	s, err := openStore(c)
	if err != nil {
		return nil, err
	}
	w := &workshop{r: r, s: s}
	if err := w.realize(c, offline); err != nil {
		s.Close()
		return nil, err
	}
	return w, nil
}

func (w *workshop) realize(c *cli.Context, offline bool) error {
	plan, _, err := lockedPlan(c, w.s, w.r, offline)
	if err != nil {
		return err
	}
	w.plan, w.b = plan, newBuilder(c, w.s, offline)
	if w.b.Substituter, err = substituter(c, w.s); err != nil {
		return err
	}
	w.b.Warn = func(format string, args ...any) {
		fmt.Fprintf(c.App.ErrWriter, "shed: warning: "+format+"\n", args...)
	}
	if w.res, err = w.b.Realize(c.Context, plan); err != nil {
		return err
	}
	top := plan.Layers[len(plan.Layers)-1]
	// Each version of a record is a root of its own, so a promotion never makes the previous one
	// collectable while someone may still launch it.
	if name, n, ok := records.Open(w.s.Root()).VersionOf(w.r.File); ok {
		if err := ensureRoot(c, w.s, fmt.Sprintf("workshop-%s-v%d", name, n), top); err != nil {
			return err
		}
	}
	return ensureRoot(c, w.s, w.r.Name, top)
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
		fmt.Fprintf(c.App.ErrWriter, "shed: wrote %s (%s)\n", lockFile, lockCounts(lock))
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

// substituter returns the caches realize asks before building: --substituter
// flags, then the store's substituters setting. nil if there are none.
func substituter(c *cli.Context, s *store.Store) (builder.Substituter, error) {
	names := append(c.StringSlice("substituter"), s.Config().Substituters...)
	if len(names) == 0 {
		return nil, nil
	}
	t, err := openTrust(s)
	if err != nil {
		return nil, err
	}
	pl := &cache.Puller{Store: s, Trust: t, Log: func(format string, args ...any) {
		logger(c).Info(fmt.Sprintf(format, args...))
	}}
	for _, n := range names {
		cc, err := cache.Open(cacheName(c, n))
		if err != nil {
			return nil, withHint(exitUsage, err, "a substituter is oci://HOST[:PORT]/REPO or oci-layout:DIR")
		}
		pl.Caches = append(pl.Caches, cc)
	}
	return pl, nil
}
