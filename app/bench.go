package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"golang.org/x/term"

	"toolshed.dev/shed/bench"
	"toolshed.dev/shed/builder"
	"toolshed.dev/shed/internal/fdio"
	"toolshed.dev/shed/internal/nospace"
	"toolshed.dev/shed/proposal"
	"toolshed.dev/shed/sandbox"
	"toolshed.dev/shed/store"
)

func init() {
	op("bench.run", (*Service).BenchRun)
	op("bench.ls", (*Service).BenchList)
	op("bench.exec", (*Service).BenchExec)
	op("bench.logs", (*Service).BenchLogs)
	op("bench.rm", (*Service).BenchRemove)
	op("bench.propose", (*Service).BenchPropose)
}

// ShellArgv is what `shed bench shell` runs: bash when the Workshop has it, else sh; a login shell.
var ShellArgv = []string{"/bin/sh", "-c", "if [ -x /bin/bash ]; then exec /bin/bash -l; else exec /bin/sh -l; fi"}

// BenchRunRequest asks for a new Bench of a Workshop, running Argv with the caller's stdio.
type BenchRunRequest struct {
	Workshop string   `json:"workshop,omitempty"` // a record's name or a recipe file
	Argv     []string `json:"argv"`               // the command and its arguments (`shed bench shell` sends a login shell)
	// Grants are HOSTPATH[:BENCHPATH][:ro|rw], within the recipe's [[grant]] bounds.
	Grants  []string `json:"grants,omitempty"`
	Net     string   `json:"net,omitempty"`     // "recipe" (default) or "none"
	Offline bool     `json:"offline,omitempty"` // realize without touching the network
	Keep    bool     `json:"keep,omitempty"`    // keep the upper layer after the command exits (`bench.rm` deletes it)
	Name    string   `json:"name,omitempty"`    // the Bench's name (default: the Workshop's and a random suffix)
	// TTY gives the command a pseudo-terminal; Term is the caller's TERM for it.
	TTY          bool     `json:"tty,omitempty"`
	Term         string   `json:"term,omitempty"`         // the client's TERM, for the terminal (default xterm)
	MemoryBytes  int64    `json:"memory_bytes,omitempty"` // memory limit in bytes (0: none, or the users' bound)
	Pids         int64    `json:"pids,omitempty"`         // limit on the number of processes (0: none, or the users' bound)
	Substituters []string `json:"substituters,omitempty"` // caches to ask before building (operators only)
	// Verify re-hashes the Workshop's layers before launch and refuses a damaged one (the store's
	// verify_before_launch setting does it for every launch).
	Verify bool `json:"verify,omitempty"`
	// User is the account the command runs as: "" is the Workshop's `user` (root when it names none),
	// "root" is always there, any other must be one the Workshop declares ([[account]]).
	User string `json:"user,omitempty"`
	// Metrics measures the Bench's use of cpu and memory while it runs (bench.metrics, `bench ls`);
	// off by default for a one-shot run, whose launch it slows (a created Bench always has it).
	Metrics bool `json:"metrics,omitempty"`
	// Secrets are the supervisor's secrets the Bench may use, by name, beside its recipe's: it gets
	// placeholders, its proxy the values (docs/secrets.md).
	Secrets []string `json:"secrets,omitempty"`

	// slot is the caller's Bench slot that the policy reserved for this launch (ReserveBench).
	slot *Slot
}

// ExitResult is a command's exit code in a Bench.
type ExitResult struct {
	Exit int `json:"exit"` // the command's exit code (128+N for a signal N)
	// OOMKilled says that the kernel's OOM killer killed a process of the command for reaching the
	// Bench's memory limit, MemoryBytes.
	OOMKilled   bool  `json:"oom_killed,omitempty"`
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	// NoSpace, when the command failed while the filesystem of the Bench's upper layer (a kept
	// Bench's is on the store's) had no room left, says which filesystem and how full it is.
	NoSpace string `json:"no_space,omitempty"`
}

