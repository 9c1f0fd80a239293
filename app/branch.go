package app

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"toolshed.dev/shed/bench"
	"toolshed.dev/shed/recipe"
	"toolshed.dev/shed/store"
	"toolshed.dev/shed/upper"
)

// Branching Benches: pause and resume, snapshots, forks and resets of the Benches the supervisor
// keeps (bench.create's: their uppers are on the uppers filesystem, package upper). Everything here is
// task state: the owner's, on this machine, counted in the owner's limits, expiring
// (Service.TaskStateTTL), never a store path, never shared or promoted. See docs/bench.md.
func init() {
	op("bench.pause", (*Service).BenchPause)
	op("bench.resume", (*Service).BenchResume)
	op("bench.fork", (*Service).BenchFork)
	op("bench.reset", (*Service).BenchReset)
	op("snapshot.create", (*Service).SnapshotCreate)
	op("snapshot.ls", (*Service).SnapshotList)
	op("snapshot.rm", (*Service).SnapshotRemove)
}

// DefaultTaskStateTTL is how long a paused Bench and a snapshot live when the operator sets nothing.
const DefaultTaskStateTTL = 24 * time.Hour

// MaxForks is the most children one bench.fork makes (E2B's bound).
const MaxForks = 100

func (s *Service) taskTTL() time.Duration {
	if s.TaskStateTTL > 0 {
		return s.TaskStateTTL
	}
	return DefaultTaskStateTTL
}

// uppers is the store's uppers filesystem, opened each time (a statfs when it is mounted): mounted
// again should something have unmounted it meanwhile.
func (s *Service) uppers(st *store.Store) (*upper.FS, error) { return bench.Uppers(st) }

func checkOnTimeout(v string) error {
	switch v {
	case "", "kill", "pause", "pause-cold":
		return nil
	}
	return usage(`"kill" (the default: the Bench ends), "pause" (its processes frozen) or "pause-cold" (they end, its files stay)`, "on_timeout %.40q", v)
}

// BenchStateResult is a Bench's state after a pause or resume.
type BenchStateResult struct {
	Bench string `json:"bench"` // its name
	ID    string `json:"id"`
	// State is "running" or "paused".
	State string `json:"state"`
	// Expires is when it ends: a running Bench's lifetime, a paused one's TaskStateTTL after its pause.
	Expires time.Time `json:"expires"`
	// Changed says the call changed its state (false: it was paused, or running, already).
	Changed bool `json:"changed"`
	// Relaunched says that the resume launched it again over its upper: its processes were gone
	// (the supervisor stopped, or the host restarted, while it was paused). Its files are all there.
	Relaunched bool `json:"relaunched,omitempty"`
}

// BenchPauseRequest names the Bench to pause.
type BenchPauseRequest struct {
	Bench string `json:"bench"` // by name or id
	// Cold ends its processes instead of freezing them (E2B's pause with memory false): only its files
	// are kept, nothing of it holds memory, and a resume launches it again over its upper.
	Cold bool `json:"cold,omitempty"`
}

// BenchPause freezes a created Bench's processes (they stay in memory) and stops its lifetime: a
// paused Bench is task state that expires TaskStateTTL after its pause. Should the supervisor stop or
// the host restart while it is paused, its processes are gone but not one of its files: a resume
// launches it again over the same upper.
func (s *Service) BenchPause(ctx context.Context, c *Call, req *BenchPauseRequest) (*BenchStateResult, error) {
	st, err := s.openStore()
	if err != nil {
		return nil, err
	}
	defer st.Close()
	rec, err := ownBench(c, st, req.Bench)
	if err != nil {
		return nil, err
	}
	if rec.Paused != nil {
		return &BenchStateResult{Bench: rec.Name, ID: rec.ID, State: "paused", Expires: rec.Paused.Add(s.taskTTL())}, nil
	}
	if req.Cold {
		if !rec.Running {
			return nil, fail(CodeFailed, fmt.Errorf("bench %s is not running", rec.Name), "`shed bench ls` lists your Benches")
		}
		return s.coldPause(st, rec)
	}
	return s.pause(st, rec)
}

