package builder

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"time"

	"toolshed.dev/shed/derivation"
	"toolshed.dev/shed/recipe"
	"toolshed.dev/shed/store"
)

// TreePuller is a Substituter that can also bring back the bytes of a path registered here: its
// copy in a cache, if that copy has exactly the recorded content hash (cache.Puller).
type TreePuller interface {
	PullTree(ctx context.Context, p store.Path, want store.Hash, out string) (bool, error)
}

// Repaired says how one damaged path was put back, or why it was not.
type Repaired struct {
	Path store.Path `json:"path"`
	// How: "substituted" (from a cache), "fetched" (a .deb or wheel downloaded again) or "rebuilt".
	How string `json:"how,omitempty"`
	Err error  `json:"-"`
}

// errNotCached ends a repair attempt from the caches that found the path in none of them.
var errNotCached = errors.New("in no cache")

// Repair puts back the registered bytes of each path (they are damaged or missing on disk; the
// caller found them with a verify): from a substituter's copy when one has the same content, else
// by fetching a fetch output again or rebuilding a seed or layer from its .drv, with the layers
// below it and its build inputs (fetched again if gc freed them). A path's bytes are swapped in
// only if they hash to its record (store.Repair), so every path that refers to it stays valid;
// a seed rebuilt from a mirror that moved on differs, and is left as it was, with an error that
// says to substitute it. Paths are repaired dependencies first, so that a layer is rebuilt over
// repaired layers. The error is about the repair as a whole (ctx ended); each path's own failure
// is in its Repaired.
func (b *Builder) Repair(ctx context.Context, paths []store.Path) ([]Repaired, error) {
	s := b.Store
	infos, _, err := s.All()
	if err != nil {
		return nil, err
	}
	var out []Repaired
	failed := map[store.Path]bool{}
	for _, p := range dependenciesFirst(infos, paths) {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		// Rebuilt over a layer still damaged, it would come out different: say why instead.
		if below := failedBelow(infos[p], failed); !below.IsZero() {
			failed[p] = true
			out = append(out, Repaired{Path: p, Err: fmt.Errorf("%s was not repaired, and %s is built over it", below, p)})
			continue
		}
		t0 := time.Now()
		b.step("repairing %s...", p.Name())
		how, err := b.repairOne(ctx, infos, p)
		if err != nil {
			failed[p] = true
		}
		if ctx.Err() != nil {
			return out, ctx.Err()
		}
		if err == nil {
			b.step("repaired %s (%s) in %s", p.Name(), how, took(time.Since(t0)))
		}
		out = append(out, Repaired{Path: p, How: how, Err: err})
	}
	return out, nil
}

// failedBelow returns a path info refers to or was built from whose repair failed, if any.
func failedBelow(info *store.PathInfo, failed map[store.Path]bool) store.Path {
	if info == nil {
		return store.Path{}
	}
	for _, r := range append(slices.Clone(info.References), info.BuildInputs...) {
		if failed[r] {
			return r
		}
	}
	return store.Path{}
}

