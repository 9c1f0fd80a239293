package builder

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"
	"toolshed.dev/shed/debian"

	"toolshed.dev/shed/derivation"
	"toolshed.dev/shed/proxy"
	"toolshed.dev/shed/recipe"
	"toolshed.dev/shed/sandbox"
	"toolshed.dev/shed/store"
)

// ErrResolve marks a recipe whose packages apt could not resolve.
var ErrResolve = errors.New("cannot resolve")

// LockOptions tune Lock.
type LockOptions struct {
	// Old is the current lock, if any. With Update, packages not named in
	// Update keep their locked versions.
	Old *recipe.Lock
	// Update names the packages to re-resolve; empty with a non-nil Old
	// re-resolves everything.
	Update []string
	// Client fetches the InRelease that dates the seed; nil = a default client.
	Client *http.Client
}

// Lock resolves r: it pins the seed (the mirror's InRelease date, or an OCI
// digest), realizes the seed, then runs apt's own resolver in a sandbox over
// the seed whose network reaches only the mirror and the recipe's sources:
// `apt-get update` (apt checks the signed Release files against the seed's
// keyring and the sources' keys) and `apt-get install --print-uris`, which
// gives the closure of what the seed lacks, with URLs and sizes. SHA-256
// comes from the signed Packages indexes. No resolver is written here.
func (b *Builder) Lock(ctx context.Context, r *recipe.Recipe, opts LockOptions) (*recipe.Lock, error) {
	fp, err := recipe.Fingerprint(r)
	if err != nil {
		return nil, err
	}
	lock := &recipe.Lock{Version: recipe.LockVersion, Inputs: fp, Seed: recipe.LockedSeed{Spec: r.Seed.Raw}, Accounts: recipe.LockAccounts(r)}
	suite := r.Seed.Suite
	switch r.Seed.Kind {
	case "debian":
		mirror := seedMirror(r)
		date, err := releaseDate(ctx, opts.Client, mirror, suite)
		if errors.Is(err, errNoSuite) {
			return nil, noSuiteError(ctx, opts.Client, r, mirror, suite, "")
		}
		if err != nil {
			return nil, err
		}
		lock.Seed.Mirror = mirror
		lock.Seed.ReleaseDate = date.Format(time.RFC1123)
		lock.Seed.Epoch = date.Unix()
	case "oci":
		if r.Seed.IsRegistry() {
			digest, im, err := ResolveImage(ctx, r.Seed)
			if err != nil {
				return nil, err
			}
			lock.Seed.Digest, lock.Seed.Image = digest, im
			break
		}
		digest, err := ResolveOCI(ctx, OCIImage{Dir: r.Seed.AbsDir, Tag: r.Seed.Tag})
		switch {
		case errors.Is(err, errNoOCITag):
			return nil, r.ErrorAt("seed", strings.TrimSuffix(err.Error(), ": "+errNoOCITag.Error()),
				"name a tag the layout has (oci:DIR:TAG), or tag the image you mean in it")
		case errors.Is(err, errNoOCIDir):
			return nil, r.ErrorAt("seed", strings.TrimSuffix(err.Error(), ": "+errNoOCIDir.Error()),
				"write the directory of an OCI image layout, absolute or relative to the recipe's directory (`skopeo copy docker://IMAGE oci:DIR:TAG` makes one)")
		case err != nil:
			return nil, err
		}
		lock.Seed.Digest = digest
	}
	if r.Seed.Kind == "oci" && len(r.Apt.Packages) > 0 {
		// An image brings its own suite; its packages are dated by the
		// recipe's mirror for that suite.
		seedPlan, err := recipe.Compile(r, &recipe.Lock{Seed: lock.Seed}, b.Store.StoreDir())
		if err != nil {
			return nil, err
		}
		if err := b.realizeSeed(ctx, seedPlan); err != nil {
			return nil, err
		}
		if suite, err = osCodename(b.Store.Location(seedPlan.Layers[0])); err != nil {
			return nil, err
		}
		date, err := releaseDate(ctx, opts.Client, r.Apt.Mirror, suite)
		if errors.Is(err, errNoSuite) {
			return nil, noSuiteError(ctx, opts.Client, r, r.Apt.Mirror, suite, "the image's Debian suite (VERSION_CODENAME in its /etc/os-release): ")
		}
		if err != nil {
			return nil, err
		}
		lock.Seed.Mirror, lock.Seed.ReleaseDate, lock.Seed.Epoch = r.Apt.Mirror, date.Format(time.RFC1123), date.Unix()
	}
	if lock.Seed.Epoch == 0 {
		lock.Seed.Epoch = store.DefaultEpoch
	}
	if len(r.Apt.Packages) > 0 {
		seedPlan, err := recipe.Compile(r, &recipe.Lock{Seed: lock.Seed}, b.Store.StoreDir())
		if err != nil {
			return nil, err
		}
		if err := b.realizeSeed(ctx, seedPlan); err != nil {
			return nil, err
		}
		if lock.Apt, err = b.resolveApt(ctx, r, seedPlan.Derivations[seedIndex(seedPlan)], suite, opts); err != nil {
			return nil, err
		}
	}
	if len(r.Pip.Packages) > 0 {
		if lock.Pip, err = b.resolvePip(ctx, r, lock, opts); err != nil {
			return nil, err
		}
	}
	return lock, nil
}

