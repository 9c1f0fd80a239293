package main

import (
	"fmt"
	"os"
	"path/filepath"
	"toolshed.dev/shed/records"

	"github.com/urfave/cli/v2"

	"toolshed.dev/shed/recipe"
	"toolshed.dev/shed/supervisor"
)

// defaultRecipe is the file commands read when none is named, as
// docker build reads ./Dockerfile.
const defaultRecipe = "workshop.toml"

func cmdRecipe() *cli.Command {
	return &cli.Command{
		Name:  "recipe",
		Usage: "work with recipes (workshop.toml)",
		Subcommands: []*cli.Command{
			{
				Name:      "check",
				Usage:     "validate a recipe",
				ArgsUsage: "[FILE]",
				Description: "Parses FILE (default ./workshop.toml) strictly: an unknown key, a wrong type or a\n" +
					"bad value is one error naming the file, the line and the field, with a hint.\n" +
					"Exits 3 if the recipe is invalid. Writes nothing. See docs/recipe.md.",
				Action: func(c *cli.Context) error {
					r, err := loadRecipe(c)
					if err != nil {
						return err
					}
					if c.Bool("json") {
						return printJSON(c, recipeJSON(r))
					}
					fmt.Fprintf(c.App.Writer, "ok: %s: %s, seed %s, %s, %s, %s\n", r.File, r.Name, r.Seed.Raw,
						plural(len(r.Apt.Packages), "apt package"), plural(len(r.Pip.Packages), "pip package"),
						plural(len(r.Grants), "grant"))
					return nil
				},
			},
		},
	}
}

// loadRecipeFile reads a recipe; grants of the store root in use are refused.
func loadRecipeFile(c *cli.Context, file string) (*recipe.Recipe, error) {
	return recipe.Load(resolveRecord(c, file), recipe.Options{ForbiddenPaths: []string{c.String("root")}})
}

// resolveRecord turns the name of a Workshop record into its current recipe file, wherever a recipe
// file is accepted; anything that exists as a file, or is not a record, is a file. A user (not an
// operator) of the supervisor names records only: no file of theirs is read as root.
func resolveRecord(c *cli.Context, file string) string {
	rs := records.Open(c.String("root"))
	if p := peer(c); p != nil && !p.Operator {
		if v, err := rs.Current(file); err == nil {
			return rs.File(v.Name, v.N)
		}
		return filepath.Join(c.String("root"), "workshops", "no-such-record", filepath.Base(file))
	}
	path := hostPath(c, file)
	if _, err := os.Stat(path); err == nil || !records.IsName(file) {
		return path
	}
	if v, err := rs.Current(file); err == nil {
		return rs.File(v.Name, v.N)
	}
	return path
}

// hostPath is a path from the command line: relative to the caller's working directory, which is the
// client's when the supervisor runs the command for an operator (and only then: a user's paths are
// never resolved by the supervisor).
func hostPath(c *cli.Context, path string) string {
	if p := peer(c); p != nil && p.Operator && path != "" && !filepath.IsAbs(path) {
		if dir := supervisor.ClientDir(c.Context); dir != "" {
			return filepath.Join(dir, path)
		}
	}
	return path
}

// loadRecipe reads the recipe named by the first argument (or ./workshop.toml).
// Grants of the store root in use are refused along with the defaults.
func loadRecipe(c *cli.Context) (*recipe.Recipe, error) {
	if c.NArg() > 1 {
		return nil, usageError("want at most one recipe FILE")
	}
	file := c.Args().First()
	if file == "" {
		file = defaultRecipe
	}
	r, err := loadRecipeFile(c, file)
	if err != nil {
		return nil, err
	}
	logger(c).Debug("recipe loaded", "file", file, "name", r.Name)
	return r, nil
}

func plural(n int, noun string) string {
	if n == 1 {
		return fmt.Sprintf("1 %s", noun)
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// recipeJSON is the --json form of a checked recipe: names as they would be
// written in the file, so scripts need not know the Go types.
func recipeJSON(r *recipe.Recipe) any {
	type source struct {
		URL        string   `json:"url"`
		Suite      string   `json:"suite"`
		Components []string `json:"components"`
		Key        string   `json:"key"`
	}
	type grant struct {
		Path string `json:"path"`
		Mode string `json:"mode"`
	}
	type out struct {
		File string `json:"file"`
		Name string `json:"name"`
		Seed string `json:"seed"`
		Apt  struct {
			Mirror   string   `json:"mirror"`
			Packages []string `json:"packages"`
			Sources  []source `json:"sources"`
		} `json:"apt"`
		Pip struct {
			Index    string   `json:"index"`
			Packages []string `json:"packages"`
		} `json:"pip"`
		Network struct {
			Profile string   `json:"profile"`
			Allow   []string `json:"allow"`
		} `json:"network"`
		Grants []grant `json:"grants"`
	}
	o := out{File: r.File, Name: r.Name, Seed: r.Seed.Raw, Grants: []grant{}}
	o.Apt.Mirror, o.Apt.Packages, o.Apt.Sources = r.Apt.Mirror, []string{}, []source{}
	for _, p := range r.Apt.Packages {
		o.Apt.Packages = append(o.Apt.Packages, p.String())
	}
	for _, s := range r.Apt.Sources {
		o.Apt.Sources = append(o.Apt.Sources, source{s.URL, s.Suite, s.Components, s.Key})
	}
	o.Pip.Index, o.Pip.Packages = r.Pip.Index, []string{}
	for _, p := range r.Pip.Packages {
		o.Pip.Packages = append(o.Pip.Packages, p.String())
	}
	o.Network.Profile, o.Network.Allow = r.Network.Profile, []string{}
	for _, h := range r.Network.Allow {
		o.Network.Allow = append(o.Network.Allow, h.String())
	}
	for _, g := range r.Grants {
		o.Grants = append(o.Grants, grant{g.Path, g.Mode})
	}
	return o
}
