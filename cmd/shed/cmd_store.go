package main

import (
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

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
					s, err := openStore(c)
					if err != nil {
						return err
					}
					defer s.Close()
					infos, _, err := s.All()
					if err != nil {
						return err
					}
					// Valid means registered and present on disk.
					paths := store.SortedPaths(infos)
					valid := paths[:0]
					for _, p := range paths {
						if s.IsValid(p) {
							valid = append(valid, p)
						}
					}
					if c.Bool("json") {
						list := make([]*pathJSON, 0, len(valid))
						for _, p := range valid {
							list = append(list, toJSON(s, infos[p]))
						}
						return printJSON(c, list)
					}
					tw := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
					for _, p := range valid {
						fmt.Fprintf(tw, "%s\t%s\n", s.Location(p), formatSize(infos[p].Size))
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
					s, err := openStore(c)
					if err != nil {
						return err
					}
					defer s.Close()
					p, err := parsePathArg(s, c.Args().First())
					if err != nil {
						return err
					}
					info, err := s.Info(p)
					if err != nil {
						return err
					}
					j := toJSON(s, info)
					if c.Bool("json") {
						return printJSON(c, j)
					}
					w := c.App.Writer
					fmt.Fprintf(w, "path:         %s\n", j.Location)
					fmt.Fprintf(w, "content hash: %s\n", info.ContentHash)
					fmt.Fprintf(w, "size:         %s (%d bytes)\n", formatSize(info.Size), info.Size)
					fmt.Fprintf(w, "registered:   %s\n", info.Registered.Format(time.RFC3339))
					if info.CA != "" {
						fmt.Fprintf(w, "addressed by: %s\n", info.CA)
					}
					if j.Deriver != "" {
						fmt.Fprintf(w, "deriver:      %s\n", j.Deriver)
					}
					fmt.Fprintf(w, "references:   %d\n", len(info.References))
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
					s, t, err := openStoreTrust(c)
					if err != nil {
						return err
					}
					defer s.Close()
					opts := store.VerifyOptions{CheckContents: c.Bool("check-contents"), CheckProvenance: t.Verify}
					for _, a := range c.Args().Slice() {
						p, err := parsePathArg(s, a)
						if err != nil {
							return err
						}
						opts.Paths = append(opts.Paths, p)
					}
					start := time.Now()
					res, err := s.Verify(c.Context, opts)
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
						if opts.CheckContents {
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
					s, t, err := openStoreTrust(c)
					if err != nil {
						return err
					}
					defer s.Close()
					var paths []store.Path
					for _, a := range c.Args().Slice() {
						p, err := parsePathArg(s, a)
						if err != nil {
							return err
						}
						paths = append(paths, p)
					}
					if len(paths) == 0 {
						infos, _, err := s.All()
						if err != nil {
							return err
						}
						for _, p := range store.SortedPaths(infos) {
							prov, _ := s.Provenance(p)
							if t.Verify(infos[p], prov) != nil {
								paths = append(paths, p)
							}
						}
					}
					for _, p := range paths {
						if err := t.Resign(c.Context, p); err != nil {
							return err
						}
					}
					if c.Bool("json") {
						return printJSON(c, map[string]any{"signed": paths, "key": t.Key.Public().String()})
					}
					fmt.Fprintf(c.App.Writer, "signed %d paths with %s\n", len(paths), t.Key.Name)
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
					src := hostPath(c, c.Args().First())
					name := c.String("name")
					if name == "" {
						name = storeName(filepath.Base(filepath.Clean(src)))
					}
					s, err := openStore(c)
					if err != nil {
						return err
					}
					defer s.Close()
					// The store's own state (a Bench's upper above all) never becomes a path: a
					// path can be pushed to a cache, an upper must never leave the machine.
					if abs, err := filepath.Abs(src); err == nil {
						if rel, err := filepath.Rel(s.Root(), abs); err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
							return withHint(exitUsage, fmt.Errorf("%s is inside the store root %s", src, s.Root()),
								"store paths come from builds; a Bench's upper layer is never added to the store or exported")
						}
					}
					info, err := s.AddDir(c.Context, src, name, nil)
					if err != nil {
						if errors.Is(err, store.ErrBadName) {
							return withHint(exitUsage, err, "pass --name with letters, digits and +-._?=")
						}
						return err
					}
					if c.Bool("json") {
						return printJSON(c, toJSON(s, info))
					}
					fmt.Fprintln(c.App.Writer, s.Location(info.Path))
					return nil
				},
			},
		},
	}
}

var badNameChars = regexp.MustCompile(`[^A-Za-z0-9+._?=-]+`)

// storeName turns a file name into a valid store name.
func storeName(base string) string {
	n := strings.TrimLeft(badNameChars.ReplaceAllString(base, "-"), ".")
	if n == "" || n == "-" {
		return "source"
	}
	if len(n) > store.MaxNameLen {
		n = n[:store.MaxNameLen]
	}
	return n
}

// pathJSON is the --json form of a path: locations are absolute so that
// scripts can use them directly.
type pathJSON struct {
	Path        string     `json:"path"`
	Location    string     `json:"location"`
	ContentHash store.Hash `json:"content_hash"`
	Size        int64      `json:"size"`
	Registered  time.Time  `json:"registered"`
	Deriver     string     `json:"deriver,omitempty"`
	References  []string   `json:"references"`
	CA          string     `json:"ca,omitempty"`
}

func toJSON(s *store.Store, info *store.PathInfo) *pathJSON {
	j := &pathJSON{
		Path:        info.Path.String(),
		Location:    s.Location(info.Path),
		ContentHash: info.ContentHash,
		Size:        info.Size,
		Registered:  info.Registered,
		References:  []string{},
		CA:          info.CA,
	}
	if !info.Deriver.IsZero() {
		j.Deriver = s.Location(info.Deriver)
	}
	for _, r := range info.References {
		j.References = append(j.References, s.Location(r))
	}
	return j
}
