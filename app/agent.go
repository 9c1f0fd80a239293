package app

import (
	"archive/tar"
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"toolshed.dev/shed/bench"
	"toolshed.dev/shed/proposal"
	"toolshed.dev/shed/proxy"
	"toolshed.dev/shed/records"
	"toolshed.dev/shed/sandbox"
	"toolshed.dev/shed/store"
)

// The operations an agent harness uses (MCP, the E2B API): Benches that outlive the request that
// made them, commands whose output comes back in the result, and files.
func init() {
	op("workshop.launchable", (*Service).Launchable)
	op("bench.create", (*Service).BenchCreate)
	op("bench.write_file", (*Service).WriteFile)
	op("bench.write_files", (*Service).WriteFiles)
	op("bench.read_file", (*Service).ReadFile)
	op("bench.list_files", (*Service).ListFiles)
	op("bench.stat_file", (*Service).StatFile)
	op("bench.make_dir", (*Service).MakeDir)
	op("bench.remove_file", (*Service).RemoveFile)
	op("bench.move_file", (*Service).MoveFile)
	op("bench.set_lifetime", (*Service).SetLifetime)
}

// Detached runs the Benches that outlive their request (bench.create): only a long-lived process, the
// supervisor, has them. Its context bounds them all; Wait waits for them to end.
type Detached struct {
	Ctx context.Context
	wg  sync.WaitGroup

	mu      sync.Mutex
	running map[string]*lifetime // by Bench id, while it runs
}

// lifetime is when a detached Bench ends: a timer that cancels its context (or, with onTimeout
// "pause" or "pause-cold", pauses it), which a caller may reset; a paused Bench's is stopped.
type lifetime struct {
	timer       *time.Timer
	expires     time.Time
	onTimeout   string
	cancel      context.CancelFunc
	id          string       // its Bench's, once it runs (under Detached.mu)
	paused      bool         // its timer is stopped: the Bench is paused
	next        *relaunchReq // a reset's pending relaunch
	relaunching bool         // a reset's relaunch is under way
}

// relaunchReq is a reset's request to launch a Bench again over another upper: an empty one (from
// "") or a branch of from.
type relaunchReq struct {
	from string
	done chan relaunched
}

type relaunched struct {
	rec *bench.Record
	err error
}

// send tells the reset what became of the relaunch, once (what comes after is no news of it).
func (r *relaunchReq) send(v relaunched) {
	select {
	case r.done <- v:
	default:
	}
}

// relaunch asks the runner of Bench id to launch it again over another upper once its processes
// end (the caller then ends them: bench.Park), and returns where the result comes; ok false if no
// runner here keeps it, busy true if a reset of it is under way already.
func (d *Detached) relaunch(id, from string) (done <-chan relaunched, ok, busy bool) {
	if d == nil {
		return nil, false, false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	l, ok := d.running[id]
	if !ok {
		return nil, false, false
	}
	if l.next != nil || l.relaunching {
		return nil, true, true
	}
	r := &relaunchReq{from: from, done: make(chan relaunched, 1)}
	l.next = r
	return r.done, true, false
}

// withdraw takes back a relaunch that will not happen (its Park failed).
func (d *Detached) withdraw(id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if l, ok := d.running[id]; ok {
		l.next = nil
	}
}

// takeRelaunch is the pending relaunch of Bench id, if any (taken: the runner does it).
func (d *Detached) takeRelaunch(id string) *relaunchReq {
	d.mu.Lock()
	defer d.mu.Unlock()
	l, ok := d.running[id]
	if !ok || l.next == nil {
		return nil
	}
	r := l.next
	l.next, l.relaunching = nil, true
	return r
}

// relaunchedNow says Bench id's relaunch is done (its record is written, or it failed).
func (d *Detached) relaunchedNow(id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if l, ok := d.running[id]; ok {
		l.relaunching = false
	}
}

// hold stops the lifetime of Bench id while it is paused.
func (d *Detached) hold(id string) {
	if d == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if l, ok := d.running[id]; ok {
		l.timer.Stop()
		l.paused = true
	}
}

// resume gives Bench id, running again, a lifetime to expires (and, if set, what its end does).
func (d *Detached) resume(id string, expires time.Time, onTimeout string) {
	if d == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if l, ok := d.running[id]; ok {
		l.timer.Reset(time.Until(expires))
		l.expires, l.paused = expires, false
		if onTimeout != "" {
			l.onTimeout = onTimeout
		}
	}
}

// Wait waits for every detached Bench to end (after Ctx is done).
func (d *Detached) Wait() { d.wg.Wait() }

// Expires says when the detached Bench id ends (ok false: it is not one, or it ended).
func (d *Detached) Expires(id string) (time.Time, bool) {
	if d == nil {
		return time.Time{}, false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	l, ok := d.running[id]
	if !ok {
		return time.Time{}, false
	}
	return l.expires, true
}

func (d *Detached) track(id string, l *lifetime) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.running == nil {
		d.running = map[string]*lifetime{}
	}
	l.id = id
	d.running[id] = l
}

func (d *Detached) untrack(id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.running, id)
}

