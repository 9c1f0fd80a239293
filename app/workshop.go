package app

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"
	"time"

	"toolshed.dev/shed/builder"
	"toolshed.dev/shed/cache"
	"toolshed.dev/shed/derivation"
	"toolshed.dev/shed/recipe"
	"toolshed.dev/shed/records"
	"toolshed.dev/shed/store"
	"toolshed.dev/shed/why"
)

// DefaultRecipe is the file read when a request names none, as docker build reads ./Dockerfile.
const DefaultRecipe = "workshop.toml"

func init() {
	op("realize", (*Service).Realize)
	op("lock", (*Service).Lock)
	op("instantiate", (*Service).Instantiate)
	op("why", (*Service).Why)
	op("diff", (*Service).Diff)
}

// RecipeFile says which recipe a Workshop field names: a record's current version when it is a
// record's name, else (for an operator) a file relative to the caller.
// Users name records only: no file of theirs is ever read as root.
func (s *Service) RecipeFile(c *Call, workshop string) (string, error) {
	if workshop == "" {
		workshop = DefaultRecipe
	}
	rs := s.Records()
	if c.Caller.Role != Operator {
		v, err := rs.Current(workshop)
		if err != nil {
			hint := "`shed workshop ls` lists the records you may use"
			if c.Caller.Role == User && c.Caller.Via == "" { // a local user at a terminal: shed without root
				hint += "; or use the file in a store of your own, without root: `shed init` makes one in your home, and your commands go to it from then on (docs/rootless.md)"
			}
			return "", fail(CodeDenied, fmt.Errorf("%w: %s is not a Workshop record: users run records only", ErrDenied, workshop), hint)
		}
		return rs.File(v.Name, v.N), nil
	}
	// A record's name first: a file of that name in whatever directory the operator is in (another
	// user's /tmp/tools) must not stand in for the record. A file is named as a path (./tools).
	if records.IsName(workshop) {
		if v, err := rs.Current(workshop); err == nil {
			return rs.File(v.Name, v.N), nil
		}
	}
	return c.path(workshop), nil
}

// loadRecipe reads the recipe a Workshop field names (its File is absolute); grants of the store
// root are refused along with the defaults.
func (s *Service) loadRecipe(c *Call, workshop string) (*recipe.Recipe, error) {
	file, err := s.RecipeFile(c, workshop)
	if err != nil {
		return nil, err
	}
	data, err := recipe.Read(file)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fail(CodeNotFound, err, "name a recipe file (default ./workshop.toml), or a Workshop record (`shed workshop ls`)")
	} else if err != nil {
		return nil, err
	}
	return s.plans.recipe(file, data, recipe.Options{ForbiddenPaths: []string{s.Root}})
}

func (s *Service) newBuilder(c *Call, st *store.Store, offline bool) *builder.Builder {
	b := &builder.Builder{Store: st, Log: s.log(), Offline: offline}
	if c.IO != nil {
		b.Progress, b.BuildOutput, b.Status = c.IO.Progress, c.IO.BuildOutput, c.IO.Status
	}
	b.Warn = func(format string, args ...any) { c.notice("warning", format, args...) }
	b.Step = func(format string, args ...any) { c.notice("info", format, args...) }
	return b
}

// realized is a realized Workshop: its recipe, the store it is in (the caller closes it), its plan,
// its builder and what realizing it did.
type realized struct {
	r    *recipe.Recipe
	st   *store.Store
	plan *recipe.Plan
	b    *builder.Builder
	res  *builder.Result
	// lock is the builder that locked the recipe first, before the realize proper (nil: it was
	// locked): what it built and fetched (the seed; for pip packages, the apt layer and its .debs).
	lock *builder.Builder
}

