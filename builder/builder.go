package builder

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"toolshed.dev/shed/derivation"
	"toolshed.dev/shed/internal/nospace"
	"toolshed.dev/shed/recipe"
	"toolshed.dev/shed/store"
	"toolshed.dev/shed/trust"
)

// Builder realizes plans in one store.
type Builder struct {
	Store *store.Store
	// Log receives what the builder does; nil is silent.
	Log *slog.Logger
	// Progress shows fetches; nil is silent.
	Progress ProgressReporter
	// BuildOutput, when set, also receives every build's output live
	// (it always goes to the path's log file).
	BuildOutput io.Writer
	// Offline forbids the network: whatever needs it and is missing is an
	// error that lists it. Substituter is still asked: it was named on purpose.
	Offline bool
	// Substituter, if set, is asked for every missing seed and layer before
	// it is built (with its references: the .debs, the layers below).
	Substituter Substituter
	// Warn hears about substitutes refused when the path can be built instead.
	Warn func(format string, args ...any)
	// Step, if set, hears each long step as it starts and ends (a build, a substitution), one line
	// each, with how long it took: so that a minute's seed build is not a minute of silence.
	Step func(format string, args ...any)
	// Status, if set, shows the step that runs while it runs (with its output's latest line, or
	// its bytes), between those lines.
	Status Status

	builtMu      sync.Mutex
	built        []store.Path // every path this builder built, in order
	fetched      []store.Path // every path this builder downloaded
	fetchedBytes int64
}

// Built lists every path this builder built (by Realize, also for a Lock's seed).
func (b *Builder) Built() []store.Path {
	b.builtMu.Lock()
	defer b.builtMu.Unlock()
	return slices.Clone(b.built)
}

// Fetched lists every path this builder downloaded, and their bytes: by Realize, also for a Lock
// (the seed's and apt layer's .debs that resolving pip packages installs first).
func (b *Builder) Fetched() ([]store.Path, int64) {
	b.builtMu.Lock()
	defer b.builtMu.Unlock()
	return slices.Clone(b.fetched), b.fetchedBytes
}

func (b *Builder) step(format string, args ...any) {
	if b.Step != nil {
		b.Step(format, args...)
	}
}

// begin starts a step that Status shows as what, before its start line (if any) is printed.
func (b *Builder) begin(what string) {
	if b.Status != nil {
		b.Status.Begin(what)
	}
}

// end ends the step begun, before its end line (if any) is printed.
func (b *Builder) end() {
	if b.Status != nil {
		b.Status.End()
	}
}

// statusOutput is where a step's own output goes besides its log, for Status to show.
func (b *Builder) statusOutput() io.Writer {
	if b.Status != nil {
		return b.Status
	}
	return io.Discard
}

// took renders a step's duration: "812 ms", "52.8 s".
func took(d time.Duration) string {
	if d < time.Second {
		return fmt.Sprintf("%d ms", d.Milliseconds())
	}
	return fmt.Sprintf("%.1f s", d.Seconds())
}

// Substituter makes store paths valid from caches, checking each before it
// is registered (cache.Puller).
type Substituter interface {
	// Pull makes p valid if a cache has it, and reports whether it did. A
	// cache that has p but fails a check is an error saying which. found,
	// unless nil, hears the name of the cache that has p before any of it
	// downloads; progress, unless nil, the bytes downloaded so far and the
	// bytes expected (which grow as the references p needs too are found).
	Pull(ctx context.Context, p store.Path, found func(cache string), progress func(done, expected int64)) (bool, error)
}

// Result says what a realization did.
type Result struct {
	// Layers are the Bench's lower layers, bottom first.
	Layers []store.Path
	// Built lists the paths built now; Fetched those downloaded now;
	// Substituted those pulled from a cache (with their references).
	Built       []store.Path
	Fetched     []store.Path
	Substituted []store.Path
	// FetchedBytes counts the bytes downloaded.
	FetchedBytes int64
}

// ErrMissing is returned when offline and something must be fetched or built
// with network.
var ErrMissing = errors.New("missing from the store")

// ErrBuildFailed marks a build that ran and failed; its log says why.
var ErrBuildFailed = errors.New("build failed")

// BuildError is a failed build of one path, with the log that says more.
type BuildError struct {
	Path store.Path
	Log  string
	Err  error
}

func (e *BuildError) Error() string { return fmt.Sprintf("build %s: %v", e.Path, e.Err) }
func (e *BuildError) Unwrap() error { return e.Err }

