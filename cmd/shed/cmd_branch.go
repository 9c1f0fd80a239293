package main

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"toolshed.dev/shed/app"
)

// The commands of created Benches and their branching: bench create, pause, resume, fork and reset,
// and shed snapshot. Each is one operation of package app, through the supervisor (which keeps
// created Benches); what they make is task state (docs/bench.md, "Branching").

var lifetimeFlag = &cli.StringFlag{Name: "lifetime", Usage: "the supervisor removes the Bench `DURATION` from now (e.g. 30m, 2h; at most 24h; default 1h)"}

// lifetimeSeconds reads --lifetime as whole seconds (0: unset, the default).
func lifetimeSeconds(c *cli.Context) (int64, error) {
	d, err := durationFlag(c, "lifetime", time.Second)
	return int64(d / time.Second), err
}

// benchCommands are the bench subcommands of created Benches, in the order help lists them.
func benchCommands() []*cli.Command {
	return []*cli.Command{
		{
			Name:      "create",
			Usage:     "start a Bench that stays up (through the supervisor), for bench exec and branching",
			ArgsUsage: "[-f FILE | --workshop NAME | --snapshot ID]",
			Description: "Realizes the Workshop and starts a Bench of it that runs until `shed bench rm` or the end of\n" +
				"its lifetime; prints its name. Commands run in it with `shed bench exec`. Its files are on the\n" +
				"uppers filesystem, so it can be paused, snapshotted, forked and reset (a `bench run` Bench\n" +
				"cannot). --snapshot starts it from a snapshot of yours instead: its files as they were sealed.\n" +
				"--on-timeout pause pauses it at the end of its lifetime instead of removing it; pause-cold\n" +
				"ends its processes then and keeps its files (a resume launches it again over them).",
			Flags: []cli.Flag{
				&cli.StringFlag{Name: "file", Aliases: []string{"f"}, Usage: "the Workshop's recipe `FILE` (default: " + app.DefaultRecipe + ")"},
				&cli.StringFlag{Name: "workshop", Usage: "a Workshop record's `NAME` (shed workshop ls)"},
				&cli.StringFlag{Name: "name", Usage: "the Bench's `NAME` (default: the Workshop's name and a random suffix)"},
				lifetimeFlag,
				&cli.StringFlag{Name: "snapshot", Usage: "start from the snapshot `ID` (or name) of yours, not a Workshop"},
				&cli.StringFlag{Name: "on-timeout", Value: "kill", Usage: "what the end of its lifetime does: `kill` (remove it), pause or pause-cold"},
				&cli.StringFlag{Name: "net", Value: "recipe", Usage: "network `MODE`: recipe (the recipe's allowlist, through a proxy) or none (loopback only)"},
				secretFlag,
				&cli.StringFlag{Name: "memory", Usage: "memory limit `SIZE` with a unit: 512M, 4G (at least 16M; 0: none)"},
				&cli.StringFlag{Name: "pids", Usage: "limit on the number of processes, `N` (at least 2)", DefaultText: "none"},
			},
			Action: benchCreate,
		},
		{
			Name:         "pause",
			BashComplete: completeBenches,
			Usage:        "freeze a created Bench's processes and stop its lifetime",
			ArgsUsage:    "BENCH",
			Description: "Its processes stay in memory where they are; exec and files are refused until `shed bench\n" +
				"resume`. A paused Bench is task state: the supervisor removes it --task-state-ttl (24h by\n" +
				"default) after its pause. Should the supervisor or the host restart meanwhile, its processes\n" +
				"are gone but none of its files: resume starts it again over them. --cold ends its processes\n" +
				"at once and keeps only its files (E2B's filesystem-only pause): resume then starts it again,\n" +
				"a new boot of it.",
			Flags: []cli.Flag{
				&cli.BoolFlag{Name: "cold", Usage: "end its processes and keep its files, instead of freezing them"},
			},
			Action: func(c *cli.Context) error {
				if c.NArg() != 1 {
					return usageError("bench pause wants one BENCH")
				}
				res, err := call[app.BenchStateResult](c, "bench.pause", &app.BenchPauseRequest{Bench: c.Args().First(), Cold: c.Bool("cold")})
				return printState(c, res, err)
			},
		},
		{
			Name:         "resume",
			BashComplete: completeBenches,
			Usage:        "let a paused Bench run again, or extend a running one's lifetime",
			ArgsUsage:    "BENCH",
			Flags:        []cli.Flag{lifetimeFlag},
			Action: func(c *cli.Context) error {
				if c.NArg() != 1 {
					return usageError("bench resume wants one BENCH")
				}
				life, err := lifetimeSeconds(c)
				if err != nil {
					return err
				}
				res, err := call[app.BenchStateResult](c, "bench.resume", &app.BenchResumeRequest{Bench: c.Args().First(), LifetimeS: life})
				return printState(c, res, err)
			},
		},
		{
			Name:         "fork",
			BashComplete: completeBenches,
			Usage:        "start new Benches with a created Bench's files as they are now",
			ArgsUsage:    "BENCH",
			Description: "Each child has the parent's files as of the fork (its own copy, on write), its Workshop,\n" +
				"network rules and limits; processes are not copied: each child starts as a new Bench does.\n" +
				"Prints each child's name, or why it did not start. Each child counts in your Benches.",
			Flags: []cli.Flag{
				&cli.StringFlag{Name: "count", Value: "1", Usage: fmt.Sprintf("how many children, `N` (1 to %d)", app.MaxForks)},
				lifetimeFlag,
			},
			Action: func(c *cli.Context) error {
				if c.NArg() != 1 {
					return usageError("bench fork wants one BENCH")
				}
				n, err := countFlag(c, "count", 1, app.MaxForks, "how many children to start")
				if err != nil {
					return err
				}
				life, err := lifetimeSeconds(c)
				if err != nil {
					return err
				}
				res, err := call[app.BenchForkResult](c, "bench.fork", &app.BenchForkRequest{Bench: c.Args().First(), Count: int(n), LifetimeS: life})
				if err != nil {
					return err
				}
				failed := 0
				for _, ch := range res.Children {
					if ch.Error != "" {
						failed++
					}
				}
				if c.Bool("json") {
					if err := printJSON(c, res); err != nil {
						return err
					}
				} else {
					for _, ch := range res.Children {
						if ch.Error != "" {
							fmt.Fprintf(c.App.ErrWriter, "shed: a child did not start: %s\n", ch.Error)
							continue
						}
						fmt.Fprintln(c.App.Writer, ch.Bench)
					}
				}
				if failed > 0 {
					return withHint(exitFailure, fmt.Errorf("%d of %d children did not start", failed, len(res.Children)),
						"the others run (`shed bench ls`); fork again for the missing ones")
				}
				return nil
			},
		},
		{
			Name:         "reset",
			BashComplete: completeBenches,
			Usage:        "put a created Bench back to its Workshop's files, or a snapshot's",
			ArgsUsage:    "BENCH",
			Description: "Its processes end and it starts again with the same name, lifetime, network rules and\n" +
				"limits, over the files a new Bench has (or the snapshot's, of the same Workshop version).",
			Flags: []cli.Flag{
				&cli.StringFlag{Name: "snapshot", Usage: "reset to the snapshot `ID` (or name) of yours"},
			},
			Action: func(c *cli.Context) error {
				if c.NArg() != 1 {
					return usageError("bench reset wants one BENCH")
				}
				res, err := call[app.BenchStateResult](c, "bench.reset", &app.BenchResetRequest{Bench: c.Args().First(), Snapshot: c.String("snapshot")})
				return printState(c, res, err)
			},
		},
	}
}

