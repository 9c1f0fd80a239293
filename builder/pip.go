package builder

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"

	"toolshed.dev/shed/derivation"
	"toolshed.dev/shed/internal/hint"
	"toolshed.dev/shed/proxy"
	"toolshed.dev/shed/recipe"
	"toolshed.dev/shed/sandbox"
	"toolshed.dev/shed/store"
)

// ErrPipResolve marks pip packages that pip could not resolve against the index (or whose resolution
// shed refuses). It is an ErrResolve.
var ErrPipResolve error = pipResolveError{}

type pipResolveError struct{}

func (pipResolveError) Error() string        { return "pip cannot resolve" }
func (pipResolveError) Is(target error) bool { return target == ErrResolve }

// ErrNoPip marks a Workshop with pip packages but without python3 and pip to install them.
var ErrNoPip = errors.New("the Workshop cannot install pip packages")

// pipDir is where pip's resolution and install sandboxes find their files: under /run, a tmpfs, so the
// mount point never lands in a captured upper.
const pipDir = "/run/shed/pip"

// pipEnv configures pip through its environment rather than flags, so that a pip too old for one of
// them ignores it instead of failing: no cache, no prompts, no version check, and consent to install
// beside the distribution's own packages (PEP 668: Debian marks its Python externally managed; the
// layer installs into /usr/local, which Debian's Python reads before its own dist-packages).
var pipEnv = []string{
	"PIP_NO_CACHE_DIR=1", "PIP_NO_INPUT=1", "PIP_DISABLE_PIP_VERSION_CHECK=1",
	"PIP_BREAK_SYSTEM_PACKAGES=1", "PIP_ROOT_USER_ACTION=ignore", "PYTHONDONTWRITEBYTECODE=1",
}

// Exit codes of the preflight in pipScript: what the Workshop lacks.
const (
	exitNoPython = 101
	exitNoPip    = 102
)

// pipScript runs pip with python3 and pip checked first, so that their absence is one clear error.
func pipScript(args ...string) []string {
	return append([]string{"/bin/sh", "-c",
		fmt.Sprintf(`command -v python3 >/dev/null || exit %d; python3 -m pip --version >/dev/null 2>&1 || exit %d; exec python3 -m pip "$@"`, exitNoPython, exitNoPip),
		"pip"}, args...)
}

func pipPreflightError(code int) error {
	switch code {
	case exitNoPython:
		return fmt.Errorf("%w: it has no python3", ErrNoPip)
	case exitNoPip:
		return fmt.Errorf("%w: its python3 has no pip module", ErrNoPip)
	}
	return nil
}

// pipRules allows the index's host; PyPI's files live on another host, which is allowed with it. An
// index on a loopback or private address (a local mirror) is allowed as the recipe's own choice.
func pipRules(index string) ([]proxy.Rule, bool, error) {
	rule, private, err := mirrorRule(index)
	if err != nil {
		return nil, false, err
	}
	rules := []proxy.Rule{rule}
	if rule.Host == "pypi.org" {
		rules = append(rules, proxy.Rule{Host: "files.pythonhosted.org"})
	}
	return rules, private, nil
}

