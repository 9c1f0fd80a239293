package recipe

import (
	"fmt"
	"net/url"
	"path/filepath"
	"slices"
	"strings"

	"toolshed.dev/shed/derivation"
	"toolshed.dev/shed/store"
)

// Plan is a recipe compiled to derivations.
type Plan struct {
	// Derivations in build order: every input before the derivations that use it.
	Derivations []*derivation.Derivation
	// Layers are the outputs a Bench stacks, bottom (seed) first.
	Layers []store.Path
}

// Builders named in derivations. They are part of the store format: a
// derivation's hash covers its builder's name.
const (
	BuilderMmdebstrap = "builtin:mmdebstrap"
	BuilderOCIImport  = "builtin:oci-import"
	BuilderAptLayer   = "builtin:apt-layer"
	BuilderPipLayer   = "builtin:pip-layer"
)

// Compile turns a recipe into derivations for a store bound to storeDir.
//
// Layers chain (seed, then apt, then pip), because dpkg's status, ld.so.cache
// and debconf are shared files that side-by-side layers would hide. Layers are
// named after what they install, not after the recipe, so two recipes that
// share a seed and an apt set share those paths. The network profile and the
// grants are not build inputs: they shape Benches, never what is built.
//
// Versions are compiled as written; `shed lock` resolves them.
func Compile(r *Recipe, storeDir string) (*Plan, error) {
	plan := &Plan{}
	add := func(d *derivation.Derivation) (derivation.Input, error) {
		d.SortInputs()
		if err := d.Finish(storeDir); err != nil {
			return derivation.Input{}, err
		}
		drv, err := d.DrvPath(storeDir)
		if err != nil {
			return derivation.Input{}, err
		}
		plan.Derivations = append(plan.Derivations, d)
		plan.Layers = append(plan.Layers, d.Output)
		return derivation.Input{Drv: drv, Out: d.Output}, nil
	}

	parent, err := add(seedDerivation(r))
	if err != nil {
		return nil, fmt.Errorf("compile %s: seed: %w", r.File, err)
	}
	if len(r.Apt.Packages) > 0 {
		var args, names []string
		for _, p := range r.Apt.Packages {
			args = append(args, p.String())
			names = append(names, p.Name)
		}
		slices.Sort(args)
		d := &derivation.Derivation{
			Name:    layerName("apt", names),
			Kind:    derivation.KindLayer,
			Builder: BuilderAptLayer,
			Network: "none",
			Inputs:  []derivation.Input{parent},
			Args:    args,
		}
		if parent, err = add(d); err != nil {
			return nil, fmt.Errorf("compile %s: apt layer: %w", r.File, err)
		}
	}
	if len(r.Pip.Packages) > 0 {
		var args, names []string
		for _, p := range r.Pip.Packages {
			args = append(args, NormalizePipName(p.Name)+versionSuffix("==", p.Version))
			names = append(names, NormalizePipName(p.Name))
		}
		slices.Sort(args)
		d := &derivation.Derivation{
			Name:    layerName("pip", names),
			Kind:    derivation.KindLayer,
			Builder: BuilderPipLayer,
			Network: "none",
			Inputs:  []derivation.Input{parent},
			Args:    args,
		}
		if _, err = add(d); err != nil {
			return nil, fmt.Errorf("compile %s: pip layer: %w", r.File, err)
		}
	}
	return plan, nil
}

func versionSuffix(op, v string) string {
	if v == "" {
		return ""
	}
	return op + v
}

func seedDerivation(r *Recipe) *derivation.Derivation {
	if r.Seed.Kind == "oci" {
		return &derivation.Derivation{
			Name:    "oci-" + safeName(filepath.Base(r.Seed.AbsDir)+"-"+r.Seed.Tag),
			Kind:    derivation.KindSeed,
			Builder: BuilderOCIImport,
			Network: "none",
			Args:    []string{r.Seed.AbsDir, r.Seed.Tag},
		}
	}
	mirror := r.Apt.Mirror
	name := "debian-" + r.Seed.Suite
	if r.Seed.Snapshot != "" {
		name += "-" + r.Seed.Snapshot
		// A pinned snapshot only means something on the snapshot archive.
		if mirror == DefaultMirror {
			mirror = "https://snapshot.debian.org/archive/debian/" + r.Seed.Snapshot + "/"
		}
	}
	host := mirror
	if u, err := url.Parse(mirror); err == nil {
		host = u.Host
	}
	return &derivation.Derivation{
		Name:    safeName(name),
		Kind:    derivation.KindSeed,
		Builder: BuilderMmdebstrap,
		Network: "allow " + host,
		Args:    []string{"--variant=minbase", "--hook-dir=merged-usr", r.Seed.Suite, mirror},
	}
}

// layerName names a layer after what it installs, shortened to stay readable.
func layerName(kind string, names []string) string {
	names = slices.Clone(names)
	slices.Sort(names)
	n := kind
	for i, p := range names {
		if len(n)+1+len(p) > 60 {
			n += fmt.Sprintf("-and-%d-more", len(names)-i)
			break
		}
		n += "-" + p
	}
	return safeName(n)
}

// safeName maps anything to a valid store name.
func safeName(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("+-._=", c) >= 0 {
			b.WriteByte(c)
		} else {
			b.WriteByte('-')
		}
	}
	n := strings.TrimLeft(b.String(), ".")
	if n == "" {
		n = "x"
	}
	if len(n) > 180 {
		n = n[:180]
	}
	return n
}
