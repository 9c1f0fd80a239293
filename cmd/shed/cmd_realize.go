package main

import (
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"

	"toolshed.dev/shed/app"
	"toolshed.dev/shed/builder"
)

// substituterFlag names caches to take missing paths from (realize, bench run).
var substituterFlag = &cli.StringSliceFlag{Name: "substituter", Usage: "take missing paths from `CACHE` (oci://HOST[:PORT]/REPO or oci-layout:DIR) when a trusted key signed them (repeatable)"}

func cmdRealize() *cli.Command {
	return &cli.Command{
		Name:      "realize",
		Usage:     "build a Workshop's store paths (a cache hit when they exist)",
		ArgsUsage: "[FILE]",
		Description: "Locks FILE (default ./workshop.toml) if needed (and says so), compiles it to derivations,\n" +
			"fetches the missing .debs in parallel (each verified against the lock's SHA-256), builds the\n" +
			"seed and the layers in order in a sandbox with no network, registers a gc root named after\n" +
			"the Workshop and prints the layers, bottom first. When everything is in the store it touches\n" +
			"no network. --offline never touches the network and lists what is missing.\n" +
			"Before building a missing seed or layer, asks the caches (--substituter, and the store's\n" +
			"substituters setting) and takes it from one only if a trusted key signed it and its bytes\n" +
			"re-hash to what was signed; a refused one is built here instead (with --offline: an error\n" +
			"that says which check failed). See docs/trust.md.\n" +
			"--check rebuilds every layer and compares it with its record, and re-hashes the files on\n" +
			"disk of every layer and seed against the same record: it says which differs (a rebuild\n" +
			"that is not reproducible, or a damaged store, which `shed store verify --repair` fixes).\n" +
			"On stderr: a line as each lock, build and substitution starts and ends (with how long it\n" +
			"took; a substitution's end says the paths it brought, their size, and the bytes downloaded),\n" +
			"and one summary line at the end: built, fetched, substituted, the time. On a terminal, also\n" +
			"download bars, and while a step runs over a second (SHED_PROGRESS_DELAY: another duration,\n" +
			"such as 250ms) a status line redrawn in place and erased at its end: a spinner, the step,\n" +
			"its seconds, and the build's latest output line (escape and\n" +
			"control characters removed) or the bytes downloaded. In a log, the lines only (and a summary\n" +
			"of the downloads; a line per .deb with --verbose). --verbose shows the builds' own output\n" +
			"instead of the status line.",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "offline", Usage: "never touch the network; fail listing what is missing"},
			&cli.BoolFlag{Name: "check", Usage: "rebuild the layers; compare them, and the files on disk, with the record"},
			substituterFlag,
		},
		Action: func(c *cli.Context) error {
			if c.NArg() > 1 {
				return usageError("want at most one recipe FILE")
			}
			res, err := call[app.RealizeResult](c, "realize", &app.RealizeRequest{
				Workshop: c.Args().First(), Offline: c.Bool("offline"), Check: c.Bool("check"), Substituters: c.StringSlice("substituter"),
			})
			if err != nil {
				return err
			}
			if c.Bool("json") {
				if err := printJSON(c, res); err != nil {
					return err
				}
			} else {
				for _, l := range res.Layers {
					fmt.Fprintln(c.App.Writer, l)
				}
				fmt.Fprintln(c.App.ErrWriter, realizeSummary(res))
				for _, ch := range res.Check {
					fmt.Fprint(c.App.ErrWriter, checkReport(ch))
				}
			}
			var damaged []string
			for _, ch := range res.Check {
				if !ch.Intact {
					damaged = append(damaged, ch.Path)
				}
			}
			if len(damaged) > 0 {
				return withHint(exitProblems, fmt.Errorf("the files on disk of %s differ from their record: the store is damaged", strings.Join(damaged, ", ")),
					"`shed store verify --repair "+strings.Join(damaged, " ")+"` puts the registered bytes back")
			}
			for _, ch := range res.Check {
				if ch.Rebuilt && !ch.Same {
					return withHint(exitProblems, fmt.Errorf("%s is not reproducible", ch.Path),
						"the files listed differ between two builds of the same inputs; see `shed log` of the path")
				}
			}
			return nil
		},
	}
}

// checkReport says what --check found for one path: the rebuild against the record, and the files
// on disk against the record.
func checkReport(ch app.CheckResult) string {
	var b strings.Builder
	switch {
	case ch.NotRebuilt != "" && ch.Intact:
		fmt.Fprintf(&b, "shed: check: %s: files intact, not rebuilt: %s\n", ch.Path, ch.NotRebuilt)
	case !ch.Rebuilt && ch.Intact:
		fmt.Fprintf(&b, "shed: check: %s: files intact (a seed is not rebuilt)\n", ch.Path)
	case ch.Same && ch.Intact:
		fmt.Fprintf(&b, "shed: check: %s: rebuilt, same as its record and as its files on disk\n", ch.Path)
	}
	if ch.Rebuilt && !ch.Same {
		fmt.Fprintf(&b, "shed: check: %s: rebuilt, content DIFFERS from its record:\n  %s\n", ch.Path, strings.Join(ch.Diffs, "\n  "))
	}
	if !ch.Intact {
		also := ""
		if ch.Rebuilt && ch.Same {
			also = " (the rebuild matches the record)"
		}
		fmt.Fprintf(&b, "shed: check: %s: files on disk DIFFER from its record%s:\n  %s\n", ch.Path, also, strings.Join(ch.DiskDiffs, "\n  "))
	}
	return b.String()
}

// realizeSummary is the line that ends a realize: what it did and how long it took.
func realizeSummary(r *app.RealizeResult) string {
	took := fmt.Sprintf("%.1f s", r.Seconds)
	if r.Seconds < 1 {
		took = fmt.Sprintf("%d ms", int(r.Seconds*1000+0.5))
	}
	if len(r.Built)+len(r.Fetched)+len(r.Substituted) == 0 {
		return fmt.Sprintf("shed: realized %s in %s: its %s were in the store", r.Workshop, took, app.Plural(len(r.Layers), "layer"))
	}
	var did []string
	if n := len(r.Built); n > 0 {
		did = append(did, "built "+app.Plural(n, "path"))
	}
	if n := len(r.Fetched); n > 0 {
		did = append(did, fmt.Sprintf("fetched %s (%s)", app.Plural(n, "file"), builder.FormatBytes(r.FetchedBytes)))
	}
	if n := len(r.Substituted); n > 0 {
		did = append(did, fmt.Sprintf("substituted %s (%s)", app.Plural(n, "path"), builder.FormatBytes(r.SubstitutedBytes)))
	}
	return fmt.Sprintf("shed: realized %s in %s: %s", r.Workshop, took, strings.Join(did, ", "))
}
