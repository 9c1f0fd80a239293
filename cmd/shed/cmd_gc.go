package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"toolshed.dev/shed/app"
	"toolshed.dev/shed/builder"
)

func cmdGC() *cli.Command {
	return &cli.Command{
		Name:  "gc",
		Usage: "delete store paths that no root needs",
		Description: "Deletes every store path not reachable from a named root, from a temporary root of\n" +
			"a running shed process (a realize in progress, a running Bench), or from another live\n" +
			"path. It also sweeps debris left by interrupted commands. Deleting only costs time:\n" +
			"everything can be rebuilt from its recipe. A layer's build inputs (the .debs and wheels it was\n" +
			"built from) are freed too, unless the store's config.toml says keep_build_inputs = true:\n" +
			"a rebuild fetches them again by their locked hashes (docs/architecture.md).",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "dry-run", Aliases: []string{"n"}, Usage: "print what would be deleted, delete nothing"},
			&cli.StringFlag{Name: "max-freed", Usage: "stop after freeing `SIZE` (e.g. 500M, 2G; bytes if no unit)"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return usageError("gc takes no arguments")
			}
			req := &app.GCRequest{DryRun: c.Bool("dry-run")}
			n, err := sizeFlag(c, "max-freed")
			if err != nil {
				return err
			}
			req.MaxFreed = n
			res, err := call[app.GCResult](c, "gc", req)
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(c, res)
			}
			verb := "deleted"
			if req.DryRun {
				verb = "would delete"
			}
			for _, l := range res.Locations {
				fmt.Fprintf(c.App.Writer, "%s %s\n", verb, l)
			}
			if req.DryRun {
				fmt.Fprintf(c.App.Writer, "would delete %d paths, %s of files", len(res.Deleted), formatSize(res.Size))
			} else {
				fmt.Fprintf(c.App.Writer, "deleted %d paths, %s freed", len(res.Deleted), formatSize(res.Freed))
				if shared := res.Size - res.Freed; shared > 0 {
					fmt.Fprintf(c.App.Writer, " (%s of their files stay, stored once for paths that stay)", formatSize(shared))
				}
			}
			if res.Links > 0 {
				fmt.Fprintf(c.App.Writer, ", %d unused stored-once files removed", res.Links)
			}
			if res.Swept > 0 {
				fmt.Fprintf(c.App.Writer, ", %d debris swept", res.Swept)
			}
			fmt.Fprintln(c.App.Writer)
			return nil
		},
	}
}

func formatSize(n int64) string { return builder.FormatBytes(n) }
