package main

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/urfave/cli/v2"
	"golang.org/x/term"

	"toolshed.dev/shed/app"
	"toolshed.dev/shed/bench"
	"toolshed.dev/shed/builder"
	"toolshed.dev/shed/internal/nospace"
	"toolshed.dev/shed/metrics"
)

func cmdBench() *cli.Command {
	runFlags := []cli.Flag{
		&cli.StringSliceFlag{Name: "grant", Usage: "mount `HOSTPATH[:BENCHPATH][:ro|rw]`, within the recipe's [[grant]] bounds (repeatable)"},
		&cli.StringFlag{Name: "net", Value: "recipe", Usage: "network `MODE`: recipe (the recipe's allowlist, through a proxy) or none (loopback only)"},
		secretFlag,
		&cli.BoolFlag{Name: "offline", Usage: "realize without touching the network (the Workshop must be in the store)"},
		&cli.BoolFlag{Name: "keep", Usage: "keep the Bench's upper layer after the command exits (shed bench rm deletes it)"},
		&cli.StringFlag{Name: "name", Usage: "the Bench's `NAME` (default: the Workshop's name and a random suffix)"},
		&cli.StringFlag{Name: "user", Aliases: []string{"u"}, Usage: "run the command as `NAME`: root or an account the Workshop declares (default: the Workshop's user, or root)"},
		&cli.BoolFlag{Name: "tty", Aliases: []string{"t"}, Usage: "attach a pseudo-terminal"},
		&cli.StringFlag{Name: "file", Aliases: []string{"f"}, Value: app.DefaultRecipe, Usage: "the Workshop's recipe `FILE`"},
		&cli.StringFlag{Name: "memory", Usage: "memory limit `SIZE` with a unit: 512M, 4G (at least 16M; 0: none)"},
		&cli.StringFlag{Name: "pids", Usage: "limit on the number of processes, `N` (at least 2: the Bench's init and the command)", DefaultText: "none"},
		&cli.BoolFlag{Name: "metrics", Usage: "measure the Bench's cpu and memory use while it runs, for shed bench ls (it costs the launch a few ms)"},
		&cli.BoolFlag{Name: "verify", Usage: "re-hash the Workshop's layers first and refuse a damaged one (store setting: verify_before_launch)"},
		substituterFlag,
	}
	return &cli.Command{
		Name:  "bench",
		Usage: "launch and manage Benches: disposable sandboxes of a Workshop",
		Description: "A Bench is an overlay of the Workshop's store layers (read-only) and an empty upper layer,\n" +
			"in fresh mount, pid, uts, ipc and network namespaces, as root of a user namespace of its own\n" +
			"(root over its files, nothing over the host's). Its writes are\n" +
			"thrown away when the command exits, unless --keep.",
		Subcommands: append([]*cli.Command{
			{
				Name:      "run",
				Usage:     "run a command in a new Bench of a Workshop",
				ArgsUsage: "[-f FILE] [OPTIONS] -- CMD [ARG...]",
				Description: "Realizes the Workshop (a cache hit when warm), launches a Bench and runs CMD with stdio\n" +
					"attached; shed exits with CMD's exit code. Grants are refused unless they lie within the\n" +
					"recipe's [[grant]] bounds (narrower paths, ro instead of rw). The network is the recipe's\n" +
					"allowlist through a proxy inside the Bench (http_proxy/https_proxy point at it); there is\n" +
					"no DNS, no route, no NAT.",
				Flags: runFlags,
				Action: func(c *cli.Context) error {
					if c.NArg() == 0 {
						return usageError("bench run wants a command: shed bench run [-f FILE] -- CMD [ARG...]")
					}
					return benchRun(c, c.Args().Slice())
				},
			},
			{
				Name:        "shell",
				Usage:       "open an interactive shell in a new Bench",
				Description: "bench run -t -- /bin/bash (or /bin/sh when the Workshop has no bash).",
				Flags:       runFlags,
				Action: func(c *cli.Context) error {
					return benchRun(c, nil)
				},
			},
			{
				Name:  "ls",
				Usage: "list running and kept Benches (through the supervisor, a user sees the ones they launched)",
				Action: func(c *cli.Context) error {
					res, err := call[app.BenchListResult](c, "bench.ls", &app.BenchListRequest{Snapshots: !c.Bool("json")})
					if err != nil {
						return err
					}
					if c.Bool("json") {
						return printJSON(c, res.Benches) // the snapshots: shed snapshot ls --json
					}
					rows := [][]string{{"NAME", "STATE", "STARTED", "CPU", "MEMORY", "COMMAND", "WORKSHOP"}}
					for _, r := range res.Benches {
						state := "running"
						if r.Paused != nil {
							state = "paused"
						} else if !r.Running {
							state = "exited " + fmt.Sprint(deref(r.Exit))
						}
						cpu, mem := usageColumns(r.Metrics)
						rows = append(rows, []string{r.Name, state, r.Started.Local().Format(time.DateTime), cpu, mem, strings.Join(r.Argv, " "), workshopLabel(r)})
					}
					fitColumns(rows, terminalWidth(c.App.Writer), 5, 6)
					tw := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
					for _, row := range rows {
						fmt.Fprintln(tw, strings.Join(row, "\t"))
					}
					if err := tw.Flush(); err != nil {
						return err
					}
					// Task state beside them: the snapshots (shed snapshot ls has more).
					if len(res.Snapshots) > 0 {
						fmt.Fprintln(c.App.Writer)
						tw = tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
						fmt.Fprintln(tw, "SNAPSHOT\tNAME\tOF BENCH\tCREATED\tEXPIRES")
						for _, s := range res.Snapshots {
							fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", s.ID, cmp.Or(s.Name, "-"), s.Bench, s.Created.Local().Format(time.DateTime), s.Expires.Local().Format(time.DateTime))
						}
						return tw.Flush()
					}
					return nil
				},
			},
			proposeCommand(),
			{
				Name:         "exec",
				BashComplete: completeBenches,
				Usage:        "run a command in a running Bench",
				ArgsUsage:    "BENCH -- CMD [ARG...]",
				Flags: []cli.Flag{
					&cli.BoolFlag{Name: "tty", Aliases: []string{"t"}, Usage: "attach a pseudo-terminal"},
					&cli.StringFlag{Name: "workdir", Aliases: []string{"w"}, Usage: "the command's working `DIR` in the Bench, absolute or relative to the user's home (default: that home)"},
					&cli.StringFlag{Name: "user", Aliases: []string{"u"}, Usage: "run the command as `NAME`: root or an account the Workshop declares (default: the Workshop's user, or root)"},
					&cli.StringSliceFlag{Name: "env", Aliases: []string{"e"}, Usage: "set `NAME=VALUE` for the command (repeatable)"},
					&cli.StringFlag{Name: "timeout", Usage: "kill the command after `DURATION` (e.g. 30s, 5m; at least 1s, whole seconds; exit 124)"},
				},
				Action: func(c *cli.Context) error {
					if c.NArg() < 2 {
						return usageError("bench exec wants BENCH and a command")
					}
					argv := c.Args().Slice()[1:]
					if argv[0] == "--" { // BENCH -- CMD: urfave/cli keeps a "--" after a positional
						argv = argv[1:]
					}
					if len(argv) == 0 {
						return usageError("bench exec wants a command after BENCH")
					}
					timeout, err := durationFlag(c, "timeout", time.Second)
					if err != nil {
						return err
					}
					res, err := call[app.ExecResult](c, "bench.exec", &app.BenchExecRequest{
						Bench: c.Args().First(), Argv: argv, TTY: c.Bool("tty"), Term: os.Getenv("TERM"),
						Cwd: c.String("workdir"), User: c.String("user"), Env: c.StringSlice("env"), TimeoutS: int64(timeout / time.Second)})
					if err != nil {
						return err
					}
					if res.TimedOut {
						fmt.Fprintf(c.App.ErrWriter, "shed: the command ran past --timeout %s and was killed\n", timeout)
					}
					if res.OOMKilled {
						warnOOM(c, res.MemoryBytes, res.Exit)
					}
					warnNoSpace(c, res.NoSpace, res.Exit)
					return exitCode(res.Exit)
				},
			},
			{
				Name:         "logs",
				BashComplete: completeBenches,
				Usage:        "print a Bench's network log: every destination allowed or refused",
				ArgsUsage:    "BENCH",
				Action: func(c *cli.Context) error {
					if c.NArg() != 1 {
						return usageError("bench logs wants BENCH")
					}
					res, err := call[app.TextResult](c, "bench.logs", &app.BenchRequest{Bench: c.Args().First()})
					if err != nil {
						return err
					}
					if _, err := io.WriteString(c.App.Writer, res.Text); err != nil {
						return err
					}
					if res.Truncated {
						fmt.Fprintf(c.App.ErrWriter, "shed: the log goes on: these are its first %d MiB\n", app.MaxText>>20)
					}
					return nil
				},
			},
			cmdBenchNetwork(),
			{
				Name:         "rm",
				BashComplete: completeBenches,
				Usage:        "stop a running Bench or delete a kept one",
				ArgsUsage:    "BENCH...",
				Action: func(c *cli.Context) error {
					if c.NArg() == 0 {
						return usageError("bench rm wants BENCH")
					}
					res, err := call[app.BenchRemoveResult](c, "bench.rm", &app.BenchRemoveRequest{Benches: c.Args().Slice()})
					if err != nil {
						return err
					}
					if c.Bool("json") {
						return printJSON(c, res)
					}
					for _, b := range res.Removed {
						fmt.Fprintf(c.App.Writer, "removed %s\n", b)
					}
					return nil
				},
			},
		}, benchCommands()...),
	}
}

