package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"toolshed.dev/shed/builder"
	"toolshed.dev/shed/recipe"
)

func cmdLock() *cli.Command {
	return &cli.Command{
		Name:      "lock",
		Usage:     "resolve a recipe's packages to exact versions and hashes (workshop.lock)",
		ArgsUsage: "[FILE] | --update [PKG...]",
		Description: "Resolves the apt packages of FILE (default ./workshop.toml) against its seed: the seed is\n" +
			"built (or found in the store), then apt-get update and apt's own resolver run in a sandbox\n" +
			"over it whose network reaches only the recipe's mirror and sources. The whole closure is\n" +
			"written to workshop.lock beside the recipe (versions, URLs, SHA-256 from the signed\n" +
			"Packages index, sizes). A lock that still matches the recipe is kept as it is.\n" +
			"--update re-resolves: every package, or only the named ones (the others keep their\n" +
			"locked versions). Commit the lock beside the recipe.",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "update", Usage: "re-resolve (all packages, or the PKGs named)"},
			&cli.StringFlag{Name: "file", Aliases: []string{"f"}, Value: defaultRecipe, Usage: "the recipe `FILE` (with --update)"},
		},
		Action: func(c *cli.Context) error {
			file := c.String("file")
			var update []string
			if c.Bool("update") {
				update = c.Args().Slice()
			} else if c.NArg() == 1 {
				file = c.Args().First()
			} else if c.NArg() > 1 {
				return usageError("lock takes one FILE (or --update PKG...)")
			}
			r, err := loadRecipeFile(c, file)
			if err != nil {
				return err
			}
			for _, u := range update {
				found := false
				for _, p := range r.Apt.Packages {
					found = found || p.Name == u
				}
				if !found {
					return withHint(exitUsage, fmt.Errorf("--update %s: %s does not declare it", u, file), "name packages from the recipe's [apt] packages")
				}
			}
			s, err := openStore(c)
			if err != nil {
				return err
			}
			defer s.Close()
			lockFile := recipe.LockFile(file)
			old, err := recipe.LoadLock(lockFile)
			if err == nil && !c.Bool("update") {
				if ok, err := old.Matches(r); err == nil && ok {
					if c.Bool("json") {
						return printJSON(c, map[string]any{"lock": lockFile, "changed": false, "packages": len(old.Apt), "pip_packages": len(old.Pip)})
					}
					fmt.Fprintf(c.App.Writer, "%s is up to date (%s)\n", lockFile, lockCounts(old))
					return nil
				}
			}
			opts := builder.LockOptions{Update: update}
			if err == nil {
				opts.Old = old
			}
			lock, err := newBuilder(c, s, false).Lock(c.Context, r, opts)
			if err != nil {
				return err
			}
			if err := writeLock(lockFile, lock); err != nil {
				return err
			}
			var changes []string
			if opts.Old != nil {
				changes = recipe.DiffLocks(opts.Old, lock)
			}
			if c.Bool("json") {
				return printJSON(c, map[string]any{"lock": lockFile, "changed": true, "packages": len(lock.Apt), "pip_packages": len(lock.Pip), "changes": changes})
			}
			for _, ch := range changes {
				fmt.Fprintln(c.App.Writer, ch)
			}
			fmt.Fprintf(c.App.Writer, "wrote %s: %s, seed dated %s\n", lockFile, lockCounts(lock), lock.Seed.ReleaseDate)
			return nil
		},
	}
}

// lockCounts says what a lock holds: "30 packages" or "30 packages, 3 pip packages".
func lockCounts(l *recipe.Lock) string {
	s := plural(len(l.Apt), "package")
	if len(l.Pip) > 0 {
		s += ", " + plural(len(l.Pip), "pip package")
	}
	return s
}