// resolvePip runs pip's own resolver in a sandbox over the Workshop's seed and apt layers (realized
// first: python3 and pip come from them), with network only to the index:
// `pip install --dry-run --ignore-installed --only-binary=:all: --report`, whose report gives the whole
// closure with exact versions, file URLs and SHA-256. Nothing is installed.
func (b *Builder) resolvePip(ctx context.Context, r *recipe.Recipe, lock *recipe.Lock, opts LockOptions) ([]recipe.LockedWheel, error) {
	base := *r
	// pip runs over the seed and apt layers only: an accounts layer over them would be built for nothing.
	base.Pip.Packages, base.Accounts = nil, nil
	plan, err := recipe.Compile(&base, lock, b.Store.StoreDir())
	if err != nil {
		return nil, err
	}
	if _, err := b.Realize(ctx, plan); err != nil {
		return nil, err
	}
	stage, release, err := b.Store.Stage(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	upper, work, dir := filepath.Join(stage, "upper"), filepath.Join(stage, "work"), filepath.Join(stage, "pip")
	for _, d := range []string{upper, work, dir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	rules, private, err := pipRules(r.Pip.Index)
	if err != nil {
		return nil, err
	}
	old := map[string]recipe.LockedWheel{}
	if opts.Old != nil {
		for _, w := range opts.Old.Pip {
			old[w.Name] = w
		}
	}
	var reqs []string
	for _, p := range r.Pip.Packages {
		name := recipe.NormalizePipName(p.Name)
		req := p.String()
		// --update PKG...: the others stay at their locked versions.
		if w, ok := old[name]; ok && p.Version == "" && len(opts.Update) > 0 && !slices.Contains(opts.Update, name) && !slices.Contains(opts.Update, p.Name) {
			req = name + "==" + w.Version
		}
		reqs = append(reqs, req)
	}
	var lowers []string
	for _, l := range plan.Layers {
		lowers = append(lowers, b.Store.Location(l))
	}
	args := []string{"install", "--dry-run", "--ignore-installed", "--only-binary=:all:",
		"--report", pipDir + "/report.json", "--index-url", r.Pip.Index, "--proxy", "http://" + proxyAddr, "-q"}
	// pip refuses plain HTTP to anything but localhost; an http:// index is the recipe author's
	// choice (a mirror on the local network), and the lock pins every file it serves by hash.
	if u, err := url.Parse(r.Pip.Index); err == nil && u.Scheme == "http" {
		args = append(args, "--trusted-host", u.Hostname())
	}
	argv := pipScript(append(append(args, "--"), reqs...)...)
	spec := &sandbox.Spec{
		Root: sandbox.Root{Lowers: lowers, Upper: upper, Work: work},
		// pip writes its report there, as the sandbox's root: a private directory of the stage.
		Binds:   []sandbox.Bind{{Source: dir, Target: pipDir, Writable: true, IDs: sandbox.IDsSandbox}},
		Network: sandbox.Network{Listen: []string{proxyAddr}},
		Argv:    argv,
		Env:     append(buildEnv(plan.Derivations[len(plan.Derivations)-1]), pipEnv...),
	}
	b.begin("resolving the pip packages of " + r.Name)
	defer b.end()
	b.step("resolving the pip packages of %s against %s (pip install --dry-run)...", r.Name, r.Pip.Index)
	var log strings.Builder
	code, err := runWithProxy(ctx, spec, rules, private, io.MultiWriter(&log, b.statusOutput()))
	if err != nil {
		return nil, err
	}
	if err := pipPreflightError(code); err != nil {
		return nil, err
	}
	if code != 0 {
		if e := missingPip(r, reqs, log.String()); e != nil {
			return nil, e
		}
		return nil, fmt.Errorf("%w %s against %s:\n%s", ErrPipResolve, strings.Join(reqs, " "), r.Pip.Index, pipErrors(log.String()))
	}
	report, err := ReadBeneath(dir, "report.json")
	if err != nil {
		return nil, fmt.Errorf("%w: pip wrote no report: %v\n%s", ErrPipResolve, err, log.String())
	}
	return ParsePipReport(report)
}

// pipReport is the part of pip's installation report (pip 22.2+, format version 1) that a lock needs.
type pipReport struct {
	Version string `json:"version"`
	Install []struct {
		DownloadInfo struct {
			URL         string `json:"url"`
			ArchiveInfo *struct {
				Hash   string            `json:"hash"`   // "sha256=HEX" (pip 22.2+)
				Hashes map[string]string `json:"hashes"` // {"sha256": "HEX"} (pip 23.1+)
			} `json:"archive_info"`
		} `json:"download_info"`
		IsDirect  bool `json:"is_direct"`
		Requested bool `json:"requested"`
		Metadata  struct {
			Name    string `json:"name"`
			Version string `json:"version"`
		} `json:"metadata"`
	} `json:"install"`
}

// ParsePipReport turns pip's installation report into locked wheels, sorted by name. Every file must be
// a wheel from an index, with a SHA-256 the index gave.
func ParsePipReport(data []byte) ([]recipe.LockedWheel, error) {
	var rep pipReport
	if err := json.Unmarshal(data, &rep); err != nil {
		return nil, fmt.Errorf("%w: pip's report: %v", ErrPipResolve, err)
	}
	if rep.Version != "1" {
		return nil, fmt.Errorf("%w: pip's report has format version %q; shed reads version 1", ErrPipResolve, rep.Version)
	}
	var out []recipe.LockedWheel
	for _, in := range rep.Install {
		name := recipe.NormalizePipName(in.Metadata.Name)
		u := in.DownloadInfo.URL
		if in.IsDirect {
			return nil, fmt.Errorf("%w: %s comes from a direct reference (%s), not from the index", ErrPipResolve, name, u)
		}
		if !strings.HasSuffix(path.Base(u), ".whl") {
			return nil, fmt.Errorf("%w: %s %s resolves to %s, which is not a wheel", ErrPipResolve, name, in.Metadata.Version, u)
		}
		var sum string
		if ai := in.DownloadInfo.ArchiveInfo; ai != nil {
			sum = ai.Hashes["sha256"]
			if h, ok := strings.CutPrefix(ai.Hash, "sha256="); ok && sum == "" {
				sum = h
			}
		}
		if sum == "" {
			return nil, fmt.Errorf("%w: the index gives no SHA-256 for %s: shed pins every file by hash; use an index whose links carry #sha256= (PEP 503)", ErrPipResolve, u)
		}
		out = append(out, recipe.LockedWheel{Name: name, Version: in.Metadata.Version, URL: u, SHA256: strings.ToLower(sum), Declared: in.Requested})
	}
	slices.SortFunc(out, func(a, b recipe.LockedWheel) int { return strings.Compare(a.Name, b.Name) })
	lock := recipe.Lock{Version: recipe.LockVersion, Pip: out}
	if err := lock.Validate(); err != nil {
		return nil, fmt.Errorf("%w: pip's report: %v", ErrPipResolve, err)
	}
	return out, nil
}

// pipNoVersion is pip's error for a requirement that no file of the index satisfies, with the
// versions it found that would install here (wheels for this Python): "ERROR: Could not find a
// version that satisfies the requirement shedtest-alpha==9.9 (from versions: 1.0, 2.0)".
var pipNoVersion = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`(?m)^ERROR: Could not find a version that satisfies the requirement (\S+) \(from versions: ([^)]*)\)`)
})