// BenchRun realizes a Workshop (a cache hit when warm), launches a Bench and runs the command.
func (s *Service) BenchRun(ctx context.Context, c *Call, req *BenchRunRequest) (*ExitResult, error) {
	sl := heldSlot(req)
	defer sl.release()
	if len(req.Argv) == 0 {
		return nil, usage("shed bench run [-f FILE] -- CMD [ARG...]", "a Bench needs a command")
	}
	if err := checkLimits(req.MemoryBytes, req.Pids); err != nil {
		return nil, err
	}
	var grants []bench.Grant
	for _, g := range req.Grants {
		gr, err := bench.ParseGrant(g)
		if err != nil {
			return nil, usage("e.g. --grant /srv/project:/work:rw", "%v", err)
		}
		// A grant's host path is the caller's: relative to where it is.
		gr.Host = c.path(gr.Host)
		grants = append(grants, gr)
	}
	limits := sandbox.Limits{MemoryBytes: req.MemoryBytes, Pids: req.Pids}
	if limits.MemoryBytes < 0 || limits.Pids < 0 {
		return nil, usage("limits are positive", "negative limit")
	}
	limits = s.limitsFor(c, limits)
	// Without a terminal, the Bench's init is a warm one of the supervisor's pool, given the
	// caller's stdio, or it starts now and initializes while the Workshop is realized (a cache hit
	// takes about as long); with one, realizing may draw progress before the terminal is made raw,
	// so init starts after.
	var pending *sandbox.Pending
	if !req.TTY {
		if pending = s.Pool.Take(req.Workshop); pending != nil {
			if err := pending.SetStdio(c.stdio()); err != nil {
				pending.Close()
				pending = nil
			}
		}
		if pending == nil {
			var err error
			if pending, err = sandbox.Prestart(ctx, c.stdio()); err != nil {
				return nil, err
			}
		}
		defer pending.Close()
	}
	w, err := s.realize(ctx, c, req.Workshop, req.Offline, req.Substituters)
	if err != nil {
		return nil, err
	}
	defer w.st.Close()
	if err := checkLayers(ctx, c, w, req.Verify); err != nil {
		return nil, err
	}
	secrets, err := s.benchSecrets(c.Caller, append(slices.Clone(req.Secrets), w.r.Network.Secrets...), nil)
	if err != nil {
		return nil, err
	}
	oom := false
	events := s.benchEvents(c, req.Workshop)
	code, err := s.withStdio(ctx, c, req.TTY, req.Term, sandbox.Winsize{}, func(stdio sandbox.Stdio, env []string) (int, error) {
		return bench.Run(ctx, w.st, w.r, w.plan.Layers, bench.Options{
			Name: req.Name, Owner: c.Caller.User, Grants: grants, Net: req.Net, Keep: req.Keep,
			Argv: req.Argv, User: req.User, Env: env, Limits: limits, Stdio: stdio, Init: pending, Event: events.hook(),
			Metrics:  req.Metrics,
			Secrets:  secrets,
			Reserved: sl.bound,
			Started:  func(*bench.Record) { sl.release() }, // its record counts from now
			Ended:    func(_ int, oomKilled bool) { oom = oomKilled },
			// The agent's one way to shed: a proposal, which a human then reads and confirms. It
			// goes through the same policy as every other request, as the agent of this Bench.
			Propose: s.agentProposes,
		})
	})
	if err != nil {
		return nil, err
	}
	if err := events.failed(); err != nil {
		return nil, &Error{Code: CodeFailed, Err: fmt.Errorf("the Bench ran (exit %d), but the audit log could not record its events: %w", code, err), Hint: auditHintFor(err)}
	}
	res := &ExitResult{Exit: code, OOMKilled: oom}
	if oom {
		res.MemoryBytes = limits.MemoryBytes
	}
	res.NoSpace = upperFull(w.st, req.Keep, code)
	return res, nil
}

// upperFull describes the store's filesystem when a command that exited with code in a Bench (kept:
// its upper layer is on that filesystem) failed while it had no room left: it failed for that,
// whatever it said. "" otherwise.
func upperFull(st *store.Store, kept bool, code int) string {
	if code == 0 || !kept || !nospace.Full(st.Root(), 1<<20) {
		return ""
	}
	return nospace.Of(st.Root(), false, errors.New("the Bench's upper layer is there")).Error()
}

