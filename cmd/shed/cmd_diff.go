package main

import (
	"fmt"
	"slices"

	"github.com/urfave/cli/v2"

	"toolshed.dev/shed/recipe"
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
			a, err := loadRecipeFile(c, c.Args().Get(0))
			if err != nil {
				return err
			}
			b, err := loadRecipeFile(c, c.Args().Get(1))
			if err != nil {
				return err
			}
			decl := diffDeclarations(a, b)
			var resolved []string
			la, errA := recipe.LoadLock(recipe.LockFile(a.File))
			lb, errB := recipe.LoadLock(recipe.LockFile(b.File))
			locked := errA == nil && errB == nil
			if locked {
				resolved = recipe.DiffLocks(la, lb)
			}
			if c.Bool("json") {
				return printJSON(c, map[string]any{"declarations": orEmpty(decl), "resolved": orEmpty(resolved), "locked": locked})
			}
			fmt.Fprintf(c.App.Writer, "--- %s\n+++ %s\n", a.File, b.File)
			for _, l := range decl {
				fmt.Fprintln(c.App.Writer, l)
			}
			if !locked {
				fmt.Fprintln(c.App.Writer, "(resolved packages not compared: run `shed lock` on both)")
				return nil
			}
			if len(resolved) > 0 {
				fmt.Fprintln(c.App.Writer, "resolved packages:")
				for _, l := range resolved {
					fmt.Fprintln(c.App.Writer, "  "+l)
				}
			}
			return nil
		},
	}
}

func orEmpty(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// diffDeclarations lists changed declarations as "- old" / "+ new" lines
// prefixed by their field.
func diffDeclarations(a, b *recipe.Recipe) []string {
	var out []string
	scalar := func(field, x, y string) {
		if x != y {
			out = append(out, fmt.Sprintf("- %s = %q", field, x), fmt.Sprintf("+ %s = %q", field, y))
		}
	}
	list := func(field string, x, y []string) {
		for _, v := range x {
			if !slices.Contains(y, v) {
				out = append(out, fmt.Sprintf("- %s: %s", field, v))
			}
		}
		for _, v := range y {
			if !slices.Contains(x, v) {
				out = append(out, fmt.Sprintf("+ %s: %s", field, v))
			}
		}
	}
	strs := func(n int, f func(int) string) []string {
		s := make([]string, n)
		for i := range s {
			s[i] = f(i)
		}
		return s
	}
	scalar("name", a.Name, b.Name)
	scalar("seed", a.Seed.Raw, b.Seed.Raw)
	scalar("apt.mirror", a.Apt.Mirror, b.Apt.Mirror)
	list("apt.packages", strs(len(a.Apt.Packages), func(i int) string { return a.Apt.Packages[i].String() }),
		strs(len(b.Apt.Packages), func(i int) string { return b.Apt.Packages[i].String() }))
	list("apt.source", strs(len(a.Apt.Sources), func(i int) string { return a.Apt.Sources[i].URL }),
		strs(len(b.Apt.Sources), func(i int) string { return b.Apt.Sources[i].URL }))
	scalar("pip.index", a.Pip.Index, b.Pip.Index)
	list("pip.packages", strs(len(a.Pip.Packages), func(i int) string { return a.Pip.Packages[i].String() }),
		strs(len(b.Pip.Packages), func(i int) string { return b.Pip.Packages[i].String() }))
	scalar("network.profile", a.Network.Profile, b.Network.Profile)
	list("network.allow", strs(len(a.Network.Allow), func(i int) string { return a.Network.Allow[i].String() }),
		strs(len(b.Network.Allow), func(i int) string { return b.Network.Allow[i].String() }))
	list("grant", strs(len(a.Grants), func(i int) string { return a.Grants[i].Path + " " + a.Grants[i].Mode }),
		strs(len(b.Grants), func(i int) string { return b.Grants[i].Path + " " + b.Grants[i].Mode }))
	return out
}