// realize loads the recipe, opens the store, locks if needed, realizes every path and roots the
// Workshop under its name: what realize, bench run and promote start with.
func (s *Service) realize(ctx context.Context, c *Call, workshop string, offline bool, substituters []string) (*realized, error) {
	r, err := s.loadRecipe(c, workshop)
	if err != nil {
		return nil, err
	}
	st, err := s.openStore()
	if err != nil {
		return nil, err
	}
	w := &realized{r: r, st: st}
	if err := s.realizeIn(ctx, c, w, offline, substituters); err != nil {
		st.Close()
		return nil, err
	}
	return w, nil
}

func (s *Service) realizeIn(ctx context.Context, c *Call, w *realized, offline bool, substituters []string) error {
	plan, _, lb, err := s.lockedPlanBuilt(ctx, c, w.st, w.r, offline)
	if err != nil {
		return err
	}
	w.lock = lb
	w.plan, w.b = plan, s.newBuilder(c, w.st, offline)
	if w.b.Substituter, err = s.substituter(c, w.st, substituters); err != nil {
		return err
	}
	w.res, err = w.b.Realize(ctx, plan)
	if w.res != nil && len(w.res.Built)+len(w.res.Fetched)+len(w.res.Substituted) > 0 {
		c.wrote.Store(true)
	}
	if err != nil {
		return err
	}
	top := plan.Layers[len(plan.Layers)-1]
	// Each version of a record is a root of its own, so a promotion never makes the previous one
	// collectable while someone may still launch it.
	if name, n, ok := s.Records().VersionOf(w.r.File); ok {
		if err := ensureRoot(ctx, w.st, fmt.Sprintf("workshop-%s-v%d", name, n), top); err != nil {
			return err
		}
	}
	return ensureRoot(ctx, w.st, w.r.Name, top)
}

// lockedPlan loads the recipe's lock, re-resolving it when it is missing or no longer matches the
// recipe (and saying so), and compiles the recipe with it.
func (s *Service) lockedPlan(ctx context.Context, c *Call, st *store.Store, r *recipe.Recipe, offline bool) (*recipe.Plan, *recipe.Lock, error) {
	plan, lock, _, err := s.lockedPlanBuilt(ctx, c, st, r, offline)
	return plan, lock, err
}

// lockedPlanBuilt is lockedPlan, and the builder that locked (nil if the lock was there): what it
// built and fetched to lock (the seed; for pip packages, the layers pip runs in).
func (s *Service) lockedPlanBuilt(ctx context.Context, c *Call, st *store.Store, r *recipe.Recipe, offline bool) (*recipe.Plan, *recipe.Lock, *builder.Builder, error) {
	var lb *builder.Builder
	lockFile := recipe.LockFile(r.File)
	data, err := recipe.ReadLock(lockFile)
	var lock *recipe.Lock
	key, memo := s.plans.planKey(r, data, st.StoreDir())
	if err == nil {
		if m, ok := s.plans.plan(key); memo && ok {
			// Compared again: the fingerprint reads the apt sources' keys, which are files of their own.
			if inputs, accounts, err := m.lock.Compare(r); err == nil && inputs && accounts {
				return m.plan, m.lock, nil, nil
			}
		}
		lock, err = recipe.ParseLock(lockFile, data)
	}
	memo = memo && err == nil // a lock rewritten or resolved below is other bytes than data
	reason := ""
	switch {
	case errors.Is(err, recipe.ErrNoLock):
		reason = lockFile + " does not exist"
	case err != nil:
		return nil, nil, nil, err
	default:
		inputs, sameAccounts, err := lock.Compare(r)
		ok, accounts := inputs && sameAccounts, inputs && !sameAccounts
		switch {
		case err != nil:
			return nil, nil, nil, err
		case accounts && !s.isRecordFile(r.File):
			// Only the accounts changed: nothing to resolve, the lock records them again.
			memo = false
			lock.Accounts = recipe.LockAccounts(r)
			c.wrote.Store(true)
			if err := recipe.WriteLock(lockFile, lock); err != nil {
				return nil, nil, nil, err
			}
			c.notice("info", "wrote %s (the recipe's accounts)", lockFile)
		case !ok:
			reason = lockFile + " no longer matches " + r.File
		}
	}
	if reason != "" {
		memo = false
		if offline {
			return nil, nil, nil, fail(CodeFailed, fmt.Errorf("cannot lock offline: %s", reason),
				"run `shed lock` once with network, and commit the lock beside the recipe")
		}
		if _, _, isRecord := s.Records().VersionOf(r.File); isRecord {
			// A record's lock is part of the record: it changes by promotion only.
			return nil, nil, nil, fail(CodeFailed, fmt.Errorf("record %s: %s", r.Name, reason),
				"a record holds its lock; an operator re-adds or promotes a locked version")
		}
		c.notice("info", "locking: %s; resolving %s...", reason, r.File)
		t0 := time.Now()
		lb = s.newBuilder(c, st, false)
		lock, err = lb.Lock(ctx, r, builder.LockOptions{})
		if err != nil {
			return nil, nil, nil, err
		}
		c.notice("info", "resolved %s in %.1f s", r.File, time.Since(t0).Seconds())
		c.wrote.Store(true)
		if err := recipe.WriteLock(lockFile, lock); err != nil {
			return nil, nil, nil, err
		}
		c.notice("info", "wrote %s (%s)", lockFile, Counts(len(lock.Apt), len(lock.Pip)))
	}
	plan, err := recipe.Compile(r, lock, st.StoreDir())
	if err != nil {
		return nil, nil, nil, err
	}
	if memo {
		s.plans.putPlan(key, memoPlan{lock, plan})
	}
	return plan, lock, lb, nil
}

