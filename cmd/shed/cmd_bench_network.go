package main

import (
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"

	"toolshed.dev/shed/app"
)

// cmdBenchNetwork replaces a running Bench's network rules (E2B's updateNetwork).
func cmdBenchNetwork() *cli.Command {
	return &cli.Command{
		Name:         "network",
		BashComplete: completeBenches,
		Usage:        "show or replace a running Bench's network rules, within its recipe's network profile",
		Description: "The rules narrow what the recipe's [network] allows, for this Bench only. An entry is an IP address,\n" +
			"a CIDR block, a name, *.name (its subdomains) or 0.0.0.0/0 (everything). --allow wins over --deny;\n" +
			"what neither names is allowed. A change replaces all the rules; it applies to the next connection\n" +
			"and cuts the connections open that the new rules deny. An --allow entry that names nothing of the\n" +
			"profile is refused, and the rules stay as they were. Without flags, the rules in force are shown.\n\n" +
			"   shed bench network NAME --deny 0.0.0.0/0 --allow deb.debian.org   # only the mirror\n" +
			"   shed bench network NAME --clear                                   # the profile alone again",
		ArgsUsage: "BENCH",
		Flags: []cli.Flag{
			&cli.StringSliceFlag{Name: "allow", Usage: "allow `ENTRY`, over any --deny (repeatable)"},
			&cli.StringSliceFlag{Name: "deny", Usage: "deny `ENTRY` (repeatable; 0.0.0.0/0: all that --allow does not name)"},
			&cli.BoolFlag{Name: "no-internet", Usage: "deny everything --allow does not name (as --deny 0.0.0.0/0)"},
			&cli.BoolFlag{Name: "clear", Usage: "remove every rule: the recipe's network profile alone"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return usageError("bench network wants BENCH")
			}
			deny := c.StringSlice("deny")
			if c.Bool("no-internet") {
				deny = append(deny, "0.0.0.0/0")
			}
			allow := c.StringSlice("allow")
			change := len(allow) > 0 || len(deny) > 0
			if change && c.Bool("clear") {
				return usageError("bench network: --clear removes every rule: give it alone, or --allow/--deny alone")
			}
			var res *app.NetworkResult
			var err error
			if change || c.Bool("clear") {
				res, err = call[app.NetworkResult](c, "bench.set_network", &app.SetNetworkRequest{Bench: c.Args().First(), Allow: allow, Deny: deny})
			} else {
				res, err = call[app.NetworkResult](c, "bench.network", &app.BenchRequest{Bench: c.Args().First()})
			}
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(c, res)
			}
			list := func(l []string) string {
				if len(l) == 0 {
					return "-"
				}
				return strings.Join(l, " ")
			}
			fmt.Fprintf(c.App.Writer, "%s: allow %s; deny %s", res.Bench, list(res.Allow), list(res.Deny))
			if res.Cut > 0 {
				fmt.Fprintf(c.App.Writer, "; cut %d open connection(s)", res.Cut)
			}
			fmt.Fprintln(c.App.Writer)
			return nil
		},
	}
}
