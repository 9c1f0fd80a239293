package builder

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"toolshed.dev/shed/debian"

	"toolshed.dev/shed/derivation"
	"toolshed.dev/shed/sandbox"
	"toolshed.dev/shed/store"
)

// buildEnv is the environment of every build: nothing from the host, so no
// host secret can reach a build, and SOURCE_DATE_EPOCH so that tools that
// honour it (pip, py_compile, gzip...) write the same bytes every time. Each
// of extra ("NAME=value") is added, or replaces the variable of that name.
func buildEnv(d *derivation.Derivation, extra ...string) []string {
	env := []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=/root", "LANG=C.UTF-8", "DEBIAN_FRONTEND=noninteractive", "TZ=UTC",
	}
	for k, v := range d.Env {
		env = append(env, k+"="+v)
	}
	slices.Sort(env)
	for _, x := range extra {
		name, _, _ := strings.Cut(x, "=")
		env = slices.DeleteFunc(env, func(e string) bool { return strings.HasPrefix(e, name+"=") })
	}
	return append(env, extra...)
}

// debsTarget is where a layer build sees its .deb files: under /run, a tmpfs,
// so the mount point never lands in the captured upper.
const debsTarget = "/run/shed/debs"

// buildAptLayer installs the fetched .debs over the layer stack, in a sandbox
// with no network and no grants, and captures the overlay upper as the layer.
// apt (not dpkg -i, which does not order Pre-Depends) installs from the local
// files; maintainer scripts run. Afterwards the packages dpkg installed must be
// exactly the lock's, or the build fails.
func (b *Builder) buildAptLayer(ctx context.Context, d *derivation.Derivation, lowers []string, debs []store.Path, stage, out string, log io.Writer) error {
	upper, work, debDir := filepath.Join(stage, "upper"), filepath.Join(stage, "work"), filepath.Join(stage, "debs")
	for _, dir := range []string{work, debDir} {
		if err := os.Mkdir(dir, 0o755); err != nil {
			return err
		}
	}
	o, err := makeOutput(upper)
	if err != nil {
		return err
	}
	defer o.close()
	// apt wants the .deb file names (name_version_arch.deb); the store names
	// them by their own rules. Hard links cost nothing and stay on this
	// filesystem; the directory is bound read-only.
	argv := []string{"/usr/bin/apt-get", "install", "-y", "--no-install-recommends", "-q",
		"-o", "Dpkg::Options::=--force-unsafe-io", "-o", "Dpkg::Use-Pty=0", "-o", "APT::Sandbox::User=root"}
	var files []string
	for _, p := range debs {
		// apt reads the package's identity from the file, not its name; it
		// only wants the .deb suffix, which every fetch name has.
		if err := os.Link(b.Store.Location(p), filepath.Join(debDir, p.Name())); err != nil {
			return fmt.Errorf("stage %s: %w", p.Name(), err)
		}
		files = append(files, path.Join(debsTarget, p.Name()))
	}
	slices.Sort(files)
	argv = append(argv, files...)
	parentStatus, err := StatusOf(lowers)
	if err != nil {
		return err
	}
	spec := &sandbox.Spec{
		Root:  sandbox.Root{Lowers: lowers, Upper: upper, Work: work},
		Binds: []sandbox.Bind{{Source: debDir, Target: debsTarget}},
		Argv:  argv,
		Env:   buildEnv(d),
	}
	code, err := sandbox.Run(ctx, spec, sandbox.Stdio{Stdout: log, Stderr: log})
	if err != nil {
		return err
	}
	if code != 0 {
		return fmt.Errorf("%w: apt-get install exited %d", ErrBuildFailed, code)
	}
	if err := checkInstalled(d, upper, parentStatus); err != nil {
		return err
	}
	if err := o.normalize(); err != nil {
		return err
	}
	return o.moveTo(out)
}

// StatusOf reads dpkg's status as the top of a layer stack (bottom first) sees it; a stack with
// none has no packages.
func StatusOf(lowers []string) (map[string]debian.Installed, error) {
	b, err := ReadTop(lowers, "var/lib/dpkg/status")
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]debian.Installed{}, nil
	}
	if err != nil {
		return nil, err
	}
	return debian.ParseStatus(b)
}

// checkInstalled compares what dpkg installed (new or changed against the
// parent) with the lock's packages, the layer derivation's "name=version"
// arguments.
func checkInstalled(d *derivation.Derivation, upper string, parent map[string]debian.Installed) error {
	b, err := ReadBeneath(upper, "var/lib/dpkg/status")
	if err != nil {
		return fmt.Errorf("%w: dpkg status not written by the build: %v", ErrBuildFailed, err)
	}
	now, err := debian.ParseStatus(b)
	if err != nil {
		return err
	}
	got := map[string]string{}
	for name, p := range now {
		if old, ok := parent[name]; !ok || old.Version != p.Version {
			got[name] = p.Version
		}
	}
	return compareInstalled("packages", d.Args, "=", got)
}

// compareInstalled checks that what a build installed (got: name → version) is exactly what the
// layer's NAME<sep>VERSION arguments say, and names every difference.
func compareInstalled(what string, args []string, sep string, got map[string]string) error {
	want := map[string]string{}
	for _, a := range args {
		name, version, _ := strings.Cut(a, sep)
		want[name] = version
	}
	var diffs []string
	for name, v := range want {
		if got[name] != v {
			diffs = append(diffs, fmt.Sprintf("%s: locked %s, installed %q", name, v, got[name]))
		}
	}
	for name, v := range got {
		if _, ok := want[name]; !ok {
			diffs = append(diffs, fmt.Sprintf("%s %s: installed but not in the lock", name, v))
		}
	}
	if len(diffs) > 0 {
		slices.Sort(diffs)
		return fmt.Errorf("%w: installed %s differ from the lock:\n  %s", ErrBuildFailed, what, strings.Join(diffs, "\n  "))
	}
	return nil
}
