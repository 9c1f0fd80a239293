package recipe

import (
	"fmt"
	"net/url"
	"path"
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
	// Fetches says which locked file each fetch output holds.
	Fetches map[store.Path]FetchInfo
	// Drvs are the .drv paths of the derivations, by output: computed once, here, where the
	// derivations that use them need them too.
	Drvs map[store.Path]store.Path
	// Locked says whether the plan was compiled from a lock (exact versions
	// and hashes) or from the names as written.
	Locked bool
}

// FetchInfo names the package a fetched file belongs to, for progress and
// errors.
type FetchInfo struct {
	Name, Version string
	Size          int64 // 0 if the lock does not record it (wheels)
}

// Builders named in derivations. They are part of the store format: a
// derivation's hash covers its builder's name.
const (
	BuilderMmdebstrap = "builtin:mmdebstrap"
	BuilderOCIImport  = "builtin:oci-import"
	// BuilderImageImport makes a registry image's root filesystem from its blobs, each a fetched path.
	BuilderImageImport = "builtin:image-import"
	BuilderAptLayer    = "builtin:apt-layer"
	BuilderPipLayer    = "builtin:pip-layer"
	BuilderFetch       = "builtin:fetch"
	// BuilderAccountsLayer makes the recipe's accounts (useradd, a sudoers file) over the layers below.
	BuilderAccountsLayer = "builtin:accounts-layer"
)

// Compile turns a recipe into derivations for a store bound to storeDir.
//
// Layers chain (seed, then apt, then pip), because dpkg's status, ld.so.cache
// and debconf are shared files that side-by-side layers would hide. Layers are
// named after what they install, not after the recipe, so two recipes that
// share a seed and an apt set share those paths. The network profile and the
// grants are not build inputs: they shape Benches, never what is built.
//
// With a lock (which must match r), every .deb of the resolved closure is a
// fixed-output fetch, the apt layer's inputs are its parent and those files,
// and every build gets SOURCE_DATE_EPOCH from the lock. Without one, versions
// are compiled as written (`shed instantiate` of an unlocked recipe).
func Compile(r *Recipe, lock *Lock, storeDir string) (*Plan, error) {
	plan := &Plan{Fetches: map[store.Path]FetchInfo{}, Drvs: map[store.Path]store.Path{}, Locked: lock != nil}
	add := func(d *derivation.Derivation, layer bool) (derivation.Input, error) {
		d.SortInputs()
		if err := d.Finish(storeDir); err != nil {
			return derivation.Input{}, err
		}
		drv, err := d.DrvPath(storeDir)
		if err != nil {
			return derivation.Input{}, err
		}
		plan.Derivations = append(plan.Derivations, d)
		plan.Drvs[d.Output] = drv
		if layer {
			plan.Layers = append(plan.Layers, d.Output)
		}
		return derivation.Input{Drv: drv, Out: d.Output}, nil
	}
	fetch := func(rawURL, sha256 string, info FetchInfo) (derivation.Input, error) {
		f, err := fetchDerivation(rawURL, sha256)
		if err != nil {
			return derivation.Input{}, err
		}
		in, err := add(f, false)
		if err != nil {
			return derivation.Input{}, err
		}
		plan.Fetches[in.Out] = info
		return in, nil
	}
	var env map[string]string
	if lock != nil && lock.Seed.Epoch > 0 {
		env = map[string]string{"SOURCE_DATE_EPOCH": fmt.Sprint(lock.Seed.Epoch)}
	}

	seed := seedDerivation(r)
	if r.Seed.IsRegistry() && lock != nil && lock.Seed.Image != nil {
		// Every blob of the image is a fixed-output fetch named by its digest alone, so images (and
		// registries) that share a layer share its path; the seed is built from those paths.
		im := lock.Seed.Image
		if r.Seed.Digest != "" && r.Seed.Digest != lock.Seed.Digest {
			return nil, fmt.Errorf("compile %s: seed: the recipe pins manifest %s but the lock pins %s: run `shed lock --update`", r.File, r.Seed.Digest, lock.Seed.Digest)
		}
		seed.Args = []string{"manifest " + im.Manifest.MediaType + " " + lock.Seed.Digest}
		blobs := append([]LockedBlob{im.Manifest, im.Config}, im.Layers...)
		for i, b := range blobs {
			what, arg, kind := "manifest", "", "blobs"
			switch {
			case i == 0:
				kind = "manifests"
			case i == 1:
				what, arg = "config", "config "+b.Digest
			default:
				what, arg = fmt.Sprintf("layer %d of %d", i-1, len(im.Layers)), "layer "+b.MediaType+" "+b.Digest
			}
			in, err := fetch("oci://"+r.Seed.Ref+"/"+kind+"/"+b.Digest, b.SHA256(), FetchInfo{Name: r.Seed.Ref, Version: what, Size: b.Size})
			if err != nil {
				return nil, fmt.Errorf("compile %s: seed: %w", r.File, err)
			}
			seed.Inputs = append(seed.Inputs, in)
			if arg != "" {
				seed.Args = append(seed.Args, arg)
			}
		}
	} else if lock != nil && lock.Seed.Digest != "" {
		seed.Args = append(seed.Args, lock.Seed.Digest)
	}
	if r.Seed.Kind == "debian" {
		// An OCI seed is the image's bytes, dated by the image: the epoch
		// (read later, from the suite the image turns out to be) is not
		// an input of the import.
		seed.Env = env
	}
	parent, err := add(seed, true)
	if err != nil {
		return nil, fmt.Errorf("compile %s: seed: %w", r.File, err)
	}
	// layer adds a layer over the one below: without a lock it installs the packages as written; with
	// one, exactly the lock's files, each a fixed-output fetch (a .deb, a wheel).
	type lockedFile struct {
		url, sha256, arg string
		info             FetchInfo
	}
	layer := func(kind, builder string, names, written []string, files []lockedFile) error {
		inputs, args := []derivation.Input{parent}, written
		if lock != nil {
			args = nil
			for _, f := range files {
				in, err := fetch(f.url, f.sha256, f.info)
				if err != nil {
					return fmt.Errorf("fetch %s: %w", f.arg, err)
				}
				inputs, args = append(inputs, in), append(args, f.arg)
			}
		}
		slices.Sort(args)
		d := &derivation.Derivation{
			Name:    layerName(kind, names),
			Kind:    derivation.KindLayer,
			Builder: builder,
			Network: "none",
			Inputs:  inputs,
			Args:    args,
			Env:     env,
		}
		var err error
		parent, err = add(d, true)
		return err
	}
	if len(r.Apt.Packages) > 0 {
		var names, written []string
		for _, p := range r.Apt.Packages {
			names, written = append(names, p.Name), append(written, p.String())
		}
		var files []lockedFile
		if lock != nil {
			for _, deb := range lock.Apt {
				files = append(files, lockedFile{deb.URL, deb.SHA256, deb.String(), FetchInfo{deb.Name, deb.Version, deb.Size}})
			}
		}
		if err := layer("apt", BuilderAptLayer, names, written, files); err != nil {
			return nil, fmt.Errorf("compile %s: apt layer: %w", r.File, err)
		}
	}
	if len(r.Pip.Packages) > 0 {
		var names, written []string
		for _, p := range r.Pip.Packages {
			name := NormalizePipName(p.Name)
			names, written = append(names, name), append(written, name+versionSuffix("==", p.Version))
		}
		var files []lockedFile
		if lock != nil {
			for _, w := range lock.Pip {
				files = append(files, lockedFile{w.URL, w.SHA256, w.String(), FetchInfo{Name: w.Name, Version: w.Version}})
			}
		}
		if err := layer("pip", BuilderPipLayer, names, written, files); err != nil {
			return nil, fmt.Errorf("compile %s: pip layer: %w", r.File, err)
		}
	}
	// Accounts are a layer of their own, on top: declaring one builds only it, and the apt and pip
	// layers below stay the paths other recipes share. Its arguments are the accounts: the layer's
	// hash changes with any of them. The default user is not an input: it shapes Benches only.
	if len(r.Accounts) > 0 {
		var names, args []string
		for _, a := range r.Accounts {
			names, args = append(names, a.Name), append(args, a.AccountArg())
		}
		d := &derivation.Derivation{
			Name:    layerName("accounts", names),
			Kind:    derivation.KindLayer,
			Builder: BuilderAccountsLayer,
			Network: "none",
			Inputs:  []derivation.Input{parent},
			Args:    args, // in the recipe's order: useradd makes them in it
			Env:     env,
		}
		if _, err := add(d, true); err != nil {
			return nil, fmt.Errorf("compile %s: accounts layer: %w", r.File, err)
		}
	}
	return plan, nil
}

