package main

import (
	"fmt"
	"slices"

	"github.com/urfave/cli/v2"

	"toolshed.dev/shed/store"
	"toolshed.dev/shed/trust"
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
					s, t, err := openStoreTrust(c)
					if err != nil {
						return err
					}
					defer s.Close()
					retired, err := t.Keys.Retired()
					if err != nil {
						return err
					}
					trusted := s.Config().TrustedPublicKeys
					if c.Bool("json") {
						var r []string
						for _, k := range retired {
							r = append(r, k.String())
						}
						return printJSON(c, map[string]any{"public_key": t.Key.Public().String(), "retired": r, "trusted": trusted})
					}
					fmt.Fprintf(c.App.Writer, "signing key: %s\n", t.Key.Public())
					for _, k := range retired {
						fmt.Fprintf(c.App.Writer, "retired:     %s\n", k)
					}
					for _, k := range trusted {
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
					s, t, err := openStoreTrust(c)
					if err != nil {
						return err
					}
					defer s.Close()
					_, err = fmt.Fprintln(c.App.Writer, t.Key.Public())
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
					s, t, err := openStoreTrust(c)
					if err != nil {
						return err
					}
					defer s.Close()
					name := c.String("name")
					if name == "" {
						name = nextKeyName(t.Key.Name)
					}
					old, cur, err := t.Keys.Rotate(name)
					if err != nil {
						return err
					}
					n := 0
					if c.Bool("resign") {
						t2, err := openTrust(s)
						if err != nil {
							return err
						}
						infos, _, err := s.All()
						if err != nil {
							return err
						}
						for _, p := range store.SortedPaths(infos) {
							if err := t2.Resign(c.Context, p); err != nil {
								return err
							}
							n++
						}
					}
					if c.Bool("json") {
						return printJSON(c, map[string]any{"old": old.String(), "new": cur.Public().String(), "resigned": n})
					}
					fmt.Fprintf(c.App.Writer, "retired %s\nsigning key: %s\n", old.Name, cur.Public())
					if n > 0 {
						fmt.Fprintf(c.App.Writer, "signed %d paths again\n", n)
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
						return usageError("key trust wants one public key, NAME:BASE64 (shed key export prints one)")
					}
					k, err := trust.ParsePublicKey(c.Args().First())
					if err != nil {
						return withHint(exitUsage, err, "`shed key export` on the signing store prints its public key")
					}
					s, err := openStore(c)
					if err != nil {
						return err
					}
					defer s.Close()
					return s.UpdateConfig(func(cfg *store.Config) error {
						if !slices.Contains(cfg.TrustedPublicKeys, k.String()) {
							cfg.TrustedPublicKeys = append(cfg.TrustedPublicKeys, k.String())
						}
						return nil
					})
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
					s, err := openStore(c)
					if err != nil {
						return err
					}
					defer s.Close()
					arg := c.Args().First()
					found := false
					err = s.UpdateConfig(func(cfg *store.Config) error {
						cfg.TrustedPublicKeys = slices.DeleteFunc(cfg.TrustedPublicKeys, func(k string) bool {
							pk, err := trust.ParsePublicKey(k)
							match := k == arg || (err == nil && pk.Name == arg)
							found = found || match
							return match
						})
						return nil
					})
					if err == nil && !found {
						return withHint(exitUsage, fmt.Errorf("no trusted key %q", arg), "`shed key show` lists the trusted keys")
					}
					return err
				},
			},
		},
	}
}

func openStoreTrust(c *cli.Context) (*store.Store, *trust.Store, error) {
	s, err := openStore(c)
	if err != nil {
		return nil, nil, err
	}
	t, err := openTrust(s)
	if err != nil {
		s.Close()
		return nil, nil, err
	}
	return s, t, nil
}

// nextKeyName turns host-1 into host-2 (and a name without a number into name-2).
func nextKeyName(name string) string {
	i := len(name)
	for i > 0 && name[i-1] >= '0' && name[i-1] <= '9' {
		i--
	}
	n := 0
	fmt.Sscan(name[i:], &n)
	if i == len(name) || i == 0 || name[i-1] != '-' {
		return name + "-2"
	}
	return fmt.Sprintf("%s%d", name[:i], n+1)
}