// coldPause ends a running Bench's processes and keeps its files and record, paused: a resume
// launches it again over its upper (a new boot of it).
func (s *Service) coldPause(st *store.Store, rec *bench.Record) (*BenchStateResult, error) {
	s.Detached.hold(rec.ID)
	if err := bench.Park(st, rec); err != nil {
		return nil, err
	}
	if err := holdLayers(st, rec); err != nil {
		return nil, err
	}
	// Answered once its runner has let it go (a resume then launches it again), and once its
	// record and files are on disk: its processes are gone, its files are all it has.
	bench.WaitEnded(st, rec.ID, 10*time.Second)
	if fs, err := s.uppers(st); err == nil {
		if err := bench.Durable(st.Root(), fs); err != nil {
			return nil, err
		}
	}
	now := time.Now().UTC()
	return &BenchStateResult{Bench: rec.Name, ID: rec.ID, State: "paused", Expires: now.Add(s.taskTTL()), Changed: true}, nil
}

func (s *Service) pause(st *store.Store, rec *bench.Record) (*BenchStateResult, error) {
	out, err := bench.Pause(st, rec.ID)
	if err != nil {
		return nil, err
	}
	s.Detached.hold(rec.ID)
	if fs, err := s.uppers(st); err == nil {
		// On disk soon after the answer, not before it (docs/bench.md): the store is closed by then.
		root := st.Root()
		go func() {
			if err := bench.Durable(root, fs); err != nil {
				s.log().Warn("pause: sync to disk", "bench", rec.Name, "err", err)
			}
		}()
	}
	return &BenchStateResult{Bench: out.Name, ID: out.ID, State: "paused", Expires: out.Paused.Add(s.taskTTL()), Changed: true}, nil
}

// holdLayers makes the paused Bench rec's layers a gc root (bench-ID) until it is removed: once its
// runner, whose temporary roots hold them while it runs, has ended while it is paused (a cold pause,
// a restart), its resume needs them (gc would make it rebuild them, or fail offline). A runner that
// ends while its Bench is paused adds it (bench.Run); a supervisor killed before it could is made
// good at the next start (SweepTaskState).
func holdLayers(st *store.Store, rec *bench.Record) error {
	if len(rec.Layers) == 0 {
		return nil
	}
	return ensureRoot(context.Background(), st, bench.RootName(rec.ID), rec.Layers[len(rec.Layers)-1])
}

// lifetimeEnded is the end of a detached Bench's lifetime: it pauses (onTimeout "pause"), pauses
// cold ("pause-cold") or ends.
func (s *Service) lifetimeEnded(l *lifetime) {
	s.Detached.mu.Lock()
	id, on := l.id, l.onTimeout
	s.Detached.mu.Unlock()
	if (on == "pause" || on == "pause-cold") && id != "" {
		if st, err := s.openStore(); err == nil {
			defer st.Close()
			rec, err := bench.Find(st, id)
			if err == nil {
				if on == "pause-cold" {
					_, err = s.coldPause(st, rec)
				} else {
					_, err = s.pause(st, rec)
				}
				if err == nil {
					return
				}
			}
			s.log().Warn("bench lifetime ended: pause failed, removing it", "bench", id, "err", err)
		}
	}
	l.cancel()
}

// BenchResumeRequest names the Bench to resume, and its lifetime from now.
type BenchResumeRequest struct {
	Bench     string `json:"bench"`                // by name or id
	LifetimeS int64  `json:"lifetime_s,omitempty"` // seconds from now (0: the default)
	// OnTimeout, if set, replaces what the end of its lifetime does ("kill", "pause" or "pause-cold").
	OnTimeout string `json:"on_timeout,omitempty"`
}

