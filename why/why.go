// Package why answers `shed why`: which layer of a Workshop holds a file, which package owns it,
// and which recipe line brought that package in.
package why

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"toolshed.dev/shed/builder"
	"toolshed.dev/shed/debian"

	"toolshed.dev/shed/derivation"
	"toolshed.dev/shed/internal/hint"
	"toolshed.dev/shed/recipe"
	"toolshed.dev/shed/store"
)

// Explanation says why a file exists in a Workshop's Bench: the layer that
// provides it, the Debian package that owns it, and the recipe declaration
// that brought that package in.
type Explanation struct {
	File      string     `json:"file"`       // as asked, absolute
	Resolved  string     `json:"resolved"`   // after symlinks in its parent directories
	Layer     store.Path `json:"layer"`      // the topmost layer holding it
	LayerKind string     `json:"layer_kind"` // "seed" or "layer"
	// Manager is who installed Package: "apt" (dpkg), or "pip" for a file of a pip layer.
	Manager string `json:"manager,omitempty"`
	Package string `json:"package,omitempty"` // the package that owns the file
	Version string `json:"version,omitempty"` // its version
	// Declared is the recipe entry that names Package, or that Package is a
	// dependency of (Chain gives the way from one to the other).
	Declared string   `json:"declared,omitempty"`
	Line     int      `json:"line,omitempty"`  // the recipe line of Declared
	Chain    []string `json:"chain,omitempty"` // the way from Declared to Package
	InSeed   bool     `json:"in_seed"`         // whether Package is part of the seed
	// ImageLayer is the digest of the image layer that brought the file, for a file of a registry
	// image's seed.
	ImageLayer string `json:"image_layer,omitempty"`
}

// ErrNoSuchFile is returned when no layer of the Workshop has the file.
var ErrNoSuchFile = errors.New("no such file in the Workshop")

