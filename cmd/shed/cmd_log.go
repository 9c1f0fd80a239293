package main

import (
	"fmt"
	"io"

	"github.com/urfave/cli/v2"

	"toolshed.dev/shed/app"
)

func cmdLog() *cli.Command {
	return &cli.Command{
		Name:      "log",
		Usage:     "print the build log of a store path",
		ArgsUsage: "PATH",
		Description: "Every build keeps its output (and, for builds with network, each destination the proxy\n" +
			"allowed or refused) in a log beside the store. Logs are never part of a path.",
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return usageError("log wants one PATH")
			}
			res, err := call[app.TextResult](c, "log", &app.PathRequest{Path: c.Args().First()})
			if err != nil {
				return err
			}
			if _, err := io.WriteString(c.App.Writer, res.Text); err != nil {
				return err
			}
			if res.Truncated {
				fmt.Fprintf(c.App.ErrWriter, "shed: the log goes on: these are its first %d MiB\n", app.MaxText>>20)
			}
			return nil
		},
	}
}
