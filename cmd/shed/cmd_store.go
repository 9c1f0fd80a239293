package main

import (
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"toolshed.dev/shed/app"
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
				Usage:     "show what the store records about a path, or what the store holds",
				ArgsUsage: "[PATH]",
				Description: "With a PATH, shows its record: content hash, size, references, and how many of its\n" +
					"bytes are stored once with other paths. Without one, counts the store's paths and bytes,\n" +
					"and what storing identical files once saves (docs/architecture.md, \"Files stored once\").",
				Action: func(c *cli.Context) error {
					if c.NArg() == 0 {
						return storeStats(c)
					}
					if c.NArg() != 1 {
						return usageError("store info wants one PATH, or none")
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
					if j.Shared > 0 {
						fmt.Fprintf(w, "stored once:  %s of it with other paths\n", formatSize(j.Shared))
					}
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
					if len(j.BuildInputs) > 0 {
						fmt.Fprintf(w, "built from:   %d\n", len(j.BuildInputs))
						for _, r := range j.BuildInputs {
							if r.Present {
								fmt.Fprintf(w, "  %s\n", r.Path)
							} else {
								fmt.Fprintf(w, "  %s (freed by gc)\n", r.Path)
							}
						}
					}
					return nil
				},
			},
			{
				Name:  "optimise",
				Usage: "store identical files of the store's paths once",
				Description: "Makes identical files of different store paths one file on disk (hard links into the\n" +
					"store's links/ directory, as `nix-store --optimise` does). No path's content hash\n" +
					"changes: a file is linked only with files that have the same bytes, mode, owner,\n" +
					"mtime and extended attributes. New paths are stored so as they are registered unless\n" +
					"the store's config.toml says store_files_once = false; this command does it for paths\n" +
					"registered before. Every file is hashed before it is shared. Safe while Benches run:\n" +
					"each file is replaced by an identical one in one rename.",
				Action: func(c *cli.Context) error {
					if c.NArg() > 0 {
						return usageError("store optimise takes no arguments")
					}
					res, err := call[app.OptimiseResult](c, "store.optimise", &app.OptimiseRequest{})
					if err != nil {
						return err
					}
					if c.Bool("json") {
						return printJSON(c, res)
					}
					fmt.Fprintf(c.App.Writer, "linked %d files in %d paths, %s freed; files stored once now save %s\n",
						res.Linked, res.Paths, formatSize(res.Saved), formatSize(res.Links.Saved))
					return nil
				},
			},
			{
				Name:      "verify",
				Usage:     "check the store's paths, or the named ones",
				ArgsUsage: "[PATH...]",
				Flags: []cli.Flag{
					&cli.BoolFlag{Name: "check-contents", Usage: "re-hash every file and name the ones that changed"},
					&cli.BoolFlag{Name: "repair", Usage: "put back the registered bytes of every damaged or missing path (implies --check-contents)"},
					&cli.BoolFlag{Name: "offline", Usage: "repair only from the store and the caches: never download or build with the network"},
					&cli.StringSliceFlag{Name: "substituter", Usage: "repair from `CACHE` (oci://HOST[:PORT]/REPO or oci-layout:DIR) when its copy has the recorded content hash (repeatable)"},
				},
				Description: "Without --check-contents, checks that every registered path is on disk, that its\n" +
					"references are valid, that its records parse, and that its provenance is signed by a\n" +
					"trusted key and names exactly its content hash, size and references (docs/trust.md).\n" +
					"With it, re-hashes every file and names each file that differs from what was\n" +
					"registered. Exits 4 if anything is wrong.\n" +
					"Unregistered bytes left by an interrupted command are listed as debris (not an\n" +
					"error: no reader sees them); `shed gc` removes them.\n" +
					"--repair puts back the registered bytes of each damaged or missing path: from a cache\n" +
					"(--substituter, the store's substituters) whose copy has the recorded content hash, else\n" +
					"by downloading a .deb again or rebuilding a layer from its .drv (the layers below are\n" +
					"repaired first). The new bytes replace the old only if they hash to the record, so what\n" +
					"depends on the path stays valid; a seed rebuilt from a mirror that moved on differs,\n" +
					"and is left as it was (take it from a cache). Then those paths are checked again.",
				Action: func(c *cli.Context) error {
					start := time.Now()
					res, err := call[app.VerifyResult](c, "store.verify", &app.VerifyRequest{
						Paths: c.Args().Slice(), CheckContents: c.Bool("check-contents"),
						Repair: c.Bool("repair"), Offline: c.Bool("offline"), Substituters: c.StringSlice("substituter"),
					})
					if err != nil {
						return err
					}
					logger(c).Debug("verified", "paths", res.Checked, "bytes", res.Bytes, "elapsed", time.Since(start))
					if c.Bool("json") {
						if err := printJSON(c, res); err != nil {
							return err
						}
					} else {
						for _, r := range res.Repaired {
							if r.Error == "" {
								fmt.Fprintf(c.App.Writer, "repaired: %s (%s)\n", r.Path, r.How)
							} else {
								fmt.Fprintf(c.App.Writer, "not repaired: %s: %s\n", r.Path, r.Error)
							}
						}
						for _, pr := range res.Problems {
							fmt.Fprintf(c.App.Writer, "problem: %s\n", pr)
						}
						for _, d := range res.Debris {
							fmt.Fprintf(c.App.Writer, "debris: %s (unregistered; `shed gc` removes it)\n", d)
						}
						// What was checked, in paths and bytes: a success says so too.
						if c.Bool("check-contents") || c.Bool("repair") {
							fmt.Fprintf(c.App.Writer, "checked %d paths (%s re-hashed)", res.Checked, formatSize(res.Bytes))
						} else {
							fmt.Fprintf(c.App.Writer, "checked %d paths (%s)", res.Checked, formatSize(res.Size))
						}
						fmt.Fprintf(c.App.Writer, ": %d problems\n", len(res.Problems))
					}
					if len(res.Problems) > 0 {
						var damaged []string
						for _, pr := range res.Problems {
							if pr.Damaged && !slices.Contains(damaged, pr.Path.String()) {
								damaged = append(damaged, pr.Path.String())
							}
						}
						hint := "a path whose record is damaged is never trusted: remove its roots, `shed gc`, and realize its Workshop again"
						switch {
						case len(damaged) > 0 && !c.Bool("repair"):
							hint = "`shed store verify --repair " + strings.Join(damaged, " ") + "` puts the registered bytes back"
						case len(damaged) > 0:
							hint = "a cache that holds the same bytes repairs what cannot be rebuilt here: --substituter CACHE"
						}
						return withHint(exitProblems, fmt.Errorf("store verification found %d problems", len(res.Problems)), hint)
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

// storeStats prints what the store holds (store info without a PATH).
func storeStats(c *cli.Context) error {
	j, err := call[app.StoreStats](c, "store.stats", &app.StoreStatsRequest{})
	if err != nil {
		return err
	}
	if c.Bool("json") {
		return printJSON(c, j)
	}
	w := c.App.Writer
	fmt.Fprintf(w, "root:         %s\n", j.Root)
	fmt.Fprintf(w, "paths:        %d, %s of files\n", j.Paths, formatSize(j.Size))
	fmt.Fprintf(w, "on disk:      %s\n", formatSize(j.Disk))
	once := "on"
	if !j.FilesOnce {
		once = "off (store_files_once = false in config.toml)"
	}
	fmt.Fprintf(w, "stored once:  %d files, %s; saves %s (new paths: %s)\n", j.Links.Files, formatSize(j.Links.Bytes), formatSize(j.Links.Saved), once)
	if j.Links.Unused > 0 {
		fmt.Fprintf(w, "              %d no longer used; `shed gc` removes them\n", j.Links.Unused)
	}
	return nil
}