// Explain answers `shed why`. The plan must be realized; aptLines and pipLines are the
// recipe lines of [apt] and [pip] packages (recipe.PackageLines).
func Explain(s *store.Store, r *recipe.Recipe, plan *recipe.Plan, aptLines, pipLines []int, file string) (*Explanation, error) {
	var layers []*derivation.Derivation // bottom first
	for _, d := range plan.Derivations {
		if d.Kind == derivation.KindFetch {
			continue
		}
		if !s.IsValid(d.Output) {
			return nil, hint.Wrap(fmt.Errorf("%w: %s: the Workshop is not realized", store.ErrNotExist, d.Output), "run `shed realize "+r.File+"` first")
		}
		layers = append(layers, d)
	}
	mans := make([]map[string]store.Entry, len(layers))
	for i, d := range layers {
		m, err := s.Manifest(d.Output)
		if err != nil {
			return nil, err
		}
		mans[i] = map[string]store.Entry{}
		for _, e := range m.Entries {
			mans[i][e.Path] = e
		}
	}
	// lookup finds the topmost entry for rel in the stack, honouring
	// whiteouts and opaque directories of higher layers.
	lookup := func(rel string) (store.Entry, int, bool) {
		for i := len(mans) - 1; i >= 0; i-- {
			if e, ok := mans[i][rel]; ok {
				if e.Type == store.EntryWhiteout {
					return store.Entry{}, -1, false
				}
				return e, i, true
			}
			// An opaque parent in this layer hides everything below.
			for dir := path.Dir(rel); dir != "."; dir = path.Dir(dir) {
				if e, ok := mans[i][dir]; ok && isOpaque(e) {
					return store.Entry{}, -1, false
				}
			}
		}
		return store.Entry{}, -1, false
	}
	rel := strings.Trim(path.Clean("/"+file), "/")
	resolved, err := resolveParents(rel, lookup)
	if err != nil {
		return nil, err
	}
	_, idx, ok := lookup(resolved)
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrNoSuchFile, "/"+rel)
	}
	ex := &Explanation{File: "/" + rel, Resolved: "/" + resolved, Layer: layers[idx].Output, LayerKind: string(layers[idx].Kind)}
	if idx == 0 {
		ex.ImageLayer = imageLayerOf(s, plan, layers[0], resolved)
	}

	// A file of a pip layer belongs to the distribution whose RECORD lists it.
	if layers[idx].Builder == recipe.BuilderPipLayer {
		if name, version, ok := pipOwner(s.Location(layers[idx].Output), resolved); ok {
			ex.Manager, ex.Package, ex.Version = "pip", name, version
			for i, p := range r.Pip.Packages {
				if recipe.NormalizePipName(p.Name) == name {
					ex.Declared, ex.Chain = p.String(), []string{name}
					if i < len(pipLines) {
						ex.Line = pipLines[i]
					}
				}
			}
		}
		return ex, nil
	}

	// The owner: dpkg's file lists, in the merged view. A package lists
	// the path it shipped (/bin/ls), which merged-usr may have moved
	// (/usr/bin/ls): compare both forms.
	candidates := map[string]bool{"/" + rel: true, "/" + resolved: true}
	owner := ""
	for i := len(layers) - 1; i >= 0 && owner == ""; i-- {
		layer := s.Location(layers[i].Output)
		names, _ := builder.ReadDirBeneath(layer, "var/lib/dpkg/info")
		for _, n := range names {
			if strings.HasSuffix(n, ".list") && listHas(layer, "var/lib/dpkg/info/"+n, candidates, lookup) {
				owner = strings.TrimSuffix(n, ".list")
				break
			}
		}
	}
	if owner == "" {
		return ex, nil // not a packaged file: made by a maintainer script, or by the seed's builder
	}
	pkgName, _, _ := strings.Cut(owner, ":") // libc6:amd64
	ex.Manager, ex.Package = "apt", pkgName
	status, err := builder.StatusOf(stackLocations(s, layers))
	if err != nil {
		return nil, err
	}
	ex.Version = status[pkgName].Version
	seedStatus, _ := builder.StatusOf([]string{s.Location(layers[0].Output)})
	_, ex.InSeed = seedStatus[pkgName]

	for i, p := range r.Apt.Packages {
		if p.Name == pkgName {
			ex.Declared, ex.Chain = p.String(), []string{pkgName}
			if i < len(aptLines) {
				ex.Line = aptLines[i]
			}
			return ex, nil
		}
	}
	deps, err := dependencyGraph(stackLocations(s, layers))
	if err != nil {
		return nil, err
	}
	for i, p := range r.Apt.Packages {
		if chain := shortestChain(deps, p.Name, pkgName); chain != nil {
			ex.Declared, ex.Chain = p.String(), chain
			if i < len(aptLines) {
				ex.Line = aptLines[i]
			}
			return ex, nil
		}
	}
	return ex, nil
}

func isOpaque(e store.Entry) bool {
	for _, x := range e.Xattrs {
		if (x.Name == "trusted.overlay.opaque" || x.Name == "user.overlay.opaque") && string(x.Value) == "y" {
			return true
		}
	}
	return false
}

// resolveParents follows symlinks in the parent directories of rel (as the
// kernel would in the merged view), not in its last element.
func resolveParents(rel string, lookup func(string) (store.Entry, int, bool)) (string, error) {
	parts := strings.Split(rel, "/")
	cur := ""
	for hops, i := 0, 0; i < len(parts)-1; i++ {
		next := path.Join(cur, parts[i])
		e, _, ok := lookup(next)
		if ok && e.Type == store.EntrySymlink {
			if hops++; hops > 40 {
				return "", fmt.Errorf("too many symlinks resolving /%s", rel)
			}
			target := e.Target
			if path.IsAbs(target) {
				next = strings.Trim(path.Clean(target), "/")
			} else {
				next = strings.Trim(path.Clean(path.Join(cur, target)), "/")
			}
			rest := strings.Join(parts[i+1:], "/")
			return resolveParents(path.Join(next, rest), lookup)
		}
		cur = next
	}
	return path.Join(cur, parts[len(parts)-1]), nil
}

// listHas reports whether a dpkg .list file names one of the candidates,
// directly or through a symlinked parent (merged-usr).
func listHas(layer, list string, candidates map[string]bool, lookup func(string) (store.Entry, int, bool)) bool {
	b, err := builder.ReadBeneath(layer, list)
	if err != nil {
		return false
	}
	// Every line, however long (bufio.Scanner would stop at the first over 64 KiB, unseen).
	for l := range strings.Lines(string(b)) {
		l = strings.TrimSuffix(l, "\n")
		if candidates[l] {
			return true
		}
		if r, err := resolveParents(strings.Trim(l, "/"), lookup); err == nil && candidates["/"+r] {
			return true
		}
	}
	return false
}

