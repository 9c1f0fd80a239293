package main

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"
	"golang.org/x/term"

	"toolshed.dev/shed/app"
	"toolshed.dev/shed/proposal"
	"toolshed.dev/shed/records"
)

func cmdWorkshop() *cli.Command {
	return &cli.Command{
		Name:  "workshop",
		Usage: "the canonical Workshop records: versions of recipes and locks, promoted from proposals",
		Description: "A record is the canonical recipe and lock of a Workshop, versioned, written only by the\n" +
			"supervisor (or by root without one). Agents propose (`shed bench propose`); a human reads\n" +
			"the diff and promotes. A record's name is accepted wherever a recipe file is (a record comes\n" +
			"first: name a file of that name as ./NAME).",
		Subcommands: []*cli.Command{
			{
				Name:      "add",
				Usage:     "register a recipe (and its lock) as a new Workshop record (operators)",
				ArgsUsage: "FILE",
				Flags: []cli.Flag{
					&cli.StringSliceFlag{Name: "allow", Usage: "`USER` (or @GROUP) who may realize it and launch its Benches (repeatable)"},
				},
				Action: func(c *cli.Context) error {
					if c.NArg() != 1 {
						if c.NArg() > 1 && strings.HasPrefix(c.Args().Get(1), "-") {
							return usageError("workshop add: flags go before FILE: shed workshop add --allow USER FILE")
						}
						return usageError("workshop add wants one recipe FILE")
					}
					v, err := call[records.Version](c, "workshop.add", &app.WorkshopAddRequest{File: c.Args().First(), Allow: c.StringSlice("allow")})
					if err != nil {
						return err
					}
					if c.Bool("json") {
						return printJSON(c, v)
					}
					fmt.Fprintf(c.App.Writer, "recorded %s version %d\n", v.Name, v.N)
					return nil
				},
			},
			{
				Name:         "allow",
				BashComplete: completeRecords,
				Usage:        "set who (besides operators) may realize a record and launch its Benches (operators)",
				ArgsUsage:    "NAME [USER|@GROUP...]",
				Description: "Replaces the list: with no USER, only operators may. Each USER and @GROUP must exist on\n" +
					"this host (make an agent harness's user first: useradd --system NAME). Users never get grants,\n" +
					"and reach the store only through the supervisor.",
				Action: func(c *cli.Context) error {
					if c.NArg() < 1 {
						return usageError("workshop allow wants a record NAME and the users")
					}
					v, err := call[records.Version](c, "workshop.allow", &app.WorkshopAllowRequest{Name: c.Args().First(), Users: c.Args().Slice()[1:]})
					if err != nil {
						return err
					}
					if c.Bool("json") {
						return printJSON(c, v)
					}
					fmt.Fprintf(c.App.Writer, "%s: allowed %s\n", v.Name, strings.Join(v.Users, ", "))
					return nil
				},
			},
			{
				Name:  "ls",
				Usage: "list the Workshop records",
				Action: func(c *cli.Context) error {
					res, err := call[app.WorkshopListResult](c, "workshop.ls", &app.WorkshopListRequest{})
					if err != nil {
						return err
					}
					if c.Bool("json") {
						return printJSON(c, res.Records)
					}
					tw := tabwriter.NewWriter(c.App.Writer, 0, 0, 2, ' ', 0)
					fmt.Fprintln(tw, "NAME\tVERSION\tSINCE\tBY")
					for _, v := range res.Records {
						fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", v.Name, v.N, v.Time.Local().Format(time.DateTime), v.By)
					}
					return tw.Flush()
				},
			},
			{
				Name:         "show",
				BashComplete: completeRecords,
				Usage:        "print a record's recipe (the current version, or --version N)",
				ArgsUsage:    "NAME",
				Flags:        []cli.Flag{&cli.IntFlag{Name: "version", Usage: "version `N`", DefaultText: "the current one"}},
				Action: func(c *cli.Context) error {
					if c.NArg() != 1 {
						return usageError("workshop show wants a record NAME")
					}
					res, err := call[app.WorkshopShowResult](c, "workshop.show", &app.WorkshopShowRequest{Name: c.Args().First(), Version: c.Int("version")})
					if err != nil {
						return err
					}
					if c.Bool("json") {
						return printJSON(c, res)
					}
					_, err = io.WriteString(c.App.Writer, res.Recipe)
					return err
				},
			},
			{
				Name:         "log",
				BashComplete: completeRecords,
				Usage:        "list a record's versions",
				ArgsUsage:    "NAME",
				Action: func(c *cli.Context) error {
					if c.NArg() != 1 {
						return usageError("workshop log wants a record NAME")
					}
					res, err := call[app.WorkshopLogResult](c, "workshop.log", &app.WorkshopRequest{Name: c.Args().First()})
					if err != nil {
						return err
					}
					if c.Bool("json") {
						return printJSON(c, res.Versions)
					}
					for _, v := range res.Versions {
						how := "added"
						if v.Proposal != "" {
							how = "promoted proposal " + v.Proposal
						}
						fmt.Fprintf(c.App.Writer, "version %d  %s  %s by %s\n", v.N, v.Time.Local().Format(time.DateTime), how, v.By)
					}
					return nil
				},
			},
			{
				Name:         "diff",
				BashComplete: completeRecords,
				Usage:        "diff two versions of a record (default: the previous and the current)",
				ArgsUsage:    "NAME [A [B]]",
				Action: func(c *cli.Context) error {
					if c.NArg() < 1 || c.NArg() > 3 {
						return usageError("workshop diff wants NAME [A [B]]")
					}
					req := &app.WorkshopDiffRequest{Name: c.Args().First()}
					for i, dst := range []**int{&req.A, &req.B} {
						if s := c.Args().Get(i + 1); s != "" {
							n, err := strconv.Atoi(s)
							if err != nil {
								return usageError("version %q is not a number", s)
							}
							*dst = &n
						}
					}
					res, err := call[app.DiffText](c, "workshop.diff", req)
					if err != nil {
						return err
					}
					if c.Bool("json") {
						return printJSON(c, res)
					}
					_, err = io.WriteString(c.App.Writer, res.Diff)
					return err
				},
			},
			{
				Name:      "promote",
				Usage:     "show a proposal's diff and, once a human confirms it on a terminal, make it the record's next version (operators)",
				ArgsUsage: "PROPOSAL",
				Flags: []cli.Flag{
					&cli.BoolFlag{Name: "no-realize", Usage: "do not realize the promoted version"},
				},
				Description: "Prints the proposal's diff, with every character outside printable ASCII shown as\n" +
					"«U+XXXX», and a WIDENS ACCESS line when it opens network destinations; on a terminal through\n" +
					"a pager, as git does: $SHED_PAGER, else $PAGER, else less (LESS=FRX unless LESS is set; \"cat\"\n" +
					"or empty: none). Then a summary (packages added, access widened, lines changed per file) and\n" +
					"the question. Asks on the terminal;\n" +
					"the answer confirms exactly the diff shown, for the record version it was made against,\n" +
					"once: a proposal edited after it was shown, a record that changed in between, or a\n" +
					"proposal promoted before are refused. Then realizes the new version (a gc root each).",
				Action: func(c *cli.Context) error {
					if c.NArg() != 1 {
						return withHint(exitUsage, errors.New("workshop promote wants a PROPOSAL id"), "`shed bench propose BENCH` prints it")
					}
					shown, err := call[app.ProposeResult](c, "proposal.show", &app.ProposalRequest{ID: c.Args().First(), ForPromotion: true})
					if ae := (*app.Error)(nil); errors.As(err, &ae) && ae.Code == app.CodeBadRequest {
						// A supervisor older than this shed knows no for_promotion: promote checks the
						// same again, after the diff is shown.
						shown, err = call[app.ProposeResult](c, "proposal.show", &app.ProposalRequest{ID: c.Args().First()})
					}
					if err != nil {
						return err
					}
					p := shown.Proposal
					// A long diff is paged on a terminal (SHED_PAGER, PAGER, less), as git's are.
					if err := page(c.App.Writer, proposal.Visible(shown.Diff)); err != nil {
						return err
					}
					// A person confirms, from the diff on their terminal; a script does not. The
					// confirmation names the exact diff shown, so nothing else can be promoted by it.
					in, ok := c.App.Reader.(*os.File)
					if !ok || !term.IsTerminal(int(in.Fd())) {
						return withHint(exitUsage, errors.New("promotion needs a human at a terminal: stdin is not one"),
							"run `shed workshop promote` in a terminal; a proposal is confirmed by a person, not by a script")
					}
					// What it changes, next to the question: the diff may have scrolled away.
					fmt.Fprintf(c.App.ErrWriter, "shed: proposal %s: %s\n", p.ID, promoteSummary(p, shown.Diff))
					fmt.Fprintf(c.App.ErrWriter, "Promote proposal %s as version %d of %s? Type yes to confirm: ", p.ID, p.Base+1, p.Workshop)
					answer, _ := bufio.NewReader(in).ReadString('\n')
					if strings.TrimSpace(answer) != "yes" {
						return withHint(exitFailure, errors.New("not confirmed: nothing changed"), "type yes to promote")
					}
					h := sha256.Sum256([]byte(shown.Diff))
					res, err := call[app.PromoteResult](c, "workshop.promote", &app.PromoteRequest{ID: p.ID, DiffSHA256: hex.EncodeToString(h[:]), NoRealize: c.Bool("no-realize")})
					if res != nil && res.Version != nil {
						fmt.Fprintf(c.App.Writer, "promoted %s version %d\n", res.Version.Name, res.Version.N)
					}
					if err != nil {
						return err
					}
					for _, l := range res.Layers {
						fmt.Fprintln(c.App.Writer, l)
					}
					return nil
				},
			},
		},
	}
}