// BenchResume lets a paused Bench run again, its processes where they stopped; if they are gone (the
// supervisor stopped, the host restarted), it launches it again over its upper (Relaunched), with
// every file it had. A running Bench's lifetime is only extended (E2B's connect).
func (s *Service) BenchResume(ctx context.Context, c *Call, req *BenchResumeRequest) (*BenchStateResult, error) {
	life, err := lifetimeOf(req.LifetimeS)
	if err != nil {
		return nil, err
	}
	if err := checkOnTimeout(req.OnTimeout); err != nil {
		return nil, err
	}
	st, err := s.openStore()
	if err != nil {
		return nil, err
	}
	defer st.Close()
	rec, err := ownBench(c, st, req.Bench)
	if err != nil {
		return nil, err
	}
	expires := time.Now().Add(life).UTC().Truncate(time.Second)
	switch {
	case rec.Paused == nil && rec.Running:
		// Running: only a later end than it has (E2B: "TTL is only extended").
		if cur, ok := s.Detached.Expires(rec.ID); ok && cur.After(expires) {
			expires = cur
		}
		if err := s.setOnTimeout(st, rec, req.OnTimeout); err != nil {
			return nil, err
		}
		s.Detached.resume(rec.ID, expires, req.OnTimeout)
		return &BenchStateResult{Bench: rec.Name, ID: rec.ID, State: "running", Expires: expires}, nil
	case rec.Paused == nil:
		return nil, fail(CodeFailed, fmt.Errorf("bench %s is not running", rec.Name), "`shed bench ls` lists your Benches")
	case rec.Running:
		if _, err := bench.Thaw(st, rec.ID); err != nil {
			return nil, err
		}
		if err := s.setOnTimeout(st, rec, req.OnTimeout); err != nil {
			return nil, err
		}
		s.Detached.resume(rec.ID, expires, req.OnTimeout)
		return &BenchStateResult{Bench: rec.Name, ID: rec.ID, State: "running", Expires: expires, Changed: true}, nil
	}
	// Its processes are gone: launched again over its upper, as it was.
	if s.Detached == nil {
		return nil, usage("start the supervisor (`shed daemon`) and call it", "resuming bench %s launches it again: that needs the supervisor", rec.Name)
	}
	w, err := s.realizeCopy(ctx, c, bench.RecipeOf(st, rec), rec.Layers)
	if err != nil {
		return nil, err
	}
	// What its lifetime's end does is its record's, unless the request says (an autoPause sandbox
	// resumed after a restart pauses again at its end).
	d := &detached{w: w, workshop: rec.Workshop, life: life, onTimeout: cmp.Or(req.OnTimeout, rec.OnTimeout), opts: s.relaunchOptions(rec), warm: s.Pool.Take("")}
	out, expires, err := s.launchDetached(ctx, c, d)
	if err != nil {
		return nil, err
	}
	return &BenchStateResult{Bench: out.Name, ID: out.ID, State: "running", Expires: expires, Changed: true, Relaunched: true}, nil
}

// setOnTimeout keeps a changed on_timeout in the Bench's record, for a launch again.
func (s *Service) setOnTimeout(st *store.Store, rec *bench.Record, v string) error {
	if v == "" || v == rec.OnTimeout {
		return nil
	}
	return bench.RecordOnTimeout(st, rec.ID, v)
}

// relaunchOptions launch the paused Bench rec again over its upper, as it was launched: with its
// secrets too (new placeholders and a new CA: those of a launch die with it).
func (s *Service) relaunchOptions(rec *bench.Record) bench.Options {
	rules, _ := bench.NetworkRules(rec.NetAllow, rec.NetDeny) // its own, checked when they were set
	o := bench.Options{ID: rec.ID, Resume: true, Owner: rec.Owner, Net: rec.Net, Rules: rules, Argv: holdArgv, User: "root", Limits: rec.Limits, OnTimeout: rec.OnTimeout,
		Workshop: rec.Workshop}
	if len(rec.Secrets) > 0 || len(rec.Inject) > 0 {
		// The secrets as they were allowed at its first launch (their ids and owners): one removed
		// and added again since, or given to another user, is revoked for it.
		o.Secrets = &bench.Secrets{Names: rec.Secrets, Refs: rec.SecretRefs, Inject: rec.Inject, Lookup: secretLookup(s.secrets())}
	}
	return o
}

