package main

import (
	"errors"
	"fmt"

	"github.com/urfave/cli/v2"

	"toolshed.dev/shed/app"
)

func cmdKey() *cli.Command {
	return &cli.Command{
		Name:  "key",
		Usage: "the store's signing key and the keys it trusts",
		Description: "Every path the store builds is signed with its ed25519 key (made by `shed init`).\n" +
			"A path from a cache or an import is used only if a trusted key signed it (docs/trust.md).",
		Subcommands: []*cli.Command{
			{
				Name:  "show",
				Usage: "print the signing key's public half, the retired keys and the trusted keys",
				Action: func(c *cli.Context) error {
					res, err := call[app.KeysResult](c, "key.show", &app.KeyShowRequest{})
					if err != nil {
						return err
					}
					if c.Bool("json") {
						return printJSON(c, res)
					}
					fmt.Fprintf(c.App.Writer, "signing key: %s\n", res.PublicKey)
					for _, k := range res.Retired {
						fmt.Fprintf(c.App.Writer, "retired:     %s\n", k)
					}
					for _, k := range res.Trusted {
						fmt.Fprintf(c.App.Writer, "trusted:     %s\n", k)
					}
					return nil
				},
			},
			{
				Name:        "export",
				Usage:       "print the signing key's public half (NAME:BASE64), for other stores to trust",
				Description: "On another machine: shed key trust \"$(shed key export)\" (or add it to trusted_public_keys).",
				Action: func(c *cli.Context) error {
					res, err := call[app.KeysResult](c, "key.show", &app.KeyShowRequest{})
					if err != nil {
						return err
					}
					_, err = fmt.Fprintln(c.App.Writer, res.PublicKey)
					return err
				},
			},
			{
				Name:  "rotate",
				Usage: "replace the signing key; the old public half stays trusted for what it signed",
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "name", Usage: "`NAME` of the new key (default: the old name with its number increased)"},
					&cli.BoolFlag{Name: "resign", Usage: "sign every path again with the new key"},
				},
				Description: "The old secret key is destroyed; its public half moves to trust/retired and still\n" +
					"verifies what it signed here. Other stores must trust the new key (shed key export).",
				Action: func(c *cli.Context) error {
					res, err := call[app.KeyRotateResult](c, "key.rotate", &app.KeyRotateRequest{Name: c.String("name"), Resign: c.Bool("resign")})
					if err != nil {
						return err
					}
					if c.Bool("json") {
						return printJSON(c, res)
					}
					fmt.Fprintf(c.App.Writer, "retired %s\nsigning key: %s\n", keyName(res.Old), res.New)
					if res.Resigned > 0 {
						fmt.Fprintf(c.App.Writer, "signed %d paths again\n", res.Resigned)
					}
					return nil
				},
			},
			{
				Name:      "trust",
				Usage:     "trust a public key (NAME:BASE64) for paths from caches and imports",
				ArgsUsage: "NAME:BASE64",
				Action: func(c *cli.Context) error {
					if c.NArg() != 1 {
						return withHint(exitUsage, errors.New("key trust wants one public key, NAME:BASE64"), "`shed key export` on the signing store prints one")
					}
					res, err := call[app.KeyResult](c, "key.trust", &app.KeyRequest{Key: c.Args().First()})
					if err != nil {
						return err
					}
					if c.Bool("json") {
						return printJSON(c, res)
					}
					if !res.Changed {
						_, err = fmt.Fprintf(c.App.Writer, "%s was trusted already\n", res.Keys[0])
						return err
					}
					_, err = fmt.Fprintf(c.App.Writer, "trusted %s\n", res.Keys[0])
					return err
				},
			},
			{
				Name:      "untrust",
				Usage:     "stop trusting a key (by NAME or NAME:BASE64)",
				ArgsUsage: "KEY",
				Action: func(c *cli.Context) error {
					if c.NArg() != 1 {
						return usageError("key untrust wants one key name or public key")
					}
					res, err := call[app.KeyResult](c, "key.untrust", &app.KeyRequest{Key: c.Args().First()})
					if err != nil {
						return err
					}
					if c.Bool("json") {
						return printJSON(c, res)
					}
					for _, k := range res.Keys {
						fmt.Fprintf(c.App.Writer, "no longer trusted: %s\n", k)
					}
					return nil
				},
			},
		},
	}
}