// missingPip returns an error at the line of the recipe's pip package that pip found no version of,
// naming the versions the index has that would install; nil if pip's failure is about another
// (a dependency) or something else. reqs are the requirements as pip was given them.
func missingPip(r *recipe.Recipe, reqs []string, pipOut string) error {
	m := pipNoVersion().FindStringSubmatch(pipOut)
	if m == nil {
		return nil
	}
	i := slices.Index(reqs, m[1])
	if i < 0 {
		return nil
	}
	p := r.Pip.Packages[i]
	field := fmt.Sprintf("pip.packages[%d]", i)
	_, v, _ := strings.Cut(m[1], "==")
	if m[2] == "none" || v == "" {
		return r.ErrorAt(field, fmt.Sprintf("the index %s has no wheel of %q that installs here", r.Pip.Index, p.Name),
			"check the name against the index (its /simple/NAME/ page lists every file); shed installs wheels only, for the Workshop's Python: "+
				"a package that ships only an sdist must be built into a wheel (pip wheel NAME) and served from your index, or taken from Debian as python3-NAME")
	}
	versions := strings.Split(m[2], ", ")
	hint := fmt.Sprintf("pin one of those (%s==%s), or write %s alone for the newest", p.Name, versions[len(versions)-1], p.Name)
	if p.Version == "" {
		hint = fmt.Sprintf("the lock pins %s, which the index no longer has: `shed lock --update -f %s %s` pins one it has", m[1], r.File, p.Name)
	}
	return r.ErrorAt(field, fmt.Sprintf("the index %s has no version %q of %s that installs here; it has %s", r.Pip.Index, v, p.Name, strings.Join(versions, ", ")), hint)
}

// pipErrors keeps pip's ERROR lines and the proxy's refusals, and says what "no matching distribution"
// can mean.
func pipErrors(out string) string {
	var keep []string
	hint := ""
	for _, l := range strings.Split(out, "\n") {
		switch {
		case strings.HasPrefix(l, "ERROR:"), strings.Contains(l, "refused"):
			keep = append(keep, l)
		}
		if strings.Contains(l, "No matching distribution found") {
			hint = "(the index has no such package or version, or no wheel of it for this Python)"
		}
	}
	if len(keep) == 0 {
		keep = []string{strings.TrimSpace(out)}
	}
	if hint != "" {
		keep = append(keep, hint)
	}
	return strings.Join(keep, "\n")
}