func (b *Builder) log() *slog.Logger {
	if b.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return b.Log
}

// Realize makes every output of plan valid: it writes the .drv files, holds
// temporary roots on every output (so a concurrent gc removes none of them),
// checks them all in one read of the database (a cache hit ends there),
// fetches the missing .debs in parallel, then builds the missing seed and
// layers in order. Each path is built at most once however many processes
// realize it at the same time (the store's per-path lock).
func (b *Builder) Realize(ctx context.Context, plan *recipe.Plan) (*Result, error) {
	s := b.Store
	res := &Result{Layers: plan.Layers}
	drvs := map[store.Path]store.Path{} // output → .drv
	byOut := map[store.Path]*derivation.Derivation{}
	// One temporary-roots call for every .drv and output, before looking
	// at any of them: on a cache hit this is the whole cost of holding the
	// Workshop against gc (a root per path would take the gc lock each time).
	var roots []store.Path
	for _, d := range plan.Derivations {
		p, ok := plan.Drvs[d.Output]
		if !ok {
			var err error
			if p, err = d.DrvPath(s.StoreDir()); err != nil {
				return nil, err
			}
		}
		drvs[d.Output], byOut[d.Output] = p, d
		roots = append(roots, p, d.Output)
	}
	if err := s.AddTempRoots(ctx, roots); err != nil {
		return nil, err
	}
	// Which of them are valid, in one read of the database: rooted now, they stay so. A cache hit
	// (every .drv, seed and layer there; the fetches are needed only to build) ends here.
	valid, err := s.ValidPaths(ctx, roots)
	if err != nil {
		return nil, err
	}
	hit := true
	for i, d := range plan.Derivations {
		if !valid[2*i] || (d.Kind != derivation.KindFetch && !valid[2*i+1]) {
			hit = false
			break
		}
	}
	if hit {
		return res, nil
	}
	for i, d := range plan.Derivations {
		if valid[2*i] {
			continue
		}
		if _, err := derivation.Write(ctx, s, d); err != nil {
			return nil, err
		}
	}

	// Caches first, top layer first: pulling a layer pulls what it references.
	if b.Substituter != nil {
		var missing []store.Path
		for _, d := range plan.Derivations {
			if !s.IsValid(d.Output) {
				missing = append(missing, d.Output)
			}
		}
		defer func() {
			for _, p := range missing {
				if s.IsValid(p) && !slices.Contains(res.Built, p) && !slices.Contains(res.Fetched, p) {
					res.Substituted = append(res.Substituted, p)
				}
			}
		}()
		for i := len(plan.Derivations) - 1; i >= 0; i-- {
			d := plan.Derivations[i]
			if d.Kind == derivation.KindFetch || s.IsValid(d.Output) {
				continue
			}
			var before []store.Path // the missing paths this pull may bring
			for _, p := range missing {
				if !s.IsValid(p) {
					before = append(before, p)
				}
			}
			t0, from := time.Now(), "a cache"
			var downloaded int64
			ok, err := b.Substituter.Pull(ctx, d.Output, func(cache string) {
				t0, from = time.Now(), cache
				b.begin(fmt.Sprintf("substituting %s (%s) from %s", d.Output.Name(), d.Kind, cache))
				b.step("substituting %s (%s) from %s...", d.Output.Name(), d.Kind, cache)
			}, func(done, expected int64) {
				downloaded = done
				if b.Status != nil {
					b.Status.Bytes(done, expected)
				}
			})
			b.end()
			if ctx.Err() != nil {
				return res, ctx.Err()
			}
			if err != nil {
				if b.Offline || nospace.Is(err) {
					return res, nospace.Check(s.Root(), err) // a build here would find no room either
				}
				if b.Warn != nil {
					b.Warn("%v; building it here", err)
				}
				continue
			}
			if ok {
				n, size := 0, int64(0)
				for _, p := range before {
					if info, err := s.Info(p); err == nil && s.IsValid(p) {
						n, size = n+1, size+info.Size
					}
				}
				b.step("substituted %s (%s) from %s: %d %s, %s in %s (%s downloaded)", d.Output.Name(), d.Kind, from,
					n, plural(n, "path", "paths"), FormatBytes(size), took(time.Since(t0)), FormatBytes(downloaded))
			}
		}
	}

	// What is missing, and which fetches the missing layers need.
	need := map[store.Path]bool{}
	var needFetch []FetchItem
	for _, d := range plan.Derivations {
		if d.Kind == derivation.KindFetch || s.IsValid(d.Output) {
			continue
		}
		need[d.Output] = true
		for _, in := range d.Inputs {
			if f := byOut[in.Out]; f != nil && f.Kind == derivation.KindFetch && !s.IsValid(in.Out) && !need[in.Out] {
				need[in.Out] = true
				needFetch = append(needFetch, itemOf(f, plan.Fetches[in.Out]))
			}
		}
	}
	if len(need) == 0 {
		return res, nil
	}
	if b.Offline {
		var missing []string
		for _, d := range plan.Derivations {
			if need[d.Output] && d.Network != "none" {
				missing = append(missing, s.Location(d.Output))
			}
		}
		if len(missing) > 0 {
			return nil, fmt.Errorf("%w: offline, and these need the network:\n  %s", ErrMissing, strings.Join(missing, "\n  "))
		}
	}
	if len(needFetch) > 0 {
		fr, err := Fetch(ctx, s, needFetch, FetchOptions{Progress: b.Progress, Offline: b.Offline})
		if fr != nil {
			res.Fetched, res.FetchedBytes = fr.Fetched, fr.Bytes
			b.builtMu.Lock()
			b.fetched, b.fetchedBytes = append(b.fetched, fr.Fetched...), b.fetchedBytes+fr.Bytes
			b.builtMu.Unlock()
		}
		if err != nil {
			return res, nospace.Check(s.Root(), err)
		}
	}

	lowers := map[store.Path][]string{} // layer → its own stack, bottom first
	for _, d := range plan.Derivations {
		if d.Kind == derivation.KindFetch {
			continue
		}
		// The layer below is needed at run time (a reference); the .debs and
		// wheels were needed only to build (build inputs, which gc may free).
		var parent *store.Path
		var refs, buildInputs []store.Path
		for _, in := range d.Inputs {
			if f := byOut[in.Out]; f != nil && f.Kind == derivation.KindFetch {
				buildInputs = append(buildInputs, in.Out)
				continue
			}
			refs = append(refs, in.Out)
			if byOut[in.Out] != nil {
				p := in.Out
				parent = &p
			}
		}
		var stack []string
		if parent != nil {
			stack = append(append(stack, lowers[*parent]...), s.Location(*parent))
		}
		lowers[d.Output] = stack
		if !need[d.Output] {
			continue
		}
		epoch, err := epochOf(d)
		if err != nil {
			return res, err
		}
		facts := &trust.Facts{Derivation: string(d.Encode())}
		for _, in := range d.Inputs {
			if info, err := s.Info(in.Out); err == nil {
				facts.Inputs = append(facts.Inputs, trust.Input{Path: path.Join(s.StoreDir(), in.Out.String()), ContentHash: info.ContentHash})
			}
		}
		opts := store.AddOptions{Deriver: drvs[d.Output], References: refs, BuildInputs: buildInputs, Epoch: epoch, Facts: facts}
		start := time.Now()
		_, built, err := s.Realize(ctx, d.Output, opts, func(ctx context.Context, out string) error {
			b.begin(fmt.Sprintf("building %s (%s)", d.Output.Name(), d.Kind))
			b.step("building %s (%s)...", d.Output.Name(), d.Kind)
			return b.build(ctx, d, stack, byOut, out, b.Store.LogFile(d.Output))
		})
		b.end() // after the registration too: hashing a seed's tree takes a while
		if err != nil {
			return res, nospace.Check(s.Root(), err)
		}
		if built {
			b.step("built %s in %s", d.Output.Name(), took(time.Since(start)))
			b.builtMu.Lock()
			b.built = append(b.built, d.Output)
			b.builtMu.Unlock()
		}
		if built {
			res.Built = append(res.Built, d.Output)
			b.log().Info("built", "path", d.Output.String(), "elapsed", time.Since(start).Round(time.Millisecond))
		}
	}
	return res, nil
}

