package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"toolshed.dev/shed/store"
)

func cmdInit() *cli.Command {
	return &cli.Command{
		Name:  "init",
		Usage: "create the store (idempotent)",
		Description: "Creates the store root (default /var/lib/toolshed) with its directories, root-only\n" +
			"(mode 0700), and a config.toml. Running it again on an existing store changes nothing\n" +
			"but tightens permissions.",
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return usageError("init takes no arguments")
			}
			s, err := store.Init(c.String("root"))
			if err != nil {
				return err
			}
			defer s.Close()
			if c.Bool("json") {
				return printJSON(c, map[string]string{"root": s.Root(), "store_dir": s.StoreDir()})
			}
			fmt.Fprintf(c.App.Writer, "initialized store at %s\n", s.Root())
			return nil
		},
	}
}
