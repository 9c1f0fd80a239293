// Package policy decides who may ask the supervisor for what: one table from each operation to the
// roles that may call it, and rules on the fields of the decoded request (which records a user may
// run, grants, substituters, names, limits, whose Benches). It runs before every operation, for the
// CLI working on a store directly (an operator) as for every caller of the daemon.
package policy

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sync"

	"toolshed.dev/shed/app"
	"toolshed.dev/shed/bench"
	"toolshed.dev/shed/records"
)

// Roles maps every operation to the roles that may call it. An operation missing here is refused
// to everyone (a test checks that every operation of package app is listed).
var Roles = map[string][]app.Role{
	"init":                {app.Operator},
	"realize":             {app.Operator, app.User},
	"lock":                {app.Operator},
	"instantiate":         {app.Operator},
	"why":                 {app.Operator, app.User},
	"diff":                {app.Operator, app.User},
	"k8s.manifests":       {app.Operator},
	"bench.run":           {app.Operator, app.User},
	"bench.ls":            {app.Operator, app.User},
	"bench.exec":          {app.Operator, app.User},
	"bench.logs":          {app.Operator, app.User},
	"bench.rm":            {app.Operator, app.User},
	"bench.propose":       {app.Operator, app.User, app.Agent},
	"bench.create":        {app.Operator, app.User},
	"bench.write_file":    {app.Operator, app.User},
	"bench.write_files":   {app.Operator, app.User},
	"bench.read_file":     {app.Operator, app.User},
	"bench.list_files":    {app.Operator, app.User},
	"bench.stat_file":     {app.Operator, app.User},
	"bench.make_dir":      {app.Operator, app.User},
	"bench.remove_file":   {app.Operator, app.User},
	"bench.move_file":     {app.Operator, app.User},
	"bench.watch_dir":     {app.Operator, app.User},
	"bench.set_lifetime":  {app.Operator, app.User},
	"bench.set_network":   {app.Operator, app.User},
	"bench.network":       {app.Operator, app.User},
	"bench.metrics":       {app.Operator, app.User},
	"workshop.launchable": {app.Operator, app.User},
	"audit.ls":            {app.Operator},
	"agent.key_create":    {app.Operator},
	"agent.key_ls":        {app.Operator},
	"agent.key_rm":        {app.Operator},
	"audit.verify":        {app.Operator},
	"workshop.add":        {app.Operator},
	"workshop.allow":      {app.Operator},
	"workshop.ls":         {app.Operator, app.User},
	"workshop.show":       {app.Operator, app.User},
	"workshop.log":        {app.Operator, app.User},
	"workshop.diff":       {app.Operator, app.User},
	"workshop.promote":    {app.Operator},
	"workshop.submit":     {app.Operator, app.User},
	"workshop.rm":         {app.Operator},
	"workshop.tag":        {app.Operator},
	"workshop.tags":       {app.Operator, app.User},
	"proposal.show":       {app.Operator},
	"store.ls":            {app.Operator},
	"store.info":          {app.Operator},
	"store.stats":         {app.Operator},
	"store.optimise":      {app.Operator},
	"store.verify":        {app.Operator},
	"store.sign":          {app.Operator},
	"store.add":           {app.Operator},
	"root.add":            {app.Operator},
	"root.ls":             {app.Operator},
	"root.rm":             {app.Operator},
	"gc":                  {app.Operator},
	"log":                 {app.Operator},
	"key.show":            {app.Operator, app.User},
	"key.rotate":          {app.Operator},
	"key.trust":           {app.Operator},
	"key.untrust":         {app.Operator},
	"copy":                {app.Operator},
	"import":              {app.Operator},

	// Polled watchers (MCP's bench_watch_*, envd's watcher RPCs): a group of their own keeps the lines above as they were.
	"bench.watcher_create": {app.Operator, app.User},
	"bench.watcher_events": {app.Operator, app.User},
	"bench.watcher_remove": {app.Operator, app.User},

	// Branching Benches (task state: the caller's own, within their limits).
	"bench.pause":     {app.Operator, app.User},
	"bench.resume":    {app.Operator, app.User},
	"bench.fork":      {app.Operator, app.User},
	"bench.reset":     {app.Operator, app.User},
	"snapshot.create": {app.Operator, app.User},
	"snapshot.ls":     {app.Operator, app.User},
	"snapshot.rm":     {app.Operator, app.User},
	// Secrets (docs/secrets.md): a user's are their own; an agent never names one.
	"secret.add":    {app.Operator, app.User},
	"secret.ls":     {app.Operator, app.User},
	"secret.rm":     {app.Operator, app.User},
	"secret.update": {app.Operator, app.User},
}

var benchNameRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,62}$`) })

func denied(hint, format string, args ...any) error {
	return &app.Error{Code: app.CodeDenied, Err: fmt.Errorf("%w: "+format, append([]any{app.ErrDenied}, args...)...), Hint: hint}
}

func bad(hint, format string, args ...any) error {
	return &app.Error{Code: app.CodeUsage, Err: fmt.Errorf(format, args...), Hint: hint}
}

// Check is the supervisor's policy (an app.Policy): nil if caller may run op with req.
func Check(s *app.Service, caller *app.Caller, op string, req any) error {
	roles, ok := Roles[op]
	if !ok {
		return denied("a bug in shed: every operation has roles; report it with the command that did this", "operation %s is in no role's table", op)
	}
	if !slices.Contains(roles, caller.Role) {
		what := "operators (root, or the supervisor's operators group)"
		if slices.Contains(roles, app.User) {
			what = "local users and operators"
		}
		hint := "ask an operator (root, or a member of the supervisor's operators group) to do it" + ownStore(caller)
		if caller.Role == app.Agent {
			hint = "an agent in a Bench proposes (POST /propose on " + bench.ProposeSocket + "); a human decides the rest"
		}
		return denied(hint, "%s is for %s; you are %s (%s)", op, what, caller.User, caller.Role)
	}
	err := fields(s, caller, req)
	if r, ok := req.(*app.BenchProposeRequest); ok && err != nil && op == "bench.propose" {
		// A snapshot named where a Bench goes: why it is never proposed, not "no bench of yours".
		if refused := s.SnapshotRefusal(caller, r.Bench, "proposed"); refused != nil {
			return refused
		}
	}
	return err
}

// fields checks the request's fields against the caller's role. Operators may name anything (their
// requests are still checked for well-formed names).
func fields(s *app.Service, caller *app.Caller, req any) error {
	op := caller.Role == app.Operator
	switch r := req.(type) {
	case *app.RealizeRequest:
		if !op {
			if len(r.Substituters) > 0 {
				return denied("leave --substituter out: the store's own substituters apply (an operator sets them in config.toml)", "substituters are for operators: the store's own substituters apply")
			}
			if r.Check {
				return denied("ask an operator to run `shed realize --check`", "--check rebuilds every layer: it is for operators")
			}
			return mayRun(s, caller, r.Workshop)
		}
	case *app.BenchRunRequest:
		if err := launch(s, caller, r.Workshop, r.Name, r.Net, r.MemoryBytes, r.Pids); err != nil {
			return err
		}
		if !op {
			if len(r.Grants) > 0 {
				return denied("launch without --grant and copy files in with `shed bench exec`, or ask an operator to launch with the grant", "grants are for operators: the supervisor would open the path as root")
			}
			if len(r.Substituters) > 0 {
				return denied("leave --substituter out: the store's own substituters apply (an operator sets them in config.toml)", "substituters are for operators: the store's own substituters apply")
			}
		}
		return reserve(s, caller, r, r.Keep)
	case *app.BenchCreateRequest:
		workshop := r.Workshop
		if r.Snapshot != "" {
			if r.Workshop != "" {
				return bad("name the snapshot alone: its Workshop is the one it was taken of", "workshop and snapshot both named")
			}
			workshop = snapshotOf // the caller's own snapshot (app checks whose), of a record they were allowed
		}
		if err := launch(s, caller, workshop, r.Name, r.Net, r.MemoryBytes, r.Pids); err != nil {
			return err
		}
		if err := disk(s, caller, "create a Bench", false); err != nil {
			return err
		}
		return reserve(s, caller, r, false)
	case *app.BenchPauseRequest:
		return ownBench(s, caller, r.Bench)
	case *app.BenchResumeRequest:
		return ownBench(s, caller, r.Bench)
	case *app.BenchResetRequest:
		return ownBench(s, caller, r.Bench)
	case *app.SnapshotCreateRequest:
		if err := ownBench(s, caller, r.Bench); err != nil {
			return err
		}
		if r.Name != "" {
			if err := bench.CheckSnapshotName(r.Name); err != nil {
				return bad("", "%v", err)
			}
		}
		if err := disk(s, caller, "take a snapshot", true); err != nil {
			return err
		}
		return snapshots(s, caller, r)
	case *app.BenchForkRequest:
		if err := ownBench(s, caller, r.Bench); err != nil {
			return err
		}
		n := max(r.Count, 1)
		if r.Count < 0 || n > app.MaxForks {
			return bad(fmt.Sprintf("1 to %d", app.MaxForks), "fork count %d", r.Count)
		}
		if err := disk(s, caller, "fork", true); err != nil {
			return err
		}
		return reserveForks(s, caller, r, n)
	case *app.WriteFileRequest:
		return ownBench(s, caller, r.Bench)
	case *app.WriteFilesRequest:
		return ownBench(s, caller, r.Bench)
	case *app.ReadFileRequest:
		return ownBench(s, caller, r.Bench)
	case *app.ListFilesRequest:
		return ownBench(s, caller, r.Bench)
	case *app.BenchPathRequest:
		return ownBench(s, caller, r.Bench)
	case *app.MoveFileRequest:
		return ownBench(s, caller, r.Bench)
	case *app.WatchDirRequest:
		return ownBench(s, caller, r.Bench)
	case *app.WatcherCreateRequest:
		return ownBench(s, caller, r.Bench)
	case *app.WatcherRequest:
		return ownBench(s, caller, r.Bench)
	case *app.SetLifetimeRequest:
		return ownBench(s, caller, r.Bench)
	case *app.SetNetworkRequest:
		return ownBench(s, caller, r.Bench)
	case *app.WhyRequest:
		if !op {
			return mayRun(s, caller, r.Workshop)
		}
	case *app.DiffRequest:
		if !op {
			for _, w := range []string{r.A, r.B} {
				if _, err := s.Records().Current(w); err != nil {
					return denied("name a Workshop record (`shed workshop ls` lists the ones you may use)", "%s is not a Workshop record: users name records only", w)
				}
			}
		}
	case *app.BenchExecRequest:
		return ownBench(s, caller, r.Bench)
	case *app.BenchRequest:
		return ownBench(s, caller, r.Bench)
	case *app.BenchMetricsRequest:
		if len(r.Benches) > app.MaxMetricsBenches { // each is looked up below: a bound before the work
			return bad(fmt.Sprintf("ask for at most %d at a time", app.MaxMetricsBenches), "metrics of %d Benches asked at once", len(r.Benches))
		}
		for _, b := range r.Benches {
			if err := ownBench(s, caller, b); err != nil {
				return err
			}
		}
		return nil
	case *app.BenchRemoveRequest:
		for _, b := range r.Benches {
			if err := ownBench(s, caller, b); err != nil {
				return err
			}
		}
	}
	return nil
}

// launch is what every launch of a Bench is checked for: well-formed, and for a user, a record
// they may run, within the users' limits (then reserve counts their Benches).
func launch(s *app.Service, caller *app.Caller, workshop, name, net string, memory, pids int64) error {
	if name != "" && !benchNameRE().MatchString(name) {
		return bad("lowercase letters, digits, '.', '_' and '-'", "bench name %q", name)
	}
	if net != "" && net != "recipe" && net != "none" {
		return bad("--net recipe or --net none", "net %q", net)
	}
	if memory < 0 || pids < 0 {
		return bad("limits are positive", "a negative limit")
	}
	if caller.Role == app.Operator {
		return nil
	}
	lim := s.UserLimits
	if lim.MemoryBytes > 0 && memory > lim.MemoryBytes {
		return denied("ask for less, or an operator raises the supervisor's --user-memory", "memory limit %d bytes is above the users' %d", memory, lim.MemoryBytes)
	}
	if lim.Pids > 0 && pids > lim.Pids {
		return denied("ask for less, or an operator raises the supervisor's --user-pids", "pids limit %d is above the users' %d", pids, lim.Pids)
	}
	if workshop == snapshotOf {
		return nil
	}
	return mayRun(s, caller, workshop)
}

// reserve holds one of a user's Bench slots for a launch, within the supervisor's --user-benches
// and --user-kept, or refuses it. The Benches the user has and the launches of theirs still starting
// are counted and the slot taken in one step (app.ReserveBench), so that launches at once cannot all
// see room for one; the launch holds the slot until its Bench's record exists or it failed. It is the
// last check of a launch: a slot is taken only for a request nothing else refuses. Operators are not
// bounded.
func reserve(s *app.Service, caller *app.Caller, req app.Launch, keep bool) error {
	if caller.Role == app.Operator || (s.UserBenches <= 0 && (s.UserKept <= 0 || !keep)) {
		return nil
	}
	lim := app.BenchLimits{Benches: s.UserBenches, Kept: s.UserKept}
	have, ok, err := s.ReserveBench(req, caller.User, keep, lim)
	if err != nil || ok {
		return err
	}
	if keep && lim.Kept > 0 && have.Kept >= lim.Kept {
		return denied("remove one (`shed bench rm NAME`; `shed bench ls` lists them), or an operator raises the supervisor's --user-kept",
			"you keep %d Benches, the most a user may", have.Kept)
	}
	return denied("remove one (`shed bench rm NAME`; `shed bench ls` lists them), or an operator raises the supervisor's --user-benches",
		"you have %d Benches, the most a user may", have.Benches)
}

// snapshotOf stands for a snapshot's Workshop in launch: the app checks that the snapshot is the caller's.
const snapshotOf = "\x00snapshot"

// reserveForks holds n of a user's Bench slots for a fork's children, or refuses the fork whole.
func reserveForks(s *app.Service, caller *app.Caller, req *app.BenchForkRequest, n int) error {
	if caller.Role == app.Operator || s.UserBenches <= 0 {
		return nil
	}
	have, ok, err := s.ReserveForks(req, caller.User, n, app.BenchLimits{Benches: s.UserBenches})
	if err != nil || ok {
		return err
	}
	return denied("fork fewer, remove some (`shed bench rm NAME`), or an operator raises the supervisor's --user-benches",
		"you have %d Benches; %d more would pass the %d a user may have", have.Benches, n, s.UserBenches)
}

// disk refuses what makes a user's task state (a Bench, a fork, a snapshot) once their uppers hold
// the supervisor's --user-disk: a snapshot writes nothing, but keeps what its Bench overwrites, and a
// storm of them would keep it all; the kernel bounds each write besides (app/quota.go). flush: the
// usage as of now (a commit, which a snapshot or fork makes anyway), else as of the last commit.
func disk(s *app.Service, caller *app.Caller, what string, flush bool) error {
	if caller.Role == app.Operator || s.UserDisk <= 0 {
		return nil
	}
	used, ok, err := s.DiskUsage(caller.UID, flush)
	if err != nil || !ok {
		return err
	}
	// At it: the kernel refuses the write that would pass the bound, so a full user sits just under.
	if used+diskSlack > s.UserDisk {
		return denied("free some: remove snapshots (`shed snapshot rm ID`) or Benches (`shed bench rm NAME`), reset a Bench (`bench.reset`), or an operator raises the supervisor's --user-disk",
			"cannot %s: your Benches and snapshots hold %s of disk, the most a user may (%s)", what, size(used), size(s.UserDisk))
	}
	return nil
}

// diskSlack is how far under --user-disk a user counts as at it: less than a MiB left.
const diskSlack = 1 << 20

// size is n bytes for a person: MiB with one decimal, or GiB from 1 GiB on.
func size(n int64) string {
	if n >= 1<<30 {
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}

// snapshots refuses a user's snapshot past the supervisor's --user-snapshots, and holds one for req
// otherwise (app.ReserveSnapshot: counted and held at once, so snapshots asked together cannot pass
// the bound); last of req's checks, so that nothing refuses it after.
func snapshots(s *app.Service, caller *app.Caller, req *app.SnapshotCreateRequest) error {
	if caller.Role == app.Operator || s.UserSnapshots <= 0 {
		return nil
	}
	n, ok, err := s.ReserveSnapshot(req, caller.User, s.UserSnapshots)
	if err != nil {
		return err
	}
	if !ok {
		return denied("remove one (`shed snapshot rm ID`; `shed snapshot ls` lists them), or an operator raises the supervisor's --user-snapshots",
			"you have %d snapshots, the most a user may", n)
	}
	return nil
}

// ownStore is what a hint adds for a local user whom the supervisor refuses what only its operators
// may do, or a recipe file: the way to do it in a store of their own (docs/rootless.md), which shed
// without root makes and then uses instead of the supervisor.
func ownStore(caller *app.Caller) string {
	if caller.Role != app.User || caller.Via != "" {
		return ""
	}
	return "; or do it in a store of your own, without root: `shed init` makes one in your home, and your commands go to it from then on (docs/rootless.md)"
}

// mayRun: a user runs the Workshop records an operator allowed them, and nothing else.
func mayRun(s *app.Service, caller *app.Caller, name string) error {
	if name == "" {
		return denied("name the Workshop record to use (`shed workshop ls`)", "users run Workshop records only, by name")
	}
	v, err := s.Records().Current(name)
	if errors.Is(err, records.ErrNoRecord) {
		return denied("`shed workshop ls` lists the records"+ownStore(caller), "%s is not a Workshop record: users run records only", name)
	} else if err != nil {
		return err
	}
	if !app.Allows(caller, v.Users) {
		return denied("an operator allows you: shed workshop allow "+name+" "+caller.User, "%s may not use Workshop %s", caller.User, name)
	}
	return nil
}

// ownBench: operators act on every Bench, users on the ones they launched, an agent on its own.
func ownBench(s *app.Service, caller *app.Caller, nameOrID string) error {
	if caller.Role == app.Operator {
		return nil
	}
	rec, err := app.FindBench(s.Root, nameOrID)
	if errors.Is(err, bench.ErrNoBench) {
		// Not "not found": that would tell a user which names others' Benches have.
		return denied("`shed bench ls` lists your Benches", "no bench %s of yours", nameOrID)
	} else if err != nil {
		return err
	}
	if !app.MayUse(caller, rec) {
		return denied("`shed bench ls` lists your Benches", "no bench %s of yours", nameOrID)
	}
	return nil
}