func benchCreate(c *cli.Context) error {
	if c.NArg() != 0 {
		return usageError("bench create takes no arguments (%q): name the Workshop with -f FILE or --workshop NAME", c.Args().First())
	}
	req := &app.BenchCreateRequest{Name: c.String("name"), Net: c.String("net"), Snapshot: c.String("snapshot"), OnTimeout: c.String("on-timeout"), Secrets: c.StringSlice("secret")}
	switch {
	case c.IsSet("file") && c.IsSet("workshop"):
		return usageError("give -f FILE or --workshop NAME, not both")
	case req.Snapshot != "" && (c.IsSet("file") || c.IsSet("workshop")):
		return usageError("--snapshot starts the Bench from the snapshot's files, over its own Workshop: give no -f or --workshop with it")
	case c.IsSet("workshop"):
		req.Workshop = c.String("workshop")
	case req.Snapshot == "":
		req.Workshop = c.String("file")
		if req.Workshop == "" {
			req.Workshop = app.DefaultRecipe
		}
	}
	var err error
	if req.LifetimeS, err = lifetimeSeconds(c); err != nil {
		return err
	}
	if req.MemoryBytes, err = memoryFlag(c, "memory"); err != nil {
		return err
	}
	if req.Pids, err = countFlag(c, "pids", app.MinPids, 0, "the most processes the Bench may have"); err != nil {
		return err
	}
	res, err := call[app.BenchCreateResult](c, "bench.create", req)
	if err != nil {
		return err
	}
	if c.Bool("json") {
		return printJSON(c, res)
	}
	fmt.Fprintln(c.App.Writer, res.Bench)
	return nil
}

// printState prints the result of a pause, resume or reset: "NAME STATE until TIME".
func printState(c *cli.Context, res *app.BenchStateResult, err error) error {
	if err != nil {
		return err
	}
	if c.Bool("json") {
		return printJSON(c, res)
	}
	how := res.State
	switch {
	case res.Relaunched:
		how += " (started again over its files: its processes are new)"
	case !res.Changed:
		how += " (already)"
	}
	fmt.Fprintf(c.App.Writer, "%s %s, until %s\n", res.Bench, how, res.Expires.Local().Format(time.DateTime))
	return nil
}

