package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/urfave/cli/v2"

	"toolshed.dev/shed/store"
	"toolshed.dev/shed/trust"
)

// defaultKeyName names a store's first key after the host, as Nix's cache keys are named.
func defaultKeyName() string {
	h, _ := os.Hostname()
	h = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '-' {
			return r
		}
		return '-'
	}, h)
	if h == "" || strings.Trim(h, ".-") != h {
		h = "shed"
	}
	if len(h) > 60 {
		h = h[:60]
	}
	return h + "-1"
}

func cmdInit() *cli.Command {
	return &cli.Command{
		Name:  "init",
		Usage: "create the store (idempotent)",
		Description: "Creates the store root (default /var/lib/toolshed) with its directories, root-only\n" +
			"(mode 0700), a config.toml, and the store's ed25519 signing key (trust/signing.sec), with\n" +
			"which every path it builds is signed (docs/trust.md). Running it again on an existing store\n" +
			"changes nothing but tightens permissions (and makes the key if there is none).",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "key-name", Usage: "`NAME` of the signing key, as other stores will list it (default: HOSTNAME-1)"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return usageError("init takes no arguments")
			}
			s, err := store.Init(c.String("root"))
			if err != nil {
				return err
			}
			defer s.Close()
			name := c.String("key-name")
			if name == "" {
				name = defaultKeyName()
			}
			key, made, err := trust.OpenKeys(s.Root()).Ensure(name)
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(c, map[string]any{"root": s.Root(), "store_dir": s.StoreDir(), "public_key": key.Public().String(), "new_key": made})
			}
			fmt.Fprintf(c.App.Writer, "initialized store at %s\n", s.Root())
			if made {
				fmt.Fprintf(c.App.Writer, "signing key: %s\n", key.Public())
			}
			return nil
		},
	}
}
