package main

import (
	"errors"
	"io"
	"io/fs"
	"os"

	"github.com/urfave/cli/v2"
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
			s, err := openStore(c)
			if err != nil {
				return err
			}
			defer s.Close()
			p, err := parsePathArg(s, c.Args().First())
			if err != nil {
				return err
			}
			f, err := os.Open(s.LogFile(p))
			if errors.Is(err, fs.ErrNotExist) {
				return withHint(exitFailure, errors.New("no build log for "+p.String()),
					"only paths built on this machine have logs: fetched and added paths have none")
			} else if err != nil {
				return err
			}
			defer f.Close()
			_, err = io.Copy(c.App.Writer, f)
			return err
		},
	}
}