// cmdSnapshot is `shed snapshot`.
func cmdSnapshot() *cli.Command {
	return &cli.Command{
		Name:  "snapshot",
		Usage: "seal a created Bench's files, to start Benches from or reset them to (task state)",
		Description: "A snapshot is a Bench's files as they were at one moment (its processes paused for it). It is\n" +
			"task state: yours, on this machine, counted in --user-snapshots, removed at its expiry\n" +
			"(--task-state-ttl, 24h by default); never a store path, never copied, exported or promoted\n" +
			"(`shed bench propose` derives a recipe). A writable grant's host files are not in it.",
		Subcommands: []*cli.Command{
			{
				Name:         "create",
				BashComplete: completeBenches,
				Usage:        "snapshot a created Bench's files; prints the snapshot's id",
				ArgsUsage:    "BENCH",
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "name", Usage: "your `NAME` for it (the newest snapshot of a name answers to it)"},
				},
				Action: func(c *cli.Context) error {
					if c.NArg() != 1 {
						return usageError("snapshot create wants one BENCH")
					}
					res, err := call[app.SnapshotInfo](c, "snapshot.create", &app.SnapshotCreateRequest{Bench: c.Args().First(), Name: c.String("name")})
					if err != nil {
						return err
					}
					if c.Bool("json") {
						return printJSON(c, res)
					}
					fmt.Fprintln(c.App.Writer, res.ID)
					return nil
				},
			},
			{
				Name:  "ls",
				Usage: "list your snapshots (an operator's: everyone's)",
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "bench", Usage: "only snapshots of `BENCH`"},
					&cli.StringFlag{Name: "name", Usage: "only the snapshot of `NAME` (or id)"},
				},
				Action: func(c *cli.Context) error {
					if c.NArg() != 0 {
						return usageError("snapshot ls takes no arguments: --bench BENCH and --name NAME filter")
					}
					all := []app.SnapshotInfo{}
					req := &app.SnapshotListRequest{Bench: c.String("bench"), Name: c.String("name")}
					for {
						res, err := call[app.SnapshotListResult](c, "snapshot.ls", req)
						if err != nil {
							return err
						}
						all = append(all, res.Snapshots...)
						if res.Next == "" {
							break
						}
						req.After = res.Next
					}
					if c.Bool("json") {
						return printJSON(c, all)
					}
					tw := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
					fmt.Fprintln(tw, "ID\tNAME\tBENCH\tOWNER\tCREATED\tEXPIRES")
					for _, s := range all {
						fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", s.ID, dash(s.Name), s.Bench, dash(s.Owner),
							s.Created.Local().Format(time.DateTime), s.Expires.Local().Format(time.DateTime))
					}
					return tw.Flush()
				},
			},
			{
				Name:         "rm",
				BashComplete: completeSnapshots,
				Usage:        "remove snapshots (Benches started from one keep their files)",
				ArgsUsage:    "ID...",
				Action: func(c *cli.Context) error {
					if c.NArg() == 0 {
						return usageError("snapshot rm wants a snapshot ID (or name)")
					}
					type removed struct {
						Snapshot string `json:"snapshot"`
						Removed  bool   `json:"removed"`
					}
					var out []removed
					var missing []string
					for _, id := range c.Args().Slice() {
						res, err := call[app.SnapshotRemoveResult](c, "snapshot.rm", &app.SnapshotRemoveRequest{Snapshot: id})
						if err != nil {
							return err
						}
						out = append(out, removed{id, res.Removed})
						if !res.Removed {
							missing = append(missing, id)
						} else if !c.Bool("json") {
							fmt.Fprintf(c.App.Writer, "removed %s\n", id)
						}
					}
					if c.Bool("json") {
						if err := printJSON(c, out); err != nil {
							return err
						}
					}
					// As rm: a name that was not there fails the command (the others are removed).
					if len(missing) > 0 {
						return &app.Error{Code: app.CodeNotFound, Err: fmt.Errorf("no snapshot %s of yours", strings.Join(missing, ", ")),
							Hint: "`shed snapshot ls` lists yours; a snapshot is removed at its expiry, or with its owner's `snapshot rm`"}
					}
					return nil
				},
			},
		},
	}
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// completeSnapshots completes an ID argument with the caller's snapshots' ids.
func completeSnapshots(c *cli.Context) {
	completeNames(c, func(ctx context.Context) []string {
		res, err := callWith[app.SnapshotListResult](ctx, c, nil, "snapshot.ls", &app.SnapshotListRequest{})
		if err != nil {
			return nil
		}
		var ids []string
		for _, s := range res.Snapshots {
			ids = append(ids, s.ID)
		}
		return ids
	})
}