// reset moves the end of the detached Bench id to expires.
func (d *Detached) reset(id string, expires time.Time) bool {
	if d == nil {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	l, ok := d.running[id]
	if !ok {
		return false
	}
	l.timer.Reset(time.Until(expires))
	l.expires = expires
	return true
}

// holdArgv is a created Bench's main command: it only holds the Bench open for exec and files.
var holdArgv = []string{"sleep", "infinity"}

// LaunchableRequest asks for the Workshops the caller may launch.
type LaunchableRequest struct{}

// LaunchableResult lists them, each record's current version.
type LaunchableResult struct {
	Workshops []*records.Version `json:"workshops"` // the records the caller may realize and launch
}

// Launchable lists the Workshop records the caller may launch: every record for an operator, the ones
// that allow them (by name or @group) for a user.
func (s *Service) Launchable(ctx context.Context, c *Call, req *LaunchableRequest) (*LaunchableResult, error) {
	all, err := s.WorkshopList(ctx, c, &WorkshopListRequest{})
	if err != nil {
		return nil, err
	}
	res := &LaunchableResult{Workshops: []*records.Version{}}
	for _, v := range all.Records {
		if c.Caller.Role == Operator || Allows(c.Caller, v.Users) {
			res.Workshops = append(res.Workshops, v)
		}
	}
	return res, nil
}

// Allows says whether caller is among users (names, or @group).
func Allows(caller *Caller, users []string) bool {
	for _, u := range users {
		if g, ok := strings.CutPrefix(u, "@"); ok {
			for _, cg := range caller.Groups {
				if cg == g {
					return true
				}
			}
		} else if u == caller.User {
			return true
		}
	}
	return false
}

// BenchCreateRequest asks for a Bench that stays up after the request, for later exec and files.
type BenchCreateRequest struct {
	Workshop    string `json:"workshop"`               // a record's name (or, for an operator, a recipe file)
	Name        string `json:"name,omitempty"`         // the Bench's name (default: the Workshop's and a random suffix)
	LifetimeS   int64  `json:"lifetime_s,omitempty"`   // seconds after which the supervisor removes it (0: the supervisor's default)
	Net         string `json:"net,omitempty"`          // "recipe" (default) or "none"
	MemoryBytes int64  `json:"memory_bytes,omitempty"` // memory limit in bytes (0: none, or the users' bound)
	Pids        int64  `json:"pids,omitempty"`         // limit on the number of processes (0: none, or the users' bound)

	// NetAllow and NetDeny narrow the recipe's network profile for this Bench (as bench.set_network).
	NetAllow []string `json:"net_allow,omitempty"`
	NetDeny  []string `json:"net_deny,omitempty"`
	// Snapshot starts the Bench from a snapshot of the caller's (by id or name): its files as they
	// were sealed, over the same layers. Workshop is then unset (or the snapshot's).
	Snapshot string `json:"snapshot,omitempty"`
	// OnTimeout is what the end of its lifetime does: "kill" (the default) removes it, "pause" pauses
	// it (E2B's autoPause), to be resumed later, "pause-cold" ends its processes and keeps its files
	// (E2B's autoPause with autoPauseMemory false): a resume launches it again over them.
	OnTimeout string `json:"on_timeout,omitempty"`
	// Secrets are the supervisor's secrets the Bench may use, by name, beside its recipe's, and Inject
	// the headers its proxy sets on its requests to a host (E2B's network transforms; a value may
	// name a secret as ${e2b.secrets.NAME}). Only the caller's own secrets (an operator's: any).
	Secrets []string          `json:"secrets,omitempty"`
	Inject  []proxy.Injection `json:"inject,omitempty"`

	// slot is the caller's Bench slot that the policy reserved for this launch (ReserveBench).
	slot *Slot
}

// BenchCreateResult names the Bench made.
type BenchCreateResult struct {
	Bench   string    `json:"bench"`   // its name
	ID      string    `json:"id"`      // its id
	Expires time.Time `json:"expires"` // when the supervisor removes it
	// User is the account its commands run as by default ("" is root) and Accounts the ones its
	// Workshop declares beside root: what a request's user selects among.
	User     string          `json:"user,omitempty"`
	Accounts []bench.Account `json:"accounts,omitempty"`
}

// DefaultLifetime is a created Bench's lifetime when the request names none; MaxLifetime bounds it.
const (
	DefaultLifetime = time.Hour
	MaxLifetime     = 24 * time.Hour
)

// BenchCreate realizes a Workshop and starts a Bench of it that lives until it is removed or its
// lifetime ends: what an agent harness asks for, then runs commands in.
func (s *Service) BenchCreate(ctx context.Context, c *Call, req *BenchCreateRequest) (*BenchCreateResult, error) {
	// The slot the policy reserved is held until the Bench's record exists or the launch failed: by
	// this call until the Bench's goroutine starts, then by that goroutine.
	sl := heldSlot(req)
	handed := false
	defer func() {
		if !handed {
			sl.release()
		}
	}()
	if s.Detached == nil {
		return nil, usage("start the supervisor (`shed daemon`, docs/supervisor.md) and call it", "bench.create needs the supervisor: a Bench it makes outlives the command that asked")
	}
	life, err := lifetimeOf(req.LifetimeS)
	if err != nil {
		return nil, err
	}
	if err := checkLimits(req.MemoryBytes, req.Pids); err != nil {
		return nil, err
	}
	if err := checkOnTimeout(req.OnTimeout); err != nil {
		return nil, err
	}
	limits := s.limitsFor(c, sandbox.Limits{MemoryBytes: req.MemoryBytes, Pids: req.Pids})
	rules, err := bench.NetworkRules(req.NetAllow, req.NetDeny)
	if err != nil {
		return nil, err
	}
	opts := bench.Options{
		// The hold is shed's, not the agent's: root's, whatever the Workshop's user.
		Name: req.Name, Owner: c.Caller.User, Net: req.Net, Rules: rules, Argv: holdArgv, User: "root", Limits: limits,
	}
	var w *realized
	workshop := req.Workshop
	if req.Snapshot != "" {
		w, err = s.fromSnapshot(ctx, c, req.Snapshot, &opts)
		workshop = ""
	} else {
		w, err = s.realize(ctx, c, req.Workshop, false, nil)
	}
	if err != nil {
		return nil, err
	}
	if err := checkLayers(ctx, c, w, false); err != nil {
		w.st.Close()
		return nil, err
	}
	if opts.Secrets, err = s.benchSecrets(c.Caller, append(slices.Clone(req.Secrets), w.r.Network.Secrets...), req.Inject); err != nil {
		w.st.Close()
		return nil, err
	}
	// A warm init of the Workshop's, or a shared one (a snapshot's Bench: any init serves).
	d := &detached{w: w, workshop: cmp.Or(workshop, req.Snapshot), life: life, onTimeout: req.OnTimeout, slot: sl, warm: s.Pool.Take(workshop), opts: opts}
	handed = true
	rec, expires, err := s.launchDetached(ctx, c, d)
	if err != nil {
		return nil, err
	}
	return &BenchCreateResult{Bench: rec.Name, ID: rec.ID, Expires: expires, User: rec.User, Accounts: rec.Accounts}, nil
}

// detached is a launch of a Bench that outlives its request (bench.create, a fork's child, a
// resume or reset that launches a paused Bench again).
type detached struct {
	w         *realized // its Workshop, realized: the launch owns its store from then on
	workshop  string    // as the request named it (the warm pool's and the audit's name)
	opts      bench.Options
	life      time.Duration
	onTimeout string // "pause", "pause-cold": its lifetime's end pauses it; else ("kill", "") it ends
	slot      *Slot  // the owner's Bench slot, held until its record exists or the launch failed
	warm      *sandbox.Pending
	release   func() // gives w's store back once the Bench ends (nil: closes it)
}

// launchDetached starts d's Bench in a goroutine of the supervisor's, over an upper on the uppers
// filesystem (every Bench that outlives its request can be paused, snapshotted, forked and reset),
// and returns once it runs (its record written) or its launch failed. It owns d.w's store and
// d.slot from the call on.
func (s *Service) launchDetached(ctx context.Context, c *Call, d *detached) (*bench.Record, time.Time, error) {
	sl := d.slot
	if d.release == nil {
		d.release = func() { d.w.st.Close() }
	}
	fs, err := s.uppers(d.w.st)
	if err == nil {
		d.opts.DiskGroup, err = s.diskGroup(fs, c, d.opts.Owner)
	}
	if err != nil {
		d.release()
		sl.release()
		if d.warm != nil {
			d.warm.Close()
		}
		return nil, time.Time{}, err
	}
	started := make(chan *bench.Record, 1)
	failed := make(chan error, 1)
	expires := time.Now().Add(d.life).UTC().Truncate(time.Second)
	s.Detached.wg.Add(1)
	bctx, cancel := context.WithCancel(s.Detached.Ctx)
	go func() {
		defer s.Detached.wg.Done()
		defer sl.release()
		defer d.release() // its temporary roots hold the layers while the Bench runs
		defer cancel()
		life := &lifetime{expires: expires, onTimeout: d.onTimeout, cancel: cancel}
		var id string
		life.timer = time.AfterFunc(time.Until(expires), func() { s.lifetimeEnded(life) })
		defer life.timer.Stop()
		defer func() {
			if id != "" {
				s.Detached.untrack(id)
			}
		}()
		if d.warm != nil {
			defer d.warm.Close() // a no-op once used
		}
		opts := d.opts
		opts.Disk, opts.Init, opts.Metrics = fs, d.warm, true // metrics: its API clients read them (E2B's /metrics, MCP's bench_metrics)
		opts.OnTimeout = d.onTimeout
		opts.Reserved = sl.bound
		opts.Started = func(rec *bench.Record) {
			sl.release() // its record counts from now
			id = rec.ID
			s.Detached.track(id, life) // and life.id, under the tracker's lock
			started <- rec
		}
		opts.Event = s.benchEvents(c, d.workshop).hook() // after the create answered: a note that fails is logged
		opts.Propose = s.agentProposes
		fail := func(err error) { failed <- err } // the launch's caller waits for it (buffered)
		for {
			_, err := bench.Run(bctx, d.w.st, d.w.r, d.w.plan.Layers, opts)
			if opts.Init != nil {
				opts.Init.Close() // a no-op once used; a relaunch that failed before its start leaves it
			}
			// A reset ended it to launch it again over another upper (Detached.relaunch).
			next := s.Detached.takeRelaunch(id)
			if next == nil {
				if err != nil {
					fail(err)
					s.log().Info("created bench ended", "owner", c.Caller.User, "err", err)
				}
				return
			}
			if err := replaceUpper(fs, id, next.from); err != nil {
				s.Detached.relaunchedNow(id)
				next.send(relaunched{err: err})
				return // paused, over whatever upper it has: a resume or rm deals with it
			}
			opts.Resume, opts.ID, opts.Reserved = true, id, nil
			s.Detached.mu.Lock()
			opts.OnTimeout = life.onTimeout // as the last resume set it
			s.Detached.mu.Unlock()
			// Its network rules as its record has them now (bench.set_network changes them).
			if cur, err := bench.FindIn(benchesDir(s.Root), id); err == nil {
				opts.Rules, _ = bench.NetworkRules(cur.NetAllow, cur.NetDeny)
			}
			opts.Init = s.Pool.Take(d.workshop) // or a shared one
			opts.Started = func(rec *bench.Record) {
				s.Detached.relaunchedNow(id)
				next.send(relaunched{rec: rec})
			}
			fail = func(err error) {
				s.Detached.relaunchedNow(id)
				next.send(relaunched{err: err})
			}
		}
	}()
	select {
	case rec := <-started:
		return rec, expires, nil
	case err := <-failed:
		return nil, time.Time{}, err
	case <-ctx.Done():
		// The caller went away before its Bench was up: no one has its name, so it ends now rather
		// than hold a slot of the caller's until its lifetime.
		cancel()
		return nil, time.Time{}, ctx.Err()
	}
}

// lifetimeOf is a request's lifetime_s as a duration: 0 is DefaultLifetime, MaxLifetime bounds it.
func lifetimeOf(seconds int64) (time.Duration, error) {
	switch {
	case seconds < 0:
		return 0, usage("a number of seconds", "lifetime_s %d", seconds)
	case seconds == 0:
		return DefaultLifetime, nil
	case seconds > int64(MaxLifetime/time.Second): // before the multiplication, which could wrap
		return 0, usage(fmt.Sprintf("at most %d seconds", int(MaxLifetime/time.Second)), "lifetime_s %d is too long", seconds)
	}
	return time.Duration(seconds) * time.Second, nil
}

// SetLifetimeRequest asks to move the end of a created Bench.
type SetLifetimeRequest struct {
	Bench     string `json:"bench"`      // the Bench, by name or id
	LifetimeS int64  `json:"lifetime_s"` // seconds from now after which the supervisor removes it (0: the default)
}

// SetLifetime moves the end of a Bench that bench.create made to lifetime_s from now (as E2B's
// set-timeout does: shorter or longer).
func (s *Service) SetLifetime(ctx context.Context, c *Call, req *SetLifetimeRequest) (*BenchCreateResult, error) {
	life, err := lifetimeOf(req.LifetimeS)
	if err != nil {
		return nil, err
	}
	st, rec, err := s.runningBench(c, req.Bench)
	if err != nil {
		return nil, err
	}
	st.Close()
	expires := time.Now().Add(life).UTC().Truncate(time.Second)
	if !s.Detached.reset(rec.ID, expires) {
		return nil, fail(CodeFailed, fmt.Errorf("bench %s has no lifetime: it was not made by bench.create, or it is ending", rec.Name),
			"a Bench of `shed bench run` ends with its command")
	}
	return &BenchCreateResult{Bench: rec.Name, ID: rec.ID, Expires: expires}, nil
}

// limitsFor fills a user's unset limits with the users' bounds (the policy refused any above them).
func (s *Service) limitsFor(c *Call, l sandbox.Limits) sandbox.Limits {
	if c.Caller.Role != Operator {
		if l.MemoryBytes == 0 {
			l.MemoryBytes = s.UserLimits.MemoryBytes
		}
		if l.Pids == 0 {
			l.Pids = s.UserLimits.Pids
		}
	}
	return l
}

// agentProposes is what a Bench's propose socket does: bench.propose, through the policy, as that
// Bench's agent.
func (s *Service) agentProposes(ctx context.Context, id string) (string, error) {
	agent := &Call{Caller: &Caller{User: "agent of bench " + id, Role: Agent, Bench: id, Dir: "/"}}
	res, err := s.Do(ctx, agent, "bench.propose", &BenchProposeRequest{Bench: id})
	if err != nil {
		return "", err
	}
	p := res.(*ProposeResult)
	return proposal.Visible(p.Diff) + fmt.Sprintf("shed: proposal %s: an operator promotes it with `shed workshop promote %s`\n", p.Proposal.ID, p.Proposal.ID), nil
}

// capture is a bounded buffer for a command's output returned in a result.
type capture struct {
	buf       bytes.Buffer
	max       int
	truncated bool
}

func (b *capture) Write(p []byte) (int, error) {
	if room := b.max - b.buf.Len(); len(p) > room {
		b.truncated = true
		b.buf.Write(p[:max(room, 0)])
		return len(p), nil
	}
	return b.buf.Write(p)
}

// MaxOutput bounds each of a captured command's stdout and stderr.
const MaxOutput = 1 << 20

// execIn runs argv in a running Bench with stdin from in, and returns its exit code and output.
func (s *Service) execIn(ctx context.Context, st *store.Store, rec *bench.Record, er sandbox.ExecRequest, in io.Reader, maxOut int) (int, *capture, *capture, error) {
	out, errb := &capture{max: maxOut}, &capture{max: MaxOutput}
	code, err := bench.ExecRecord(ctx, st, rec, er, sandbox.Stdio{Stdin: in, Stdout: out, Stderr: errb})
	return code, out, errb, err
}

// benchFile checks a path in a Bench: absolute, clean, no NUL.
func benchFile(p string) (string, error) {
	if !path.IsAbs(p) || strings.ContainsRune(p, 0) {
		return "", usage("an absolute path, as the Bench sees it (/root/notes.txt)", "path %q", p)
	}
	return path.Clean(p), nil
}

// WriteFileRequest asks to write a file in a Bench.
type WriteFileRequest struct {
	Bench   string `json:"bench"`          // the Bench, by name or id
	Path    string `json:"path"`           // absolute, as the Bench sees it; missing directories are made
	Content string `json:"content"`        // the file's bytes
	Mode    string `json:"mode,omitempty"` // octal, e.g. "0755" (default 0644)

	// User is the account that owns the file and the directories made for it ("" is the Bench's
	// default user, "root" is always there), as for bench.write_files.
	User string `json:"user,omitempty"`
}

// WriteFile writes a file in a running Bench, as its root, from inside: the path is resolved in the
// Bench's own mount namespace by its own processes, never on the host.
func (s *Service) WriteFile(ctx context.Context, c *Call, req *WriteFileRequest) (*Empty, error) {
	p, err := benchFile(req.Path)
	if err != nil {
		return nil, err
	}
	mode := "0644"
	if req.Mode != "" {
		if m, err := strconv.ParseUint(req.Mode, 8, 32); err != nil || m > 0o7777 {
			return nil, usage("octal, e.g. 0755", "mode %q", req.Mode)
		}
		mode = req.Mode
	}
	st, rec, err := s.runningBench(c, req.Bench)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	acct, err := rec.Account(req.User)
	if err != nil {
		return nil, err
	}
	script := mkdirs + `mk "$(dirname -- "$1")"; cat > "$1"; [ -z "${OWN:-}" ] || chown -- "$OWN" "$1"; chmod "$2" -- "$1"`
	er := sandbox.ExecRequest{Argv: []string{"/bin/sh", "-c", script, "sh", p, mode}, Dir: "/", Env: ownEnv(acct)}
	code, _, errb, err := s.execIn(ctx, st, rec, er, strings.NewReader(req.Content), 0)
	if err != nil {
		return nil, err
	}
	if code != 0 {
		return nil, fail(CodeFailed, fmt.Errorf("write %s in bench %s: %s", p, rec.Name, firstLine(errb.buf.String(), code)), "")
	}
	return &Empty{}, nil
}

// WriteFilesRequest asks to write many files in a Bench at once (an upload of several): one
// operation, one command in the Bench and one audit entry, however many files.
type WriteFilesRequest struct {
	Bench string `json:"bench"` // the Bench, by name or id
	// Files are the files, each {path, content, mode} as bench.write_file's, written in order (a
	// path named twice ends as the last names it): at most 4096 (MaxWriteFiles), their contents at
	// most 8 MiB together (MaxWriteBytes).
	Files []FileWrite `json:"files"`
	// Metadata is every file's metadata (the E2B API's: package bench keeps it as extended
	// attributes); what a file had before is removed either way.
	Metadata map[string]string `json:"metadata,omitempty"`
	// User is the account that owns what is written (the files, and the directories made for them),
	// as envd does for E2B's user: "" is the Bench's default user, "root" is always there.
	User string `json:"user,omitempty"`
}

// FileWrite is one file of a bench.write_files.
type FileWrite struct {
	Path    string `json:"path"`           // absolute, as the Bench sees it; missing directories are made
	Content string `json:"content"`        // the file's bytes
	Mode    string `json:"mode,omitempty"` // octal, e.g. "0755" (default 0644)
}

// WriteFilesResult names the files written.
type WriteFilesResult struct {
	Paths []string `json:"paths"` // each file's path, clean, in the request's order
}

// The bounds of one bench.write_files: a request over them is refused before anything is written.
const (
	MaxWriteFiles = 4096    // files
	MaxWriteBytes = MaxText // their contents, together
	maxPathLen    = 4096    // one path's bytes (PATH_MAX)
)

// WriteFiles writes files in a running Bench, as its root, from inside, with one command: tar
// (Debian's, or busybox's) reads them from its stdin, in the Bench's own mount namespace, so every
// path resolves there, never on the host. A file that exists is replaced (a symlink at the path
// too, not followed); on a failure the files before the one that failed may be written.
func (s *Service) WriteFiles(ctx context.Context, c *Call, req *WriteFilesRequest) (*WriteFilesResult, error) {
	if len(req.Files) == 0 {
		return nil, usage("name at least one file", "no files to write")
	}
	if len(req.Files) > MaxWriteFiles {
		return nil, usage(fmt.Sprintf("at most %d files a request: send the others in more requests", MaxWriteFiles), "%d files in one request", len(req.Files))
	}
	if err := checkMetadata(req.Metadata); err != nil {
		return nil, err
	}
	headers := make([]*tar.Header, len(req.Files))
	paths := make([]string, len(req.Files))
	total := 0
	now := time.Now().Truncate(time.Second)
	for i, f := range req.Files {
		p, err := benchFile(f.Path)
		if err != nil {
			return nil, err
		}
		if p == "/" || len(p) > maxPathLen {
			return nil, usage(fmt.Sprintf("a file's absolute path, at most %d bytes", maxPathLen), "path %.64q", p)
		}
		mode := uint64(0o644)
		if f.Mode != "" {
			if mode, err = strconv.ParseUint(f.Mode, 8, 32); err != nil || mode > 0o7777 {
				return nil, usage("octal, e.g. 0755", "%s: mode %q", p, f.Mode)
			}
		}
		if total += len(f.Content); total > MaxWriteBytes {
			return nil, usage(fmt.Sprintf("at most %d bytes of contents a request: send the others in more requests", MaxWriteBytes), "more than %d bytes of contents in one request", MaxWriteBytes)
		}
		paths[i] = p
		// A name relative to the Bench's root (tar -C /); the GNU format holds a long one.
		headers[i] = &tar.Header{Typeflag: tar.TypeReg, Name: p[1:], Mode: int64(mode), Size: int64(len(f.Content)), ModTime: now, Format: tar.FormatGNU}
	}
	st, rec, err := s.runningBench(c, req.Bench)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	acct, err := rec.Account(req.User)
	if err != nil {
		return nil, err
	}
	// As root, tar writes what the Bench's root may; for another account, its files carry the
	// account's ids (tar, run as root, keeps a header's owner) and the directories made for them are
	// the account's too (mkdirs), as envd makes them.
	er := sandbox.ExecRequest{Argv: []string{"tar", "-x", "-f", "-", "-C", "/"}, Dir: "/", Env: agentEnv}
	if acct.UID != 0 {
		dirs, size := []string{}, 0
		seen := map[string]bool{}
		for i, h := range headers {
			h.Uid, h.Gid = int(acct.UID), int(acct.GID)
			if d := path.Dir(paths[i]); !seen[d] {
				seen[d], size = true, size+len(d)+1
				dirs = append(dirs, d)
			}
		}
		if size > maxDirArgs {
			return nil, usage("files in fewer directories a request: send the others in more requests", "the files of one request are in directories of more than %d bytes of names", maxDirArgs)
		}
		script := mkdirs + `for d; do mk "$d"; done; exec tar -x -f - -C / --numeric-owner`
		er = sandbox.ExecRequest{Argv: append([]string{"/bin/sh", "-c", script, "sh"}, dirs...), Dir: "/", Env: ownEnv(acct)}
	}
	pr, pw := io.Pipe()
	defer pr.Close() // and with it a write tar did not read
	go func() {
		tw := tar.NewWriter(pw)
		for i, h := range headers {
			if err := tw.WriteHeader(h); err != nil {
				pw.CloseWithError(err)
				return
			}
			if _, err := io.WriteString(tw, req.Files[i].Content); err != nil {
				pw.CloseWithError(err)
				return
			}
		}
		pw.CloseWithError(tw.Close())
	}()
	code, _, errb, err := s.execIn(ctx, st, rec, er, pr, 0)
	if err != nil {
		return nil, err
	}
	if code != 0 {
		return nil, fail(CodeFailed, fmt.Errorf("write %s in bench %s: %s", Plural(len(paths), "file"), rec.Name, firstLine(errb.buf.String(), code)),
			"bench.write_files runs tar in the Bench: its Workshop needs one (Debian's, or busybox's)")
	}
	// tar kept no attributes of a file it replaced; a stale one of ours is removed all the same.
	if err := bench.SetMetadata(rec, paths, req.Metadata); err != nil {
		return nil, fail(CodeFailed, fmt.Errorf("write %s in bench %s: written, but %w", Plural(len(paths), "file"), rec.Name, err), "")
	}
	return &WriteFilesResult{Paths: paths}, nil
}

// summary is what the audit log says of a bench.write_files: how many files, and the first.
func (r *WriteFilesRequest) summary() string {
	if len(r.Files) == 0 {
		return "no files"
	}
	return fmt.Sprintf("%s, first %.256s", Plural(len(r.Files), "file"), r.Files[0].Path) // bounded: a refused request is recorded too
}

// agentEnv is what the commands shed runs in a Bench for files add to its environment.
var agentEnv = []string{"LC_ALL=C"}

// mkdirs defines mk DIR, which makes DIR and the directories above it that are missing, each given
// to $OWN (uid:gid) when it is set: what envd does for the directories of a file it writes for a user.
const mkdirs = `set -e; mk() { [ -d "$1" ] && return 0; mk "$(dirname -- "$1")"; mkdir -- "$1"; [ -z "${OWN:-}" ] || chown -- "$OWN" "$1"; }; `

// maxDirArgs bounds the names of the directories one bench.write_files makes for an account (they
// are a command's arguments, within the kernel's ARG_MAX).
const maxDirArgs = 512 << 10

// ownEnv is agentEnv with OWN set to the account's ids, for mkdirs (empty for root: mk leaves owners be).
func ownEnv(a bench.Account) []string {
	if a.UID == 0 {
		return agentEnv
	}
	return append(slices.Clone(agentEnv), fmt.Sprintf("OWN=%d:%d", a.UID, a.GID))
}

// firstLine is the first line of a command's stderr, for an error, at most maxErrLine bytes: the
// command is the Bench's (its agent may have replaced tar or sh), and its line is in the answer.
func firstLine(s string, code int) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	if s == "" {
		return "exit " + strconv.Itoa(code)
	}
	if len(s) > maxErrLine {
		n := maxErrLine
		for n > 0 && !utf8.RuneStart(s[n]) {
			n--
		}
		s = fmt.Sprintf("%s…[%d bytes]", s[:n], len(s))
	}
	return s
}