// seedMirror is the mirror the seed and apt resolve against: the snapshot
// archive when the seed pins a snapshot and the recipe keeps the default mirror.
func seedMirror(r *recipe.Recipe) string {
	if r.Seed.Snapshot != "" && r.Apt.Mirror == recipe.DefaultMirror {
		return "https://snapshot.debian.org/archive/debian/" + r.Seed.Snapshot + "/"
	}
	return r.Apt.Mirror
}

// realizeSeed builds just the seed of a plan: its derivation and the fetches before it (a registry
// image's blobs).
func (b *Builder) realizeSeed(ctx context.Context, plan *recipe.Plan) error {
	i := seedIndex(plan)
	seedOnly := &recipe.Plan{Derivations: plan.Derivations[:i+1], Layers: plan.Layers[:1], Fetches: plan.Fetches, Drvs: plan.Drvs, Locked: plan.Locked}
	_, err := b.Realize(ctx, seedOnly)
	return err
}

// seedIndex is the index of a plan's seed among its derivations (after the fetches it needs).
func seedIndex(plan *recipe.Plan) int {
	for i, d := range plan.Derivations {
		if d.Output == plan.Layers[0] {
			return i
		}
	}
	return 0
}

// releaseDate reads the Date: of the suite's InRelease. shed fetches it itself
// (it is what a fixed-output fetch would do); apt verifies the signature of
// the same file inside the resolution sandbox.
func releaseDate(ctx context.Context, client *http.Client, mirror, suite string) (time.Time, error) {
	if client == nil {
		client = &http.Client{Timeout: 60 * time.Second}
	}
	u := strings.TrimSuffix(mirror, "/") + "/dists/" + suite + "/InRelease"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return time.Time{}, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return time.Time{}, fmt.Errorf("fetch %s: %w", u, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return time.Time{}, fmt.Errorf("fetch %s: %s: %w", u, resp.Status, errNoSuite)
	}
	if resp.StatusCode != http.StatusOK {
		return time.Time{}, fmt.Errorf("fetch %s: %s", u, resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return time.Time{}, fmt.Errorf("fetch %s: %w", u, err)
	}
	d, err := debian.ReleaseDate(body)
	if err != nil {
		return time.Time{}, fmt.Errorf("%s: %w", u, err)
	}
	return d, nil
}

// errNoSuite: the mirror has no InRelease for the suite (HTTP 404).
var errNoSuite = errors.New("no such suite")

// noSuiteError is the error for a suite the mirror does not serve, at the recipe's seed line, with
// the suites it does serve among the ones Debian has (the mirror's dists/ has no listing one can
// count on: each is asked for its InRelease, all at once, on this failure only).
func noSuiteError(ctx context.Context, client *http.Client, r *recipe.Recipe, mirror, suite, what string) error {
	if client == nil {
		client = &http.Client{Timeout: 15 * time.Second}
	}
	probe := recipe.Suggest(suite, recipe.DebianSuites(), 3)
	for _, s := range []string{"bullseye", "bookworm", "trixie", "forky", "sid",
		"oldoldstable", "oldstable", "stable", "testing", "unstable"} {
		if !slices.Contains(probe, s) {
			probe = append(probe, s)
		}
	}
	served := make([]bool, len(probe))
	var wg sync.WaitGroup
	for i, s := range probe {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, err := http.NewRequestWithContext(ctx, http.MethodHead, strings.TrimSuffix(mirror, "/")+"/dists/"+s+"/InRelease", nil)
			if err != nil {
				return
			}
			if resp, err := client.Do(req); err == nil {
				resp.Body.Close()
				served[i] = resp.StatusCode == http.StatusOK
			}
		}()
	}
	wg.Wait()
	var have []string
	for i, s := range probe {
		if served[i] {
			have = append(have, s)
		}
	}
	msg := fmt.Sprintf("%sthe mirror %s has no suite %q (no dists/%s/InRelease)", what, mirror, suite, suite)
	hint := "check the suite's name"
	if len(have) > 0 {
		hint = fmt.Sprintf("name a suite the mirror serves, e.g. seed = \"debian/%s\"", have[0])
		msg += "; of Debian's suites, it serves " + strings.Join(have, ", ")
		if guess := recipe.Suggest(suite, have, 1); len(guess) > 0 {
			msg += fmt.Sprintf(": did you mean %q?", guess[0])
			if r.Seed.Kind == "debian" {
				hint = fmt.Sprintf("write seed = %q", strings.Replace(r.Seed.Raw, suite, guess[0], 1))
			}
		}
	}
	if what != "" {
		hint = "set [apt] mirror to one that serves the image's suite, or use an image of a suite the mirror serves"
	} else if len(have) == 0 {
		hint = "check the suite's name, and that [apt] mirror is a Debian mirror"
	}
	return r.ErrorAt("seed", msg, hint)
}

var codenameRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`(?m)^VERSION_CODENAME=("?)([a-z]+)("?)$`) })

func osCodename(root string) (string, error) {
	// Debian's /etc/os-release is a symlink to ../usr/lib/os-release, which is read instead.
	for _, f := range []string{"usr/lib/os-release", "etc/os-release"} {
		b, err := ReadBeneath(root, f)
		if err != nil {
			continue
		}
		if m := codenameRE().FindSubmatch(b); m != nil {
			return string(m[2]), nil
		}
	}
	return "", fmt.Errorf("the seed has no VERSION_CODENAME in /etc/os-release: cannot tell which Debian suite its packages come from")
}

// aptDir is where the resolution sandbox finds its sources and keys.
const aptDir = "/run/shed/apt"

// resolveApt runs apt's resolver over the seed.
func (b *Builder) resolveApt(ctx context.Context, r *recipe.Recipe, seed *derivation.Derivation, suite string, opts LockOptions) ([]recipe.LockedDeb, error) {
	stage, release, err := b.Store.Stage(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	upper, work, conf := filepath.Join(stage, "upper"), filepath.Join(stage, "work"), filepath.Join(stage, "apt")
	for _, d := range []string{upper, work, conf, filepath.Join(conf, "parts"), filepath.Join(conf, "keys")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	mirror := seedMirror(r)
	if r.Seed.Kind == "oci" {
		mirror = r.Apt.Mirror
	}
	rule, private, err := mirrorRule(mirror)
	if err != nil {
		return nil, err
	}
	rules := []proxy.Rule{rule}
	bases := []string{strings.TrimSuffix(mirror, "/") + "/"}
	list := fmt.Sprintf("deb %s %s main\n", mirror, suite)
	for i, src := range r.Apt.Sources {
		key, err := os.ReadFile(filepath.Join(r.Dir, src.Key))
		if err != nil {
			return nil, fmt.Errorf("read key of source %s: %w", src.URL, err)
		}
		keyFile := fmt.Sprintf("keys/source%d.asc", i)
		if err := os.WriteFile(filepath.Join(conf, keyFile), key, 0o644); err != nil {
			return nil, err
		}
		list += fmt.Sprintf("deb [signed-by=%s/%s] %s %s %s\n", aptDir, keyFile, src.URL, src.Suite, strings.Join(src.Components, " "))
		sr, sp, err := mirrorRule(src.URL)
		if err != nil {
			return nil, err
		}
		rules = append(rules, sr)
		private = private || sp
		bases = append(bases, strings.TrimSuffix(src.URL, "/")+"/")
	}
	if err := os.WriteFile(filepath.Join(conf, "sources.list"), []byte(list), 0o644); err != nil {
		return nil, err
	}
	aptOpts := []string{
		"-o", "Dir::Etc::SourceList=" + aptDir + "/sources.list",
		"-o", "Dir::Etc::SourceParts=" + aptDir + "/parts",
		"-o", "Acquire::http::Proxy=http://" + proxyAddr,
		"-o", "Acquire::https::Proxy=http://" + proxyAddr,
		"-o", "Acquire::Languages=none",
		"-o", "APT::Install-Recommends=false",
	}
	spec := func(argv ...string) *sandbox.Spec {
		return &sandbox.Spec{
			Root:    sandbox.Root{Lowers: []string{b.Store.Location(seed.Output)}, Upper: upper, Work: work},
			Binds:   []sandbox.Bind{{Source: conf, Target: aptDir}},
			Network: sandbox.Network{Listen: []string{proxyAddr}},
			Argv:    argv,
			Env:     buildEnv(seed),
		}
	}
	b.begin("resolving the apt packages of " + r.Name)
	defer b.end()
	// A line a log gets too: apt says nothing (-qq) until it is done, some seconds on.
	b.step("resolving the apt packages of %s against %s %s (apt-get update, install --print-uris)...", r.Name, mirror, suite)
	var log strings.Builder
	code, err := runWithProxy(ctx, spec(append(append([]string{"/usr/bin/apt-get"}, aptOpts...), "update", "-q")...), rules, private, io.MultiWriter(&log, b.statusOutput()))
	if err != nil {
		return nil, err
	}
	if code != 0 {
		if e := missingSource(r, log.String()); e != nil {
			return nil, e
		}
		return nil, fmt.Errorf("%w: apt-get update failed (exit %d):\n%s", ErrResolve, code, aptErrors(log.String()))
	}

	wanted := map[string]bool{}
	var args []string
	old := map[string]recipe.LockedDeb{}
	if opts.Old != nil {
		for _, d := range opts.Old.Apt {
			old[d.Name] = d
		}
	}
	for _, p := range r.Apt.Packages {
		wanted[p.Name] = true
		arg := p.String()
		// --update PKG...: the others stay at their locked versions.
		if d, ok := old[p.Name]; ok && p.Version == "" && len(opts.Update) > 0 && !slices.Contains(opts.Update, p.Name) {
			arg = p.Name + "=" + d.Version
		}
		args = append(args, arg)
	}
	var out strings.Builder
	argv := append(append([]string{"/usr/bin/apt-get"}, aptOpts...), "install", "--print-uris", "-qq", "--no-install-recommends")
	code, err = runWithProxy(ctx, spec(append(argv, args...)...), rules, private, io.MultiWriter(&out, b.statusOutput()))
	if err != nil {
		return nil, err
	}
	if code != 0 {
		if e := missingApt(r, args, out.String(), upper, b.Store.Location(seed.Output), mirror, suite); e != nil {
			return nil, e
		}
		return nil, fmt.Errorf("%w: %s", ErrResolve, aptErrors(out.String()))
	}
	uris, err := debian.ParsePrintURIs([]byte(out.String()))
	if err != nil {
		return nil, err
	}
	// Map each URL to its Filename in a Packages index.
	want := map[string]bool{}
	fileOf := map[string]string{}
	for _, u := range uris {
		for _, base := range bases {
			if rest, ok := strings.CutPrefix(u.URL, base); ok {
				want[rest], fileOf[u.URL] = true, rest
			}
		}
		if _, ok := fileOf[u.URL]; !ok {
			return nil, fmt.Errorf("%w: apt wants %s, which is from none of the recipe's repositories", ErrResolve, u.URL)
		}
	}
	entries := map[string]debian.PackageEntry{}
	names, _ := ReadDirBeneath(upper, "var/lib/apt/lists")
	for _, l := range names {
		if !strings.HasSuffix(l, "_Packages") {
			continue
		}
		b, err := ReadBeneath(upper, "var/lib/apt/lists/"+l)
		if err != nil {
			return nil, err
		}
		found, err := debian.IndexByFilename(bytes.NewReader(b), want)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", l, err)
		}
		for k, v := range found {
			entries[k] = v
		}
	}
	var debs []recipe.LockedDeb
	for _, u := range uris {
		e, ok := entries[fileOf[u.URL]]
		if !ok {
			return nil, fmt.Errorf("%w: %s is in no Packages index", ErrResolve, u.URL)
		}
		if e.Size != u.Size {
			return nil, fmt.Errorf("%w: %s: apt says %d bytes, the index %d", ErrResolve, u.URL, u.Size, e.Size)
		}
		if len(e.SHA256) != 64 {
			return nil, fmt.Errorf("%w: %s: the index has no SHA256", ErrResolve, u.URL)
		}
		debs = append(debs, recipe.LockedDeb{
			Name: e.Package, Version: e.Version, Arch: e.Architecture, URL: u.URL,
			SHA256: e.SHA256, Size: e.Size, Declared: wanted[e.Package],
		})
	}
	slices.SortFunc(debs, func(a, b recipe.LockedDeb) int { return strings.Compare(a.Name, b.Name) })
	return debs, nil
}

// missingSource returns an error at the suite's line of the recipe's [[apt.source]] that apt found
// no Release file of ("E: The repository 'URL SUITE Release' does not have a Release file."): a
// suite (or a URL) the repository does not serve. nil if apt says no such thing.
func missingSource(r *recipe.Recipe, aptOut string) error {
	for i, src := range r.Apt.Sources {
		u := strings.TrimSuffix(src.URL, "/")
		for _, q := range []string{"'" + u + " " + src.Suite + " Release'", "'" + u + "/ " + src.Suite + " Release'"} {
			if strings.Contains(aptOut, q+" does not have a Release file") {
				return r.ErrorAt(fmt.Sprintf("apt.source[%d].suite", i),
					fmt.Sprintf("the repository %s has no suite %q (no dists/%s/InRelease or Release)", src.URL, src.Suite, src.Suite),
					"check the source's url and suite: apt reads URL/dists/SUITE/InRelease (the vendor's instructions name both, as `deb URL SUITE COMPONENT`)")
			}
		}
	}
	return nil
}

// missingApt finds, when apt could not resolve, the first of the recipe's packages that is not there
// (no such package, or no such version of it) in the Packages indexes apt fetched, or installed in
// the seed, and returns an error at its line naming what is there; nil if each is there (apt's
// errors then say what else is wrong). args are the packages as apt was given them, aptOut what
// it said.
func missingApt(r *recipe.Recipe, args []string, aptOut, upper, seed, mirror, suite string) error {
	var av debian.Available
	names, _ := ReadDirBeneath(upper, "var/lib/apt/lists")
	for _, l := range names {
		if !strings.HasSuffix(l, "_Packages") {
			continue
		}
		b, err := ReadBeneath(upper, "var/lib/apt/lists/"+l)
		if err != nil || av.AddIndex(bytes.NewReader(b)) != nil {
			return nil
		}
	}
	if st, err := ReadBeneath(seed, "var/lib/dpkg/status"); err == nil {
		if av.AddIndex(bytes.NewReader(st)) != nil {
			return nil
		}
	}
	if len(av.Versions) == 0 {
		return nil // apt fetched no index: its own errors say why
	}
	where := fmt.Sprintf("%s %s", mirror, suite)
	if len(r.Apt.Sources) > 0 {
		where += " or the recipe's [[apt.source]]"
	}
	for i, p := range r.Apt.Packages {
		field := fmt.Sprintf("apt.packages[%d]", i)
		versions, ok := av.Versions[p.Name]
		if !ok {
			// A virtual package with one provider is installed through it: it is what stopped apt
			// only when apt says so.
			if prov := av.Provides[p.Name]; len(prov) > 0 && strings.Contains(aptOut, "'"+p.Name+"' has no installation candidate") {
				return r.ErrorAt(field, fmt.Sprintf("%q is a virtual package, provided by %s", p.Name, listSome(prov, 10)),
					"name the package that provides it, e.g. "+prov[0])
			}
			if len(av.Provides[p.Name]) > 0 {
				continue
			}
			msg := fmt.Sprintf("no package %q in %s", p.Name, where)
			all := make([]string, 0, len(av.Versions))
			for n := range av.Versions {
				all = append(all, n)
			}
			slices.Sort(all)
			if guess := recipe.Suggest(p.Name, all, 3); len(guess) > 0 {
				msg += fmt.Sprintf(": did you mean %s?", listSome(guess, 3))
			}
			return r.ErrorAt(field, msg, "check the name: `apt-cache search WORD` on a Debian machine, or https://packages.debian.org")
		}
		// The version apt was asked for: the recipe's pin, or the lock's for a package not updated.
		_, v, _ := strings.Cut(args[i], "=")
		if v != "" && !slices.Contains(versions, v) {
			msg := fmt.Sprintf("no version %q of %s in %s; there is %s", v, p.Name, where, listSome(versions, 10))
			if len(versions) > 1 {
				msg = fmt.Sprintf("no version %q of %s in %s; there are %s", v, p.Name, where, listSome(versions, 10))
			}
			those := "one of those"
			if len(versions) == 1 {
				those = "that version"
			}
			hint := fmt.Sprintf("pin %s (%s=%s), or write %s alone for the mirror's newest", those, p.Name, versions[0], p.Name)
			if p.Version == "" {
				hint = fmt.Sprintf("the lock pins %s=%s, which the mirror no longer has: `shed lock --update -f %s %s` pins one it has", p.Name, v, r.File, p.Name)
			}
			return r.ErrorAt(field, msg, hint)
		}
	}
	return nil
}

// listSome writes at most n of names, and how many more there are.
func listSome(names []string, n int) string {
	if len(names) <= n {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:n], ", "), len(names)-n)
}

// aptErrors keeps apt's error and warning lines, which say what went wrong
// ("E: Unable to locate package foo"), and drops the progress chatter.
func aptErrors(out string) string {
	var keep []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "E:") || strings.HasPrefix(l, "W:") || strings.HasPrefix(l, "Err:") || strings.Contains(l, "refused") {
			keep = append(keep, l)
		}
	}
	if len(keep) == 0 {
		return strings.TrimSpace(out)
	}
	return strings.Join(keep, "\n")
}
