package builder

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"

	"toolshed.dev/shed/derivation"
	"toolshed.dev/shed/internal/hint"
	"toolshed.dev/shed/proxy"
	"toolshed.dev/shed/sandbox"
)

// proxyAddr is the loopback address, inside a build's network namespace, at
// which shed's allowlisting proxy listens. Nothing else is reachable there.
const proxyAddr = "127.0.0.1:3128"

// seedTarget is where mmdebstrap writes the seed, a writable bind under /run.
const seedTarget = "/run/shed/seed"

// mmdebstrapHooks is Debian's merged-usr hook directory (lab report §1: the
// same package set as debootstrap, 127 MB instead of 178 MB).
const mmdebstrapHooks = "/usr/share/mmdebstrap/hooks/merged-usr"

// buildDebianSeed runs the host's mmdebstrap (variant minbase) in a sandbox
// whose only network is the proxy, allowing the mirror alone. The host's
// resolv.conf and hostname, which mmdebstrap copies in, are blanked.
func (b *Builder) buildDebianSeed(ctx context.Context, d *derivation.Derivation, stage, out string, log io.Writer) error {
	if len(d.Args) < 4 {
		return fmt.Errorf("seed derivation %s: want variant, hook dir, suite and mirror", d.Name)
	}
	if _, err := os.Stat("/usr/bin/mmdebstrap"); err != nil {
		return hint.Wrap(fmt.Errorf("mmdebstrap is not installed: %w", err), "as root: `apt-get install mmdebstrap` (it builds Debian seeds)")
	}
	suite, mirror := d.Args[2], d.Args[3]
	dir := filepath.Join(stage, "seed")
	o, err := makeOutput(dir)
	if err != nil {
		return err
	}
	defer o.close()
	rule, private, err := mirrorRule(mirror)
	if err != nil {
		return err
	}
	// The proxy is given in the environment, which apt reads: mmdebstrap
	// would write an --aptopt into the seed's apt.conf.d, and a seed must not
	// carry how it was built.
	// mmdebstrap mounts /proc, /sys and /dev into the seed while it installs: in a mount namespace of
	// its own (unshare), since the sandbox's tree is not its to change.
	argv := []string{"/usr/bin/unshare", "--mount", "--propagation", "unchanged", "--",
		"/usr/bin/mmdebstrap", "--variant=minbase", "--hook-dir=" + mmdebstrapHooks, suite, seedTarget, mirror}
	spec := &sandbox.Spec{
		// What users keep (homes, the store) is not the seed build's to read: as root the sandbox
		// could read only what every user may, without root it is the user's uid.
		Root: sandbox.Root{Host: true, Hide: b.hostPrivate()},
		// The seed's files land with the owners mmdebstrap gives them (root's as root's): the
		// directory is the stage's, which nobody else can reach.
		Binds:   []sandbox.Bind{{Source: dir, Target: seedTarget, Writable: true, IDs: sandbox.IDsSandbox}},
		Network: sandbox.Network{Listen: []string{proxyAddr}},
		Argv:    argv,
		// The host's /root is not the sandbox's to read (dpkg looks for ~/.dpkg.cfg there).
		Env: buildEnv(d, "HOME=/tmp", "http_proxy=http://"+proxyAddr, "https_proxy=http://"+proxyAddr),
	}
	code, err := runWithProxy(ctx, spec, []proxy.Rule{rule}, private, log)
	if err != nil {
		return err
	}
	if code != 0 {
		return fmt.Errorf("%w: mmdebstrap exited %d", ErrBuildFailed, code)
	}
	if err := o.normalize(); err != nil {
		return err
	}
	if err := removeJunk(o.fd, "etc/apt/apt.conf.d/99mmdebstrap"); err != nil {
		return err
	}
	// Host leakage (lab report §1): never let the builder's host name or
	// resolver into a seed every Bench starts from.
	for _, f := range []string{"etc/resolv.conf", "etc/hostname"} {
		if err := o.empty(f); err != nil {
			return err
		}
	}
	return o.moveTo(out)
}

// runWithProxy runs spec, serving its first Listen socket with an allowlisting
// proxy for rules, and logs each destination decision to log.
func runWithProxy(ctx context.Context, spec *sandbox.Spec, rules []proxy.Rule, allowPrivate bool, log io.Writer) (int, error) {
	log = &syncWriter{w: log}
	px, err := proxy.New(proxy.Config{
		Allow:        rules,
		AllowPrivate: allowPrivate,
		Log: func(d proxy.Decision) {
			verdict := "allowed"
			if !d.Allowed {
				verdict = "refused: " + d.Reason
			}
			fmt.Fprintf(log, "shed: network: %s %s:%d %s\n", d.Method, d.Host, d.Port, verdict)
		},
	})
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	p, err := sandbox.Start(ctx, spec, sandbox.Stdio{Stdout: log, Stderr: log})
	if err != nil {
		return 0, err
	}
	done := make(chan error, 1)
	go func() { done <- px.Serve(ctx, p.Listeners[0]) }()
	code, err := p.Wait()
	cancel()
	<-done
	return code, err
}

// mirrorRule allows a mirror's host and port. A mirror on a loopback or
// private address (a local mirror) is allowed to resolve there: only build
// steps reach it, never a Bench.
func mirrorRule(mirror string) (proxy.Rule, bool, error) {
	u, err := url.Parse(mirror)
	if err != nil {
		return proxy.Rule{}, false, fmt.Errorf("mirror %q: %w", mirror, err)
	}
	host, port := u.Hostname(), 0
	if ps := u.Port(); ps != "" {
		port, _ = strconv.Atoi(ps)
	}
	private := host == "localhost"
	if ip := net.ParseIP(host); ip != nil {
		private = ip.IsLoopback() || ip.IsPrivate() || ip.IsLinkLocalUnicast()
	}
	return proxy.Rule{Host: host, Port: port}, private, nil
}

// buildOCISeed imports an OCI image by the digest its derivation pins.
func (b *Builder) buildOCISeed(ctx context.Context, d *derivation.Derivation, out string, log io.Writer) error {
	if len(d.Args) < 3 {
		return hint.Wrap(fmt.Errorf("seed derivation %s: not locked: want layout dir, tag and digest", d.Name), "run `shed lock`: it pins the image's digest")
	}
	img := OCIImage{Dir: d.Args[0], Tag: d.Args[1]}
	fmt.Fprintf(log, "shed: importing %s:%s at %s\n", img.Dir, img.Tag, d.Args[2])
	if err := ImportOCI(ctx, img, d.Args[2], out); err != nil {
		return err
	}
	return Normalize(out)
}

// syncWriter serializes writes: a sandbox's output and the proxy's decisions
// reach one log from several goroutines.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// hostPrivate are the host directories a seed build's host root hides: users' homes (this one's too,
// wherever it is), root's, the runtime directories, the scratch that outlives a boot, and the store.
func (b *Builder) hostPrivate() []string {
	dirs := []string{"/home", "/root", "/run/user", "/var/tmp", "/var/mail"}
	for _, d := range []string{os.Getenv("HOME"), os.Getenv("XDG_RUNTIME_DIR"), b.Store.Root()} {
		if d = filepath.Clean(d); filepath.IsAbs(d) && d != "/" && !slices.Contains(dirs, d) {
			dirs = append(dirs, d)
		}
	}
	return dirs
}