// maxErrLine bounds the line of a command's stderr that an error quotes.
const maxErrLine = 1024

// ReadFileRequest asks for a file of a Bench.
type ReadFileRequest struct {
	Bench string `json:"bench"` // the Bench, by name or id
	Path  string `json:"path"`  // absolute, as the Bench sees it
}

// FileResult is a file's content.
type FileResult struct {
	Content string `json:"content"` // the file's bytes (at most MaxText)
}

// ReadFile reads a file of a running Bench, from inside it.
func (s *Service) ReadFile(ctx context.Context, c *Call, req *ReadFileRequest) (*FileResult, error) {
	p, err := benchFile(req.Path)
	if err != nil {
		return nil, err
	}
	st, rec, err := s.runningBench(c, req.Bench)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	er := sandbox.ExecRequest{Argv: []string{"cat", "--", p}, Dir: "/", Env: agentEnv}
	code, out, errb, err := s.execIn(ctx, st, rec, er, nil, MaxText)
	if err != nil {
		return nil, err
	}
	if code != 0 {
		return nil, fail(CodeNotFound, fmt.Errorf("read %s in bench %s: %s", p, rec.Name, firstLine(errb.buf.String(), code)), "")
	}
	if out.truncated {
		return nil, fail(CodeFailed, fmt.Errorf("read %s in bench %s: larger than %d bytes", p, rec.Name, MaxText), "read it in parts with bench.exec (head, tail, split)")
	}
	return &FileResult{Content: out.buf.String()}, nil
}

