package mcp

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"toolshed.dev/shed/app"
	"toolshed.dev/shed/metrics"
	"toolshed.dev/shed/records"
)

// Caller makes one request of op (an operation of package app) with req, as the user who started the
// server, and decodes its result into resp (a pointer to op's result type). Requests are marked as
// MCP's (api.Request's Via: "mcp"), so that the supervisor leaves its host paths out of their errors.
type Caller func(ctx context.Context, op string, req, resp any) error

// Server is the MCP server of one user.
type Server struct {
	Call    Caller
	Version string // shed's, in the server's implementation info
	// Hosts are the host's paths this process knows (the socket it reached, the store it opened):
	// an error shows none of them to the agent.
	Hosts app.HostPaths
}

// Run serves the protocol on t until the client goes or ctx ends.
func (s *Server) Run(ctx context.Context, t sdk.Transport) error {
	return s.server().Run(ctx, t)
}

// toolError is a failed call as the agent reads it: the error, then what to do, without a path of
// the host's (the supervisor leaves its own out for a request marked mcp; these are the ones this
// process knows: the socket it reached, or the store it opened).
func (s *Server) toolError(err error) error {
	e := app.Classify(err)
	msg, hint := s.Hosts.Hide(e.Error()), s.Hosts.Hide(e.Hint)
	if hint != "" {
		return fmt.Errorf("%s (%s)\nhint: %s", msg, e.Code, hint)
	}
	return fmt.Errorf("%s (%s)", msg, e.Code)
}

// call makes one request through s.Call and returns its result, or the error as the agent reads it.
func call[Resp any](s *Server, ctx context.Context, op string, req any) (*Resp, error) {
	var resp Resp
	if err := s.Call(ctx, op, req, &resp); err != nil {
		return nil, s.toolError(err)
	}
	return &resp, nil
}

