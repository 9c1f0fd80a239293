package main

import (
	"fmt"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"toolshed.dev/shed/derivation"
	"toolshed.dev/shed/recipe"
)

func cmdInstantiate() *cli.Command {
	return &cli.Command{
		Name:      "instantiate",
		Usage:     "compile a recipe to derivations and write them to the store",
		ArgsUsage: "[FILE]",
		Description: "Compiles FILE (default ./workshop.toml) to derivations (a seed, then an apt layer,\n" +
			"then a pip layer, each over the one below), writes their .drv files to the store and\n" +
			"prints each derivation with the output path it will build. Nothing is built.\n" +
			"Versions are taken as written; `shed lock` will resolve them.",
		Action: func(c *cli.Context) error {
			r, err := loadRecipe(c)
			if err != nil {
				return err
			}
			s, err := openStore(c)
			if err != nil {
				return err
			}
			defer s.Close()
			plan, err := recipe.Compile(r, nil, s.StoreDir())
			if err != nil {
				return err
			}
			type drvJSON struct {
				Name   string `json:"name"`
				Kind   string `json:"kind"`
				Drv    string `json:"drv"`
				Output string `json:"output"`
			}
			out := []drvJSON{}
			for _, d := range plan.Derivations {
				p, err := derivation.Write(c.Context, s, d)
				if err != nil {
					return err
				}
				out = append(out, drvJSON{d.Name, string(d.Kind), s.Location(p), s.Location(d.Output)})
			}
			if c.Bool("json") {
				return printJSON(c, out)
			}
			tw := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
			for _, d := range out {
				fmt.Fprintf(tw, "%s\t%s\t-> %s\n", d.Kind, d.Drv, d.Output)
			}
			return tw.Flush()
		},
	}
}