func deref(p *int) int {
	if p == nil {
		return -1
	}
	return *p
}

// exitCode makes shed exit with the Bench command's code, printing nothing.
func exitCode(code int) error {
	if code == 0 {
		return nil
	}
	return &exitError{code: code, err: errSilent}
}

var errSilent = errors.New("")

func benchRun(c *cli.Context, argv []string) error {
	tty := c.Bool("tty")
	if argv == nil { // shell
		tty, argv = true, app.ShellArgv
	}
	req := &app.BenchRunRequest{
		Workshop: c.String("file"), Argv: argv, Grants: c.StringSlice("grant"), Net: c.String("net"), Offline: c.Bool("offline"),
		Keep: c.Bool("keep"), Name: c.String("name"), TTY: tty, Term: os.Getenv("TERM"), Substituters: c.StringSlice("substituter"),
		Verify: c.Bool("verify"), User: c.String("user"), Metrics: c.Bool("metrics"), Secrets: c.StringSlice("secret"),
	}
	var err error
	if req.MemoryBytes, err = memoryFlag(c, "memory"); err != nil {
		return err
	}
	if req.Pids, err = countFlag(c, "pids", app.MinPids, 0, "the most processes the Bench may have"); err != nil {
		return err
	}
	res, err := call[app.ExitResult](c, "bench.run", req)
	if err != nil {
		return err
	}
	if res.OOMKilled {
		warnOOM(c, res.MemoryBytes, res.Exit)
	}
	warnNoSpace(c, res.NoSpace, res.Exit)
	return exitCode(res.Exit)
}