// ListFilesRequest asks for a directory's entries in a Bench.
type ListFilesRequest struct {
	Bench string `json:"bench"`           // the Bench, by name or id
	Path  string `json:"path"`            // an absolute directory, as the Bench sees it
	Depth int    `json:"depth,omitempty"` // how many levels down to list (default 1: the directory's own entries)
}

// FileEntry is one file of a Bench, as `find -printf` inside it tells.
type FileEntry struct {
	Name     string    `json:"name"`             // its name in its directory
	Path     string    `json:"path"`             // its absolute path
	Type     string    `json:"type"`             // "file", "dir", "symlink" or "other"
	Size     int64     `json:"size"`             // bytes
	Mode     uint32    `json:"mode"`             // permission bits (07777)
	Owner    string    `json:"owner"`            // its owner's name in the Bench
	Group    string    `json:"group"`            // its group's
	Modified time.Time `json:"modified"`         // its last change
	Target   string    `json:"target,omitempty"` // a symlink's target

	// What a symlink resolves to (unset if nothing: dangling, a loop).
	Resolved   string `json:"resolved,omitempty"`    // its target resolved inside the Bench, absolute
	TargetType string `json:"target_type,omitempty"` // what it resolves to: "file", "dir" or "other"
	TargetMode uint32 `json:"target_mode,omitempty"` // and that file's permission bits

	Metadata map[string]string `json:"metadata,omitempty"` // its metadata (bench.write_files'), if it has any
}