func (c *Call) stdio() sandbox.Stdio {
	return sandbox.Stdio{Stdin: c.stdin(), Stdout: c.stdout(), Stderr: c.stderr()}
}

// withStdio runs fn with the caller's stdio, or with a pseudo-terminal that the Bench allocates from
// its own /dev/pts: the caller's is put in raw mode and its window size followed, so that the
// terminal inside behaves as the caller's would.
func (s *Service) withStdio(ctx context.Context, c *Call, tty bool, termName string, size sandbox.Winsize, fn func(sandbox.Stdio, []string) (int, error)) (int, error) {
	stdio := c.stdio()
	if c.IO != nil {
		stdio.Signal = c.IO.Signal
	}
	if !tty {
		return fn(stdio, nil)
	}
	in := stdio.Stdin.(*os.File)
	t := &sandbox.Terminal{}
	stdio.Terminal = t
	// The terminal's input and output are copied by goroutines of ours: they must end with the
	// request even if the caller's descriptors never become readable or writable (a client holding a
	// pipe open and silent, or a stopped terminal).
	stdio.Stdin = fdio.Reader(ctx, in)
	if out, ok := stdio.Stdout.(*os.File); ok {
		stdio.Stdout = fdio.Writer(ctx, out, 0)
	}
	if termName == "" {
		termName = "xterm"
	}
	env := []string{"TERM=" + termName}
	fd := int(in.Fd())
	if !term.IsTerminal(fd) {
		// The client tells the sizes (the E2B API).
		t.Size = size
		if c.IO != nil {
			t.Resize = c.IO.Winsize
		}
	} else {
		if old, err := term.MakeRaw(fd); err == nil {
			defer term.Restore(fd, old)
		}
		size := func() sandbox.Winsize {
			ws, err := unix.IoctlGetWinsize(fd, unix.TIOCGWINSZ)
			if err != nil {
				return sandbox.Winsize{}
			}
			return sandbox.Winsize{Rows: ws.Row, Cols: ws.Col}
		}
		t.Size = size()
		// Resizes come as SIGWINCH (in process), or from the client (through the daemon).
		winch := make(chan os.Signal, 1)
		signal.Notify(winch, syscall.SIGWINCH)
		defer signal.Stop(winch)
		var remote <-chan struct{}
		if c.IO != nil {
			remote = c.IO.Resize
		}
		resize := make(chan sandbox.Winsize, 1)
		t.Resize = resize
		done := make(chan struct{})
		defer close(done)
		go func() {
			for {
				select {
				case <-winch:
				case <-remote:
				case <-done:
					return
				case <-ctx.Done():
					return
				}
				// Only the latest size matters: replace one still pending.
				select {
				case <-resize:
				default:
				}
				resize <- size()
			}
		}()
	}
	return fn(stdio, env)
}

// sweep removes what dead Benches left; every operation that opens the store runs it, so that a
// SIGKILLed shed leaves nothing for long.
func sweep(st *store.Store) { _, _ = bench.Sweep(st) }

// MinMemory is the least memory limit a Bench may have: below it not even a shell starts, and a limit
// that small is a unit forgotten (64 meant as 64M).
const MinMemory = 16 << 20

// MinPids is the least limit on a Bench's processes: its init and the command.
const MinPids = 2

// checkLimits refuses limits a Bench cannot run under (0 is none).
func checkLimits(memory, pids int64) error {
	if memory != 0 && memory < MinMemory {
		return usage("a size with a unit: 512M, 4G (at least 16M)", "memory limit %d bytes is below the least a Bench can run in, 16 MiB", memory)
	}
	if pids != 0 && pids < MinPids {
		return usage("at least 2 (none: 0)", "a limit of %d processes is below the least a Bench can run in, %d: its init and the command", pids, MinPids)
	}
	return nil
}

// BenchListRequest asks for the running and kept Benches.
type BenchListRequest struct {
	// Snapshots lists the caller's snapshots too (task state beside its Benches: `shed bench ls`).
	Snapshots bool `json:"snapshots,omitempty"`
}

