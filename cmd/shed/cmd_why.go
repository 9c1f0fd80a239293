package main

import (
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"

	"toolshed.dev/shed/app"
)

func cmdWhy() *cli.Command {
	return &cli.Command{
		Name:      "why",
		Usage:     "say why a file exists in a Workshop: its layer, its package, the recipe line",
		ArgsUsage: "WORKSHOP FILE",
		Description: "WORKSHOP is a recipe file (realized); FILE is a path as a Bench sees it, e.g. /usr/bin/jq.\n" +
			"Prints the layer that provides FILE, the Debian package that owns it, and the recipe line\n" +
			"that declared that package, directly or as a dependency of which declared package.",
		Action: func(c *cli.Context) error {
			if c.NArg() != 2 {
				return usageError("why wants WORKSHOP and FILE")
			}
			ex, err := call[app.WhyResult](c, "why", &app.WhyRequest{Workshop: c.Args().Get(0), File: c.Args().Get(1)})
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(c, ex)
			}
			w := c.App.Writer
			fmt.Fprintln(w, ex.File)
			if ex.Resolved != ex.File {
				fmt.Fprintf(w, "  is:       %s (through a symlinked directory)\n", ex.Resolved)
			}
			kind := "apt layer"
			switch {
			case ex.LayerKind == "seed":
				kind = "seed " + ex.Seed
			case ex.Manager == "pip" || strings.HasPrefix(ex.Layer.Name(), "pip-"):
				kind = "pip layer"
			}
			fmt.Fprintf(w, "  layer:    %s (%s)\n", ex.Location, kind)
			if ex.ImageLayer != "" {
				fmt.Fprintf(w, "  image:    layer %s of %s\n", ex.ImageLayer, ex.Seed)
			}
			if ex.Package == "" {
				fmt.Fprintln(w, "  package:  none (made by a maintainer script or by the seed's builder, not shipped by a package)")
				return nil
			}
			fmt.Fprintf(w, "  package:  %s %s\n", ex.Package, ex.Version)
			file := c.Args().Get(0)
			if ex.Manager == "pip" {
				if ex.Declared != "" {
					fmt.Fprintf(w, "  declared: %s:%d: pip.packages: %q\n", file, ex.Line, ex.Declared)
				} else {
					fmt.Fprintln(w, "  declared: a dependency pip's resolver added for [pip] packages (see the lock)")
				}
				return nil
			}
			switch {
			case ex.Declared != "" && len(ex.Chain) == 1:
				fmt.Fprintf(w, "  declared: %s:%d: apt.packages: %q\n", file, ex.Line, ex.Declared)
			case ex.Declared != "":
				fmt.Fprintf(w, "  needed by: %s\n", strings.Join(ex.Chain, " → "))
				fmt.Fprintf(w, "  declared: %s:%d: apt.packages: %q\n", file, ex.Line, ex.Declared)
			case ex.InSeed:
				fmt.Fprintf(w, "  declared: part of the seed %q (%s)\n", ex.Seed, file)
			default:
				fmt.Fprintln(w, "  declared: no declared package needs it")
			}
			return nil
		},
	}
}
