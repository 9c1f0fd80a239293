package main

import (
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"toolshed.dev/shed/app"
	"toolshed.dev/shed/store"
)

func cmdStore() *cli.Command {
	return &cli.Command{
		Name:  "store",
		Usage: "inspect and check the store",
		Subcommands: []*cli.Command{
			{
				Name:  "ls",
				Usage: "list valid store paths",
				Action: func(c *cli.Context) error {
					res, err := call[app.PathsResult](c, "store.ls", &app.StoreListRequest{})
					if err != nil {
						return err
					}
					if c.Bool("json") {
						return printJSON(c, res.Paths)
					}
					tw := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
					for _, p := range res.Paths {
						fmt.Fprintf(tw, "%s\t%s\n", p.Location, formatSize(p.Size))
					}
					return tw.Flush()
				},
			},
			{
				Name:      "info",
				Usage:     "show what the store records about a path",
				ArgsUsage: "PATH",
				Action: func(c *cli.Context) error {
					if c.NArg() != 1 {
						return usageError("store info wants one PATH")
					}
					j, err := call[app.PathInfo](c, "store.info", &app.PathRequest{Path: c.Args().First()})
					if err != nil {
						return err
					}
					if c.Bool("json") {
						return printJSON(c, j)
					}
					w := c.App.Writer
					fmt.Fprintf(w, "path:         %s\n", j.Location)
					fmt.Fprintf(w, "content hash: %s\n", j.ContentHash)
					fmt.Fprintf(w, "size:         %s (%d bytes)\n", formatSize(j.Size), j.Size)
					fmt.Fprintf(w, "registered:   %s\n", j.Registered.Format(time.RFC3339))
					if j.CA != "" {
						fmt.Fprintf(w, "addressed by: %s\n", j.CA)
					}
					if j.Deriver != "" {
						fmt.Fprintf(w, "deriver:      %s\n", j.Deriver)
					}
					fmt.Fprintf(w, "references:   %d\n", len(j.References))
					for _, r := range j.References {
						fmt.Fprintf(w, "  %s\n", r)
					}
					return nil
				},
			},
			{
				Name:      "verify",
				Usage:     "check the store's paths, or the named ones",
				ArgsUsage: "[PATH...]",
				Flags: []cli.Flag{
					&cli.BoolFlag{Name: "check-contents", Usage: "re-hash every file and name the ones that changed"},
				},
				Description: "Without --check-contents, checks that every registered path is on disk, that its\n" +
					"references are valid, that its records parse, and that its provenance is signed by a\n" +
					"trusted key and names exactly its content hash, size and references (docs/trust.md).\n" +
					"With it, re-hashes every file and names each file that differs from what was\n" +
					"registered. Exits 4 if anything is wrong.\n" +
					"Unregistered bytes left by an interrupted command are listed as debris (not an\n" +
					"error: no reader sees them); `shed gc` removes them.",
				Action: func(c *cli.Context) error {
					start := time.Now()
					res, err := call[store.VerifyResult](c, "store.verify", &app.VerifyRequest{Paths: c.Args().Slice(), CheckContents: c.Bool("check-contents")})
					if err != nil {
						return err
					}
					logger(c).Debug("verified", "paths", res.Checked, "bytes", res.Bytes, "elapsed", time.Since(start))
					if c.Bool("json") {
						if err := printJSON(c, res); err != nil {
							return err
						}
					} else {
						for _, pr := range res.Problems {
							fmt.Fprintf(c.App.Writer, "problem: %s\n", pr)
						}
						for _, d := range res.Debris {
							fmt.Fprintf(c.App.Writer, "debris: %s (unregistered; `shed gc` removes it)\n", d)
						}
						fmt.Fprintf(c.App.Writer, "checked %d paths", res.Checked)
						if c.Bool("check-contents") {
							fmt.Fprintf(c.App.Writer, " (%s re-hashed)", formatSize(res.Bytes))
						}
						fmt.Fprintf(c.App.Writer, ": %d problems\n", len(res.Problems))
					}
					if len(res.Problems) > 0 {
						return withHint(exitProblems, fmt.Errorf("store verification found %d problems", len(res.Problems)),
							"a corrupt path is never trusted: delete it with `shed gc` after removing its roots, then realize again to rebuild it")
					}
					return nil
				},
			},
			{
				Name:      "sign",
				Usage:     "sign paths with the store's key (all unsigned paths, or the named ones)",
				ArgsUsage: "[PATH...]",
				Description: "Signs the provenance of paths this store holds with its current key: the named\n" +
					"paths, or every path whose provenance does not verify (paths registered before shed\n" +
					"signed what it builds). What a verifying provenance says is kept. Sign only paths\n" +
					"you vouch for: a signature says this store stands behind the bytes.",
				Action: func(c *cli.Context) error {
					res, err := call[app.SignResult](c, "store.sign", &app.SignRequest{Paths: c.Args().Slice()})
					if err != nil {
						return err
					}
					if c.Bool("json") {
						return printJSON(c, res)
					}
					fmt.Fprintf(c.App.Writer, "signed %d paths with %s\n", len(res.Signed), keyName(res.Key))
					return nil
				},
			},
			{
				Name:      "add",
				Usage:     "copy a directory or file into the store, addressed by its content",
				ArgsUsage: "DIR",
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "name", Usage: "store `NAME` (default: the base name of DIR)"},
				},
				Description: "Copies DIR (owners, modes, setuid bits, xattrs, hard links, device nodes kept;\n" +
					"symlinks never followed) into the store. The path's hash comes from the content,\n" +
					"so adding the same content twice gives the same path and stores it once.",
				Action: func(c *cli.Context) error {
					if c.NArg() != 1 {
						return usageError("store add wants one DIR")
					}
					j, err := call[app.PathInfo](c, "store.add", &app.StoreAddRequest{Dir: c.Args().First(), Name: c.String("name")})
					if err != nil {
						return err
					}
					if c.Bool("json") {
						return printJSON(c, j)
					}
					fmt.Fprintln(c.App.Writer, j.Location)
					return nil
				},
			},
		},
	}
}

// keyName is the NAME of a NAME:BASE64 key.
func keyName(k string) string {
	name, _, _ := strings.Cut(k, ":")
	return name
}