// BenchListResult lists Benches, by start time.
type BenchListResult struct {
	Benches []*bench.Record `json:"benches"` // the Benches, by start time (`bench.Record`: id, name, owner, workshop, layers, argv, net, grants, keep, started, running, exit, expires, record, version, paused, disk, from, and a running Bench's newest metrics)
	// Snapshots are the caller's snapshots, oldest first, when asked for.
	Snapshots []SnapshotInfo `json:"snapshots,omitempty"`
}

// MayUse says whether caller may act on the Bench rec: operators on every Bench, users on the ones
// they launched, an agent on its own.
func MayUse(caller *Caller, rec *bench.Record) bool {
	switch caller.Role {
	case Operator:
		return true
	case Agent:
		return rec.ID == caller.Bench
	}
	return rec.Owner == caller.User
}

// BenchList lists the Benches the caller may act on.
func (s *Service) BenchList(ctx context.Context, c *Call, req *BenchListRequest) (*BenchListResult, error) {
	st, err := s.openStore()
	if err != nil {
		return nil, err
	}
	defer st.Close()
	all, err := bench.List(st)
	if err != nil {
		return nil, err
	}
	recs := slices.DeleteFunc(all, func(r *bench.Record) bool { return !MayUse(c.Caller, r) })
	if recs == nil {
		recs = []*bench.Record{}
	}
	for _, r := range recs {
		if r.Paused != nil {
			t := r.Paused.Add(s.taskTTL()) // task state: it expires as such
			r.Expires = &t
		} else if t, ok := s.Detached.Expires(r.ID); ok {
			r.Expires = &t
		}
		r.Record, r.Version, _ = s.Records().VersionOf(r.Workshop)
	}
	s.withMetrics(recs)
	res := &BenchListResult{Benches: recs}
	if req.Snapshots {
		all, err := bench.Snapshots(st)
		if err != nil {
			return nil, err
		}
		for _, snap := range all {
			if c.Caller.Role == Operator || snap.Owner == c.Caller.User {
				res.Snapshots = append(res.Snapshots, snapshotInfo(snap))
			}
		}
	}
	return res, nil
}

// FindBench returns the Bench nameOrID of the store at root (for the policy: whose it is).
func FindBench(root, nameOrID string) (*bench.Record, error) {
	return bench.FindIn(filepath.Join(root, "benches"), nameOrID)
}

// ownBench finds the Bench nameOrID for an operation on it, if the caller may act on it. The policy
// decided already; this is the same rule, again where the Bench is used.
func ownBench(c *Call, st *store.Store, nameOrID string) (*bench.Record, error) {
	rec, err := bench.Find(st, nameOrID)
	if err != nil {
		return nil, err
	}
	if !MayUse(c.Caller, rec) {
		return nil, fail(CodeDenied, fmt.Errorf("%w: no bench %s of yours", ErrDenied, nameOrID),
			"`shed bench ls` lists your Benches; an operator may act on any")
	}
	return rec, nil
}

// BenchExecRequest asks to run a command in a running Bench.
type BenchExecRequest struct {
	Bench string   `json:"bench"`           // the Bench, by name or id
	Argv  []string `json:"argv,omitempty"`  // the command and its arguments
	Shell string   `json:"shell,omitempty"` // or a command line for /bin/sh -c (exactly one of argv and shell)
	Cwd   string   `json:"cwd,omitempty"`   // its working directory: absolute, or relative to the user's home (~ too); default that home
	Env   []string `json:"env,omitempty"`   // NAME=VALUE variables added to the Bench's
	// TimeoutS kills the command after that many seconds (0: none); the result then says timed_out.
	TimeoutS int64 `json:"timeout_s,omitempty"`
	// Capture returns stdout and stderr in the result (each at most MaxOutput bytes) instead of
	// writing them to the caller's descriptors; Stdin is then the command's input.
	Capture bool   `json:"capture,omitempty"`
	Stdin   string `json:"stdin,omitempty"`
	TTY     bool   `json:"tty,omitempty"`  // give the command a pseudo-terminal (raw mode and the window size follow the client's stdin when it is a terminal)
	Term    string `json:"term,omitempty"` // the client's TERM, for that terminal (default xterm)
	Rows    uint16 `json:"rows,omitempty"` // the terminal's rows when the client's stdin is not a terminal (0: unset)
	Cols    uint16 `json:"cols,omitempty"` // its columns, likewise

	// User is the account it runs as: "" is the Bench's default (its Workshop's `user`, or root),
	// "root" is always there, any other must be one its Workshop declares.
	User string `json:"user,omitempty"`
}

