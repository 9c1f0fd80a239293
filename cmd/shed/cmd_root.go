package main

import (
	"fmt"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"toolshed.dev/shed/app"
)

func cmdRoot() *cli.Command {
	return &cli.Command{
		Name:  "root",
		Usage: "manage named gc roots",
		Description: "A named root keeps a store path, and everything it references, safe from gc.\n" +
			"Realizing a Workshop registers one for it.",
		Subcommands: []*cli.Command{
			{
				Name:      "add",
				Usage:     "make NAME a root for PATH (replacing an existing root of that name)",
				ArgsUsage: "NAME PATH",
				Action: func(c *cli.Context) error {
					if c.NArg() != 2 {
						return usageError("root add wants NAME and PATH")
					}
					r, err := call[app.Root](c, "root.add", &app.RootAddRequest{Name: c.Args().Get(0), Path: c.Args().Get(1)})
					if err != nil {
						return err
					}
					if c.Bool("json") {
						return printJSON(c, r)
					}
					fmt.Fprintf(c.App.Writer, "%s -> %s\n", r.Name, r.Location)
					return nil
				},
			},
			{
				Name:  "ls",
				Usage: "list the named roots",
				Action: func(c *cli.Context) error {
					res, err := call[app.RootsResult](c, "root.ls", &app.RootListRequest{})
					if err != nil {
						return err
					}
					if c.Bool("json") {
						return printJSON(c, res.Roots)
					}
					tw := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
					for _, r := range res.Roots {
						fmt.Fprintf(tw, "%s\t%s\n", r.Name, r.Location)
					}
					return tw.Flush()
				},
			},
			{
				Name:      "rm",
				Usage:     "remove a named root (the paths stay until gc)",
				ArgsUsage: "NAME",
				Action: func(c *cli.Context) error {
					if c.NArg() != 1 {
						return usageError("root rm wants NAME")
					}
					r, err := call[app.Root](c, "root.rm", &app.RootRequest{Name: c.Args().First()})
					if err != nil {
						return err
					}
					if c.Bool("json") {
						return printJSON(c, r)
					}
					if r.Location == "" {
						_, err = fmt.Fprintf(c.App.Writer, "removed root %s\n", r.Name)
						return err
					}
					// What it kept stays until gc, unless another root keeps it.
					_, err = fmt.Fprintf(c.App.Writer, "removed root %s -> %s (kept until gc)\n", r.Name, r.Location)
					return err
				},
			},
		},
	}
}
