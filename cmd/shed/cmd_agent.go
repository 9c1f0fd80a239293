package main

import (
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"toolshed.dev/shed/app"
)

func cmdAgent() *cli.Command {
	return &cli.Command{
		Name:  "agent",
		Usage: "manage what agent harnesses use to reach the supervisor: API keys for the E2B API (operators)",
		Subcommands: []*cli.Command{{
			Name:  "key",
			Usage: "make, list and remove API keys (E2B_API_KEY for `shed daemon --e2b`)",
			Subcommands: []*cli.Command{{
				Name:      "create",
				Usage:     "make an API key that acts as USER (with USER's roles and limits) and print it",
				ArgsUsage: "USER",
				Description: "Prints the key once: shed keeps only its SHA-256 (in the store's api-keys/, root's).\n" +
					"Give it to the harness as E2B_API_KEY. Prefer a user of its own for each harness: a key of\n" +
					"an operator acts as an operator.",
				Action: func(c *cli.Context) error {
					if c.NArg() != 1 {
						return usageError("shed agent key create USER")
					}
					res, err := call[app.KeyCreateResult](c, "agent.key_create", &app.KeyCreateRequest{User: c.Args().First()})
					if err != nil {
						return err
					}
					if c.Bool("json") {
						return printJSON(c, res)
					}
					fmt.Fprintln(c.App.Writer, res.Key)
					fmt.Fprintf(c.App.ErrWriter, "shed: key %s acts as %s; it is not shown again (`shed agent key rm %s` revokes it)\n", res.ID, res.User, res.ID)
					return nil
				},
			}, {
				Name:  "ls",
				Usage: "list the API keys: id, user, created (never a key)",
				Action: func(c *cli.Context) error {
					res, err := call[app.KeyListResult](c, "agent.key_ls", &app.Empty{})
					if err != nil {
						return err
					}
					if c.Bool("json") {
						return printJSON(c, res.Keys)
					}
					tw := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
					fmt.Fprintln(tw, "ID\tUSER\tCREATED")
					for _, k := range res.Keys {
						fmt.Fprintf(tw, "%s\t%s\t%s\n", k.ID, k.User, k.Created.Local().Format(time.DateTime))
					}
					return tw.Flush()
				},
			}, {
				Name:      "rm",
				Usage:     "remove an API key (or every key of a user: user:NAME); its sandboxes are refused from then on",
				ArgsUsage: "ID|user:NAME",
				Action: func(c *cli.Context) error {
					if c.NArg() != 1 {
						return withHint(exitUsage, errors.New("agent key rm wants one key ID, or user:NAME for every key of a user"), "`shed agent key ls` lists the keys")
					}
					res, err := call[app.KeyListResult](c, "agent.key_rm", &app.KeyRemoveRequest{ID: c.Args().First()})
					if err != nil {
						return err
					}
					if c.Bool("json") {
						return printJSON(c, res.Keys)
					}
					for _, k := range res.Keys {
						fmt.Fprintf(c.App.Writer, "removed key %s of %s\n", k.ID, k.User)
					}
					return nil
				},
			}},
		}},
	}
}