func stackLocations(s *store.Store, layers []*derivation.Derivation) []string {
	var locs []string
	for _, d := range layers {
		locs = append(locs, s.Location(d.Output))
	}
	return locs
}

// dependencyGraph reads Depends and Pre-Depends of the installed packages,
// as the top of the stack sees them.
func dependencyGraph(lowers []string) (map[string][]string, error) {
	g := map[string][]string{}
	b, err := builder.ReadTop(lowers, "var/lib/dpkg/status")
	if errors.Is(err, fs.ErrNotExist) {
		return g, nil
	} else if err != nil {
		return nil, err
	}
	provides := map[string][]string{}
	err = debian.Paragraphs(bytes.NewReader(b), func(f map[string]string) error {
		name := f["Package"]
		for _, field := range []string{"Pre-Depends", "Depends"} {
			g[name] = append(g[name], depNames(f[field])...)
		}
		for _, p := range depNames(f["Provides"]) {
			provides[p] = append(provides[p], name)
		}
		return nil
	})
	// A dependency on a virtual package reaches its providers.
	for name, ds := range g {
		for _, d := range ds {
			g[name] = append(g[name], provides[d]...)
		}
	}
	return g, err
}

// depNames extracts package names from "a (>= 1), b | c, d:any".
func depNames(field string) []string {
	var names []string
	for _, alt := range strings.FieldsFunc(field, func(r rune) bool { return r == ',' || r == '|' }) {
		n := strings.TrimSpace(alt)
		if i := strings.IndexAny(n, " ("); i >= 0 {
			n = n[:i]
		}
		n, _, _ = strings.Cut(n, ":")
		if n != "" {
			names = append(names, n)
		}
	}
	return names
}

func shortestChain(g map[string][]string, from, to string) []string {
	prev := map[string]string{from: ""}
	queue := []string{from}
	for len(queue) > 0 {
		n := queue[0]
		queue = queue[1:]
		if n == to {
			var chain []string
			for c := to; c != ""; c = prev[c] {
				chain = append(chain, c)
			}
			slices.Reverse(chain)
			return chain
		}
		for _, d := range g[n] {
			if _, seen := prev[d]; !seen {
				prev[d] = n
				queue = append(queue, d)
			}
		}
	}
	return nil
}

// pipRecords lists the RECORD files of a pip layer, relative to it:
// usr/local/lib/python3*/*-packages/*.dist-info/RECORD.
func pipRecords(layer string) []string {
	var out []string
	lib := "usr/local/lib"
	pys, _ := builder.ReadDirBeneath(layer, lib)
	for _, py := range pys {
		if !strings.HasPrefix(py, "python3") {
			continue
		}
		sites, _ := builder.ReadDirBeneath(layer, lib+"/"+py)
		for _, site := range sites {
			if !strings.HasSuffix(site, "-packages") {
				continue
			}
			dir := lib + "/" + py + "/" + site
			dists, _ := builder.ReadDirBeneath(layer, dir)
			for _, d := range dists {
				if strings.HasSuffix(d, ".dist-info") {
					out = append(out, dir+"/"+d+"/RECORD")
				}
			}
		}
	}
	return out
}

// pipOwner finds the distribution installed in a pip layer whose RECORD lists rel (a path in the
// layer, as a Bench sees it): RECORD paths are relative to the site-packages directory.
func pipOwner(layer, rel string) (name, version string, ok bool) {
	for _, rec := range pipRecords(layer) {
		siteRel := path.Dir(path.Dir(rec))
		b, err := builder.ReadBeneath(layer, rec)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			p, _, _ := strings.Cut(line, ",")
			if p != "" && path.Clean(path.Join(siteRel, p)) == rel {
				base := strings.TrimSuffix(filepath.Base(filepath.Dir(rec)), ".dist-info")
				if i := strings.LastIndexByte(base, '-'); i > 0 {
					return recipe.NormalizePipName(base[:i]), base[i+1:], true
				}
			}
		}
	}
	return "", "", false
}