// realizeCopy realizes a Bench's own copy of its recipe (bench.RecipeOf, or a snapshot's), which
// must give the layers it had: the files of its upper were made over those.
func (s *Service) realizeCopy(ctx context.Context, c *Call, file string, layers []store.Path) (*realized, error) {
	r, err := recipe.Load(file, recipe.Options{ForbiddenPaths: []string{s.Root}})
	if err != nil {
		return nil, err
	}
	st, err := s.openStore()
	if err != nil {
		return nil, err
	}
	w := &realized{r: r, st: st}
	if err := s.realizeIn(ctx, c, w, false, nil); err != nil {
		st.Close()
		return nil, err
	}
	if !slices.Equal(w.plan.Layers, layers) {
		st.Close()
		return nil, fail(CodeFailed, fmt.Errorf("%s now gives other layers than the ones its files were made over", file),
			"a bug in shed (its recipe and lock are copies): report it")
	}
	return w, nil
}

// fromSnapshot realizes the snapshot's recipe and branches its upper for a new Bench (opts gets the
// id and where it came from).
func (s *Service) fromSnapshot(ctx context.Context, c *Call, idOrName string, opts *bench.Options) (*realized, error) {
	st, err := s.openStore()
	if err != nil {
		return nil, err
	}
	defer st.Close()
	snap, err := s.ownSnapshot(c, st, idOrName)
	if err != nil {
		return nil, err
	}
	fs, err := s.uppers(st)
	if err != nil {
		return nil, err
	}
	w, err := s.realizeCopy(ctx, c, snap.Recipe, snap.Layers)
	if err != nil {
		return nil, err
	}
	opts.ID = bench.NewID()
	if err := fs.Branch(bench.SnapshotUpper(snap.ID), []string{bench.UpperName(opts.ID)}, false); err != nil {
		w.st.Close()
		return nil, err
	}
	opts.From, opts.Workshop = "snapshot:"+snap.ID, snap.Workshop
	return w, nil
}

// ownSnapshot is the caller's snapshot of that id or name (an operator's: anyone's).
func (s *Service) ownSnapshot(c *Call, st *store.Store, idOrName string) (*bench.Snapshot, error) {
	owner := c.Caller.User
	if c.Caller.Role == Operator {
		owner = ""
	}
	// OWNER/NAME (as E2B lists them) is that owner's NAME only: never another user's of the same
	// name, and for a user only their own.
	if o, name, ok := strings.Cut(idOrName, "/"); ok {
		if owner != "" && o != owner {
			return nil, &Error{Code: CodeNotFound, Err: fmt.Errorf("%w: %.80q", bench.ErrNoSnapshot, idOrName)}
		}
		owner, idOrName = o, name
	}
	snap, err := bench.FindSnapshot(st, owner, idOrName)
	if errors.Is(err, bench.ErrNoSnapshot) {
		return nil, &Error{Code: CodeNotFound, Err: err}
	}
	return snap, err
}

// BenchForkRequest asks for count children of a Bench.
type BenchForkRequest struct {
	Bench     string `json:"bench"`                // the parent, by name or id: running or paused
	Count     int    `json:"count,omitempty"`      // how many children (1 to MaxForks; 0: 1)
	LifetimeS int64  `json:"lifetime_s,omitempty"` // each child's lifetime (0: the default)

	slots []*Slot // the caller's Bench slots the policy reserved, one a child
}

// BenchForkResult is each child, in order: a Bench, or why it did not start.
type BenchForkResult struct {
	Children []ForkChild `json:"children"`
}

// ForkChild is one child of a fork: Bench and ID, or Error.
type ForkChild struct {
	Bench   string    `json:"bench,omitempty"`
	ID      string    `json:"id,omitempty"`
	Expires time.Time `json:"expires,omitzero"`
	Error   string    `json:"error,omitempty"`
}