// ListFilesResult is a directory's entries, sorted by path.
type ListFilesResult struct {
	Entries []FileEntry `json:"entries"` // the entries
}

// MaxDepth bounds a listing's depth.
const MaxDepth = 16

// ListFiles lists a directory of a running Bench, from inside it.
func (s *Service) ListFiles(ctx context.Context, c *Call, req *ListFilesRequest) (*ListFilesResult, error) {
	depth := req.Depth
	switch {
	case depth == 0:
		depth = 1
	case depth < 0 || depth > MaxDepth:
		return nil, usage(fmt.Sprintf("a depth from 1 to %d", MaxDepth), "depth %d", req.Depth)
	}
	entries, err := s.findIn(ctx, c, req.Bench, req.Path, "-mindepth", "1", "-maxdepth", strconv.Itoa(depth))
	if err != nil {
		return nil, err
	}
	return &ListFilesResult{Entries: entries}, nil
}

// StatFile describes one file of a running Bench (a symlink itself, not its target).
func (s *Service) StatFile(ctx context.Context, c *Call, req *BenchPathRequest) (*FileEntry, error) {
	entries, err := s.findIn(ctx, c, req.Bench, req.Path, "-maxdepth", "0")
	if err != nil {
		return nil, err
	}
	if len(entries) != 1 {
		return nil, fail(CodeFailed, fmt.Errorf("stat %s in bench %s: %d entries", req.Path, req.Bench, len(entries)), "")
	}
	return &entries[0], nil
}

