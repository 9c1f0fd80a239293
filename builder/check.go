package builder

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"

	"toolshed.dev/shed/derivation"
	"toolshed.dev/shed/recipe"
	"toolshed.dev/shed/store"
)

// CheckResult compares a rebuild of one layer with the stored path.
type CheckResult struct {
	Path  store.Path `json:"path"`
	Same  bool       `json:"same"`
	Diffs []string   `json:"diffs,omitempty"`
}

// Check rebuilds every layer of a realized plan from the same inputs, in a
// private staging directory, and compares content hashes (invariant 4: the
// same layer derivation gives the same bytes on another day). Nothing is
// registered or replaced; differing files are listed. Seeds are not rebuilt:
// mmdebstrap reads the live mirror, which is reproducible only at a pinned
// snapshot.
func (b *Builder) Check(ctx context.Context, plan *recipe.Plan) ([]CheckResult, error) {
	s := b.Store
	byOut := map[store.Path]*derivation.Derivation{}
	for _, d := range plan.Derivations {
		byOut[d.Output] = d
	}
	var results []CheckResult
	var stack []string
	for _, d := range plan.Derivations {
		if d.Kind == derivation.KindFetch {
			continue
		}
		lowers := stack
		stack = append(append([]string(nil), stack...), s.Location(d.Output))
		if d.Kind != derivation.KindLayer {
			continue
		}
		info, err := s.Info(d.Output)
		if err != nil {
			return results, fmt.Errorf("check %s: realize it first: %w", d.Output, err)
		}
		dir, release, err := s.Stage(ctx)
		if err != nil {
			return results, err
		}
		res, err := func() (CheckResult, error) {
			defer release()
			out := filepath.Join(dir, "out")
			if err := b.build(ctx, d, lowers, byOut, out, s.LogFile(d.Output)+".check"); err != nil {
				return CheckResult{}, err
			}
			epoch := int64(store.DefaultEpoch)
			if v, ok := d.Env["SOURCE_DATE_EPOCH"]; ok {
				epoch, _ = strconv.ParseInt(v, 10, 64)
			}
			if err := store.ClampTimes(out, epoch); err != nil {
				return CheckResult{}, err
			}
			got, err := store.ScanTree(ctx, out)
			if err != nil {
				return CheckResult{}, err
			}
			r := CheckResult{Path: d.Output, Same: got.Hash() == info.ContentHash}
			if !r.Same {
				want, err := s.Manifest(d.Output)
				if err != nil {
					return r, err
				}
				r.Diffs = store.DiffManifests(want, got)
			}
			return r, nil
		}()
		if err != nil {
			return results, err
		}
		results = append(results, res)
	}
	return results, nil
}
