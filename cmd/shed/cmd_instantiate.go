package main

import (
	"fmt"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"toolshed.dev/shed/app"
)

func cmdInstantiate() *cli.Command {
	return &cli.Command{
		Name:      "instantiate",
		Usage:     "compile a recipe to derivations and write them to the store",
		ArgsUsage: "[FILE]",
		Description: "Compiles FILE (default ./workshop.toml) to derivations (a seed, then an apt layer,\n" +
			"then a pip layer, each over the one below), writes their .drv files to the store and\n" +
			"prints each derivation with the output path it will build. Nothing is built or resolved:\n" +
			"with the lock beside FILE (workshop.lock), these are the paths `shed realize` builds, a\n" +
			"fetch for each locked package included; without one (or with a stale one) the versions are\n" +
			"taken as written, and a warning says that realize would lock first.",
		Action: func(c *cli.Context) error {
			if c.NArg() > 1 {
				return usageError("want at most one recipe FILE")
			}
			res, err := call[app.InstantiateResult](c, "instantiate", &app.InstantiateRequest{File: c.Args().First()})
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(c, res.Derivations)
			}
			tw := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
			for _, d := range res.Derivations {
				fmt.Fprintf(tw, "%s\t%s\t-> %s\n", d.Kind, d.Drv, d.Output)
			}
			return tw.Flush()
		},
	}
}