// BenchFork makes count Benches whose files are the parent's as of the call (a file a process wrote
// just before is in each), each then its own; the parent goes on running (or stays paused).
// Processes are not cloned: each child runs what a created Bench runs. Its network rules, limits
// and Workshop are the parent's.
func (s *Service) BenchFork(ctx context.Context, c *Call, req *BenchForkRequest) (*BenchForkResult, error) {
	slots := req.slots
	defer func() {
		for _, sl := range slots {
			sl.release()
		}
	}()
	n := req.Count
	if n == 0 {
		n = 1
	}
	if n < 1 || n > MaxForks {
		return nil, usage(fmt.Sprintf("1 to %d", MaxForks), "count %d", req.Count)
	}
	life, err := lifetimeOf(req.LifetimeS)
	if err != nil {
		return nil, err
	}
	if s.Detached == nil {
		return nil, usage("start the supervisor (`shed daemon`) and call it", "bench.fork needs the supervisor: the children outlive the command that asked")
	}
	st, parent, fs, err := s.branchable(c, req.Bench)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	// One realize of the parent's recipe serves every child: the store it holds stays open until the
	// last child ends.
	w, err := s.realizeCopy(ctx, c, bench.RecipeOf(st, parent), parent.Layers)
	if err != nil {
		return nil, err
	}
	shared := &sharedStore{st: w.st, users: n}
	ids := make([]string, n)
	dsts := make([]string, n)
	for i := range ids {
		ids[i] = bench.NewID()
		dsts[i] = bench.UpperName(ids[i])
	}
	if err := bench.Branch(st, fs, parent, dsts, false); err != nil {
		w.st.Close()
		return nil, err
	}
	opts := s.relaunchOptions(parent)
	opts.Resume, opts.Owner = false, c.Caller.User
	if live, ok := bench.Network(parent.ID); ok { // the rules in force, as set_network last set them
		opts.Rules = live
	}
	res := &BenchForkResult{Children: make([]ForkChild, n)}
	var wg sync.WaitGroup
	for i := range ids {
		var sl *Slot
		if i < len(slots) {
			sl, slots[i] = slots[i], nil // the child's launch owns it now
		}
		o := opts
		o.ID, o.From = ids[i], "fork:"+parent.ID
		d := &detached{w: &realized{r: w.r, st: w.st, plan: w.plan}, release: shared.release, workshop: parent.Workshop, life: life, slot: sl, opts: o,
			warm: s.Pool.Take("")} // a shared warm init, while there are any
		wg.Add(1)
		go func() {
			defer wg.Done()
			rec, expires, err := s.launchDetached(ctx, c, d)
			if err != nil {
				res.Children[i] = ForkChild{Error: err.Error()}
				return
			}
			res.Children[i] = ForkChild{Bench: rec.Name, ID: rec.ID, Expires: expires}
		}()
	}
	wg.Wait()
	return res, nil
}

// branchable opens the store and the caller's Bench nameOrID, running or paused, to branch it (a
// fork, a snapshot), and the uppers' filesystem; the caller closes the store.
func (s *Service) branchable(c *Call, nameOrID string) (*store.Store, *bench.Record, *upper.FS, error) {
	st, err := s.openStore()
	if err != nil {
		return nil, nil, nil, err
	}
	rec, err := ownBench(c, st, nameOrID)
	if err == nil && !rec.Running && rec.Paused == nil {
		err = fail(CodeNotFound, fmt.Errorf("%w: bench %s is not running", bench.ErrNoBench, rec.Name), "`shed bench ls` lists your Benches")
	}
	var fs *upper.FS
	if err == nil {
		fs, err = s.uppers(st)
	}
	if err != nil {
		st.Close()
		return nil, nil, nil, err
	}
	return st, rec, fs, nil
}

// sharedStore is a store handle several launches share: closed by the last.
type sharedStore struct {
	mu    sync.Mutex
	st    *store.Store
	users int
}

func (s *sharedStore) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.users--; s.users == 0 {
		s.st.Close()
	}
}

// BenchResetRequest names the Bench to reset, and the snapshot to reset it to ("": its Workshop's
// own files, as a new Bench has them).
type BenchResetRequest struct {
	Bench    string `json:"bench"`
	Snapshot string `json:"snapshot,omitempty"` // a snapshot of the caller's, of the same Workshop version
}