// warnOOM says that the kernel killed the command for memory, at the Bench's limit.
func warnOOM(c *cli.Context, limit int64, exit int) {
	at := "the host's memory: the Bench had no limit of its own"
	if limit > 0 {
		at = builder.FormatBytes(limit)
	}
	fmt.Fprintf(c.App.ErrWriter, "shed: warning: out of memory: the kernel killed a process of the command at the Bench's memory limit (%s); exit %d\n"+
		"shed: hint: give the Bench more with --memory (512M, 4G)\n", at, exit)
}

// warnNoSpace says that the command failed with the filesystem of its kept Bench's upper full.
func warnNoSpace(c *cli.Context, noSpace string, exit int) {
	if noSpace == "" {
		return
	}
	fmt.Fprintf(c.App.ErrWriter, "shed: warning: the command failed (exit %d) with its disk full: %s\n"+
		"shed: hint: free space there (`shed gc`, `shed bench rm` of kept Benches you are done with), or keep the Bench on a store of a larger filesystem (--root)\n", exit, noSpace)
}

// workshopLabel is how a Bench's Workshop is shown: a record as "NAME vN", a recipe file as given.
func workshopLabel(r *bench.Record) string {
	if r.Record != "" {
		return fmt.Sprintf("%s v%d", r.Record, r.Version)
	}
	return r.Workshop
}

// terminalWidth is w's width when it is a terminal, else 0 (no limit: a pipe gets whole lines).
func terminalWidth(w io.Writer) int {
	f, ok := w.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return 0
	}
	cols, _, err := term.GetSize(int(f.Fd()))
	if err != nil {
		return 0
	}
	return cols
}

// usageColumns are a Bench's cpu use (of all its cpus) and memory in use, from its newest reading
// ("-" for none: an exited Bench, or one shed cannot read without root).
func usageColumns(m *metrics.Sample) (cpu, mem string) {
	if m == nil {
		return "-", "-"
	}
	return fmt.Sprintf("%.1f%%", m.CPUUsedPct), nospace.FormatBytes(uint64(max(m.MemUsed, 0)))
}

// fitColumns shortens the cells of the flexible columns (an ellipsis at the end) so that each row,
// as tabwriter lays it out with two spaces between columns, fits width; width 0 leaves them whole.
func fitColumns(rows [][]string, width int, flexible ...int) {
	if width <= 0 || len(rows) == 0 {
		return
	}
	cols := len(rows[0])
	widest := make([]int, cols)
	for _, row := range rows {
		for i, cell := range row {
			widest[i] = max(widest[i], utf8.RuneCountInString(cell))
		}
	}
	used := 2 * (cols - 1)
	flex := 0
	for i, w := range widest {
		if slices.Contains(flexible, i) {
			flex += w
		} else {
			used += w
		}
	}
	room := width - 1 - used
	if flex <= room {
		return
	}
	// Share the room out narrowest first: a column that needs less than an equal share keeps its
	// width and leaves the rest to the wider ones. Each keeps at least 4 (three characters and "…").
	order := slices.Clone(flexible)
	slices.SortFunc(order, func(a, b int) int { return widest[a] - widest[b] })
	left := room
	for k, i := range order {
		limit := max(4, min(widest[i], left/(len(order)-k)))
		left -= limit
		for _, row := range rows {
			if r := []rune(row[i]); len(r) > limit {
				row[i] = string(r[:limit-1]) + "…"
			}
		}
	}
}