// The tools' arguments and results. Their JSON schemas come from these types and their
// jsonschema tags.
type (
	workshopListIn  struct{}
	workshopListOut struct {
		Workshops []mcpWorkshop `json:"workshops" jsonschema:"the Workshop records you may launch"`
	}
	mcpWorkshop struct {
		Name    string `json:"name" jsonschema:"the record's name: pass it as workshop to bench_create"`
		Version int    `json:"version" jsonschema:"its current version"`
	}
	benchCreateIn struct {
		Workshop  string   `json:"workshop,omitempty" jsonschema:"a Workshop record's name (workshop_list); none with snapshot"`
		Name      string   `json:"name,omitempty" jsonschema:"the Bench's name (default: the Workshop's and a random suffix)"`
		LifetimeS int64    `json:"lifetime_s,omitempty" jsonschema:"seconds after which the Bench is removed (default 3600, at most 86400)"`
		Snapshot  string   `json:"snapshot,omitempty" jsonschema:"start it from a snapshot of yours (snapshot_create's id, or its name): its files as they were then; workshop is then left empty"`
		OnTimeout string   `json:"on_timeout,omitempty" jsonschema:"what the end of its lifetime does: kill (the default: it is removed), pause (bench_resume resumes it) or pause-cold (its processes end, its files stay: bench_resume launches it again over them)"`
		Secrets   []string `json:"secrets,omitempty" jsonschema:"names of your secrets (shed secret ls) the Bench may use: it gets a placeholder in each one's variable, and its proxy puts the value in requests to the secret's hosts only"`
		networkIn
	}
	// networkIn are a Bench's network rules (E2B's allowOut, denyOut and allowInternetAccess), which
	// narrow the Workshop's network profile.
	networkIn struct {
		AllowOut            []string `json:"allow_out,omitempty" jsonschema:"destinations allowed even where deny_out denies them: IP addresses, CIDR blocks, host names, *.names; each must be within the Workshop's network profile"`
		DenyOut             []string `json:"deny_out,omitempty" jsonschema:"destinations refused: the same forms; 0.0.0.0/0 refuses everything allow_out does not name"`
		AllowInternetAccess *bool    `json:"allow_internet_access,omitempty" jsonschema:"false: the same as deny_out 0.0.0.0/0"`
	}
	benchNetworkIn struct {
		Bench string `json:"bench" jsonschema:"the Bench's name"`
		networkIn
		Clear bool `json:"clear,omitempty" jsonschema:"remove every rule: the Workshop's profile alone"`
	}
	benchNetworkOut struct {
		AllowOut []string `json:"allow_out" jsonschema:"the allow rules in force"`
		DenyOut  []string `json:"deny_out" jsonschema:"the deny rules in force (none: the Workshop's profile alone)"`
		Cut      int      `json:"cut,omitempty" jsonschema:"open connections the new rules denied, which were cut"`
	}
	benchLifetimeIn struct {
		Bench     string `json:"bench" jsonschema:"the Bench's name"`
		LifetimeS int64  `json:"lifetime_s" jsonschema:"seconds from now after which the Bench is removed (shorter or longer than before; at most 86400)"`
	}
	benchWatchIn struct {
		Bench     string `json:"bench" jsonschema:"the Bench's name"`
		Path      string `json:"path" jsonschema:"an absolute directory in the Bench"`
		Recursive bool   `json:"recursive,omitempty" jsonschema:"the directories below it too"`
	}
	benchWatchOut struct {
		Watcher string `json:"watcher" jsonschema:"the watcher's id, for bench_watch_events and bench_watch_stop"`
	}
	benchWatcherIn struct {
		Bench   string `json:"bench" jsonschema:"the Bench's name"`
		Watcher string `json:"watcher" jsonschema:"the watcher's id (bench_watch_start's)"`
	}
	benchWatchEventsOut struct {
		Events []mcpEvent `json:"events" jsonschema:"the changes since the last call, oldest first"`
	}
	mcpEvent struct {
		Name string `json:"name" jsonschema:"the file's path relative to the watched directory"`
		Type string `json:"type" jsonschema:"create, write, remove, rename or chmod"`
	}
	benchWatchStopOut struct {
		Stopped string `json:"stopped" jsonschema:"the watcher stopped"`
	}
	benchCreateOut struct {
		Bench   string `json:"bench" jsonschema:"the Bench's name, for the other tools"`
		Expires string `json:"expires" jsonschema:"when it is removed (RFC 3339)"`
	}
	benchExecIn struct {
		Bench    string            `json:"bench" jsonschema:"the Bench's name"`
		Command  []string          `json:"command" jsonschema:"the command and its arguments, e.g. [\"sh\", \"-c\", \"apt-get install -y git\"]"`
		Cwd      string            `json:"cwd,omitempty" jsonschema:"its working directory: absolute, or relative to the home of the Bench's user (default: that home)"`
		Env      map[string]string `json:"env,omitempty" jsonschema:"variables to set"`
		TimeoutS int64             `json:"timeout_s,omitempty" jsonschema:"kill it after this many seconds (exit code 124)"`
		User     string            `json:"user,omitempty" jsonschema:"the account it runs as: root, or one the Workshop declares (default: the Workshop's user, else root)"`
	}
	benchExecOut struct {
		ExitCode  int    `json:"exit_code" jsonschema:"the command's exit code"`
		Stdout    string `json:"stdout" jsonschema:"what it wrote to stdout (at most 1 MiB)"`
		Stderr    string `json:"stderr" jsonschema:"what it wrote to stderr (at most 1 MiB)"`
		Truncated bool   `json:"truncated,omitempty" jsonschema:"an output was longer and was cut"`
		TimedOut  bool   `json:"timed_out,omitempty" jsonschema:"it ran past timeout_s and was killed"`
		OOMKilled bool   `json:"oom_killed,omitempty" jsonschema:"the kernel killed it (or a process it started) for memory, at the Bench's limit"`
		NoSpace   string `json:"no_space,omitempty" jsonschema:"it failed with the disk of the Bench's upper layer full: which filesystem, how full"`
	}
	benchWriteIn struct {
		Bench   string `json:"bench" jsonschema:"the Bench's name"`
		Path    string `json:"path" jsonschema:"an absolute path in the Bench; missing directories are made"`
		Content string `json:"content" jsonschema:"the file's content"`
		// Metadata as E2B's files.write keeps it.
		Metadata map[string]string `json:"metadata,omitempty" jsonschema:"key-value pairs kept with the file (replacing any it had), shown by bench_stat_file and bench_list_files; keys of letters, digits and !#$%&'*+-.^_|~, values printable ASCII"`
		User     string            `json:"user,omitempty" jsonschema:"the account that owns the file and the directories made for it: root, or one the Workshop declares (default: the Workshop's user, else root)"`
	}
	benchWriteOut struct {
		Path string `json:"path" jsonschema:"the file written"`
	}
	benchReadIn struct {
		Bench string `json:"bench" jsonschema:"the Bench's name"`
		Path  string `json:"path" jsonschema:"an absolute path in the Bench"`
	}
	benchReadOut struct {
		Content string `json:"content" jsonschema:"the file's content"`
	}
	benchListIn  struct{}
	benchListOut struct {
		Benches []mcpBench `json:"benches" jsonschema:"your Benches"`
	}
	mcpBench struct {
		Name     string     `json:"name"`
		Workshop string     `json:"workshop" jsonschema:"its Workshop record's name, as workshop_list and bench_create name it (empty: an operator's recipe file, not a record)"`
		Version  int        `json:"version,omitempty" jsonschema:"the record's version it was made of"`
		Running  bool       `json:"running"`
		Paused   string     `json:"paused,omitempty" jsonschema:"when it was paused (RFC 3339): bench_resume resumes it"`
		Started  string     `json:"started" jsonschema:"when it started (RFC 3339)"`
		Metrics  *mcpMetric `json:"metrics,omitempty" jsonschema:"a running Bench's newest reading of its use (bench_metrics has its history)"`
	}
	mcpMetric struct {
		Time       string  `json:"time" jsonschema:"when it was read (RFC 3339)"`
		CPUCount   int     `json:"cpu_count" jsonschema:"the cpus the Bench may run on"`
		CPUUsedPct float64 `json:"cpu_used_pct" jsonschema:"its cpu use since the reading before (about 5 s), in % of all its cpus"`
		MemUsed    int64   `json:"mem_used" jsonschema:"memory in use, bytes"`
		MemCache   int64   `json:"mem_cache" jsonschema:"page cache, bytes (the files written in the Bench are in it)"`
		MemTotal   int64   `json:"mem_total" jsonschema:"its memory limit, bytes: past it the kernel kills a process of it"`
		DiskUsed   int64   `json:"disk_used" jsonschema:"bytes written in the Bench (its upper layer)"`
		DiskTotal  int64   `json:"disk_total" jsonschema:"how many bytes may be written in it, in all"`
	}
	benchListFilesIn struct {
		Bench string `json:"bench" jsonschema:"the Bench's name"`
		Path  string `json:"path" jsonschema:"an absolute directory in the Bench"`
		Depth int    `json:"depth,omitempty" jsonschema:"how many levels down to list (default 1: the directory's own entries; at most 16)"`
	}
	benchListFilesOut struct {
		Entries []mcpFile `json:"entries" jsonschema:"the entries, sorted by path"`
	}
	benchPathIn struct {
		Bench string `json:"bench" jsonschema:"the Bench's name"`
		Path  string `json:"path" jsonschema:"an absolute path in the Bench"`
	}
	mcpFile struct {
		Name     string            `json:"name" jsonschema:"its name in its directory"`
		Path     string            `json:"path" jsonschema:"its absolute path"`
		Type     string            `json:"type" jsonschema:"file, dir, symlink or other"`
		Size     int64             `json:"size" jsonschema:"bytes"`
		Mode     uint32            `json:"mode" jsonschema:"permission bits (e.g. 493 is 0755)"`
		Owner    string            `json:"owner" jsonschema:"its owner's name in the Bench"`
		Group    string            `json:"group" jsonschema:"its group's name"`
		Modified string            `json:"modified" jsonschema:"its last change (RFC 3339)"`
		Target   string            `json:"target,omitempty" jsonschema:"a symlink's target"`
		Metadata map[string]string `json:"metadata,omitempty" jsonschema:"the key-value pairs bench_write_file kept with it"`
	}
	benchMetricsIn struct {
		Bench string `json:"bench" jsonschema:"the Bench's name"`
		Start int64  `json:"start,omitempty" jsonschema:"from this unix time in seconds (default: the Bench's start)"`
		End   int64  `json:"end,omitempty" jsonschema:"to this unix time in seconds (default: now)"`
	}
	benchMetricsOut struct {
		Samples []mcpMetric `json:"samples" jsonschema:"its readings, oldest first, every 5 s (coarser for a Bench that ran long: at most 360)"`
	}
	benchIn struct {
		Bench string `json:"bench" jsonschema:"the Bench's name"`
	}
	benchRemoveOut struct {
		Removed string `json:"removed" jsonschema:"the Bench removed"`
	}
	benchResumeIn struct {
		Bench     string `json:"bench" jsonschema:"the Bench's name"`
		LifetimeS int64  `json:"lifetime_s,omitempty" jsonschema:"seconds from now after which it is removed (default 3600, at most 86400)"`
		OnTimeout string `json:"on_timeout,omitempty" jsonschema:"what the end of its lifetime does from now: kill, pause or pause-cold (default: as before)"`
	}
	benchStateOut struct {
		Bench      string `json:"bench" jsonschema:"the Bench's name"`
		State      string `json:"state" jsonschema:"running or paused"`
		Expires    string `json:"expires" jsonschema:"when it is removed (RFC 3339): a paused Bench's, its pause plus the supervisor's task-state lifetime"`
		Changed    bool   `json:"changed" jsonschema:"the call changed its state (false: it was so already; a resume of a running Bench only extends its lifetime)"`
		Relaunched bool   `json:"relaunched,omitempty" jsonschema:"its processes were started again over its files: the ones it had are gone (the supervisor or the host restarted while it was paused, or a reset)"`
	}
	benchForkIn struct {
		Bench     string `json:"bench" jsonschema:"the Bench to fork, running or paused"`
		Count     int    `json:"count,omitempty" jsonschema:"how many children (default 1, at most 100)"`
		LifetimeS int64  `json:"lifetime_s,omitempty" jsonschema:"each child's lifetime in seconds (default 3600, at most 86400)"`
	}
	benchForkOut struct {
		Children []mcpChild `json:"children" jsonschema:"each child, in order: its bench, or the error that stopped it"`
	}
	mcpChild struct {
		Bench   string `json:"bench,omitempty" jsonschema:"the child's name"`
		Expires string `json:"expires,omitempty" jsonschema:"when it is removed (RFC 3339)"`
		Error   string `json:"error,omitempty" jsonschema:"why this child did not start"`
	}
	benchResetIn struct {
		Bench    string `json:"bench" jsonschema:"the Bench's name"`
		Snapshot string `json:"snapshot,omitempty" jsonschema:"a snapshot of yours (id or name) of the same Workshop version to reset to (default: the Workshop's own files, as a new Bench has them)"`
	}
	snapshotCreateIn struct {
		Bench string `json:"bench" jsonschema:"the Bench whose files to seal, running or paused"`
		Name  string `json:"name,omitempty" jsonschema:"your name for the snapshot (the newest of a name answers to it)"`
	}
	mcpSnapshot struct {
		ID      string `json:"id" jsonschema:"the snapshot's id: for bench_create's snapshot, bench_reset and snapshot_remove"`
		Name    string `json:"name,omitempty" jsonschema:"its name"`
		Bench   string `json:"bench" jsonschema:"the Bench it was taken of"`
		Created string `json:"created" jsonschema:"when (RFC 3339)"`
		Expires string `json:"expires" jsonschema:"when it is removed (RFC 3339)"`
	}
	snapshotListIn struct {
		Name  string `json:"name,omitempty" jsonschema:"only the snapshot of this name (or id)"`
		Bench string `json:"bench,omitempty" jsonschema:"only snapshots of this Bench"`
		Limit int    `json:"limit,omitempty" jsonschema:"at most this many (default and most 100)"`
		After string `json:"after,omitempty" jsonschema:"the page after this snapshot id (a previous call's next)"`
	}
	snapshotListOut struct {
		Snapshots []mcpSnapshot `json:"snapshots" jsonschema:"your snapshots, oldest first"`
		Next      string        `json:"next,omitempty" jsonschema:"after for the next page (none: this is the last)"`
	}
	snapshotRemoveIn struct {
		Snapshot string `json:"snapshot" jsonschema:"the snapshot's id or name"`
	}
	snapshotRemoveOut struct {
		Removed bool `json:"removed" jsonschema:"false: you had no snapshot of that id or name (removing twice is no error)"`
	}
	benchProposeOut struct {
		Proposal string `json:"proposal" jsonschema:"the proposal's id: a human reads its diff and promotes it"`
		Diff     string `json:"diff" jsonschema:"the change to the Workshop's recipe and lock it proposes"`
	}
)

