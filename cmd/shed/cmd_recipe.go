package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"toolshed.dev/shed/app"
	"toolshed.dev/shed/recipe"
)

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
					"Exits 3 if the recipe is invalid. Writes nothing and reads nothing else: a suite, a package\n" +
					"or a version the mirror (or index) does not have is found by `shed lock` (or realize), and\n" +
					"reported the same way, at its line, with what there is. See docs/recipe.md.",
				Action: func(c *cli.Context) error {
					r, err := loadRecipe(c)
					if err != nil {
						return err
					}
					if c.Bool("json") {
						return printJSON(c, recipeJSON(r))
					}
					fmt.Fprintf(c.App.Writer, "ok: %s: %s, seed %s, %s, %s, %s\n", r.File, r.Name, r.Seed.Raw,
						app.Plural(len(r.Apt.Packages), "apt package"), app.Plural(len(r.Pip.Packages), "pip package"),
						app.Plural(len(r.Grants), "grant"))
					return nil
				},
			},
		},
	}
}

// loadRecipe reads the recipe named by the first argument (or ./workshop.toml). It runs in this
// process, as this user, on a file of theirs: checking a recipe needs no store and no privilege.
func loadRecipe(c *cli.Context) (*recipe.Recipe, error) {
	if c.NArg() > 1 {
		return nil, usageError("want at most one recipe FILE")
	}
	file := c.Args().First()
	if file == "" {
		file = app.DefaultRecipe
	}
	r, err := recipe.Load(file, recipe.Options{ForbiddenPaths: []string{storeRoot(c)}})
	if err != nil {
		return nil, err
	}
	logger(c).Debug("recipe loaded", "file", file, "name", r.Name)
	return r, nil
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
			Secrets []string `json:"secrets,omitempty"`
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
	o.Network.Profile, o.Network.Allow, o.Network.Secrets = r.Network.Profile, []string{}, r.Network.Secrets
	for _, h := range r.Network.Allow {
		o.Network.Allow = append(o.Network.Allow, h.String())
	}
	for _, g := range r.Grants {
		o.Grants = append(o.Grants, grant{g.Path, g.Mode})
	}
	return o
}