// findEntry is what find prints of a file: NUL-separated fields, the last ends the entry.
const findEntry = `%y\0%m\0%s\0%T@\0%u\0%g\0%l\0%p\0`

// findIn runs find over a path of the caller's Bench, inside it, and parses what it prints.
func (s *Service) findIn(ctx context.Context, c *Call, benchName, dir string, args ...string) ([]FileEntry, error) {
	p, err := benchFile(dir)
	if err != nil {
		return nil, err
	}
	st, rec, err := s.runningBench(c, benchName)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	argv := append([]string{"find", p}, args...)
	argv = append(argv, "-printf", findEntry)
	code, out, errb, err := s.execIn(ctx, st, rec, sandbox.ExecRequest{Argv: argv, Dir: "/", Env: agentEnv}, nil, MaxText)
	if err != nil {
		return nil, err
	}
	if code != 0 {
		return nil, fail(CodeNotFound, fmt.Errorf("%s in bench %s: %s", p, rec.Name, firstLine(errb.buf.String(), code)), "")
	}
	if out.truncated {
		return nil, fail(CodeFailed, fmt.Errorf("list %s in bench %s: longer than %d bytes", p, rec.Name, MaxText), "list a smaller depth, or parts")
	}
	f := strings.Split(out.buf.String(), "\x00")
	entries := []FileEntry{}
	for i := 0; i+8 <= len(f); i += 8 {
		mode, _ := strconv.ParseUint(f[i+1], 8, 32)
		size, _ := strconv.ParseInt(f[i+2], 10, 64)
		secs, _ := strconv.ParseFloat(f[i+3], 64)
		t := map[string]string{"f": "file", "d": "dir", "l": "symlink"}[f[i]]
		if t == "" {
			t = "other"
		}
		full := f[i+7]
		entries = append(entries, FileEntry{
			Name: path.Base(full), Path: full, Type: t, Size: size, Mode: uint32(mode), Owner: f[i+4], Group: f[i+5],
			Modified: time.Unix(0, int64(secs*1e9)).UTC(), Target: f[i+6],
		})
	}
	slices.SortFunc(entries, func(a, b FileEntry) int { return strings.Compare(a.Path, b.Path) })
	s.resolveLinks(ctx, st, rec, entries)
	paths := make([]string, len(entries))
	for i := range entries {
		paths[i] = entries[i].Path
	}
	if md, err := bench.Metadata(rec, paths); err == nil {
		for i := range entries {
			entries[i].Metadata = md[i]
		}
	}
	return entries, nil
}