// proposeCommand is `shed bench propose`.
func proposeCommand() *cli.Command {
	return &cli.Command{
		Name:         "propose",
		BashComplete: completeBenches,
		Usage:        "propose a new version of a Bench's Workshop from what was installed in it",
		ArgsUsage:    "BENCH",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "quiet", Aliases: []string{"q"}, Usage: "print only the proposal's id, for a script: id=$(shed bench propose -q work)"},
		},
		Description: "Derives a proposal from the live (or kept) Bench: the packages apt marks as manually\n" +
			"installed that the recipe lacks, the pip distributions installed as requested, the network\n" +
			"destinations its proxy refused, pinned to the versions installed, locked. Nothing of the\n" +
			"Bench's files is kept. Prints the proposal's id and diff; an operator promotes it with\n" +
			"`shed workshop promote ID` (which shows the diff again). Inside a Bench the same is a POST\n" +
			"to /run/shed/propose.sock.",
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return usageError("bench propose wants a BENCH")
			}
			res, err := call[app.ProposeResult](c, "bench.propose", &app.BenchRequest{Bench: c.Args().First()})
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(c, res)
			}
			if c.Bool("quiet") {
				_, err := fmt.Fprintln(c.App.Writer, res.Proposal.ID)
				return err
			}
			fmt.Fprint(c.App.Writer, proposal.Visible(res.Diff))
			fmt.Fprintf(c.App.ErrWriter, "shed: proposal %s: promote with `shed workshop promote %s`\n", res.Proposal.ID, res.Proposal.ID)
			return nil
		},
	}
}
