package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"toolshed.dev/shed/app"
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
			"SHED_REGISTRY_PASSWORD or the Docker credentials file, never from the recipe.\n" +
			"A path's closure is what it needs at run time (a layer and the layers below it);\n" +
			"--with-build-inputs adds the .debs and wheels they were built from, for a mirror or to\n" +
			"rebuild elsewhere a version gone upstream.\n" +
			"--image TAG also pushes the one WORKSHOP as an OCI image tagged TAG in the same repository:\n" +
			"one layer per store path, annotated with its path, so that any runtime can pull and run it\n" +
			"and containerd with `shed snapshotter` takes its layers from the node's store (docs/kubernetes.md).",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "to", Required: true, Usage: "the `CACHE`: oci://HOST[:PORT]/REPO or oci-layout:DIR"},
			withBuildInputsFlag,
			&cli.StringFlag{Name: "image", Usage: "also push the Workshop as an OCI image tagged `TAG`"},
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
			"and run `shed import DIR` there. --with-build-inputs adds the .debs and wheels the\n" +
			"layers were built from.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "oci", Required: true, Usage: "the layout `DIR` (created if missing)"},
			withBuildInputsFlag,
		},
		Action: func(c *cli.Context) error { return copyTo(c, "oci-layout:"+c.String("oci")) },
	}
}

var withBuildInputsFlag = &cli.BoolFlag{Name: "with-build-inputs", Usage: "also push what the layers were built from (.debs, wheels)"}

func copyTo(c *cli.Context, to string) error {
	res, err := call[app.CopyResult](c, "copy", &app.CopyRequest{To: to, Items: c.Args().Slice(), BuildInputs: c.Bool("with-build-inputs"), Image: c.String("image")})
	if err != nil {
		return err
	}
	if c.Bool("json") {
		return printJSON(c, res)
	}
	fmt.Fprintf(c.App.Writer, "pushed %d paths (%s compressed) to %s; %d were there\n", len(res.Pushed), formatSize(res.Bytes), to, len(res.Present))
	if res.Image != nil {
		fmt.Fprintf(c.App.Writer, "pushed image %s@%s (%d layers, %s compressed now)\n", res.Image.Ref, res.Image.Digest, res.Image.Layers, formatSize(res.Image.Bytes))
	}
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
			res, err := call[app.ImportResult](c, "import", &app.ImportRequest{Dir: c.Args().First(), Paths: c.Args().Slice()[1:]})
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(c, res)
			}
			fmt.Fprintf(c.App.Writer, "imported %d paths (with their references); %d were here\n", len(res.Imported), len(res.Present))
			return nil
		},
	}
}