// isRecordFile says whether file is a Workshop record's recipe (whose lock changes by promotion only).
func (s *Service) isRecordFile(file string) bool {
	_, _, isRecord := s.Records().VersionOf(file)
	return isRecord
}

// Counts says what a lock holds: "30 packages" or "30 packages, 3 pip packages".
func Counts(apt, pip int) string {
	s := Plural(apt, "package")
	if pip > 0 {
		s += ", " + Plural(pip, "pip package")
	}
	return s
}

// Plural says "1 noun" or "N nouns".
func Plural(n int, noun string) string {
	if n == 1 {
		return fmt.Sprintf("1 %s", noun)
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// substituter returns the caches realize asks before building: the request's, then the store's
// substituters setting. nil if there are none.
func (s *Service) substituter(c *Call, st *store.Store, names []string) (builder.Substituter, error) {
	names = append(slices.Clone(names), st.Config().Substituters...)
	if len(names) == 0 {
		return nil, nil
	}
	t, err := s.openTrust(st)
	if err != nil {
		return nil, err
	}
	pl := &cache.Puller{Store: st, Trust: t, Log: func(format string, args ...any) {
		s.log().Info(fmt.Sprintf(format, args...))
	}}
	for _, n := range names {
		cc, err := cache.Open(s.cacheName(c, n))
		if err != nil {
			return nil, fail(CodeUsage, err, "a substituter is oci://HOST[:PORT]/REPO or oci-layout:DIR")
		}
		pl.Caches = append(pl.Caches, cc)
	}
	return pl, nil
}

// cacheName is a cache as the caller named it: the DIR of oci-layout:DIR is relative to the caller.
func (s *Service) cacheName(c *Call, name string) string {
	if dir, ok := strings.CutPrefix(name, "oci-layout:"); ok {
		return "oci-layout:" + c.path(dir)
	}
	return name
}

// ensureRoot points the root name at top, writing only on change: a cache-hit realize should not
// pay for an fsync.
func ensureRoot(ctx context.Context, st *store.Store, name string, top store.Path) error {
	// Only this root's file is read: a store keeps a root per record version and per paused Bench.
	if p, err := st.RootPath(name); err == nil && p == top {
		return nil
	}
	return st.AddRoot(ctx, name, top)
}

func locations(st *store.Store, ps []store.Path) []string {
	out := []string{}
	for _, p := range ps {
		out = append(out, st.Location(p))
	}
	return out
}

// RealizeRequest asks for a Workshop's store paths.
type RealizeRequest struct {
	// Workshop is a record's name or a recipe file (default ./workshop.toml).
	Workshop string `json:"workshop,omitempty"`
	// Offline never touches the network.
	Offline bool `json:"offline,omitempty"`
	// Check rebuilds every layer and compares it with its record, and the files on disk with it too.
	Check bool `json:"check,omitempty"`
	// Substituters are caches to ask before building, besides the store's.
	Substituters []string `json:"substituters,omitempty"`
}

// RealizeResult is what realizing did. Locations are absolute, so scripts can use them.
type RealizeResult struct {
	Workshop     string   `json:"workshop"`      // the Workshop's name
	File         string   `json:"file"`          // the recipe file realized
	Layers       []string `json:"layers"`        // the Bench's layers, bottom first
	Built        []string `json:"built"`         // paths built now
	Fetched      []string `json:"fetched"`       // paths downloaded now
	FetchedBytes int64    `json:"fetched_bytes"` // bytes downloaded
	Substituted  []string `json:"substituted"`   // paths taken from a cache
	// SubstitutedBytes is the size of the paths taken from a cache (their files' bytes).
	SubstitutedBytes int64         `json:"substituted_bytes"`
	Seconds          float64       `json:"seconds"`         // how long the realize took
	Check            []CheckResult `json:"check,omitempty"` // with Check: each layer rebuilt, and whether it came out the same
}

// CheckResult is one path of the Workshop checked by --check: a layer rebuilt and compared with its
// record, and its files on disk compared with the same record (a seed's files only).
type CheckResult struct {
	Path    string `json:"path"`
	Rebuilt bool   `json:"rebuilt"` // a layer is rebuilt; a seed is not
	// NotRebuilt says why a layer was not rebuilt (one below it is damaged).
	NotRebuilt string   `json:"not_rebuilt,omitempty"`
	Same       bool     `json:"same"`                 // the rebuild hashes to the record
	Diffs      []string `json:"diffs,omitempty"`      // files that differ between record and rebuild
	Intact     bool     `json:"intact"`               // the files on disk hash to the record
	DiskDiffs  []string `json:"disk_diffs,omitempty"` // files on disk that differ from the record
}

// Realize builds (or finds) every store path of a Workshop and roots it under its name.
func (s *Service) Realize(ctx context.Context, c *Call, req *RealizeRequest) (*RealizeResult, error) {
	start := time.Now()
	w, err := s.realize(ctx, c, req.Workshop, req.Offline, req.Substituters)
	if err != nil {
		return nil, err
	}
	defer w.st.Close()
	built, fetched, fetchedBytes := w.res.Built, w.res.Fetched, w.res.FetchedBytes
	if w.lock != nil { // what locking did first counts as this realize's too
		lockFetched, n := w.lock.Fetched()
		built, fetched, fetchedBytes = append(w.lock.Built(), built...), append(lockFetched, fetched...), fetchedBytes+n
	}
	res := &RealizeResult{
		Workshop: w.r.Name, File: w.r.File, Layers: locations(w.st, w.res.Layers), Built: locations(w.st, built),
		Fetched: locations(w.st, fetched), FetchedBytes: fetchedBytes, Substituted: locations(w.st, w.res.Substituted),
	}
	for _, p := range w.res.Substituted {
		if info, err := w.st.Info(p); err == nil {
			res.SubstitutedBytes += info.Size
		}
	}
	res.Seconds = time.Since(start).Seconds()
	if req.Check {
		results, err := w.b.Check(ctx, w.plan)
		if err != nil {
			return nil, err
		}
		res.Check = []CheckResult{}
		for _, cr := range results {
			res.Check = append(res.Check, CheckResult{Path: w.st.Location(cr.Path), Rebuilt: cr.Rebuilt, NotRebuilt: cr.NotRebuilt, Same: cr.Same,
				Diffs: cr.Diffs, Intact: cr.Intact, DiskDiffs: cr.DiskDiffs})
		}
	}
	return res, nil
}

// LockRequest asks to resolve a recipe's packages into its lock.
type LockRequest struct {
	File string `json:"file,omitempty"` // default ./workshop.toml
	// Update re-resolves: the Packages named, or every package when none is.
	Update   bool     `json:"update,omitempty"`
	Packages []string `json:"packages,omitempty"` // with Update, the [apt] packages to re-resolve (none: all)
}

// LockResult says what the lock is now.
type LockResult struct {
	Lock        string   `json:"lock"`                   // the lock file
	Changed     bool     `json:"changed"`                // whether the lock was written (false: it still matched)
	Packages    int      `json:"packages"`               // apt packages locked
	PipPackages int      `json:"pip_packages"`           // pip distributions locked
	Changes     []string `json:"changes,omitempty"`      // what an update changed, package by package
	ReleaseDate string   `json:"release_date,omitempty"` // the seed's date (its suite's signed InRelease)
}

// Lock writes workshop.lock beside a recipe: every package pinned to a version, URL and SHA-256.
func (s *Service) Lock(ctx context.Context, c *Call, req *LockRequest) (*LockResult, error) {
	if !req.Update && len(req.Packages) > 0 {
		return nil, usage("name packages with update", "packages %s: only an update names packages", strings.Join(req.Packages, ", "))
	}
	file, err := s.RecipeFile(c, req.File)
	if err != nil {
		return nil, err
	}
	if _, _, isRecord := s.Records().VersionOf(file); isRecord {
		return nil, usage("lock the recipe file, then `shed workshop add` it or propose from a Bench",
			"%s is a Workshop record: its lock changes by promotion only", req.File)
	}
	r, err := recipe.Load(file, recipe.Options{ForbiddenPaths: []string{s.Root}})
	if err != nil {
		return nil, err
	}
	var declared []string
	for _, p := range r.Apt.Packages {
		declared = append(declared, p.Name)
	}
	for _, p := range r.Pip.Packages {
		declared = append(declared, p.Name)
	}
	for _, u := range req.Packages {
		isPip := slices.ContainsFunc(r.Pip.Packages, func(p recipe.PipPackage) bool {
			return recipe.NormalizePipName(p.Name) == recipe.NormalizePipName(u)
		})
		if !slices.Contains(declared, u) && !isPip {
			hint := "name packages from the recipe's [apt] or [pip] packages"
			if guess := recipe.Suggest(u, declared, 1); len(guess) > 0 {
				hint = fmt.Sprintf("did you mean %s? %s", guess[0], hint)
			}
			return nil, usage(hint, "update %s: %s does not declare it", u, file)
		}
	}
	st, err := s.openStore()
	if err != nil {
		return nil, err
	}
	defer st.Close()
	lockFile := recipe.LockFile(file)
	old, err := recipe.LoadLock(lockFile)
	if err == nil && !req.Update {
		if ok, err := old.Matches(r); err == nil && ok {
			return &LockResult{Lock: lockFile, Packages: len(old.Apt), PipPackages: len(old.Pip), ReleaseDate: old.Seed.ReleaseDate}, nil
		}
	}
	opts := builder.LockOptions{Update: req.Packages}
	if err == nil {
		opts.Old = old
	}
	lock, err := s.newBuilder(c, st, false).Lock(ctx, r, opts)
	if err != nil {
		return nil, err
	}
	c.wrote.Store(true)
	if err := recipe.WriteLock(lockFile, lock); err != nil {
		return nil, err
	}
	res := &LockResult{Lock: lockFile, Changed: true, Packages: len(lock.Apt), PipPackages: len(lock.Pip), ReleaseDate: lock.Seed.ReleaseDate}
	if opts.Old != nil {
		res.Changes = recipe.DiffLocks(opts.Old, lock)
	}
	return res, nil
}

// InstantiateRequest asks to compile a recipe to derivations and write them to the store.
type InstantiateRequest struct {
	File string `json:"file,omitempty"` // the recipe file (default ./workshop.toml)
}

// InstantiateResult lists the derivations written, bottom first.
type InstantiateResult struct {
	Derivations []Derivation `json:"derivations"` // the derivations written, bottom first
}

// Derivation is one written derivation and the output it will build.
type Derivation struct {
	Name   string `json:"name"`
	Kind   string `json:"kind"`
	Drv    string `json:"drv"`
	Output string `json:"output"`
}

// Instantiate writes a recipe's .drv files, with the lock beside it as realize uses it (so the outputs are
// the paths realize builds); nothing is resolved or built.
func (s *Service) Instantiate(ctx context.Context, c *Call, req *InstantiateRequest) (*InstantiateResult, error) {
	r, err := s.loadRecipe(c, req.File)
	if err != nil {
		return nil, err
	}
	st, err := s.openStore()
	if err != nil {
		return nil, err
	}
	defer st.Close()
	// The lock beside the recipe, as realize uses it, so that these are the paths realize builds.
	// Without one (or with one the recipe no longer matches) realize would resolve first, which needs
	// the network: instantiate stays offline and compiles the recipe unlocked, and says so.
	lock, err := recipe.LoadLock(recipe.LockFile(r.File))
	switch {
	case errors.Is(err, recipe.ErrNoLock):
		lock = nil
		c.notice("warning", "%s does not exist: these derivations are unlocked, and realize would lock first (`shed lock %s`)", recipe.LockFile(r.File), r.File)
	case err != nil:
		return nil, err
	default:
		if ok, err := lock.Matches(r); err != nil {
			return nil, err
		} else if !ok {
			lock = nil
			c.notice("warning", "%s no longer matches %s: these derivations are unlocked, and realize would lock again (`shed lock %s`)", recipe.LockFile(r.File), r.File, r.File)
		}
	}
	plan, err := recipe.Compile(r, lock, st.StoreDir())
	if err != nil {
		return nil, err
	}
	res := &InstantiateResult{Derivations: []Derivation{}}
	for _, d := range plan.Derivations {
		p, err := derivation.Write(ctx, st, d)
		if err != nil {
			return nil, err
		}
		res.Derivations = append(res.Derivations, Derivation{d.Name, string(d.Kind), st.Location(p), st.Location(d.Output)})
	}
	return res, nil
}

// WhyRequest asks why a file exists in a realized Workshop.
type WhyRequest struct {
	Workshop string `json:"workshop"` // a record's name or a recipe file
	File     string `json:"file"`     // as a Bench sees it, e.g. /usr/bin/jq
}

// WhyResult is the explanation, with the recipe it is about.
type WhyResult struct {
	why.Explanation
	Recipe   string `json:"recipe"`   // the recipe file
	Seed     string `json:"seed"`     // its seed, as written
	Location string `json:"location"` // the layer's location
}

// Why says which layer holds a file, which package owns it, and which recipe line brought it in.
func (s *Service) Why(ctx context.Context, c *Call, req *WhyRequest) (*WhyResult, error) {
	r, err := s.loadRecipe(c, req.Workshop)
	if err != nil {
		return nil, err
	}
	st, err := s.openStore()
	if err != nil {
		return nil, err
	}
	defer st.Close()
	lock, err := recipe.LoadLock(recipe.LockFile(r.File))
	if err != nil {
		return nil, fail(CodeFailed, err, "run `shed realize "+req.Workshop+"` first")
	}
	plan, err := recipe.Compile(r, lock, st.StoreDir())
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(r.File)
	if err != nil {
		return nil, err
	}
	aptLines, pipLines, err := recipe.PackageLines(data)
	if err != nil {
		return nil, err
	}
	ex, err := why.Explain(st, r, plan, aptLines, pipLines, req.File)
	if err != nil {
		return nil, err
	}
	return &WhyResult{Explanation: *ex, Recipe: r.File, Seed: r.Seed.Raw, Location: st.Location(ex.Layer)}, nil
}

// DiffRequest asks how two Workshops differ.
type DiffRequest struct {
	A string `json:"a"` // a Workshop: a record's name or a recipe file
	B string `json:"b"` // the other Workshop
}

// DiffResult is what B declares differently from A and, when both are locked, how their resolved
// packages differ.
type DiffResult struct {
	FileA        string   `json:"file_a"`       // A's recipe file
	FileB        string   `json:"file_b"`       // B's recipe file
	Declarations []string `json:"declarations"` // changed declarations, as "- old" and "+ new" lines prefixed by their field
	Resolved     []string `json:"resolved"`     // how the resolved packages differ: "+ added", "- removed", "~ changed"
	Locked       bool     `json:"locked"`       // whether both are locked (and Resolved compared)
}

// Diff compares two Workshops by declarations and resolved packages, not files.
func (s *Service) Diff(ctx context.Context, c *Call, req *DiffRequest) (*DiffResult, error) {
	a, err := s.loadRecipe(c, req.A)
	if err != nil {
		return nil, err
	}
	b, err := s.loadRecipe(c, req.B)
	if err != nil {
		return nil, err
	}
	res := &DiffResult{FileA: a.File, FileB: b.File, Declarations: diffDeclarations(a, b), Resolved: []string{}}
	la, errA := recipe.LoadLock(recipe.LockFile(a.File))
	lb, errB := recipe.LoadLock(recipe.LockFile(b.File))
	if res.Locked = errA == nil && errB == nil; res.Locked {
		if d := recipe.DiffLocks(la, lb); d != nil {
			res.Resolved = d
		}
	}
	return res, nil
}

// diffDeclarations lists changed declarations as "- old" / "+ new" lines prefixed by their field.
func diffDeclarations(a, b *recipe.Recipe) []string {
	out := []string{}
	scalar := func(field, x, y string) {
		if x != y {
			out = append(out, fmt.Sprintf("- %s = %q", field, x), fmt.Sprintf("+ %s = %q", field, y))
		}
	}
	list := func(field string, x, y []string) {
		for _, v := range x {
			if !slices.Contains(y, v) {
				out = append(out, fmt.Sprintf("- %s: %s", field, v))
			}
		}
		for _, v := range y {
			if !slices.Contains(x, v) {
				out = append(out, fmt.Sprintf("+ %s: %s", field, v))
			}
		}
	}
	strs := func(n int, f func(int) string) []string {
		s := make([]string, n)
		for i := range s {
			s[i] = f(i)
		}
		return s
	}
	scalar("name", a.Name, b.Name)
	scalar("seed", a.Seed.Raw, b.Seed.Raw)
	scalar("apt.mirror", a.Apt.Mirror, b.Apt.Mirror)
	list("apt.packages", strs(len(a.Apt.Packages), func(i int) string { return a.Apt.Packages[i].String() }),
		strs(len(b.Apt.Packages), func(i int) string { return b.Apt.Packages[i].String() }))
	list("apt.source", strs(len(a.Apt.Sources), func(i int) string { return a.Apt.Sources[i].URL }),
		strs(len(b.Apt.Sources), func(i int) string { return b.Apt.Sources[i].URL }))
	scalar("pip.index", a.Pip.Index, b.Pip.Index)
	list("pip.packages", strs(len(a.Pip.Packages), func(i int) string { return a.Pip.Packages[i].String() }),
		strs(len(b.Pip.Packages), func(i int) string { return b.Pip.Packages[i].String() }))
	scalar("network.profile", a.Network.Profile, b.Network.Profile)
	list("network.allow", strs(len(a.Network.Allow), func(i int) string { return a.Network.Allow[i].String() }),
		strs(len(b.Network.Allow), func(i int) string { return b.Network.Allow[i].String() }))
	list("network.secrets", a.Network.Secrets, b.Network.Secrets)
	list("grant", strs(len(a.Grants), func(i int) string { return a.Grants[i].Path + " " + a.Grants[i].Mode }),
		strs(len(b.Grants), func(i int) string { return b.Grants[i].Path + " " + b.Grants[i].Mode }))
	return out
}