// BenchPathRequest names one path of a Bench.
type BenchPathRequest struct {
	Bench string `json:"bench"` // the Bench, by name or id
	Path  string `json:"path"`  // absolute, as the Bench sees it
	// User, for bench.make_dir, is the account that owns the directories made ("" is the Bench's
	// default user, "root" is always there).
	User string `json:"user,omitempty"`
}

// MadeResult says whether an operation made something or found it there.
type MadeResult struct {
	Created bool `json:"created"` // false: it was there already
}

// MakeDir makes a directory of a running Bench and the ones above it, from inside it.
func (s *Service) MakeDir(ctx context.Context, c *Call, req *BenchPathRequest) (*MadeResult, error) {
	out, err := s.shIn(ctx, c, req.Bench, req.User, `if [ -d "$1" ]; then echo exists; else mk "$1"; fi`, req.Path)
	if err != nil {
		return nil, err
	}
	return &MadeResult{Created: out != "exists\n"}, nil
}

// RemoveFileRequest names a path of a Bench to remove.
type RemoveFileRequest struct {
	Bench     string `json:"bench"`                // the Bench, by name or id
	Path      string `json:"path"`                 // absolute, as the Bench sees it
	MissingOK bool   `json:"missing_ok,omitempty"` // a path that is not there is removed already (envd's, rm -f's answer), not an error
}

