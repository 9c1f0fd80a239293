package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"toolshed.dev/shed/app"
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
			&cli.StringFlag{Name: "file", Aliases: []string{"f"}, Value: app.DefaultRecipe, Usage: "the recipe `FILE` (with --update)"},
		},
		Action: func(c *cli.Context) error {
			req := &app.LockRequest{File: c.String("file"), Update: c.Bool("update")}
			if c.Bool("update") {
				req.Packages = c.Args().Slice()
			} else if c.NArg() == 1 {
				req.File = c.Args().First()
			} else if c.NArg() > 1 {
				return usageError("lock takes one FILE (or --update PKG...)")
			}
			res, err := call[app.LockResult](c, "lock", req)
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(c, res)
			}
			if !res.Changed {
				fmt.Fprintf(c.App.Writer, "%s is up to date (%s)\n", res.Lock, app.Counts(res.Packages, res.PipPackages))
				return nil
			}
			for _, ch := range res.Changes {
				fmt.Fprintln(c.App.Writer, ch)
			}
			fmt.Fprintf(c.App.Writer, "wrote %s: %s, seed dated %s\n", res.Lock, app.Counts(res.Packages, res.PipPackages), res.ReleaseDate)
			return nil
		},
	}
}