// fetchItem is what Fetch needs to download a fetch derivation's output; info names the package
// (empty when only the .drv is known, as in a repair).
func itemOf(f *derivation.Derivation, info recipe.FetchInfo) FetchItem {
	name := f.Output.Name()
	if info.Name != "" {
		name = fmt.Sprintf("%s (%s %s)", f.Output.Name(), info.Name, info.Version)
	}
	return FetchItem{Path: f.Output, URLs: []string{f.Args[0]}, SHA256: f.Fixed.Hash, Size: info.Size, Name: name}
}

// epochOf is the time a derivation's output mtimes are clamped to: SOURCE_DATE_EPOCH, else the
// store's default; an imported image keeps its own (Python's .pyc checks depend on them).
func epochOf(d *derivation.Derivation) (int64, error) {
	epoch := int64(store.DefaultEpoch)
	if d.Builder == recipe.BuilderOCIImport || d.Builder == recipe.BuilderImageImport {
		epoch = math.MaxInt64
	}
	if v, ok := d.Env["SOURCE_DATE_EPOCH"]; ok {
		if epoch, _ = strconv.ParseInt(v, 10, 64); epoch <= 0 {
			return 0, fmt.Errorf("%s: bad SOURCE_DATE_EPOCH %q", d.Name, v)
		}
	}
	return epoch, nil
}