// BenchReset puts a created Bench back to its Workshop's files, or a snapshot's, without a new Bench:
// its processes end, its upper is replaced by an empty one (or a branch of the snapshot's), and it
// runs again with the same name, id, lifetime, network rules and limits (RL's environment reset).
func (s *Service) BenchReset(ctx context.Context, c *Call, req *BenchResetRequest) (*BenchStateResult, error) {
	st, err := s.openStore()
	if err != nil {
		return nil, err
	}
	defer st.Close()
	rec, err := ownBench(c, st, req.Bench)
	if err != nil {
		return nil, err
	}
	if !rec.Disk {
		_, err := bench.Pause(st, rec.ID) // its refusal: not branchable
		return nil, err
	}
	from := ""
	if req.Snapshot != "" {
		snap, err := s.ownSnapshot(c, st, req.Snapshot)
		if err != nil {
			return nil, err
		}
		if !slices.Equal(snap.Layers, rec.Layers) {
			return nil, usage("reset to a snapshot of the same Workshop version, or create a Bench of this one (bench.create with snapshot)",
				"snapshot %s is of other layers than bench %s's (another Workshop, or version)", snap.ID, rec.Name)
		}
		from = bench.SnapshotUpper(snap.ID)
	}
	fs, err := s.uppers(st)
	if err != nil {
		return nil, err
	}
	done, ok, busy := s.Detached.relaunch(rec.ID, from)
	if busy {
		return nil, fail(CodeConflict, fmt.Errorf("bench %s is being reset already", rec.Name), "wait for that reset to end, then reset it again")
	}
	if !ok {
		// No runner here (a paused Bench whose processes are gone): its upper is replaced now, and
		// it stays paused until it is resumed.
		if !rec.Running && rec.Paused != nil {
			if err := replaceUpper(fs, rec.ID, from); err != nil {
				return nil, err
			}
			return &BenchStateResult{Bench: rec.Name, ID: rec.ID, State: "paused", Expires: rec.Paused.Add(s.taskTTL()), Changed: true}, nil
		}
		return nil, fail(CodeFailed, fmt.Errorf("bench %s is not one the supervisor keeps (bench.create)", rec.Name), "")
	}
	if err := bench.Park(st, rec); err != nil {
		s.Detached.withdraw(rec.ID) // nothing to relaunch after all
		return nil, err
	}
	select {
	case r := <-done:
		if r.err != nil {
			return nil, r.err
		}
		exp, _ := s.Detached.Expires(rec.ID)
		if rec.Paused != nil {
			// It was paused, its lifetime held: it runs again, for what was left of it (or the
			// default, if that is past).
			if time.Until(exp) < time.Minute {
				exp = time.Now().Add(DefaultLifetime).UTC().Truncate(time.Second)
			}
			s.Detached.resume(rec.ID, exp, "")
		}
		return &BenchStateResult{Bench: r.rec.Name, ID: r.rec.ID, State: "running", Expires: exp, Changed: true, Relaunched: true}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// replaceUpper puts an empty upper (from "") or a branch of the upper from in place of Bench id's.
func replaceUpper(fs *upper.FS, id, from string) error {
	if from != "" {
		// The snapshot may be gone since the request looked (removed, expired): the Bench keeps its
		// upper then.
		if _, err := os.Lstat(fs.Dir(from)); err != nil {
			return fail(CodeNotFound, fmt.Errorf("reset: the snapshot is gone: %w", err), "`shed snapshot ls` lists yours")
		}
	}
	if err := fs.Remove(bench.UpperName(id)); err != nil {
		return err
	}
	if from == "" {
		return fs.Create(bench.UpperName(id))
	}
	return fs.Branch(from, []string{bench.UpperName(id)}, false)
}

// SnapshotCreateRequest asks to seal a Bench's files.
type SnapshotCreateRequest struct {
	Bench string `json:"bench"`          // by name or id: running or paused
	Name  string `json:"name,omitempty"` // the caller's name for it (the newest snapshot of a name has it)

	// hold is the caller's snapshot the policy reserved for this request (ReserveSnapshot).
	hold *SnapshotHold
}

// SnapshotInfo is a snapshot as listed.
type SnapshotInfo struct {
	ID       string    `json:"id"`
	Name     string    `json:"name,omitempty"`
	Owner    string    `json:"owner,omitempty"`
	Bench    string    `json:"bench"`    // the Bench it was taken of
	BenchID  string    `json:"bench_id"` // and that Bench's id
	Workshop string    `json:"workshop"` // its Workshop's recipe file when taken
	Created  time.Time `json:"created"`
	Expires  time.Time `json:"expires"`
}

func snapshotInfo(snap *bench.Snapshot) SnapshotInfo {
	return SnapshotInfo{ID: snap.ID, Name: snap.Name, Owner: snap.Owner, Bench: snap.Bench, BenchID: snap.BenchID,
		Workshop: snap.Workshop, Created: snap.Created, Expires: snap.Expires}
}

// SnapshotCreate seals a created Bench's files as they are (its processes frozen for the moment it
// takes), as a snapshot the caller can start Benches from (bench.create with snapshot) or reset
// Benches to. The Bench goes on. Its grants' files are not in it: they are the host's.
func (s *Service) SnapshotCreate(ctx context.Context, c *Call, req *SnapshotCreateRequest) (*SnapshotInfo, error) {
	defer req.hold.release() // whatever happens: its record exists by then, or there is none
	st, rec, fs, err := s.branchable(c, req.Bench)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	id := bench.NewSnapshotID()
	req.hold.bound(id)
	snap, err := bench.TakeSnapshot(st, fs, rec, id, req.Name, c.Caller.User, s.taskTTL())
	if err != nil {
		return nil, err
	}
	// gc keeps its layers while it lives (a Bench of it needs them).
	if err := st.AddRoot(ctx, "snapshot-"+snap.ID, snap.Layers[len(snap.Layers)-1]); err != nil {
		_ = bench.RemoveSnapshot(st, fs, snap)
		return nil, err
	}
	info := snapshotInfo(snap)
	return &info, nil
}

// SnapshotListRequest filters and pages the caller's snapshots (an operator's: everyone's).
type SnapshotListRequest struct {
	Name  string `json:"name,omitempty"`  // only the snapshot of this name (or id)
	Bench string `json:"bench,omitempty"` // only snapshots of this Bench (name or id)
	Limit int    `json:"limit,omitempty"` // at most this many (1 to 100; 0: 100)
	After string `json:"after,omitempty"` // the page after this snapshot id (SnapshotListResult.Next)
}

// SnapshotListResult is one page, oldest first.
type SnapshotListResult struct {
	Snapshots []SnapshotInfo `json:"snapshots"`
	Next      string         `json:"next,omitempty"` // the After of the next page ("" : none)
}

// SnapshotList lists snapshots.
func (s *Service) SnapshotList(ctx context.Context, c *Call, req *SnapshotListRequest) (*SnapshotListResult, error) {
	limit := req.Limit
	if limit == 0 {
		limit = 100
	}
	if limit < 1 || limit > 100 {
		return nil, usage("1 to 100", "limit %d", req.Limit)
	}
	st, err := s.openStore()
	if err != nil {
		return nil, err
	}
	defer st.Close()
	all, err := bench.Snapshots(st)
	if err != nil {
		return nil, err
	}
	res := &SnapshotListResult{Snapshots: []SnapshotInfo{}}
	past := req.After == ""
	for _, snap := range all {
		if !past {
			past = snap.ID == req.After
			continue
		}
		if c.Caller.Role != Operator && snap.Owner != c.Caller.User {
			continue
		}
		if req.Name != "" && snap.Name != req.Name && snap.ID != req.Name {
			continue
		}
		if req.Bench != "" && snap.Bench != req.Bench && snap.BenchID != req.Bench {
			continue
		}
		if len(res.Snapshots) == limit {
			res.Next = res.Snapshots[limit-1].ID
			break
		}
		res.Snapshots = append(res.Snapshots, snapshotInfo(snap))
	}
	return res, nil
}

// SnapshotRemoveRequest names the snapshot to delete.
type SnapshotRemoveRequest struct {
	Snapshot string `json:"snapshot"` // by id or name
}

// SnapshotRemoveResult says whether there was one to remove.
type SnapshotRemoveResult struct {
	Removed bool `json:"removed"` // false: there was no such snapshot of the caller's (removing again is no error)
}

// SnapshotRemove deletes a snapshot of the caller's. Benches started from it, or reset to it, keep
// their files: each has its own branch of it.
func (s *Service) SnapshotRemove(ctx context.Context, c *Call, req *SnapshotRemoveRequest) (*SnapshotRemoveResult, error) {
	st, err := s.openStore()
	if err != nil {
		return nil, err
	}
	defer st.Close()
	snap, err := s.ownSnapshot(c, st, req.Snapshot)
	var e *Error
	if errors.As(err, &e) && e.Code == CodeNotFound {
		return &SnapshotRemoveResult{}, nil
	} else if err != nil {
		return nil, err
	}
	fs, err := s.uppers(st)
	if err != nil {
		return nil, err
	}
	if err := bench.RemoveSnapshot(st, fs, snap); err != nil {
		return nil, err
	}
	if err := st.RemoveRoot("snapshot-" + snap.ID); err != nil && !errors.Is(err, store.ErrRootNotExist) {
		return nil, err
	}
	return &SnapshotRemoveResult{Removed: true}, nil
}

// SweepTaskState removes the paused Benches and snapshots past their expiry (the supervisor, every
// minute). It returns how many.
func (s *Service) SweepTaskState(now time.Time) (int, error) {
	st, err := s.openStore()
	if err != nil {
		return 0, err
	}
	defer st.Close()
	recs, err := bench.List(st)
	if err != nil {
		return 0, err
	}
	n := 0
	var errs []error
	for _, r := range recs {
		if r.Paused != nil && now.Sub(*r.Paused) > s.taskTTL() {
			if err := bench.Remove(st, r.ID); err != nil {
				errs = append(errs, err)
				continue
			}
			n++
		} else if r.Paused != nil && !r.Running {
			if err := holdLayers(st, r); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if !s.haveUppers(st) {
		return n, errors.Join(errs...)
	}
	fs, err := s.uppers(st)
	if err != nil {
		return n, errors.Join(append(errs, err)...)
	}
	m, err := bench.SweepSnapshots(st, fs, now)
	// The roots of snapshots and paused Benches that are gone (removed by a sweep, or whose removal
	// a crash cut before their root went).
	if roots, rerr := st.Roots(); rerr == nil {
		for _, r := range roots {
			if id, ok := strings.CutPrefix(r.Name, "snapshot-"); ok {
				if _, e := os.Lstat(filepath.Join(bench.SnapshotsDir(st), id)); errors.Is(e, os.ErrNotExist) {
					_ = st.RemoveRoot(r.Name)
				}
			} else if id, ok := strings.CutPrefix(r.Name, "bench-"); ok {
				if _, e := os.Lstat(filepath.Join(bench.Dir(st), id)); errors.Is(e, os.ErrNotExist) {
					_ = st.RemoveRoot(r.Name)
				}
			}
		}
	}
	return n + m, errors.Join(append(errs, err)...)
}

func (s *Service) haveUppers(st *store.Store) bool { return bench.HaveUppers(st) }

// StartTaskSweep removes expired task state now and every minute until ctx ends (the supervisor's).
func (s *Service) StartTaskSweep(ctx context.Context) {
	go func() {
		t := time.NewTicker(time.Minute)
		defer t.Stop()
		for {
			if n, err := s.SweepTaskState(time.Now()); err != nil {
				s.log().Warn("task state sweep", "removed", n, "err", err)
			} else if n > 0 {
				s.log().Info("task state sweep", "removed", n)
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
}
