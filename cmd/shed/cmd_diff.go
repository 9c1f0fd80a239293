package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"toolshed.dev/shed/app"
)

func cmdDiff() *cli.Command {
	return &cli.Command{
		Name:      "diff",
		Usage:     "compare two Workshops by declarations and resolved packages, not files",
		ArgsUsage: "WORKSHOP-A WORKSHOP-B",
		Description: "Prints what B declares differently from A (seed, mirror, packages, network, grants) and,\n" +
			"when both are locked, how their resolved packages differ (+ added, - removed, ~ changed).",
		Action: func(c *cli.Context) error {
			if c.NArg() != 2 {
				return usageError("diff wants two recipe files")
			}
			res, err := call[app.DiffResult](c, "diff", &app.DiffRequest{A: c.Args().Get(0), B: c.Args().Get(1)})
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(c, map[string]any{"declarations": res.Declarations, "resolved": res.Resolved, "locked": res.Locked})
			}
			fmt.Fprintf(c.App.Writer, "--- %s\n+++ %s\n", res.FileA, res.FileB)
			for _, l := range res.Declarations {
				fmt.Fprintln(c.App.Writer, l)
			}
			if !res.Locked {
				fmt.Fprintln(c.App.Writer, "(resolved packages not compared: run `shed lock` on both)")
				return nil
			}
			if len(res.Resolved) > 0 {
				fmt.Fprintln(c.App.Writer, "resolved packages:")
				for _, l := range res.Resolved {
					fmt.Fprintln(c.App.Writer, "  "+l)
				}
			}
			return nil
		},
	}
}