// ExecResult is a command's exit code and, when captured, its output.
type ExecResult struct {
	Exit      int    `json:"exit"`                // the command's exit code (128+N for a signal N)
	Stdout    string `json:"stdout,omitempty"`    // with capture: what it wrote to stdout
	Stderr    string `json:"stderr,omitempty"`    // with capture: what it wrote to stderr
	Truncated bool   `json:"truncated,omitempty"` // with capture: an output was longer than MaxOutput
	TimedOut  bool   `json:"timed_out,omitempty"` // it was killed after timeout_s
	// OOMKilled says that the kernel's OOM killer killed a process in the Bench, at its memory limit
	// (MemoryBytes), while the command ran: the command's, as a rule.
	OOMKilled   bool  `json:"oom_killed,omitempty"`
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	// NoSpace, when the command failed in a kept Bench while the filesystem of its upper layer (the
	// store's) had no room left, says which filesystem and how full it is.
	NoSpace string `json:"no_space,omitempty"`
}

var envRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=`) })

// BenchExec runs a command in a running Bench, with the caller's stdio or capturing its output.
func (s *Service) BenchExec(ctx context.Context, c *Call, req *BenchExecRequest) (*ExecResult, error) {
	argv := req.Argv
	switch {
	case len(argv) > 0 && req.Shell != "":
		return nil, usage("name the command as argv or as shell, not both", "both argv and shell")
	case req.Shell != "":
		argv = []string{"/bin/sh", "-c", req.Shell}
	case len(argv) == 0:
		return nil, usage("shed bench exec BENCH -- CMD [ARG...]", "bench exec wants a command")
	}
	if strings.ContainsRune(req.Cwd, 0) {
		return nil, usage("a directory, as the Bench sees it", "cwd %q", req.Cwd)
	}
	for _, e := range req.Env {
		if !envRE().MatchString(e) || strings.ContainsRune(e, 0) {
			return nil, usage("NAME=VALUE", "env %q", e)
		}
	}
	if req.TimeoutS < 0 || (req.Capture && req.TTY) {
		return nil, usage("a timeout in seconds; capture without tty", "timeout_s %d, capture %v, tty %v", req.TimeoutS, req.Capture, req.TTY)
	}
	st, rec, err := s.runningBench(c, req.Bench)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	runCtx := ctx
	if req.TimeoutS > 0 {
		var cancel context.CancelFunc
		runCtx, cancel = context.WithTimeout(ctx, time.Duration(req.TimeoutS)*time.Second)
		defer cancel()
	}
	acct, err := rec.Account(req.User)
	if err != nil {
		return nil, err
	}
	dir, err := InHome(req.Cwd, acct.Home)
	if err != nil {
		return nil, err
	}
	if req.Cwd == "" && rec.Workdir != "" {
		dir = rec.Workdir // the Workshop's workdir, as E2B's envd starts commands in a template's
	}
	er := sandbox.ExecRequest{Argv: argv, Dir: dir, UID: acct.UID, GID: acct.GID}
	res := &ExecResult{}
	// The Bench's memory cgroup's OOM kills, before and after: an exec'd command killed at the limit
	// is named as that, not a bare 137.
	memcg := memoryCgroup(rec)
	kills, _ := sandbox.OOMKills(memcg)
	defer func() {
		if after, limit := sandbox.OOMKills(memcg); memcg != "" && after > kills && res.Exit != 0 {
			res.OOMKilled, res.MemoryBytes = true, limit
		}
		res.NoSpace = upperFull(st, rec.Keep, res.Exit)
	}()
	if req.Capture {
		er.Env = req.Env
		var out, errb *capture
		res.Exit, out, errb, err = s.execIn(runCtx, st, rec, er, strings.NewReader(req.Stdin), MaxOutput)
		if out != nil {
			res.Stdout, res.Stderr, res.Truncated = out.buf.String(), errb.buf.String(), out.truncated || errb.truncated
		}
	} else {
		res.Exit, err = s.withStdio(runCtx, c, req.TTY, req.Term, sandbox.Winsize{Rows: req.Rows, Cols: req.Cols}, func(stdio sandbox.Stdio, env []string) (int, error) {
			er.Env = append(env, req.Env...)
			return bench.ExecRecord(runCtx, st, rec, er, stdio)
		})
	}
	if err != nil && req.TimeoutS > 0 && errors.Is(runCtx.Err(), context.DeadlineExceeded) && ctx.Err() == nil {
		res.Exit, res.TimedOut = 124, true // as timeout(1) says it
		return res, nil
	}
	if err != nil {
		return nil, err
	}
	return res, nil
}

// memcgs are the memory cgroups of the Benches commands were run in, by Bench and init pid: finding
// one reads the children of each of the init's threads and their /proc cgroup files, per command
// otherwise. An entry whose directory is gone (its Bench ended) is looked up again.
var memcgs struct {
	sync.Mutex
	m map[memcgKey]string
}

type memcgKey struct {
	id  string
	pid int
}

// maxMemcgs bounds memcgs: past it, it starts again empty.
const maxMemcgs = 1024

func memoryCgroup(rec *bench.Record) string {
	k := memcgKey{rec.ID, rec.Pid}
	memcgs.Lock()
	dir, ok := memcgs.m[k]
	memcgs.Unlock()
	if ok {
		if _, err := os.Stat(dir); err == nil {
			return dir
		}
	}
	dir = sandbox.MemoryCgroup(rec.Pid)
	if dir != "" {
		keepMemcg(k, dir)
	}
	return dir
}

func keepMemcg(k memcgKey, dir string) {
	memcgs.Lock()
	defer memcgs.Unlock()
	if memcgs.m == nil || len(memcgs.m) >= maxMemcgs {
		memcgs.m = make(map[memcgKey]string)
	}
	memcgs.m[k] = dir
}

// InHome makes a path of a Bench absolute as envd does for a user: "" is home, a relative path and
// "~/x" are under home; "~user" is refused (envd cannot expand it either).
func InHome(p, home string) (string, error) {
	switch {
	case p == "" || p == "~":
		return home, nil
	case strings.HasPrefix(p, "~/"):
		return path.Join(home, p[2:]), nil
	case strings.HasPrefix(p, "~"):
		return "", usage("a path, relative to the user's home or absolute (~ is that home; ~user is not expanded)", "path %.64q", p)
	case path.IsAbs(p):
		return path.Clean(p), nil
	}
	return path.Join(home, p), nil
}

// BenchRequest names one Bench.
type BenchRequest struct {
	Bench string `json:"bench"` // the Bench, by name or id
}

// TextResult is text an operation read for the caller (a log).
type TextResult struct {
	Text      string `json:"text"`                // the log
	Truncated bool   `json:"truncated,omitempty"` // the log is longer: Text is its first MaxText bytes
}

// MaxText bounds a log sent back in a result (it is held in memory a few times over on the way).
const MaxText = 8 << 20

// readText reads r's first MaxText bytes.
func readText(r io.Reader) (*TextResult, error) {
	b, err := io.ReadAll(io.LimitReader(r, MaxText+1))
	if err != nil {
		return nil, err
	}
	if len(b) > MaxText {
		return &TextResult{Text: string(b[:MaxText]), Truncated: true}, nil
	}
	return &TextResult{Text: string(b)}, nil
}

// BenchLogs returns a Bench's network log: every destination its proxy allowed or refused.
func (s *Service) BenchLogs(ctx context.Context, c *Call, req *BenchRequest) (*TextResult, error) {
	st, err := s.openStore()
	if err != nil {
		return nil, err
	}
	defer st.Close()
	rec, err := ownBench(c, st, req.Bench)
	if err != nil {
		return nil, err
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(bench.Logs(st, rec.ID, pw)) }()
	defer pr.Close() // and with it the copy
	return readText(pr)
}

// BenchRemoveRequest names Benches to stop or delete.
type BenchRemoveRequest struct {
	Benches []string `json:"benches"` // names or ids
}

// BenchRemoveResult lists the Benches removed.
type BenchRemoveResult struct {
	Removed []string `json:"removed"` // the names of the Benches removed, in order
}

// BenchRemove stops running Benches and deletes kept ones.
func (s *Service) BenchRemove(ctx context.Context, c *Call, req *BenchRemoveRequest) (*BenchRemoveResult, error) {
	if len(req.Benches) == 0 {
		return nil, usage("shed bench rm BENCH...", "name the Benches to remove")
	}
	st, err := s.openStore()
	if err != nil {
		return nil, err
	}
	defer st.Close()
	res := &BenchRemoveResult{Removed: []string{}}
	for _, b := range req.Benches {
		rec, err := ownBench(c, st, b)
		if err != nil {
			return res, err
		}
		if err := bench.Remove(st, rec.ID); err != nil {
			return res, err
		}
		res.Removed = append(res.Removed, rec.Name)
	}
	return res, nil
}

// BenchProposeRequest names the Bench to propose from.
type BenchProposeRequest = BenchRequest

// ProposeResult is a proposal made, with the diff a human reads before promoting it.
type ProposeResult struct {
	Proposal *proposal.Proposal `json:"proposal"` // the proposal (`proposal.Proposal`: id, workshop, base, bench, created, widens, added, grants, diff_sha256)
	Diff     string             `json:"diff"`     // the diff a human confirms (render it with every non-ASCII character visible)
}

// BenchPropose derives a proposal from what was installed in a Bench.
func (s *Service) BenchPropose(ctx context.Context, c *Call, req *BenchProposeRequest) (*ProposeResult, error) {
	st, err := s.openStore()
	if err != nil {
		return nil, err
	}
	defer st.Close()
	rec, err := ownBench(c, st, req.Bench)
	if errors.Is(err, bench.ErrNoBench) {
		if _, serr := s.ownSnapshot(c, st, req.Bench); serr == nil {
			return nil, s.taskState(c, st, req.Bench, "proposed")
		}
	}
	if err != nil {
		return nil, err
	}
	// The agent's proposals draw no progress: nothing of the Bench's side is a terminal of ours.
	b := s.newBuilder(c, st, false)
	p, diff, err := proposal.New(st, b).Propose(ctx, rec.ID)
	if err != nil {
		return nil, err
	}
	return &ProposeResult{Proposal: p, Diff: diff}, nil
}

// checkLayers re-hashes a Workshop's layers before a launch when asked (bench run --verify) or when
// the store says so for every launch (verify_before_launch): a damaged layer is refused, never
// mounted. The layers are held by the realize's temporary roots, so gc cannot swap them meanwhile.
func checkLayers(ctx context.Context, c *Call, w *realized, asked bool) error {
	if !asked && !w.st.Config().VerifyBeforeLaunch {
		return nil
	}
	start := time.Now()
	var n int64
	for _, l := range w.plan.Layers {
		info, err := w.st.Info(l)
		if err != nil {
			return err
		}
		got, err := store.ScanTree(ctx, w.st.Location(l))
		if err != nil {
			return fail(CodeProblems, fmt.Errorf("%s cannot be re-hashed: %w", w.st.Location(l), err),
				"`shed store verify --repair "+w.st.Location(l)+"` (an operator's command) puts its registered bytes back")
		}
		n += got.Size()
		if got.Hash() == info.ContentHash {
			continue
		}
		what := "its files differ from its record"
		if want, err := w.st.Manifest(l); err == nil {
			if diffs := store.DiffManifests(want, got); len(diffs) > 0 {
				what = fmt.Sprintf("%s from its record, first %s", Plural(len(diffs), "difference"), diffs[0])
			}
		}
		return fail(CodeProblems, fmt.Errorf("refusing to launch %s: layer %s is damaged: %s", w.r.Name, w.st.Location(l), what),
			"`shed store verify --repair "+w.st.Location(l)+"` (an operator's command) puts its registered bytes back")
	}
	c.notice("info", "verified %s (%s) in %s", Plural(len(w.plan.Layers), "layer"), builder.FormatBytes(n), time.Since(start).Round(time.Millisecond))
	return nil
}