func (s *Server) server() *sdk.Server {
	srv := sdk.NewServer(&sdk.Implementation{Name: "shed", Version: s.Version}, &sdk.ServerOptions{
		Instructions: "Toolshed Benches: disposable sandboxes built from Workshop recipes. Create a Bench from a " +
			"Workshop (workshop_list), run commands and read and write files in it, and when what you installed " +
			"is worth keeping, propose it (bench_propose): a human reviews the diff. Remove Benches you are done with.",
	})
	sdk.AddTool(srv, &sdk.Tool{Name: "workshop_list", Description: "List the Workshops you may create Benches of."},
		func(ctx context.Context, _ *sdk.CallToolRequest, _ workshopListIn) (*sdk.CallToolResult, workshopListOut, error) {
			res, err := call[app.LaunchableResult](s, ctx, "workshop.launchable", &app.LaunchableRequest{})
			out := workshopListOut{Workshops: []mcpWorkshop{}}
			if err != nil {
				return nil, out, err
			}
			for _, v := range res.Workshops {
				out.Workshops = append(out.Workshops, mcpWorkshop{v.Name, v.N})
			}
			return nil, out, nil
		})
	sdk.AddTool(srv, &sdk.Tool{Name: "bench_create", Description: "Create a Bench (a sandbox) of a Workshop. It stays up for exec and files until removed or its lifetime ends. allow_out, deny_out and allow_internet_access narrow its network within the Workshop's network profile (bench_network changes them later). secrets names credentials it uses without holding them (placeholders in their variables)."},
		func(ctx context.Context, _ *sdk.CallToolRequest, in benchCreateIn) (*sdk.CallToolResult, benchCreateOut, error) {
			// A Workshop is a record the caller may launch, never a file, as for the E2B API: an
			// operator's agent must not have root read whatever file it names (a recipe's error
			// quotes its lines) or learn the host's paths.
			if in.Snapshot != "" && in.Workshop != "" {
				return nil, benchCreateOut{}, errors.New("give workshop or snapshot, not both: a Bench of a snapshot is of the snapshot's Workshop (usage)")
			}
			ws, err := call[app.LaunchableResult](s, ctx, "workshop.launchable", &app.LaunchableRequest{})
			if err != nil {
				return nil, benchCreateOut{}, err
			}
			if in.Snapshot != "" {
				ws.Workshops = nil // the snapshot's own Workshop, which the supervisor checks
			} else if !records.IsName(in.Workshop) {
				// Not echoed: a file's path is the host's, and it was never going to be read.
				return nil, benchCreateOut{}, errors.New("workshop is not a Workshop record's name (lowercase letters, digits, '.', '_', '-'): a file is never one here (usage)\nhint: workshop_list lists the records you may launch")
			}
			if in.Snapshot == "" && !slices.ContainsFunc(ws.Workshops, func(v *records.Version) bool { return v.Name == in.Workshop }) {
				return nil, benchCreateOut{}, fmt.Errorf("%q is not a Workshop record you may launch (not_found)\nhint: workshop_list lists them; an operator allows one with `shed workshop allow NAME USER`", in.Workshop)
			}
			allow, deny := in.networkIn.rules()
			res, err := call[app.BenchCreateResult](s, ctx, "bench.create", &app.BenchCreateRequest{Workshop: in.Workshop, Name: in.Name, LifetimeS: in.LifetimeS,
				NetAllow: allow, NetDeny: deny, Snapshot: in.Snapshot, OnTimeout: in.OnTimeout, Secrets: in.Secrets})
			if err != nil {
				return nil, benchCreateOut{}, err
			}
			return nil, benchCreateOut{Bench: res.Bench, Expires: res.Expires.Format(time.RFC3339)}, nil
		})
	sdk.AddTool(srv, &sdk.Tool{Name: "bench_exec", Description: "Run a command in a Bench, as its Workshop's user (root unless the Workshop declares one; user picks another of its accounts), and return its exit code and output. The network is the Workshop's allowlist, through a proxy."},
		func(ctx context.Context, _ *sdk.CallToolRequest, in benchExecIn) (*sdk.CallToolResult, benchExecOut, error) {
			req := &app.BenchExecRequest{Bench: in.Bench, Argv: in.Command, Cwd: in.Cwd, TimeoutS: in.TimeoutS, Capture: true, User: in.User}
			keys := make([]string, 0, len(in.Env))
			for k := range in.Env {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				req.Env = append(req.Env, k+"="+in.Env[k])
			}
			if len(in.Command) == 0 {
				return nil, benchExecOut{}, errors.New("command is empty: give the command and its arguments, e.g. [\"ls\", \"-l\"]")
			}
			res, err := call[app.ExecResult](s, ctx, "bench.exec", req)
			if err != nil {
				return nil, benchExecOut{}, err
			}
			return nil, benchExecOut{ExitCode: res.Exit, Stdout: res.Stdout, Stderr: res.Stderr, Truncated: res.Truncated, TimedOut: res.TimedOut, OOMKilled: res.OOMKilled, NoSpace: res.NoSpace}, nil
		})
	sdk.AddTool(srv, &sdk.Tool{Name: "bench_write_file", Description: "Write a file in a Bench (missing directories are made), with metadata if given."},
		func(ctx context.Context, _ *sdk.CallToolRequest, in benchWriteIn) (*sdk.CallToolResult, benchWriteOut, error) {
			if in.Metadata != nil {
				// bench.write_files is the operation that keeps metadata (E2B's upload).
				res, err := call[app.WriteFilesResult](s, ctx, "bench.write_files", &app.WriteFilesRequest{Bench: in.Bench,
					Files: []app.FileWrite{{Path: in.Path, Content: in.Content}}, Metadata: in.Metadata, User: in.User})
				if err != nil {
					return nil, benchWriteOut{}, err
				}
				return nil, benchWriteOut{Path: res.Paths[0]}, nil
			}
			if _, err := call[app.Empty](s, ctx, "bench.write_file", &app.WriteFileRequest{Bench: in.Bench, Path: in.Path, Content: in.Content, User: in.User}); err != nil {
				return nil, benchWriteOut{}, err
			}
			return nil, benchWriteOut{Path: in.Path}, nil
		})
	sdk.AddTool(srv, &sdk.Tool{Name: "bench_read_file", Description: "Read a file of a Bench."},
		func(ctx context.Context, _ *sdk.CallToolRequest, in benchReadIn) (*sdk.CallToolResult, benchReadOut, error) {
			res, err := call[app.FileResult](s, ctx, "bench.read_file", &app.ReadFileRequest{Bench: in.Bench, Path: in.Path})
			if err != nil {
				return nil, benchReadOut{}, err
			}
			return nil, benchReadOut{Content: res.Content}, nil
		})
	sdk.AddTool(srv, &sdk.Tool{Name: "bench_list_files", Description: "List a directory of a Bench: each entry's name, path, type, size, mode, owner, group, last change and metadata."},
		func(ctx context.Context, _ *sdk.CallToolRequest, in benchListFilesIn) (*sdk.CallToolResult, benchListFilesOut, error) {
			out := benchListFilesOut{Entries: []mcpFile{}}
			res, err := call[app.ListFilesResult](s, ctx, "bench.list_files", &app.ListFilesRequest{Bench: in.Bench, Path: in.Path, Depth: in.Depth})
			if err != nil {
				return nil, out, err
			}
			for _, e := range res.Entries {
				out.Entries = append(out.Entries, fileOf(e))
			}
			return nil, out, nil
		})
	sdk.AddTool(srv, &sdk.Tool{Name: "bench_stat_file", Description: "Describe one file of a Bench (a symlink itself, not its target), with its metadata."},
		func(ctx context.Context, _ *sdk.CallToolRequest, in benchPathIn) (*sdk.CallToolResult, mcpFile, error) {
			res, err := call[app.FileEntry](s, ctx, "bench.stat_file", &app.BenchPathRequest{Bench: in.Bench, Path: in.Path})
			if err != nil {
				return nil, mcpFile{}, err
			}
			return nil, fileOf(*res), nil
		})
	sdk.AddTool(srv, &sdk.Tool{Name: "bench_list", Description: "List your Benches."},
		func(ctx context.Context, _ *sdk.CallToolRequest, _ benchListIn) (*sdk.CallToolResult, benchListOut, error) {
			res, err := call[app.BenchListResult](s, ctx, "bench.ls", &app.BenchListRequest{})
			out := benchListOut{Benches: []mcpBench{}}
			if err != nil {
				return nil, out, err
			}
			for _, b := range res.Benches {
				// The record's name, never its file (a path of the store's): users and agents name records.
				mb := mcpBench{Name: b.Name, Workshop: b.Record, Version: b.Version, Running: b.Running, Started: b.Started.Format(time.RFC3339)}
				if b.Paused != nil {
					mb.Paused = b.Paused.Format(time.RFC3339)
				}
				if b.Metrics != nil {
					m := metricOf(*b.Metrics)
					mb.Metrics = &m
				}
				out.Benches = append(out.Benches, mb)
			}
			return nil, out, nil
		})
	sdk.AddTool(srv, &sdk.Tool{Name: "bench_metrics", Description: "What a running Bench uses over time: cpu, memory and the disk of what was written in it, read every 5 s."},
		func(ctx context.Context, _ *sdk.CallToolRequest, in benchMetricsIn) (*sdk.CallToolResult, benchMetricsOut, error) {
			out := benchMetricsOut{Samples: []mcpMetric{}}
			res, err := call[app.BenchMetricsResult](s, ctx, "bench.metrics", &app.BenchMetricsRequest{Benches: []string{in.Bench}, Start: in.Start, End: in.End})
			if err != nil {
				return nil, out, err
			}
			for _, b := range res.Benches {
				if !b.Running {
					return nil, out, fmt.Errorf("bench %s is not running: a Bench has metrics while it runs (not_found)", b.Bench)
				}
				for _, x := range b.Samples {
					out.Samples = append(out.Samples, metricOf(x))
				}
			}
			return nil, out, nil
		})
	sdk.AddTool(srv, &sdk.Tool{Name: "bench_network", Description: "Show or replace a running Bench's network rules. With only bench, it shows the rules in force. " +
		"With allow_out, deny_out, allow_internet_access or clear, it replaces them all at once (a field left out is cleared) and returns the rules now in force. " +
		"Rules narrow the Workshop's network profile and never widen it: an allow_out outside the profile is refused and the old rules stay. " +
		"New rules apply to the next connection, and cut the open connections they deny."},
		func(ctx context.Context, _ *sdk.CallToolRequest, in benchNetworkIn) (*sdk.CallToolResult, benchNetworkOut, error) {
			n := in.networkIn
			var res *app.NetworkResult
			var err error
			if !in.Clear && n.AllowOut == nil && n.DenyOut == nil && n.AllowInternetAccess == nil {
				res, err = call[app.NetworkResult](s, ctx, "bench.network", &app.BenchRequest{Bench: in.Bench})
			} else {
				if in.Clear && (n.AllowOut != nil || n.DenyOut != nil || n.AllowInternetAccess != nil) {
					return nil, benchNetworkOut{}, errors.New("clear removes every rule: give it alone, or give the rules that replace them (usage)")
				}
				allow, deny := n.rules()
				res, err = call[app.NetworkResult](s, ctx, "bench.set_network", &app.SetNetworkRequest{Bench: in.Bench, Allow: allow, Deny: deny})
			}
			if err != nil {
				return nil, benchNetworkOut{}, err
			}
			return nil, benchNetworkOut{AllowOut: nonNil(res.Allow), DenyOut: nonNil(res.Deny), Cut: res.Cut}, nil
		})
	sdk.AddTool(srv, &sdk.Tool{Name: "bench_set_lifetime", Description: "Move the end of a Bench to lifetime_s seconds from now, sooner or later than before."},
		func(ctx context.Context, _ *sdk.CallToolRequest, in benchLifetimeIn) (*sdk.CallToolResult, benchCreateOut, error) {
			if in.LifetimeS <= 0 {
				return nil, benchCreateOut{}, errors.New("lifetime_s must be a number of seconds from now, at least 1 (usage)\nhint: bench_remove removes a Bench now")
			}
			res, err := call[app.BenchCreateResult](s, ctx, "bench.set_lifetime", &app.SetLifetimeRequest{Bench: in.Bench, LifetimeS: in.LifetimeS})
			if err != nil {
				return nil, benchCreateOut{}, err
			}
			return nil, benchCreateOut{Bench: res.Bench, Expires: res.Expires.Format(time.RFC3339)}, nil
		})
	sdk.AddTool(srv, &sdk.Tool{Name: "bench_watch_start", Description: "Start watching a directory of a running Bench for changes (files created, written, removed, renamed, chmod). " +
		"Returns a watcher id: bench_watch_events takes the changes since the last call, bench_watch_stop ends it. A watcher ends with its Bench; a Bench has at most 16 watches (these and the E2B API's)."},
		func(ctx context.Context, _ *sdk.CallToolRequest, in benchWatchIn) (*sdk.CallToolResult, benchWatchOut, error) {
			res, err := call[app.WatcherResult](s, ctx, "bench.watcher_create", &app.WatcherCreateRequest{Bench: in.Bench, Path: in.Path, Recursive: in.Recursive})
			if err != nil {
				return nil, benchWatchOut{}, err
			}
			return nil, benchWatchOut{Watcher: res.Watcher}, nil
		})
	sdk.AddTool(srv, &sdk.Tool{Name: "bench_watch_events", Description: "Take the changes a watcher (bench_watch_start) saw since the last call; none yet is an empty list. " +
		"A watch that ended (its directory removed, or more than 4096 changes waited between two calls) gives its last changes, then an error."},
		func(ctx context.Context, _ *sdk.CallToolRequest, in benchWatcherIn) (*sdk.CallToolResult, benchWatchEventsOut, error) {
			out := benchWatchEventsOut{Events: []mcpEvent{}}
			res, err := call[app.WatcherEventsResult](s, ctx, "bench.watcher_events", &app.WatcherRequest{Bench: in.Bench, Watcher: in.Watcher})
			if err != nil {
				return nil, out, err
			}
			for _, e := range res.Events {
				out.Events = append(out.Events, mcpEvent{Name: e.Name, Type: e.Type})
			}
			return nil, out, nil
		})
	sdk.AddTool(srv, &sdk.Tool{Name: "bench_watch_stop", Description: "Stop a watcher (bench_watch_start); the changes it holds are gone."},
		func(ctx context.Context, _ *sdk.CallToolRequest, in benchWatcherIn) (*sdk.CallToolResult, benchWatchStopOut, error) {
			res, err := call[app.WatcherResult](s, ctx, "bench.watcher_remove", &app.WatcherRequest{Bench: in.Bench, Watcher: in.Watcher})
			if err != nil {
				return nil, benchWatchStopOut{}, err
			}
			return nil, benchWatchStopOut{Stopped: res.Watcher}, nil
		})
	sdk.AddTool(srv, &sdk.Tool{Name: "bench_remove", Description: "Remove a Bench: its processes and its files are gone."},
		func(ctx context.Context, _ *sdk.CallToolRequest, in benchIn) (*sdk.CallToolResult, benchRemoveOut, error) {
			if _, err := call[app.BenchRemoveResult](s, ctx, "bench.rm", &app.BenchRemoveRequest{Benches: []string{in.Bench}}); err != nil {
				return nil, benchRemoveOut{}, err
			}
			return nil, benchRemoveOut{Removed: in.Bench}, nil
		})
	sdk.AddTool(srv, &sdk.Tool{Name: "bench_propose", Description: "Propose a new version of the Bench's Workshop from the packages installed in it and the network destinations it was refused. A human reads the diff and decides."},
		func(ctx context.Context, _ *sdk.CallToolRequest, in benchIn) (*sdk.CallToolResult, benchProposeOut, error) {
			res, err := call[app.ProposeResult](s, ctx, "bench.propose", &app.BenchRequest{Bench: in.Bench})
			if err != nil {
				return nil, benchProposeOut{}, err
			}
			return nil, benchProposeOut{Proposal: res.Proposal.ID, Diff: res.Diff}, nil
		})
	s.branchTools(srv)
	return srv
}