// build runs one derivation's builder, with its output logged to the path's
// log file.
func (b *Builder) build(ctx context.Context, d *derivation.Derivation, lowers []string, byOut map[store.Path]*derivation.Derivation, out, logFile string) error {
	logf, err := os.Create(logFile)
	if err != nil {
		return nospace.Check(b.Store.Root(), fmt.Errorf("create build log: %w", err))
	}
	defer logf.Close()
	// The log is on the store's filesystem: when that is full, its writes fail, and the build's
	// output must still flow (a writer that fails ends the copy from the tool, which then dies of
	// SIGPIPE, 141, before it says why). The scanner hears the tool say that a disk is full.
	lw, scan := &bestEffort{w: logf}, &nospace.Scanner{}
	w := io.MultiWriter(lw, scan, b.statusOutput())
	if b.BuildOutput != nil {
		w = io.MultiWriter(lw, scan, b.statusOutput(), b.BuildOutput)
	}
	fmt.Fprintf(w, "shed: building %s (%s, %s)\n", d.Output, d.Kind, d.Builder)
	stage := filepath.Dir(out)
	switch d.Builder {
	case recipe.BuilderMmdebstrap:
		err = b.buildDebianSeed(ctx, d, stage, out, w)
	case recipe.BuilderOCIImport:
		err = b.buildOCISeed(ctx, d, out, w)
	case recipe.BuilderImageImport:
		err = b.buildImageSeed(ctx, d, byOut, out, w)
	case recipe.BuilderAptLayer:
		var debs []store.Path
		for _, in := range d.Inputs {
			if f := byOut[in.Out]; f != nil && f.Kind == derivation.KindFetch {
				debs = append(debs, in.Out)
			}
		}
		err = b.buildAptLayer(ctx, d, lowers, debs, stage, out, w)
	case recipe.BuilderPipLayer:
		var wheels []wheelInput
		for _, in := range d.Inputs {
			if f := byOut[in.Out]; f != nil && f.Kind == derivation.KindFetch {
				wheels = append(wheels, wheelInput{path: in.Out, sha256: f.Fixed.Hash})
			}
		}
		err = b.buildPipLayer(ctx, d, lowers, wheels, stage, out, w)
	case recipe.BuilderAccountsLayer:
		err = b.buildAccountsLayer(ctx, d, lowers, stage, out, w)
	default:
		err = fmt.Errorf("%s: builder %s is not available in this version of shed", d.Name, d.Builder)
	}
	if err != nil {
		// A full filesystem is named as such, whoever hit it: shed's own write (ENOSPC), the tool
		// (its output says so), or neither clearly (a tool that only exits 25) while the store's
		// filesystem has almost nothing left, measured now, before the stage is removed.
		seen, quota := scan.Seen()
		var ne *nospace.Error
		if !errors.As(err, &ne) && (seen || nospace.Is(err) || nospace.Is(lw.err) || nospace.Full(stage, 1<<20)) {
			err = nospace.Of(b.Store.Root(), quota || errors.Is(err, unix.EDQUOT), err)
		}
		fmt.Fprintf(w, "shed: build failed: %v\n", err)
		return &BuildError{Path: d.Output, Log: logFile, Err: err}
	}
	if lw.err != nil {
		return nospace.Check(b.Store.Root(), fmt.Errorf("write build log %s: %w", logFile, lw.err))
	}
	fmt.Fprintf(w, "shed: built %s\n", d.Output)
	return nil
}

// bestEffort writes to w until a write fails, then nothing, and never fails: err is the failure.
type bestEffort struct {
	w   io.Writer
	err error
}

func (b *bestEffort) Write(p []byte) (int, error) {
	if b.err == nil {
		_, b.err = b.w.Write(p)
	}
	return len(p), nil
}
