package main

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/user"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"toolshed.dev/shed/proposal"
	"toolshed.dev/shed/records"

	"github.com/pmezard/go-difflib/difflib"
	"github.com/urfave/cli/v2"
	"golang.org/x/term"

	"toolshed.dev/shed/supervisor"
)

func cmdWorkshop() *cli.Command {
	return &cli.Command{
		Name:  "workshop",
		Usage: "the canonical Workshop records: versions of recipes and locks, promoted from proposals",
		Description: "A record is the canonical recipe and lock of a Workshop, versioned, written only by the\n" +
			"supervisor (or by root without one). Agents propose (`shed bench propose`); a human reads\n" +
			"the diff and promotes. A record's name is accepted wherever a recipe file is.",
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
						return usageError("workshop add wants one recipe FILE")
					}
					r, err := loadRecipeFile(c, c.Args().First())
					if err != nil {
						return err
					}
					s, err := openStore(c)
					if err != nil {
						return err
					}
					defer s.Close()
					if _, _, err := lockedPlan(c, s, r, false); err != nil {
						return err
					}
					files, err := records.ReadFiles(r)
					if err != nil {
						return err
					}
					v, err := records.Open(s.Root()).Add(c.Context, records.Version{Name: r.Name, By: caller(c), Users: c.StringSlice("allow")}, files, nil)
					if err != nil {
						return withHint(exitFailure, err, "`shed workshop ls` lists the records; a record changes through `shed bench propose` and `shed workshop promote`")
					}
					if c.Bool("json") {
						return printJSON(c, v)
					}
					fmt.Fprintf(c.App.Writer, "recorded %s version %d\n", v.Name, v.N)
					return nil
				},
			},
			{
				Name:      "allow",
				Usage:     "set who (besides operators) may realize a record and launch its Benches (operators)",
				ArgsUsage: "NAME [USER|@GROUP...]",
				Description: "Replaces the list: with no USER, only operators may. Users never get grants, and reach\n" +
					"the store only through the supervisor.",
				Action: func(c *cli.Context) error {
					if c.NArg() < 1 {
						return usageError("workshop allow wants a record NAME and the users")
					}
					s, err := openStore(c)
					if err != nil {
						return err
					}
					defer s.Close()
					v, err := records.Open(s.Root()).Allow(c.Args().First(), c.Args().Slice()[1:])
					if err != nil {
						return recordErr(err)
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
					rs := records.Open(c.String("root"))
					names, err := rs.Names()
					if err != nil {
						return err
					}
					var vs []*records.Version
					for _, n := range names {
						v, err := rs.Current(n)
						if err != nil {
							return err
						}
						vs = append(vs, v)
					}
					if c.Bool("json") {
						return printJSON(c, vs)
					}
					tw := tabwriter.NewWriter(c.App.Writer, 0, 0, 2, ' ', 0)
					fmt.Fprintln(tw, "NAME\tVERSION\tSINCE\tBY")
					for _, v := range vs {
						fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", v.Name, v.N, v.Time.Local().Format(time.DateTime), v.By)
					}
					return tw.Flush()
				},
			},
			{
				Name:      "show",
				Usage:     "print a record's recipe (the current version, or --version N)",
				ArgsUsage: "NAME",
				Flags:     []cli.Flag{&cli.IntFlag{Name: "version", Usage: "version `N`"}},
				Action: func(c *cli.Context) error {
					rs, v, err := recordVersion(c, c.Int("version"))
					if err != nil {
						return err
					}
					b, err := os.ReadFile(rs.File(v.Name, v.N))
					if err != nil {
						return err
					}
					if c.Bool("json") {
						return printJSON(c, map[string]any{"version": v, "recipe": string(b), "file": rs.File(v.Name, v.N)})
					}
					_, err = c.App.Writer.Write(b)
					return err
				},
			},
			{
				Name:      "log",
				Usage:     "list a record's versions",
				ArgsUsage: "NAME",
				Action: func(c *cli.Context) error {
					if c.NArg() != 1 {
						return usageError("workshop log wants a record NAME")
					}
					vs, err := records.Open(c.String("root")).Log(c.Args().First())
					if err != nil {
						return recordErr(err)
					}
					if c.Bool("json") {
						return printJSON(c, vs)
					}
					for _, v := range vs {
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
				Name:      "diff",
				Usage:     "diff two versions of a record (default: the previous and the current)",
				ArgsUsage: "NAME [A [B]]",
				Action: func(c *cli.Context) error {
					if c.NArg() < 1 || c.NArg() > 3 {
						return usageError("workshop diff wants NAME [A [B]]")
					}
					rs := records.Open(c.String("root"))
					cur, err := rs.Current(c.Args().First())
					if err != nil {
						return recordErr(err)
					}
					a, b := cur.N-1, cur.N
					for i, dst := range []*int{&a, &b} {
						if s := c.Args().Get(i + 1); s != "" {
							if *dst, err = strconv.Atoi(s); err != nil {
								return usageError("version %q is not a number", s)
							}
						}
					}
					var out strings.Builder
					for _, f := range []string{"workshop.toml", "workshop.lock"} {
						read := func(n int) string {
							if n < 1 {
								return ""
							}
							b, _ := os.ReadFile(strings.TrimSuffix(rs.File(cur.Name, n), "workshop.toml") + f)
							return string(b)
						}
						ud, _ := difflib.GetUnifiedDiffString(difflib.UnifiedDiff{A: difflib.SplitLines(read(a)), B: difflib.SplitLines(read(b)),
							FromFile: fmt.Sprintf("a/%s (version %d)", f, a), ToFile: fmt.Sprintf("b/%s (version %d)", f, b), Context: 3})
						out.WriteString(ud)
					}
					_, err = fmt.Fprint(c.App.Writer, proposal.Visible(out.String()))
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
					"«U+XXXX», and a WIDENS ACCESS line when it opens network destinations. Asks on the terminal;\n" +
					"the answer confirms exactly the diff shown, for the record version it was made against,\n" +
					"once: a proposal edited after it was shown, a record that changed in between, or a\n" +
					"proposal promoted before are refused. Then realizes the new version (a gc root each).",
				Action: func(c *cli.Context) error {
					if c.NArg() != 1 {
						return usageError("workshop promote wants a PROPOSAL id (`shed bench propose` prints it)")
					}
					s, err := openStore(c)
					if err != nil {
						return err
					}
					defer s.Close()
					sv := proposal.New(s, newBuilder(c, s, false))
					p, diff, err := sv.Get(c.Args().First())
					if err != nil {
						return withHint(exitUsage, err, "`shed bench propose BENCH` prints a proposal's id")
					}
					fmt.Fprint(c.App.Writer, proposal.Visible(diff))
					in, ok := c.App.Reader.(*os.File)
					if !ok || !term.IsTerminal(int(in.Fd())) {
						return withHint(exitUsage, errors.New("promotion needs a human at a terminal: stdin is not one"),
							"run `shed workshop promote` in a terminal; a proposal is confirmed by a person, not by a script")
					}
					fmt.Fprintf(c.App.ErrWriter, "Promote proposal %s as version %d of %s? Type yes to confirm: ", p.ID, p.Base+1, p.Workshop)
					answer, _ := bufio.NewReader(in).ReadString('\n')
					if strings.TrimSpace(answer) != "yes" {
						return withHint(exitFailure, errors.New("not confirmed: nothing changed"), "type yes to promote")
					}
					h := sha256.Sum256([]byte(diff))
					v, err := sv.Promote(c.Context, p.ID, hex.EncodeToString(h[:]), caller(c))
					if err != nil {
						return withHint(exitFailure, err, "`shed bench propose` makes a fresh proposal against the current record")
					}
					fmt.Fprintf(c.App.Writer, "promoted %s version %d\n", v.Name, v.N)
					if c.Bool("no-realize") {
						return nil
					}
					w, err := realizeWorkshop(c, sv.Records.File(v.Name, v.N), false)
					if err != nil {
						return err
					}
					w.s.Close()
					for _, l := range locations(w.s, w.res.Layers) {
						fmt.Fprintln(c.App.Writer, l)
					}
					return nil
				},
			},
		},
	}
}

func recordVersion(c *cli.Context, n int) (*records.Workshops, *records.Version, error) {
	if c.NArg() != 1 {
		return nil, nil, usageError("want a record NAME")
	}
	rs := records.Open(c.String("root"))
	var v *records.Version
	var err error
	if n > 0 {
		v, err = rs.Get(c.Args().First(), n)
	} else {
		v, err = rs.Current(c.Args().First())
	}
	return rs, v, recordErr(err)
}

func recordErr(err error) error {
	if errors.Is(err, records.ErrNoRecord) {
		return withHint(exitUsage, err, "`shed workshop ls` lists the records; `shed workshop add FILE` makes one")
	}
	return err
}

// callerKey carries the supervisor's peer into a command it runs for a client.
type callerKey struct{}

// peer is the client the supervisor runs this command for, or nil when shed works on its store directly.
func peer(c *cli.Context) *supervisor.Peer {
	p, _ := c.Context.Value(callerKey{}).(*supervisor.Peer)
	return p
}

// caller names who runs this command: the peer of the supervisor's socket, or this process's user.
func caller(c *cli.Context) string {
	if p := peer(c); p != nil {
		return p.User
	}
	if u, err := user.Current(); err == nil {
		return u.Username
	}
	return strconv.Itoa(os.Getuid())
}

// proposeCommand is `shed bench propose`.
func proposeCommand() *cli.Command {
	return &cli.Command{
		Name:      "propose",
		Usage:     "propose a new version of a Bench's Workshop from what was installed in it",
		ArgsUsage: "BENCH",
		Description: "Derives a proposal from the live (or kept) Bench: the packages apt marks as manually\n" +
			"installed that the recipe lacks, the pip distributions installed as requested, the network\n" +
			"destinations its proxy refused, pinned to the versions installed, locked. Nothing of the\n" +
			"Bench's files is kept. Prints the proposal's id and diff; an operator promotes it with\n" +
			"`shed workshop promote ID`. Inside a Bench the same is a POST to /run/shed/propose.sock.",
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return usageError("bench propose wants a BENCH")
			}
			s, err := openStore(c)
			if err != nil {
				return err
			}
			defer s.Close()
			sv := proposal.New(s, newBuilder(c, s, false))
			rec, err := ownBench(c, s, c.Args().First())
			if err != nil {
				return err
			}
			p, diff, err := sv.Propose(c.Context, rec.ID)
			if errors.Is(err, proposal.ErrUnfinished) {
				return withHint(exitFailure, err, "finish or undo it in the Bench (`dpkg --configure -a`, `apt-get -f install`, or remove the package), then propose again")
			}
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(c, map[string]any{"proposal": p, "diff": diff})
			}
			fmt.Fprint(c.App.Writer, proposal.Visible(diff))
			fmt.Fprintf(c.App.ErrWriter, "shed: proposal %s: promote with `shed workshop promote %s`\n", p.ID, p.ID)
			return nil
		},
	}
}