// branchTools are the tools of branching: pause and resume, fork, reset and snapshots. All of it is
// task state, the agent's user's, expiring, never a Workshop's: bench_propose still derives a recipe.
func (s *Server) branchTools(srv *sdk.Server) {
	state := func(res *app.BenchStateResult) benchStateOut {
		return benchStateOut{Bench: res.Bench, State: res.State, Expires: res.Expires.Format(time.RFC3339), Changed: res.Changed, Relaunched: res.Relaunched}
	}
	sdk.AddTool(srv, &sdk.Tool{Name: "bench_pause", Description: "Pause a Bench: its processes are frozen where they are (in memory) and its lifetime stops; exec and files are refused until bench_resume. A paused Bench is removed a while after its pause (expires)."},
		func(ctx context.Context, _ *sdk.CallToolRequest, in benchIn) (*sdk.CallToolResult, benchStateOut, error) {
			res, err := call[app.BenchStateResult](s, ctx, "bench.pause", &app.BenchPauseRequest{Bench: in.Bench})
			if err != nil {
				return nil, benchStateOut{}, err
			}
			return nil, state(res), nil
		})
	sdk.AddTool(srv, &sdk.Tool{Name: "bench_resume", Description: "Resume a paused Bench, its processes where they stopped, for lifetime_s from now; a running one's lifetime is only extended. If its processes were lost while it was paused (a restart), it starts again over the same files (relaunched)."},
		func(ctx context.Context, _ *sdk.CallToolRequest, in benchResumeIn) (*sdk.CallToolResult, benchStateOut, error) {
			res, err := call[app.BenchStateResult](s, ctx, "bench.resume", &app.BenchResumeRequest{Bench: in.Bench, LifetimeS: in.LifetimeS, OnTimeout: in.OnTimeout})
			if err != nil {
				return nil, benchStateOut{}, err
			}
			return nil, state(res), nil
		})
	sdk.AddTool(srv, &sdk.Tool{Name: "bench_fork", Description: "Make count new Benches whose files are this Bench's as they are now, each then its own (processes are not copied: each child starts as a new Bench does). The parent goes on. Each child counts as one of your Benches."},
		func(ctx context.Context, _ *sdk.CallToolRequest, in benchForkIn) (*sdk.CallToolResult, benchForkOut, error) {
			out := benchForkOut{Children: []mcpChild{}}
			res, err := call[app.BenchForkResult](s, ctx, "bench.fork", &app.BenchForkRequest{Bench: in.Bench, Count: in.Count, LifetimeS: in.LifetimeS})
			if err != nil {
				return nil, out, err
			}
			for _, ch := range res.Children {
				m := mcpChild{Bench: ch.Bench, Error: s.Hosts.Hide(ch.Error)}
				if !ch.Expires.IsZero() {
					m.Expires = ch.Expires.Format(time.RFC3339)
				}
				out.Children = append(out.Children, m)
			}
			return nil, out, nil
		})
	sdk.AddTool(srv, &sdk.Tool{Name: "bench_reset", Description: "Put a Bench back to its Workshop's files as a new Bench has them, or to a snapshot's: its processes end and it starts again, same name and lifetime."},
		func(ctx context.Context, _ *sdk.CallToolRequest, in benchResetIn) (*sdk.CallToolResult, benchStateOut, error) {
			res, err := call[app.BenchStateResult](s, ctx, "bench.reset", &app.BenchResetRequest{Bench: in.Bench, Snapshot: in.Snapshot})
			if err != nil {
				return nil, benchStateOut{}, err
			}
			return nil, state(res), nil
		})
	sdk.AddTool(srv, &sdk.Tool{Name: "snapshot_create", Description: "Seal a Bench's files as they are now (its processes paused for the moment it takes), to start Benches from (bench_create's snapshot) or reset one to. A snapshot is yours alone and expires; it is never a Workshop (bench_propose proposes one)."},
		func(ctx context.Context, _ *sdk.CallToolRequest, in snapshotCreateIn) (*sdk.CallToolResult, mcpSnapshot, error) {
			res, err := call[app.SnapshotInfo](s, ctx, "snapshot.create", &app.SnapshotCreateRequest{Bench: in.Bench, Name: in.Name})
			if err != nil {
				return nil, mcpSnapshot{}, err
			}
			return nil, snapshotOf(*res), nil
		})
	sdk.AddTool(srv, &sdk.Tool{Name: "snapshot_list", Description: "List your snapshots, oldest first."},
		func(ctx context.Context, _ *sdk.CallToolRequest, in snapshotListIn) (*sdk.CallToolResult, snapshotListOut, error) {
			out := snapshotListOut{Snapshots: []mcpSnapshot{}}
			res, err := call[app.SnapshotListResult](s, ctx, "snapshot.ls", &app.SnapshotListRequest{Name: in.Name, Bench: in.Bench, Limit: in.Limit, After: in.After})
			if err != nil {
				return nil, out, err
			}
			for _, x := range res.Snapshots {
				out.Snapshots = append(out.Snapshots, snapshotOf(x))
			}
			out.Next = res.Next
			return nil, out, nil
		})
	sdk.AddTool(srv, &sdk.Tool{Name: "snapshot_remove", Description: "Remove a snapshot of yours. Benches started from it keep their files."},
		func(ctx context.Context, _ *sdk.CallToolRequest, in snapshotRemoveIn) (*sdk.CallToolResult, snapshotRemoveOut, error) {
			res, err := call[app.SnapshotRemoveResult](s, ctx, "snapshot.rm", &app.SnapshotRemoveRequest{Snapshot: in.Snapshot})
			if err != nil {
				return nil, snapshotRemoveOut{}, err
			}
			return nil, snapshotRemoveOut{Removed: res.Removed}, nil
		})
}

