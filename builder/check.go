package builder

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"

	"toolshed.dev/shed/derivation"
	"toolshed.dev/shed/recipe"
	"toolshed.dev/shed/store"
)

// CheckResult compares one layer three ways: a rebuild, the registered record, and the files on disk.
type CheckResult struct {
	Path store.Path `json:"path"`
	// Rebuilt says whether the path was rebuilt: layers are, seeds are not (mmdebstrap reads the live
	// mirror, which is reproducible only at a pinned snapshot), but their files are still checked.
	// NotRebuilt says why a layer was not: one below it is damaged, so a rebuild over it would differ.
	Rebuilt    bool   `json:"rebuilt"`
	NotRebuilt string `json:"not_rebuilt,omitempty"`
	// Same: the rebuild hashes to the record (reproducible). Diffs name the files that differ.
	Same  bool     `json:"same"`
	Diffs []string `json:"diffs,omitempty"`
	// Intact: the files on disk hash to the record. DiskDiffs name the damaged files.
	Intact    bool     `json:"intact"`
	DiskDiffs []string `json:"disk_diffs,omitempty"`
}

// Check rebuilds every layer of a realized plan from the same inputs, in a private staging
// directory, and compares its content hash with the record (invariant 4: the same layer
// derivation gives the same bytes on another day); it also re-hashes every layer and seed on disk
// against the same record, so that a rebuild that differs is told from a store that was damaged.
// Build inputs that gc freed are fetched again first (by their locked hashes). Nothing is
// registered or replaced; `shed store verify --repair` puts damaged bytes back.
func (b *Builder) Check(ctx context.Context, plan *recipe.Plan) ([]CheckResult, error) {
	s := b.Store
	byOut := map[store.Path]*derivation.Derivation{}
	for _, d := range plan.Derivations {
		byOut[d.Output] = d
	}
	var missing []FetchItem
	for _, d := range plan.Derivations {
		for _, in := range d.Inputs {
			if f := byOut[in.Out]; d.Kind == derivation.KindLayer && f != nil && f.Kind == derivation.KindFetch && !s.IsValid(in.Out) {
				missing = append(missing, itemOf(f, plan.Fetches[in.Out]))
			}
		}
	}
	if len(missing) > 0 {
		b.step("fetching %d %s that gc freed, to rebuild...", len(missing), plural(len(missing), "build input", "build inputs"))
		if _, err := Fetch(ctx, s, missing, FetchOptions{Progress: b.Progress, Offline: b.Offline}); err != nil {
			return nil, err
		}
	}
	var results []CheckResult
	var stack []string
	var damagedBelow store.Path
	for _, d := range plan.Derivations {
		if d.Kind == derivation.KindFetch {
			continue
		}
		lowers := stack
		stack = append(append([]string(nil), stack...), s.Location(d.Output))
		info, err := s.Info(d.Output)
		if err != nil {
			return results, fmt.Errorf("check %s: realize it first: %w", d.Output, err)
		}
		want, err := s.Manifest(d.Output)
		if err != nil {
			return results, err
		}
		r := CheckResult{Path: d.Output, Rebuilt: d.Kind == derivation.KindLayer}
		disk, err := store.ScanTree(ctx, s.Location(d.Output))
		switch {
		case errors.Is(err, fs.ErrNotExist):
			r.DiskDiffs = []string{"missing on disk"}
		case err != nil:
			return results, fmt.Errorf("check %s: %w", d.Output, err)
		default:
			if r.Intact = disk.Hash() == info.ContentHash; !r.Intact {
				r.DiskDiffs = store.DiffManifests(want, disk)
			}
		}
		if r.Rebuilt && !damagedBelow.IsZero() {
			r.Rebuilt, r.NotRebuilt = false, fmt.Sprintf("%s below it is damaged", damagedBelow.Name())
		}
		if !r.Intact && damagedBelow.IsZero() {
			damagedBelow = d.Output
		}
		if r.Rebuilt {
			got, err := b.rebuild(ctx, d, lowers, byOut)
			if err != nil {
				return results, err
			}
			if r.Same = got.Hash() == info.ContentHash; !r.Same {
				r.Diffs = store.DiffManifests(want, got)
			}
		}
		results = append(results, r)
	}
	return results, nil
}

// rebuild builds d again in a staging directory, clamps it as a registration would, and returns its
// manifest; nothing is registered.
func (b *Builder) rebuild(ctx context.Context, d *derivation.Derivation, lowers []string, byOut map[store.Path]*derivation.Derivation) (*store.Manifest, error) {
	s := b.Store
	dir, release, err := s.Stage(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	b.begin(fmt.Sprintf("rebuilding %s (%s) to check it", d.Output.Name(), d.Kind))
	defer b.end()
	out := filepath.Join(dir, "out")
	if err := b.build(ctx, d, lowers, byOut, out, s.LogFile(d.Output)+".check"); err != nil {
		return nil, err
	}
	epoch, err := epochOf(d)
	if err != nil {
		return nil, err
	}
	if err := store.ClampTimes(out, epoch); err != nil {
		return nil, err
	}
	return store.ScanTree(ctx, out)
}
