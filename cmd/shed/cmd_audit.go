package main

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"toolshed.dev/shed/app"
)

func cmdAudit() *cli.Command {
	return &cli.Command{
		Name:  "audit",
		Usage: "show the audit log: every privileged action and Bench event, hash-chained (operators)",
		Description: "Every operation that changes something (and every refusal: past a bounded rate per user and\n" +
			"operation, counted in an audit.dropped entry), every Bench's start and end, and every network\n" +
			"destination a Bench's proxy allowed or refused, with who asked (as the kernel said), the Bench,\n" +
			"the Workshop and version, and a promotion's diff hash. An operation that changes authority\n" +
			"(records, proposals, keys, the store) has an INTENT entry before it acts and its outcome after.\n" +
			"Every field is bounded: a longer value is cut and marked with its length and hash. Entries are\n" +
			"chained by hash: `shed audit verify` finds one changed, removed or moved, cut from the end, a\n" +
			"line that is not exactly one entry, and a head that lags. Secrets are never in it.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "user", Usage: "only `USER`'s entries"},
			&cli.StringFlag{Name: "bench", Usage: "only `BENCH`'s entries"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return usageError("audit takes no arguments (or: shed audit verify)")
			}
			res, err := call[app.AuditResult](c, "audit.ls", &app.AuditRequest{User: c.String("user"), Bench: c.String("bench")})
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(c, res.Entries)
			}
			tw := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "SEQ\tTIME\tUSER\tEVENT\tBENCH\tWORKSHOP\tDETAIL")
			for _, e := range res.Entries {
				ws := e.Workshop
				if e.Version > 0 {
					ws = fmt.Sprintf("%s v%d", ws, e.Version)
				}
				detail := e.Detail
				for _, more := range []string{e.Dest, e.DiffSHA256} {
					if more != "" {
						detail = more + " " + detail
					}
				}
				if e.Error != "" {
					detail = "REFUSED/FAILED " + e.Error + " " + detail
				}
				if e.Intent {
					detail = "INTENT " + detail
				} else if e.Of > 0 {
					detail = fmt.Sprintf("(intent %d) %s", e.Of, detail)
				}
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", e.Seq, e.Time.Local().Format(time.DateTime), e.User, e.Event, e.Bench, ws, detail)
			}
			return tw.Flush()
		},
		Subcommands: []*cli.Command{{
			Name:  "verify",
			Usage: "check the audit log's chain: exit 4 if an entry was changed, removed, moved or cut, a line is not exactly one entry, or the head lags",
			Action: func(c *cli.Context) error {
				res, err := call[app.AuditVerifyResult](c, "audit.verify", &app.AuditVerifyRequest{})
				if err != nil {
					return err
				}
				if c.Bool("json") {
					if err := printJSON(c, res); err != nil {
						return err
					}
				} else {
					for _, p := range res.Problems {
						fmt.Fprintf(c.App.Writer, "problem: line %d: %s\n", p.Line, p.What)
					}
					fmt.Fprintf(c.App.Writer, "checked %d entries: %d problems\n", res.Entries, len(res.Problems))
				}
				if len(res.Problems) > 0 {
					return withHint(exitProblems, fmt.Errorf("the audit log has %d problems", len(res.Problems)),
						"the log was edited outside shed: keep a copy for the investigation; new entries chain on from the head")
				}
				return nil
			},
		}},
	}
}
