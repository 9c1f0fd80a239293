package main

import (
	"fmt"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"toolshed.dev/shed/store"
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
					s, err := openStore(c)
					if err != nil {
						return err
					}
					defer s.Close()
					p, err := parsePathArg(s, c.Args().Get(1))
					if err != nil {
						return err
					}
					if err := s.AddRoot(c.Context, c.Args().Get(0), p); err != nil {
						return err
					}
					if c.Bool("json") {
						return printJSON(c, store.Root{Name: c.Args().Get(0), Path: p})
					}
					fmt.Fprintf(c.App.Writer, "%s -> %s\n", c.Args().Get(0), s.Location(p))
					return nil
				},
			},
			{
				Name:  "ls",
				Usage: "list the named roots",
				Action: func(c *cli.Context) error {
					s, err := openStore(c)
					if err != nil {
						return err
					}
					defer s.Close()
					roots, err := s.Roots()
					if err != nil {
						return err
					}
					if c.Bool("json") {
						if roots == nil {
							roots = []store.Root{}
						}
						return printJSON(c, roots)
					}
					tw := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
					for _, r := range roots {
						fmt.Fprintf(tw, "%s\t%s\n", r.Name, s.Location(r.Path))
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
					s, err := openStore(c)
					if err != nil {
						return err
					}
					defer s.Close()
					return s.RemoveRoot(c.Args().First())
				},
			},
		},
	}
}