// fetchDerivation is the fixed-output derivation of one locked file (a .deb, a
// wheel): its output path depends only on the SHA-256 and the file's name, so
// the same file is fetched once whichever recipe, mirror or index asks for it.
func fetchDerivation(rawURL, sha256 string) (*derivation.Derivation, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, err
	}
	base := u.Path
	if i := strings.LastIndexByte(base, '/'); i >= 0 {
		base = base[i+1:]
	}
	return &derivation.Derivation{
		Name:    fetchName(u, base),
		Kind:    derivation.KindFetch,
		Builder: BuilderFetch,
		Network: "allow " + u.Host,
		Fixed:   &derivation.Fixed{Algo: "sha256", Hash: sha256},
		Args:    []string{rawURL},
	}, nil
}

// fetchName names a fetched file: its URL's last element, or for an image's manifest or blob
// (oci://HOST/REPO/manifests/sha256:HEX, oci://HOST/REPO/blobs/sha256:HEX) "oci-manifest-" or
// "oci-blob-" and the digest's start, the same whichever registry and repository serve it.
func fetchName(u *url.URL, base string) string {
	if d, ok := strings.CutPrefix(base, "sha256:"); u.Scheme == "oci" && ok && len(d) >= 16 {
		if strings.HasSuffix(path.Dir(u.Path), "/manifests") {
			return "oci-manifest-" + d[:16]
		}
		return "oci-blob-" + d[:16]
	}
	return safeName(base)
}

func versionSuffix(op, v string) string {
	if v == "" {
		return ""
	}
	return op + v
}

func seedDerivation(r *Recipe) *derivation.Derivation {
	if r.Seed.IsRegistry() {
		// Named after the repository and the tag (or the digest's start), never the registry: the
		// image, not where it was fetched, is what is built. Unlocked, it cannot be built.
		ref := r.Seed.Tag
		if r.Seed.Digest != "" {
			ref = strings.TrimPrefix(r.Seed.Digest, "sha256:")[:12]
		}
		return &derivation.Derivation{
			Name:    "oci-" + safeName(path.Base(r.Seed.Ref)+"-"+ref),
			Kind:    derivation.KindSeed,
			Builder: BuilderImageImport,
			Network: "none",
		}
	}
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