func (b *Builder) repairOne(ctx context.Context, infos map[store.Path]*store.PathInfo, p store.Path) (string, error) {
	s := b.Store
	info := infos[p]
	if info == nil {
		return "", fmt.Errorf("%s: %w", p, store.ErrNotExist)
	}
	if tp, ok := b.Substituter.(TreePuller); ok {
		err := s.Repair(ctx, p, math.MaxInt64, func(ctx context.Context, out string) error {
			ok, err := tp.PullTree(ctx, p, info.ContentHash, out)
			if err == nil && !ok {
				err = errNotCached
			}
			return err
		})
		if err == nil {
			return "substituted", nil
		}
		if !errors.Is(err, errNotCached) && b.Warn != nil {
			b.Warn("%v; rebuilding it instead", err)
		}
	}
	drv := info.Deriver
	if drv.IsZero() {
		drv = fetchDrvOf(b, infos, p)
	}
	if drv.IsZero() && strings.HasPrefix(info.CA, "fixed:") {
		return "", fmt.Errorf("%s was downloaded, and no .drv here says from where (no layer built from it is left)", p)
	}
	if drv.IsZero() {
		return "", fmt.Errorf("%s was added, not built (it has no .drv): nothing here can make its bytes again", p)
	}
	d, err := b.readDrv(drv)
	if err != nil {
		return "", err
	}
	if d.Output != p {
		return "", fmt.Errorf("%s: its deriver %s builds %s", p, drv, d.Output)
	}
	if d.Kind == derivation.KindFetch {
		// The record's size bounds the download: a server that never stops sending is cut off.
		_, err := Refetch(ctx, s, itemOf(d, recipe.FetchInfo{Size: info.Size}), FetchOptions{Progress: b.Progress, Offline: b.Offline})
		return "fetched", err
	}
	// The derivations of the layers below and of the build inputs, for build's stack and inputs. As
	// in Realize, a layer's parent is its last input that is not a fetch; a lower's other inputs
	// (its .debs) are not needed, so a .drv of theirs that is gone does not matter.
	byOut := map[store.Path]*derivation.Derivation{p: d}
	var stack []string
	var missing []FetchItem
	for cur := d; cur != nil; {
		var parent *derivation.Derivation
		for _, in := range cur.Inputs {
			if in.Drv.IsZero() {
				continue
			}
			id, err := b.readDrv(in.Drv)
			if err != nil {
				if cur == d {
					return "", err
				}
				continue
			}
			if cur == d {
				byOut[id.Output] = id
			}
			switch {
			case id.Kind == derivation.KindFetch:
				if cur == d && !s.IsValid(id.Output) {
					missing = append(missing, itemOf(id, recipe.FetchInfo{}))
				}
			default:
				parent = id
			}
		}
		if parent != nil {
			if !s.IsValid(parent.Output) {
				return "", fmt.Errorf("%s: the layer below it, %s, is not in the store: realize its Workshop again", p, parent.Output)
			}
			stack = append([]string{s.Location(parent.Output)}, stack...)
		}
		cur = parent
	}
	if len(missing) > 0 {
		if _, err := Fetch(ctx, s, missing, FetchOptions{Progress: b.Progress, Offline: b.Offline}); err != nil {
			return "", err
		}
	}
	if d.Network != "none" && b.Offline {
		return "", fmt.Errorf("%s: rebuilding it needs the network: %w", p, ErrOffline)
	}
	epoch, err := epochOf(d)
	if err != nil {
		return "", err
	}
	b.begin(fmt.Sprintf("rebuilding %s (%s) to repair it", p.Name(), d.Kind))
	err = s.Repair(ctx, p, epoch, func(ctx context.Context, out string) error {
		return b.build(ctx, d, stack, byOut, out, s.LogFile(p)+".repair")
	})
	b.end()
	if errors.Is(err, store.ErrRepairDiffers) && d.Kind == derivation.KindSeed {
		err = fmt.Errorf("%w (a seed is rebuilt from the live mirror, which has moved on: take it from a cache with --substituter)", err)
	}
	return "rebuilt", err
}

// fetchDrvOf finds the fetch .drv of a downloaded file (a .deb, a wheel), which is registered by
// its content and without a deriver: the .drv of a path built from it names it as an input.
func fetchDrvOf(b *Builder, infos map[store.Path]*store.PathInfo, p store.Path) store.Path {
	if !strings.HasPrefix(infos[p].CA, "fixed:") {
		return store.Path{}
	}
	// In a stable order: every such .drv names the file by the same hash, but their URLs may differ.
	for _, q := range store.SortedPaths(infos) {
		info := infos[q]
		if info.Deriver.IsZero() || !slices.Contains(info.BuildInputs, p) && !slices.Contains(info.References, p) {
			continue
		}
		d, err := b.readDrv(info.Deriver)
		if err != nil {
			continue
		}
		for _, in := range d.Inputs {
			if in.Out == p && !in.Drv.IsZero() {
				return in.Drv
			}
		}
	}
	return store.Path{}
}

// readDrv reads and decodes a .drv of the store; Decode refuses one edited by hand.
func (b *Builder) readDrv(p store.Path) (*derivation.Derivation, error) {
	s := b.Store
	if !s.IsValid(p) {
		return nil, fmt.Errorf("the derivation %s is not in the store: realize its Workshop again", p)
	}
	data, err := os.ReadFile(s.Location(p))
	if err != nil {
		return nil, err
	}
	d, err := derivation.Decode(data, s.StoreDir())
	if err != nil {
		return nil, fmt.Errorf("%s: %w (the .drv is damaged: realize its Workshop again)", p, err)
	}
	return d, nil
}

// dependenciesFirst orders paths so that each comes after the paths of the set it refers to or was
// built from.
func dependenciesFirst(infos map[store.Path]*store.PathInfo, paths []store.Path) []store.Path {
	in := map[store.Path]bool{}
	for _, p := range paths {
		in[p] = true
	}
	var order []store.Path
	done := map[store.Path]bool{}
	var visit func(p store.Path)
	visit = func(p store.Path) {
		if done[p] {
			return
		}
		done[p] = true
		if info := infos[p]; info != nil {
			// A layer is rebuilt over the layers below and from its .debs: both repaired first.
			for _, r := range append(slices.Clone(info.References), info.BuildInputs...) {
				if in[r] {
					visit(r)
				}
			}
		}
		order = append(order, p)
	}
	sorted := slices.Clone(paths)
	slices.SortFunc(sorted, func(a, b store.Path) int { return cmpPath(a, b) })
	for _, p := range sorted {
		visit(p)
	}
	return order
}

func cmpPath(a, b store.Path) int {
	switch x, y := a.String(), b.String(); {
	case x < y:
		return -1
	case x > y:
		return 1
	}
	return 0
}