// RemoveFile removes a file of a running Bench, or a directory and all it holds, from inside it.
func (s *Service) RemoveFile(ctx context.Context, c *Call, req *RemoveFileRequest) (*Empty, error) {
	missing := `{ echo "$1: no such file or directory" >&2; exit 2; }`
	if req.MissingOK {
		missing = "exit 0"
	}
	if _, err := s.shIn(ctx, c, req.Bench, "root", `[ -e "$1" ] || [ -L "$1" ] || `+missing+`; rm -rf -- "$1"`, req.Path); err != nil {
		return nil, err
	}
	return &Empty{}, nil
}

// MoveFileRequest asks to rename a file of a Bench.
type MoveFileRequest struct {
	Bench string `json:"bench"` // the Bench, by name or id
	From  string `json:"from"`  // absolute, as the Bench sees it
	To    string `json:"to"`    // the new path, absolute; missing directories are made

	User string `json:"user,omitempty"` // the account that owns the directories made ("" is the Bench's default user)
}

// MoveFile renames a file or directory of a running Bench, from inside it.
func (s *Service) MoveFile(ctx context.Context, c *Call, req *MoveFileRequest) (*FileEntry, error) {
	to, err := benchFile(req.To)
	if err != nil {
		return nil, err
	}
	if _, err := s.shIn(ctx, c, req.Bench, req.User, `mk "$(dirname -- "$2")"; mv -T -- "$1" "$2"`, req.From, to); err != nil {
		return nil, err
	}
	return s.StatFile(ctx, c, &BenchPathRequest{Bench: req.Bench, Path: to})
}

// shIn runs a short script over paths of the caller's Bench, inside it, as its root; its output
// comes back, a failure as an error with its first line. The script may call mk (mkdirs): the
// directories it makes are user's.
func (s *Service) shIn(ctx context.Context, c *Call, benchName, user, script string, paths ...string) (string, error) {
	args := []string{"/bin/sh", "-c", mkdirs + script, "sh"}
	for _, p := range paths {
		clean, err := benchFile(p)
		if err != nil {
			return "", err
		}
		args = append(args, clean)
	}
	st, rec, err := s.runningBench(c, benchName)
	if err != nil {
		return "", err
	}
	defer st.Close()
	acct, err := rec.Account(user)
	if err != nil {
		return "", err
	}
	code, out, errb, err := s.execIn(ctx, st, rec, sandbox.ExecRequest{Argv: args, Dir: "/", Env: ownEnv(acct)}, nil, MaxText)
	if err != nil {
		return "", err
	}
	if code != 0 {
		code := CodeFailed
		if strings.Contains(errb.buf.String(), "No such file") || strings.Contains(errb.buf.String(), "no such file") {
			code = CodeNotFound
		}
		return "", fail(code, fmt.Errorf("in bench %s: %s", rec.Name, firstLine(errb.buf.String(), 1)), "")
	}
	return out.buf.String(), nil
}

// runningBench opens the store and finds the caller's running Bench.
func (s *Service) runningBench(c *Call, nameOrID string) (*store.Store, *bench.Record, error) {
	st, err := s.openStore()
	if err != nil {
		return nil, nil, err
	}
	rec, err := ownBench(c, st, nameOrID)
	if err == nil && rec.Paused != nil {
		err = fail(CodeConflict, fmt.Errorf("%w: bench %s", bench.ErrPaused, rec.Name), "resume it first: `shed bench resume "+rec.Name+"` (E2B: connect)")
	} else if err == nil && !rec.Running {
		err = fail(CodeFailed, fmt.Errorf("bench %s is not running", rec.Name), "`shed bench ls` lists your Benches")
	}
	if err != nil {
		st.Close()
		return nil, nil, err
	}
	return st, rec, nil
}
