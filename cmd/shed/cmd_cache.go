package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/urfave/cli/v2"

	"toolshed.dev/shed/cache"
	"toolshed.dev/shed/store"
)

func cmdCopy() *cli.Command {
	return &cli.Command{
		Name:      "copy",
		Usage:     "push store paths (with everything they reference) to a cache",
		ArgsUsage: "--to CACHE [PATH...|WORKSHOP]",
		Description: "Pushes each path and its reference closure to CACHE (oci://HOST[:PORT]/REPO, a registry;\n" +
			"or oci-layout:DIR) as OCI artifacts, one per path, tagged with the path's hash part: the\n" +
			"path's record, manifest, signed provenance and tree (docs/trust.md). WORKSHOP (a recipe file,\n" +
			"default ./workshop.toml) means its realized layers. Paths already there with the same\n" +
			"provenance are skipped. Registry credentials come from SHED_REGISTRY_USERNAME and\n" +
			"SHED_REGISTRY_PASSWORD or the Docker credentials file, never from the recipe.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "to", Required: true, Usage: "the `CACHE`: oci://HOST[:PORT]/REPO or oci-layout:DIR"},
		},
		Action: func(c *cli.Context) error { return copyTo(c, c.String("to")) },
	}
}

func cmdExport() *cli.Command {
	return &cli.Command{
		Name:      "export",
		Usage:     "write store paths (with their references) to an OCI image layout directory",
		ArgsUsage: "--oci DIR [PATH...|WORKSHOP]",
		Description: "copy --to oci-layout:DIR: for machines with no registry and no network, carry DIR over\n" +
			"and run `shed import DIR` there.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "oci", Required: true, Usage: "the layout `DIR` (created if missing)"},
		},
		Action: func(c *cli.Context) error { return copyTo(c, "oci-layout:"+c.String("oci")) },
	}
}

func copyTo(c *cli.Context, to string) error {
	s, t, err := openStoreTrust(c)
	if err != nil {
		return err
	}
	defer s.Close()
	paths, err := pathsFromArgs(c, s, c.Args().Slice())
	if err != nil {
		return err
	}
	cc, err := cache.Open(cacheName(c, to))
	if err != nil {
		return withHint(exitUsage, err, "a cache is oci://HOST[:PORT]/REPO or oci-layout:DIR")
	}
	res, err := cache.Push(c.Context, s, t, cc, paths)
	if err != nil {
		return err
	}
	if c.Bool("json") {
		return printJSON(c, map[string]any{"cache": to, "pushed": locations(s, res.Pushed), "present": locations(s, res.Present), "bytes": res.Bytes})
	}
	fmt.Fprintf(c.App.Writer, "pushed %d paths (%s compressed) to %s; %d were there\n", len(res.Pushed), formatSize(res.Bytes), to, len(res.Present))
	return nil
}

func cmdImport() *cli.Command {
	return &cli.Command{
		Name:      "import",
		Usage:     "take store paths from an OCI image layout directory, verifying each",
		ArgsUsage: "DIR [PATH...]",
		Description: "Registers every path in DIR (made by `shed export`), or the named ones, with their\n" +
			"references: each only if a trusted key signed its provenance and its bytes re-hash to what\n" +
			"was signed (docs/trust.md). Nothing of a path that fails a check is registered.",
		Action: func(c *cli.Context) error {
			if c.NArg() < 1 {
				return usageError("import wants the layout DIR")
			}
			dir := hostPath(c, c.Args().First())
			if _, err := os.Stat(dir); err != nil {
				return withHint(exitUsage, err, "DIR is a directory written by `shed export --oci DIR`")
			}
			s, t, err := openStoreTrust(c)
			if err != nil {
				return err
			}
			defer s.Close()
			cc, err := cache.Open("oci-layout:" + dir)
			if err != nil {
				return err
			}
			var paths []store.Path
			if c.NArg() > 1 {
				for _, a := range c.Args().Slice()[1:] {
					p, err := store.ParsePath(strings.TrimPrefix(a, s.StoreDir()+"/"))
					if err != nil {
						return withHint(exitUsage, err, "name paths by their base name (HASH-NAME)")
					}
					paths = append(paths, p)
				}
			} else {
				tags, err := cc.Tags(c.Context)
				if err != nil {
					return err
				}
				for _, tag := range tags {
					p, err := cc.PathOf(c.Context, s, tag)
					if err != nil {
						return err
					}
					paths = append(paths, p)
				}
			}
			pl := &cache.Puller{Store: s, Trust: t, Caches: []*cache.Cache{cc}}
			var imported, present []store.Path
			for _, p := range paths {
				if s.IsValid(p) {
					present = append(present, p)
					continue
				}
				ok, err := pl.Pull(c.Context, p)
				if err != nil {
					return err
				}
				if !ok {
					return fmt.Errorf("%s is not in %s", p, dir)
				}
				imported = append(imported, p)
			}
			if c.Bool("json") {
				return printJSON(c, map[string]any{"imported": locations(s, imported), "present": locations(s, present)})
			}
			fmt.Fprintf(c.App.Writer, "imported %d paths (with their references); %d were here\n", len(imported), len(present))
			return nil
		},
	}
}

// cacheName is a cache as named on the command line: the DIR of oci-layout:DIR is the caller's.
func cacheName(c *cli.Context, name string) string {
	if dir, ok := strings.CutPrefix(name, "oci-layout:"); ok {
		return "oci-layout:" + hostPath(c, dir)
	}
	return name
}

// pathsFromArgs turns arguments into store paths: a store path as itself, a
// recipe file as its realized layers (default ./workshop.toml).
func pathsFromArgs(c *cli.Context, s *store.Store, args []string) ([]store.Path, error) {
	if len(args) == 0 {
		args = []string{defaultRecipe}
	}
	var out []store.Path
	for _, a := range args {
		if p, err := parsePathArg(s, a); err == nil {
			if !s.IsValid(p) {
				return nil, withHint(exitFailure, fmt.Errorf("%s: %w", p, store.ErrNotExist), "`shed store ls` lists the valid paths")
			}
			out = append(out, p)
			continue
		}
		if fi, err := os.Stat(hostPath(c, a)); err == nil && fi.IsDir() {
			return nil, withHint(exitUsage, fmt.Errorf("%s is neither a store path nor a recipe file", a),
				"only store paths, and a Workshop's realized layers, can be copied; a Bench's upper layer never can")
		}
		r, err := loadRecipeFile(c, a)
		if err != nil {
			return nil, err
		}
		plan, _, err := lockedPlan(c, s, r, true)
		if err != nil {
			return nil, err
		}
		for _, l := range plan.Layers {
			if !s.IsValid(l) {
				return nil, withHint(exitFailure, fmt.Errorf("%s is not realized (%s is missing)", a, l), "run `shed realize "+a+"` first")
			}
		}
		out = append(out, plan.Layers...)
	}
	return out, nil
}