// snapshotOf is a snapshot as an agent reads it: no recipe file, no owner (its own).
func snapshotOf(x app.SnapshotInfo) mcpSnapshot {
	return mcpSnapshot{ID: x.ID, Name: x.Name, Bench: x.Bench, Created: x.Created.Format(time.RFC3339), Expires: x.Expires.Format(time.RFC3339)}
}

// rules are bench.create's and bench.set_network's allow and deny for n, as the E2B API maps them:
// allow_internet_access false is deny_out 0.0.0.0/0.
func (n networkIn) rules() (allow, deny []string) {
	deny = n.DenyOut
	if n.AllowInternetAccess != nil && !*n.AllowInternetAccess {
		deny = append(slices.Clone(deny), "0.0.0.0/0")
	}
	return n.AllowOut, deny
}

func nonNil(l []string) []string {
	if l == nil {
		return []string{}
	}
	return l
}

func metricOf(x metrics.Sample) mcpMetric {
	return mcpMetric{Time: x.Time.Format(time.RFC3339), CPUCount: x.CPUCount, CPUUsedPct: x.CPUUsedPct,
		MemUsed: x.MemUsed, MemCache: x.MemCache, MemTotal: x.MemTotal, DiskUsed: x.DiskUsed, DiskTotal: x.DiskTotal}
}

func fileOf(e app.FileEntry) mcpFile {
	return mcpFile{Name: e.Name, Path: e.Path, Type: e.Type, Size: e.Size, Mode: e.Mode, Owner: e.Owner, Group: e.Group,
		Modified: e.Modified.Format(time.RFC3339), Target: e.Target, Metadata: e.Metadata}
}