// buildPipLayer installs the fetched wheels over the layer stack, in a sandbox with no network: pip with
// no index, only the wheels, each pinned by version and hash, without dependency resolution (the lock is
// the closure), without bytecode (.pyc files would carry build-time state), where the Workshop's python3
// installs as root (Debian's: /usr/local/lib/python3.X/dist-packages, read before Debian's own
// packages). Afterwards the distributions installed must be exactly the lock's.
func (b *Builder) buildPipLayer(ctx context.Context, d *derivation.Derivation, lowers []string, wheels []wheelInput, stage, out string, log io.Writer) error {
	upper, work, dir := filepath.Join(stage, "upper"), filepath.Join(stage, "work"), filepath.Join(stage, "pip")
	for _, p := range []string{work, filepath.Join(dir, "wheels")} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
	}
	o, err := makeOutput(upper)
	if err != nil {
		return err
	}
	defer o.close()
	byFile := map[string]wheelInput{}
	for _, w := range wheels {
		// pip reads a wheel's name and version from its file name: the store names it after its URL.
		if err := os.Link(b.Store.Location(w.path), filepath.Join(dir, "wheels", w.path.Name())); err != nil {
			return fmt.Errorf("stage %s: %w", w.path.Name(), err)
		}
		byFile[w.path.Name()] = w
	}
	var reqs []string
	for _, a := range d.Args {
		name, version, ok := strings.Cut(a, "==")
		if !ok {
			return hint.Wrap(fmt.Errorf("%s: argument %q is not name==version", d.Name, a), "run `shed lock` to pin every pip package")
		}
		w, ok := findWheel(byFile, name, version)
		if !ok {
			return fmt.Errorf("%s: no fetched wheel for %s", d.Name, a)
		}
		reqs = append(reqs, fmt.Sprintf("%s --hash=sha256:%s", a, w.sha256))
	}
	if err := os.WriteFile(filepath.Join(dir, "requirements.txt"), []byte(strings.Join(reqs, "\n")+"\n"), 0o644); err != nil {
		return err
	}
	argv := pipScript("install", "--no-index", "--find-links", pipDir+"/wheels", "--no-deps", "--require-hashes",
		"--ignore-installed", "--no-compile", "--no-warn-script-location", "-r", pipDir+"/requirements.txt")
	spec := &sandbox.Spec{
		Root:  sandbox.Root{Lowers: lowers, Upper: upper, Work: work},
		Binds: []sandbox.Bind{{Source: dir, Target: pipDir}},
		Argv:  argv,
		Env:   append(buildEnv(d), pipEnv...),
	}
	code, err := sandbox.Run(ctx, spec, sandbox.Stdio{Stdout: log, Stderr: log})
	if err != nil {
		return err
	}
	if err := pipPreflightError(code); err != nil {
		return err
	}
	if code != 0 {
		return fmt.Errorf("%w: pip install exited %d", ErrBuildFailed, code)
	}
	if err := checkPipInstalled(d, upper); err != nil {
		return err
	}
	if err := o.normalize(); err != nil {
		return err
	}
	return o.moveTo(out)
}

// wheelInput is a fetched wheel of a pip layer: its store path and the SHA-256 its fetch pinned.
type wheelInput struct {
	path   store.Path
	sha256 string
}

// findWheel finds the wheel file of name==version: a wheel's file name starts with its distribution
// name (with '-' as '_', any case) and its version.
func findWheel(byFile map[string]wheelInput, name, version string) (wheelInput, bool) {
	for file, w := range byFile {
		parts := strings.SplitN(strings.TrimSuffix(file, ".whl"), "-", 3)
		if len(parts) == 3 && recipe.NormalizePipName(parts[0]) == name && parts[1] == version {
			return w, true
		}
	}
	return wheelInput{}, false
}

// checkPipInstalled compares the distributions the build installed (their .dist-info directories in
// the upper) with the layer's name==version arguments.
func checkPipInstalled(d *derivation.Derivation, upper string) error {
	got := map[string]string{}
	err := filepath.WalkDir(filepath.Join(upper, "usr"), func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) {
				return nil
			}
			return err
		}
		if !e.IsDir() || !strings.HasSuffix(e.Name(), ".dist-info") {
			return nil
		}
		base := strings.TrimSuffix(e.Name(), ".dist-info")
		if i := strings.LastIndexByte(base, '-'); i > 0 {
			got[recipe.NormalizePipName(base[:i])] = base[i+1:]
		}
		return filepath.SkipDir
	})
	if err != nil {
		return err
	}
	return compareInstalled("distributions", d.Args, "==", got)
}
