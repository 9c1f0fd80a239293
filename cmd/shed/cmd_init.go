package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"toolshed.dev/shed/app"
)

func cmdInit() *cli.Command {
	return &cli.Command{
		Name:  "init",
		Usage: "create the store (idempotent)",
		Description: "Creates the store root (default /var/lib/toolshed) with its directories, root-only\n" +
			"(mode 0700), a config.toml, and the store's ed25519 signing key (trust/signing.sec), with\n" +
			"which every path it builds is signed (docs/trust.md). Running it again on an existing store\n" +
			"changes nothing but tightens permissions (and makes the key if there is none).",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "key-name", Usage: "`NAME` of the signing key, as other stores will list it (default: HOSTNAME-XXXXXX-1, a random suffix so that two stores are told apart)"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return usageError("init takes no arguments")
			}
			res, err := call[app.InitResult](c, "init", &app.InitRequest{KeyName: c.String("key-name")})
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(c, res)
			}
			fmt.Fprintf(c.App.Writer, "initialized store at %s\n", res.Root)
			if res.NewKey {
				fmt.Fprintf(c.App.Writer, "signing key: %s\n", res.PublicKey)
			}
			return nil
		},
	}
}
