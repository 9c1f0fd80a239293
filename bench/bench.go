package bench

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"toolshed.dev/shed/internal/atomicfile"
	"toolshed.dev/shed/internal/fdbudget"
	"toolshed.dev/shed/internal/hint"
	"toolshed.dev/shed/internal/userns"
	"toolshed.dev/shed/metrics"
	"toolshed.dev/shed/proxy"
	"toolshed.dev/shed/recipe"
	"toolshed.dev/shed/sandbox"
	"toolshed.dev/shed/store"
	"toolshed.dev/shed/upper"
)

// Options describe one launch.
type Options struct {
	Name   string  // "" = the Workshop's name and a random suffix
	Owner  string  // the user who launches it: through the supervisor, users act on their own Benches only
	Grants []Grant // requested grants (none by default: grants are bounds, not ambient access)
	Net    string  // "recipe" (default) or "none"
	// Rules narrow the recipe's network profile for this Bench (NetworkRules; nil: the profile alone).
	// Rules outside the profile are refused before anything starts; SetNetwork changes them later.
	Rules  *proxy.Filter
	Keep   bool     // keep the upper after the command exits
	Argv   []string // the command
	Env    []string // extra environment (e.g. TERM)
	Limits sandbox.Limits
	Stdio  sandbox.Stdio
	// Init, if set, is the Bench's init, started ahead (sandbox.Prestart, with Stdio) while the caller
	// realized the layers; Run gives it the Bench's spec. The caller closes it (a no-op once used).
	Init *sandbox.Pending
	// Event, if set, hears what the Bench does, for the audit log: "bench.start", "bench.end" (detail:
	// the exit code), and each network destination its proxy allowed ("net.allowed") or refused
	// ("net.refused", detail: why), or cut when new network rules no longer allowed it ("net.cut").
	Event func(bench, event, dest, detail string)
	// Reserved, if set, is told the Bench's id once its name is reserved, before it has a record (a
	// count of Benches that holds a launch's place until then tells the two apart by it).
	Reserved func(id string)
	// Started, if set, is called once the Bench runs and its record is written (a Bench created for an
	// API caller is returned then, while Run goes on until it ends).
	Started func(*Record)
	// Ended, if set, is told the command's exit code when the Bench ends, and whether the kernel's OOM
	// killer killed a process of it for the memory limit (an exit of 137 that was the limit).
	Ended func(code int, oomKilled bool)
	// Propose, if set, is served inside the Bench at ProposeSocket: an agent there can ask for a
	// proposal made from this Bench (POST /propose), and nothing else. It returns the text to answer.
	Propose func(ctx context.Context, bench string) (string, error)
	// User is the account the command runs as: "" is the Workshop's default (its `user`, or root),
	// "root" is always there, any other one its Workshop declares.
	User string
	// Metrics measures the Bench's use of cpu and memory while it runs (cgroups of its own:
	// sandbox.Spec.Account), for bench.metrics and `bench ls`. A supervisor's created Benches, whose
	// API clients read their metrics, are; a one-shot run is only when asked, since making and
	// removing those cgroups is a third of its launch (cgroup v1, docs/benchmarks.md).
	Metrics bool
	// Disk, if set, puts the Bench's upper on the store's uppers filesystem (UpperName) instead of a
	// tmpfs, and its processes in a freezer: a Bench that can be paused, snapshotted, forked and reset
	// (a created Bench). An upper already there is used as it is (a fork's or a snapshot's branch,
	// made by the caller under ID); else an empty one is made.
	Disk *upper.FS
	// DiskGroup, if set, charges the upper to that quota group of Disk's (upper.FS.Charge: its
	// owner's uid) before anything runs over it, each launch: a branch or a reset's upper is new.
	DiskGroup *uint32
	// ID, if set, is the Bench's id (16 hex digits): one whose upper the caller branched already.
	ID string
	// Resume launches the paused Bench ID again, whose processes are gone, over its upper: the same
	// id, name and record (no longer paused once it runs). If the launch fails, it stays paused and
	// its upper stays.
	Resume bool
	// From says what the upper was branched from, for the record: "snapshot:ID" or "fork:BENCH-ID".
	From string
	// OnTimeout is what the end of its lifetime does, kept in its record for a launch again
	// ("pause", "pause-cold" or "kill"; the caller keeps the lifetime).
	OnTimeout string
	// Secrets, if set, are the credentials the Bench uses through its proxy without holding them.
	Secrets *Secrets
	// Workshop, if set, is the Workshop its record names: a Bench launched from a copy of a recipe (a
	// fork's child, a snapshot's Bench, a relaunch) names the one the copy is of, not the copy.
	Workshop string
}

// ProposeSocket is where a Bench's agent finds the propose endpoint (HTTP over a unix socket):
//
//	curl --unix-socket /run/shed/propose.sock -X POST http://bench/propose
const ProposeSocket = "/run/shed/propose.sock"

// Record is what `shed bench ls` shows of a Bench; it is written to
// <root>/benches/<id>/bench.json when the Bench starts.
type Record struct {
	ID       string       `json:"id"`
	Name     string       `json:"name"`
	Owner    string       `json:"owner,omitempty"` // who launched it
	Workshop string       `json:"workshop"`        // the recipe file
	Layers   []store.Path `json:"layers"`
	Argv     []string     `json:"argv"`
	Net      string       `json:"net"`
	Grants   []Grant      `json:"grants"`
	Keep     bool         `json:"keep"`
	Started  time.Time    `json:"started"`
	Pid      int          `json:"pid,omitempty"`
	// Running is computed (the runner holds the lock), never stored.
	Running bool `json:"running"`
	// Exit is the command's exit code, written when it ends (kept Benches).
	Exit *int `json:"exit,omitempty"`
	// Expires is when the supervisor removes a Bench that bench.create made: told by the supervisor
	// that holds its lifetime, never stored.
	Expires *time.Time `json:"expires,omitempty"`
	// Record and Version name the Workshop record version it was launched from, when Workshop is one:
	// what users call it, where Workshop is a file of the store (computed, never stored).
	Record  string `json:"record,omitempty"`
	Version int    `json:"version,omitempty"`
	// Metrics is a running Bench's newest reading of its use (cpu, memory, its upper's disk):
	// computed by the lister, never stored.
	Metrics *metrics.Sample `json:"metrics,omitempty"`
	// User is the account commands run as by default ("" is root) and Accounts the ones the Workshop
	// declares beside root: what a request's user selects among (Account).
	User     string    `json:"user,omitempty"`
	Accounts []Account `json:"accounts,omitempty"`
	// Env and Workdir are the Workshop's [env] and workdir: every command of the Bench gets the
	// variables, and starts in Workdir unless it names a directory ("": its user's home).
	Env     []string `json:"env,omitempty"`
	Workdir string   `json:"workdir,omitempty"`
	// Disk says that its upper is on the uppers filesystem (UpperName): it can be paused,
	// snapshotted, forked and reset. From is what that upper was branched from ("snapshot:ID",
	// "fork:BENCH-ID"; "" for an empty one).
	Disk bool   `json:"disk,omitempty"`
	From string `json:"from,omitempty"`
	// DiskGroup is the quota group its upper is charged to (Options.DiskGroup; nil: none), whose
	// bound is its owner's.
	DiskGroup *uint32 `json:"disk_group,omitempty"`
	// Paused is when the Bench was paused (nil: it is not). While its runner lives its processes are
	// frozen in memory; if the runner ends meanwhile they are gone, and its record and upper stay
	// until it is resumed (launched again over the upper), removed, or expires.
	Paused *time.Time `json:"paused,omitempty"`
	// NetAllow and NetDeny are its network rules (Options.Rules, as SetNetwork last set them): a
	// Bench launched again (resume, reset) gets them.
	NetAllow []string `json:"net_allow,omitempty"`
	NetDeny  []string `json:"net_deny,omitempty"`
	// Secrets are the secrets it may use (names: never a value), and BrokerEnv the variables that
	// hold their placeholders and point its clients at its proxy's CA: every command gets them.
	Secrets    []string    `json:"secrets,omitempty"`
	SecretRefs []SecretRef `json:"secret_refs,omitempty"` // as they were allowed (Secrets.Refs)
	BrokerEnv  []string    `json:"broker_env,omitempty"`
	// Inject are the headers its proxy sets (E2B's network transforms): values as given, which name
	// secrets as ${e2b.secrets.NAME}, never hold theirs.
	Inject []proxy.Injection `json:"inject,omitempty"`
	// Limits are the limits it was launched with: a Bench launched again or forked gets them.
	Limits sandbox.Limits `json:"limits"`
	// OnTimeout is what the end of its lifetime does ("pause", "pause-cold": it pauses; else it ends), for its
	// launches again (Options.OnTimeout).
	OnTimeout string `json:"on_timeout,omitempty"`
}

// ErrNoBench is returned for a name or id that matches no Bench.
var ErrNoBench = errors.New("no such bench")

var nameRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,62}$`) })

// proxyAddr is where a Bench finds the network, inside its own namespace.
const proxyAddr = "127.0.0.1:3128"

// Dir is where a store's Benches keep their state.
func Dir(s *store.Store) string { return filepath.Join(s.Root(), "benches") }

// Run launches a Bench over layers (bottom first, all valid and held by s's
// temporary roots), runs the command with stdio attached and returns its exit
// code. Everything it made (mounts, processes, the proxy listener, the tmpfs
// upper) is gone when it returns, and also if shed is killed: the sandbox dies
// with its parent and Sweep removes the state left.
func Run(ctx context.Context, s *store.Store, r *recipe.Recipe, layers []store.Path, opts Options) (int, error) {
	if len(opts.Argv) == 0 {
		return 0, errors.New("bench: no command")
	}
	if opts.Net == "" {
		opts.Net = "recipe"
	}
	if opts.Net != "recipe" && opts.Net != "none" {
		return 0, fmt.Errorf("--net %q: want none or recipe", opts.Net)
	}
	grants, err := resolveGrants(r, opts.Grants, storesOf(s))
	if err != nil {
		return 0, err
	}
	defer func() {
		for _, g := range grants {
			g.fd.Close()
		}
	}()
	id := opts.ID
	if id == "" {
		id = randomID()
	} else if !idRE().MatchString(id) {
		return 0, fmt.Errorf("bench id %q: want 16 hex digits", id)
	}
	if (opts.Resume || opts.ID != "") && opts.Disk == nil {
		return 0, errors.New("bench: Resume and ID are for a Bench on the uppers filesystem (Disk)")
	}
	dir := filepath.Join(Dir(s), id)
	var lk *os.File
	var prev *Record // the paused Bench launched again
	name := opts.Name
	if opts.Resume {
		if lk, prev, err = reclaim(dir); err != nil {
			return 0, err
		}
		name = prev.Name
		// Its runner may have died without removing its control socket (a supervisor killed).
		if ctl := controlAddr(s, id); !strings.HasPrefix(ctl, "@") {
			os.Remove(ctl)
		}
	} else {
		if name == "" {
			name = r.Name + "-" + id[:6]
		}
		if !nameRE().MatchString(name) {
			return 0, fmt.Errorf("bench name %q: use lowercase letters, digits, '.', '_' and '-'", name)
		}
		if lk, err = reserve(Dir(s), dir, name); err != nil {
			return 0, err
		}
	}
	defer lk.Close()
	if opts.Reserved != nil {
		opts.Reserved(id)
	}
	// A kept Bench's state stays once its record names it; before, a failure removes it whatever
	// Keep says, since nothing could name it to remove it. A paused Bench launched again keeps its
	// state whatever happens: it is still paused until it runs. A Bench on the uppers filesystem
	// has its upper there, removed with its state.
	keep := opts.Resume
	defer func() {
		if keep {
			return
		}
		if opts.Disk != nil {
			_ = opts.Disk.Remove(UpperName(id))
			_ = s.RemoveRoot(RootName(id)) // the root of its layers, if it was paused once
		}
		os.RemoveAll(dir)
	}()

	rec := &Record{ID: id, Name: name, Owner: opts.Owner, Workshop: cmp.Or(opts.Workshop, r.File), Layers: layers, Argv: opts.Argv, Net: opts.Net, Keep: opts.Keep, Started: time.Now().UTC()}
	if prev != nil {
		rec.Owner, rec.From = prev.Owner, prev.From
	} else {
		rec.From = opts.From
	}
	if opts.Rules != nil {
		rec.NetAllow, rec.NetDeny = opts.Rules.Allow, opts.Rules.Deny
	}
	rec.Limits, rec.OnTimeout = opts.Limits, opts.OnTimeout
	if opts.Disk != nil && !opts.Resume {
		// Its recipe as launched, beside its state: what it is launched again, forked or snapshotted
		// from, whatever becomes of the file (a snapshot's Bench outlives the snapshot).
		if err := copyRecipe(r.File, dir, false); err != nil {
			return 0, err
		}
	}
	rec.User, rec.Accounts = accountsOf(r)
	rec.Env, rec.Workdir = r.Environ(), r.Workdir
	acct, err := rec.Account(opts.User)
	if err != nil {
		return 0, err
	}
	cwd := acct.Home
	if rec.Workdir != "" {
		cwd = rec.Workdir
	}
	for _, g := range grants {
		rec.Grants = append(rec.Grants, g.Grant)
	}
	spec := &sandbox.Spec{
		Hostname: name,
		Argv:     opts.Argv,
		Env:      mergeEnv(mergeEnv(mergeEnv(benchEnv(Options{}), rec.Env), opts.Env), accountEnv(acct)),
		Dir:      cwd,
		MakeDir:  rec.Workdir != "",
		UID:      acct.UID,
		GID:      acct.GID,
		Limits:   opts.Limits,
		Account:  opts.Metrics,
		Pausable: opts.Disk != nil,
		Control:  controlAddr(s, id),
	}
	spec.Root.Setuid = sudoOf(r)
	for _, l := range layers {
		spec.Root.Lowers = append(spec.Root.Lowers, s.Location(l))
	}
	switch {
	case opts.Disk != nil && opts.Keep:
		return 0, errors.New("bench: Keep and Disk: a kept upper is on the store's filesystem, a branchable one on the uppers'")
	case opts.Disk != nil:
		// On the uppers filesystem, with the ids the sandbox chose (idmapped, as a build's upper):
		// the same files are right in any Bench branched from it, whatever ids its sandbox gets.
		// That filesystem is root's alone (0700, nosuid, nodev): no host user reaches its files.
		u := UpperName(id)
		if _, err := os.Lstat(opts.Disk.Dir(u)); errors.Is(err, os.ErrNotExist) {
			if opts.Resume {
				// Never an empty one in its place: what it had is gone (a crash in a reset).
				return 0, hint.Wrap(fmt.Errorf("bench %s: its upper %s is gone: it stays paused", name, opts.Disk.Dir(u)),
					"`shed bench reset "+name+"` gives it an empty one, `shed bench rm "+name+"` removes it")
			}
			if err := opts.Disk.Create(u); err != nil {
				return 0, err
			}
		} else if err != nil {
			return 0, err
		}
		if opts.DiskGroup != nil {
			if err := opts.Disk.Charge(u, *opts.DiskGroup); err != nil {
				return 0, err
			}
			rec.DiskGroup = opts.DiskGroup
		}
		spec.Root.Upper, spec.Root.Work = filepath.Join(opts.Disk.Dir(u), "upper"), filepath.Join(opts.Disk.Dir(u), "work")
		rec.Disk = true
	case opts.Keep:
		// Kept to be read (proposals), never run: with host ids, nothing in it is root's on the host.
		spec.Root.Upper, spec.Root.Work = filepath.Join(dir, "upper"), filepath.Join(dir, "work")
		spec.Root.UpperHostIDs = true
		for _, d := range []string{spec.Root.Upper, spec.Root.Work} {
			if err := os.Mkdir(d, 0o755); err != nil {
				return 0, err
			}
		}
	default:
		spec.Root.UpperTmpfs = true
	}
	for _, g := range grants {
		// The granted directory's owner is the Bench's root there (or, root's, it shows as to any user).
		spec.Binds = append(spec.Binds, sandbox.Bind{SourceFD: g.fd, Target: g.Bench, Writable: g.Mode == "rw", IDs: g.ids})
	}
	var px *proxy.Proxy
	var logMu sync.Mutex
	var logErr error // the first failed write of the network log
	netLog, err := os.OpenFile(filepath.Join(dir, "network.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return 0, err
	}
	defer netLog.Close()
	live := &liveNet{rules: opts.Rules}
	if opts.Net == "recipe" {
		rules, err := Rules(r)
		if err != nil {
			return 0, err
		}
		live.profile = rules
		if err := within(opts.Rules, rules); err != nil {
			return 0, err
		}
		if len(rules) > 0 {
			spec.Network.Listen = []string{proxyAddr}
			enc := json.NewEncoder(&capped{w: netLog, left: MaxNetworkLog})
			// The Bench's share of the process's proxy connections (package fdbudget): its
			// excess waits behind its own connections.
			var broker *proxy.Broker
			if opts.Secrets != nil && (len(opts.Secrets.Names) > 0 || len(opts.Secrets.Inject) > 0) {
				var bundle []byte
				broker, rec.BrokerEnv, bundle, err = opts.Secrets.broker(name, rules, s, layers)
				if err != nil {
					return 0, err
				}
				rec.Secrets, rec.SecretRefs, rec.Inject = opts.Secrets.Names, opts.Secrets.Refs, opts.Secrets.Inject
				spec.Env = mergeEnv(spec.Env, rec.BrokerEnv)
				spec.Files = append(spec.Files, sandbox.File{Path: CABundle, Data: bundle, Mode: 0o644})
			}
			px, err = proxy.New(proxy.Config{Allow: rules, Filter: opts.Rules, Broker: broker, MaxConns: fdbudget.Process().ProxyPerBench, Shared: proxyShare(), Log: func(d proxy.Decision) {
				if opts.Event != nil {
					ev := "net.refused"
					switch {
					case d.Cut:
						ev = "net.cut"
					case d.Allowed:
						ev = "net.allowed"
					}
					if d.Secret != "" {
						// The secret's name and the destination, never its value.
						ev, d.Reason = "secret.refused", "secret "+d.Secret+": "+d.Reason
					}
					opts.Event(name, ev, net.JoinHostPort(d.Host, strconv.Itoa(d.Port)), d.Reason)
				}
				// A proposal reads the refusals from this log: one it misses is reported at the end.
				if err := enc.Encode(d); err != nil {
					logMu.Lock()
					logErr = cmp.Or(logErr, err)
					logMu.Unlock()
				}
			}})
			if err != nil {
				return 0, err
			}
			spec.Env = append(spec.Env, proxyEnv()...)
		}
	} else if err := within(opts.Rules, nil); err != nil {
		return 0, err
	}
	if opts.Secrets != nil && len(opts.Secrets.Names) > 0 && px == nil {
		return 0, hint.Wrap(fmt.Errorf("bench %s: secrets need a network: this Bench has none", name),
			"launch with the recipe's network (not --net none), whose [network] allows the secrets' hosts")
	}
	live.px = px
	nets.Store(id, live)
	defer nets.Delete(id)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if opts.Propose != nil {
		// The socket is in a tmpfs of its own, attached nowhere, and bound through /proc/self/fd: no
		// path names it, so neither /proc/net/unix nor the Bench's mountinfo, which any user reads,
		// shows the Bench's id (its state directory) or the store's place (docs/bench.md).
		pd, err := proposeDir()
		if err != nil {
			return 0, err
		}
		// Named at random, not by the Bench's id: the name is what the Bench's mountinfo shows.
		sockName := randomID() + ".sock"
		ln, err := listenPropose(fmt.Sprintf("/proc/self/fd/%d/%s", pd.Fd(), sockName))
		if err != nil {
			return 0, err
		}
		defer ln.Close() // and unlinked: the directory is the process's
		sock, err := openPath(pd, sockName)
		if err != nil {
			return 0, err
		}
		defer sock.Close()
		// The socket is root's (0600): its owner's ids make it the Bench root's to connect to.
		spec.Binds = append(spec.Binds, sandbox.Bind{SourceFD: sock, Target: ProposeSocket, IDs: sandbox.IDsOwner})
		go serveProposals(ctx, ln, func(ctx context.Context) (string, error) { return opts.Propose(ctx, id) })
	}
	var p *sandbox.Process
	if opts.Init != nil {
		p, err = opts.Init.Start(spec)
	} else {
		p, err = sandbox.Start(ctx, spec, opts.Stdio)
	}
	if err != nil {
		return 0, err
	}
	if opts.Init != nil || opts.Disk != nil {
		// A pre-started init lives by the context it was started with (a warm pool's is the
		// supervisor's): this Bench's context ends it too, as it does one started here. And a
		// Bench that may be frozen is thawed as it is killed (sandbox.Kill): a frozen one would not
		// die of the SIGKILL alone (cgroup v1).
		stop := context.AfterFunc(ctx, func() { sandbox.Kill(p.Pid) })
		defer stop()
	}
	rec.Pid = p.Pid
	done := make(chan error, 1)
	if px != nil {
		go func() { done <- px.Serve(ctx, p.Listeners[0]) }()
	} else {
		close(done)
	}
	if err := writeRecord(dir, rec); err != nil {
		// A Bench without its record could be neither found nor stopped (ls, exec, propose, rm): it
		// does not run. Its init dies, and the pid namespace with it.
		sandbox.Kill(p.Pid)
		p.Wait()
		cancel()
		<-done
		return 0, fmt.Errorf("bench %s: %w", name, err)
	}
	keep = opts.Keep
	if opts.Started != nil {
		opts.Started(rec)
	}
	if opts.Event != nil {
		opts.Event(name, "bench.start", "", "")
	}
	code, err := p.Wait()
	if opts.Ended != nil {
		opts.Ended(code, p.OOMKilled())
	}
	if opts.Event != nil {
		detail := "exit " + strconv.Itoa(code)
		if p.OOMKilled() {
			detail += ", out of memory"
		}
		opts.Event(name, "bench.end", "", detail)
	}
	cancel()
	<-done
	if opts.Disk != nil {
		// Paused when its processes ended (its runner stops while it is paused: the supervisor's
		// end): its record and upper stay, for a resume that launches it again over the upper.
		if cur, err := updateRecord(dir, func(r *Record) error {
			if r.Paused == nil {
				return errNotPausedNow
			}
			r.Pid = 0
			return nil
		}); err == nil && cur.Paused != nil {
			keep = true
			// Its layers, which this runner's temporary roots held, are a root of their own while
			// it stays paused (RootName; removed with it).
			if len(layers) > 0 {
				_ = s.AddRoot(context.Background(), RootName(id), layers[len(layers)-1])
			}
		}
	}
	if keep && rec.Keep {
		rec.Exit = &code
		rec.Pid = 0
		if werr := writeRecord(dir, rec); werr != nil && err == nil {
			err = fmt.Errorf("bench %s: %w", name, werr)
		}
	}
	logMu.Lock()
	defer logMu.Unlock()
	if cerr := netLog.Close(); cerr != nil { // the deferred Close is then a no-op
		logErr = cmp.Or(logErr, cerr)
	}
	if logErr != nil && err == nil {
		err = fmt.Errorf("bench %s: write network log: %w", name, logErr)
	}
	return code, err
}

// proposeDir is the process's private directory of propose sockets (sandbox.PrivateDir), one for
// every Bench it runs: a detached mount's last close unmounts it, which waits for an RCU grace period
// (IPIs to every CPU), and one per Bench was on each launch's path. Made again after a failure.
func proposeDir() (*os.File, error) {
	proposeDirs.Lock()
	defer proposeDirs.Unlock()
	if proposeDirs.f == nil {
		f, err := sandbox.PrivateDir()
		if err != nil {
			return nil, err
		}
		proposeDirs.f = f
	}
	return proposeDirs.f, nil
}

var proposeDirs struct {
	sync.Mutex
	f *os.File
}

// proxyShare is the process's share of client connections to Benches' proxies, over all Benches.
var proxyShare = sync.OnceValue(func() *proxy.Share { return proxy.NewShare(fdbudget.Process().ProxyConns) })

// Rules is the allowlist of a recipe's network profile: its allow entries,
// and with profile "debian" the hosts of its mirror and sources.
func Rules(r *recipe.Recipe) ([]proxy.Rule, error) {
	var rules []proxy.Rule
	for _, h := range r.Network.Allow {
		rules = append(rules, proxy.Rule{Host: h.Name, Port: h.Port})
	}
	if r.Network.Profile == "debian" {
		urls := []string{r.Apt.Mirror}
		for _, src := range r.Apt.Sources {
			urls = append(urls, src.URL)
		}
		for _, u := range urls {
			pu, err := url.Parse(u)
			if err != nil {
				return nil, err
			}
			port := 0
			if ps := pu.Port(); ps != "" {
				port, _ = strconv.Atoi(ps)
			}
			rules = append(rules, proxy.Rule{Host: pu.Hostname(), Port: port})
		}
	}
	return rules, nil
}

// benchEnv is a Bench's environment: nothing from the host but what asked.
func benchEnv(opts Options) []string {
	env := []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=/root", "LANG=C.UTF-8", "TZ=UTC",
		// Python would write .pyc files into the upper; they are debris.
		"PYTHONDONTWRITEBYTECODE=1",
	}
	return append(env, opts.Env...)
}

// proxyEnv points the usual clients at the Bench's proxy: curl, wget, apt and
// pip read these. There is no DNS inside: the proxy resolves names.
func proxyEnv() []string {
	u := "http://" + proxyAddr
	return []string{"http_proxy=" + u, "https_proxy=" + u, "HTTP_PROXY=" + u, "HTTPS_PROXY=" + u,
		"no_proxy=localhost,127.0.0.1", "NO_PROXY=localhost,127.0.0.1"}
}

// NewID is a new Bench's id: for a caller that branches its upper before it launches it (Options.ID).
func NewID() string { return randomID() }

func randomID() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func writeRecord(dir string, rec *Record) error {
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return fmt.Errorf("write bench record: %w", err)
	}
	if !rec.Keep {
		// The record of a Bench that is not kept describes a live process and a tmpfs upper: a crash
		// ends both, and Sweep removes the directory. Durability would buy nothing, at an fsync of
		// the store's disk per launch.
		return atomicfile.Replace(filepath.Join(dir, "bench.json"), b, 0o600)
	}
	return atomicfile.WriteFile(filepath.Join(dir, "bench.json"), b, 0o600)
}

// MaxNetworkLog bounds a Bench's network log: an agent makes it grow with every refused request,
// and it is on the store's filesystem. Entries past it are dropped whole.
const MaxNetworkLog = 64 << 20

// capped writes to w until left bytes are used, then drops writes whole (a log's lines stay whole).
type capped struct {
	w    io.Writer
	left int64
}

func (c *capped) Write(p []byte) (int, error) {
	if int64(len(p)) > c.left {
		c.left = 0
		return len(p), nil
	}
	c.left -= int64(len(p))
	return c.w.Write(p)
}

// ErrNameTaken is a Bench name in use by a running or kept Bench (anyone's: names are one namespace).
var ErrNameTaken = errors.New("the Bench name is taken")

// reserve makes the Bench's directory dir under benches, named name, and returns its lock, held:
// under a lock of all names, so that two launches with one name cannot both get it. The name is
// written beside the lock at once, so a Bench still starting (no record yet) holds its name too.
func reserve(benches, dir, name string) (*os.File, error) {
	if err := os.MkdirAll(benches, 0o700); err != nil {
		return nil, err
	}
	names, err := os.OpenFile(filepath.Join(benches, ".names.lock"), os.O_CREATE|os.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, err
	}
	defer names.Close() // and with it the names' lock
	if err := unix.Flock(int(names.Fd()), unix.LOCK_EX); err != nil {
		return nil, err
	}
	if _, err := FindIn(benches, name); err == nil {
		return nil, hint.Wrap(fmt.Errorf("%w: %s", ErrNameTaken, name), "pick another --name; `shed bench ls` lists yours")
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, err
	}
	lk, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err == nil {
		if err = unix.Flock(int(lk.Fd()), unix.LOCK_EX|unix.LOCK_NB); err == nil {
			err = os.WriteFile(filepath.Join(dir, "name"), []byte(name), 0o600)
		}
		if err != nil {
			lk.Close()
		}
	}
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("reserve bench %s: %w", name, err)
	}
	return lk, nil
}

// reclaim takes the lock of the paused Bench in dir, whose runner is gone, to launch it again.
func reclaim(dir string) (*os.File, *Record, error) {
	lk, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("resume bench: %w", err)
	}
	if err := unix.Flock(int(lk.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		lk.Close()
		return nil, nil, fmt.Errorf("resume bench %s: %w", filepath.Base(dir), ErrBusy)
	}
	rec := readEntry(filepath.Dir(dir), filepath.Base(dir))
	if rec == nil || rec.Paused == nil {
		lk.Close()
		return nil, nil, fmt.Errorf("resume bench %s: %w", filepath.Base(dir), ErrNotPaused)
	}
	return lk, rec, nil
}

// errNotPausedNow ends an updateRecord that finds the Bench not paused.
var errNotPausedNow = errors.New("not paused")

// waitStopped waits (at most limit) until the runner of the Bench in dir has let go of its lock: the
// moment its Run returns, not the next tick of a poll.
func waitStopped(dir string, limit time.Duration) {
	f, err := os.Open(filepath.Join(dir, "lock"))
	if err != nil {
		return
	}
	got := make(chan struct{})
	go func() {
		// The goroutine owns f: past the limit it is left to end when the runner does.
		defer f.Close()
		unix.Flock(int(f.Fd()), unix.LOCK_SH)
		close(got)
	}()
	select {
	case <-got:
	case <-time.After(limit):
	}
}

// running reports whether the shed process running the Bench in dir is alive
// (it holds dir/lock).
func running(dir string) bool {
	f, err := os.Open(filepath.Join(dir, "lock"))
	if err != nil {
		return false
	}
	defer f.Close()
	return unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil
}

// List returns the Benches of a store, running and kept, by start time.
func List(s *store.Store) ([]*Record, error) { return ListIn(Dir(s)) }

// ListIn returns the Benches whose state is in benches (a store's Dir), running and kept: for a
// reader that need not open the store.
func ListIn(benches string) ([]*Record, error) {
	ents, err := os.ReadDir(benches)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	var out []*Record
	for _, e := range ents {
		if !e.IsDir() {
			continue // .names.lock
		}
		if rec := readEntry(benches, e.Name()); rec != nil {
			out = append(out, rec)
		}
	}
	slices.SortFunc(out, func(a, b *Record) int { return a.Started.Compare(b.Started) })
	return out, nil
}

// readEntry is the Bench whose state is benches/id, if it is running or kept; nil otherwise.
func readEntry(benches, id string) *Record {
	dir := filepath.Join(benches, id)
	b, err := os.ReadFile(filepath.Join(dir, "bench.json"))
	if err != nil {
		// Starting (it holds its name already), or debris for Sweep.
		if name, err := os.ReadFile(filepath.Join(dir, "name")); err == nil && running(dir) {
			return &Record{ID: id, Name: string(name), Running: true}
		}
		return nil
	}
	var rec Record
	if json.Unmarshal(b, &rec) != nil {
		return nil
	}
	rec.Running = running(dir)
	if !rec.Running && !rec.Keep && rec.Paused == nil {
		return nil // a dead Bench's leftovers
	}
	return &rec
}

// idRE is a Bench's id (randomID).
var idRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[0-9a-f]{16}$`) })

func find(s *store.Store, nameOrID string) (*Record, error) { return FindIn(Dir(s), nameOrID) }

// FindIn returns the Bench named nameOrID whose state is in benches.
func FindIn(benches, nameOrID string) (*Record, error) {
	// By id, the Bench's own state alone is read: every operation on a Bench finds it (an E2B
	// sandbox's, by id, several times a command), and reading every Bench's record each time made
	// a command's cost grow with the number of Benches. Ids are random: a name that is another
	// Bench's id could only be guessed, and the id wins.
	if idRE().MatchString(nameOrID) {
		if rec := readEntry(benches, nameOrID); rec != nil && rec.ID == nameOrID {
			return rec, nil
		}
	}
	recs, err := ListIn(benches)
	if err != nil {
		return nil, err
	}
	for _, r := range recs {
		if r.Name == nameOrID || r.ID == nameOrID {
			return r, nil
		}
	}
	return nil, fmt.Errorf("%w: %s", ErrNoBench, nameOrID)
}

// Find returns the Bench named nameOrID.
func Find(s *store.Store, nameOrID string) (*Record, error) { return find(s, nameOrID) }

// Exec runs a command in a running Bench, with the environment the Bench's command got plus req.Env.
func Exec(ctx context.Context, s *store.Store, nameOrID string, req sandbox.ExecRequest, stdio sandbox.Stdio) (int, error) {
	rec, err := find(s, nameOrID)
	if err != nil {
		return 0, err
	}
	return ExecRecord(ctx, s, rec, req, stdio)
}

// ExecRecord is Exec in the Bench of rec, a record the caller has just read (Find): not read again.
func ExecRecord(ctx context.Context, s *store.Store, rec *Record, req sandbox.ExecRequest, stdio sandbox.Stdio) (int, error) {
	if rec.Paused != nil {
		return 0, paused(rec)
	}
	if !rec.Running {
		return 0, fmt.Errorf("bench %s is not running (it exited %s)", rec.Name, exitString(rec.Exit))
	}
	// The Bench's environment, as its command got it, then the request's own variables (TERM).
	env := mergeEnv(benchEnv(Options{}), rec.Env)
	if rec.Net == "recipe" {
		env = append(env, proxyEnv()...)
	}
	env = mergeEnv(env, rec.BrokerEnv)
	if a, ok := rec.accountOfUID(req.UID); ok {
		env = mergeEnv(env, accountEnv(a))
	}
	req.Env = mergeEnv(env, req.Env)
	return sandbox.Exec(ctx, controlAddr(s, rec.ID), req, stdio)
}

// openPath opens name in dir as an O_PATH descriptor, refusing a symlink.
func openPath(dir *os.File, name string) (*os.File, error) {
	fd, err := unix.Openat(int(dir.Fd()), name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", name, err)
	}
	return os.NewFile(uintptr(fd), name), nil
}

// controlAddr is where a Bench's control socket is: in its state directory, root's; without root an
// abstract socket of shed's network namespace, since the user's uid, which owns the store, is every
// Bench's root too: a Bench granted a directory that holds a store (another of the user's) could
// reach that store's sockets by path, but no Bench reaches an abstract socket of the host's network.
// Any user reads abstract names (/proc/net/unix): the name is a hash of the id, not the id.
func controlAddr(s *store.Store, id string) string {
	if userns.Active() {
		uid, _ := userns.Owner()
		return "@" + AbstractControl(uid, id)
	}
	return filepath.Join(Dir(s), id, "control.sock")
}

// AbstractControl is the abstract socket name (without its "@") of the control socket of the Bench id
// of a store of uid's, without root.
func AbstractControl(uid uint32, id string) string {
	sum := sha256.Sum256([]byte("toolshed bench control\x00" + id))
	return fmt.Sprintf("toolshed-%d-%x", uid, sum[:12])
}

// mergeEnv is base with extra's variables, each replacing one of the same name.
func mergeEnv(base, extra []string) []string {
	out := slices.Clone(base)
	for _, e := range extra {
		name, _, _ := strings.Cut(e, "=")
		if i := slices.IndexFunc(out, func(b string) bool { return strings.HasPrefix(b, name+"=") }); i >= 0 {
			out[i] = e
		} else {
			out = append(out, e)
		}
	}
	return out
}

func exitString(code *int) string {
	if code == nil {
		return "unknown"
	}
	return strconv.Itoa(*code)
}

// Logs copies a Bench's network log (every destination its proxy allowed or
// refused, one JSON object a line) to w.
func Logs(s *store.Store, nameOrID string, w io.Writer) error {
	rec, err := find(s, nameOrID)
	if err != nil {
		return err
	}
	f, err := os.Open(filepath.Join(Dir(s), rec.ID, "network.log"))
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(w, f)
	return err
}

// Remove stops a running Bench (its runner's process is signalled; the
// sandbox dies with it) or deletes a kept one.
func Remove(s *store.Store, nameOrID string) error {
	rec, err := find(s, nameOrID)
	if err != nil {
		return err
	}
	dir := filepath.Join(Dir(s), rec.ID)
	if rec.Paused != nil {
		// Not paused any more: its runner, seeing it end, removes it rather than keep it.
		if _, err := updateRecord(dir, func(r *Record) error { r.Paused = nil; return nil }); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	if rec.Running && rec.Pid > 0 {
		// Kill the sandbox's init: the pid namespace takes everything with
		// it, and the runner returns and cleans up.
		kill(rec.Pid)
		waitStopped(dir, 2*time.Second)
	}
	if rec.Disk {
		f, err := Uppers(s)
		if err != nil {
			return err
		}
		if err := f.Remove(UpperName(rec.ID)); err != nil {
			return err
		}
		if err := s.RemoveRoot(RootName(rec.ID)); err != nil && !errors.Is(err, store.ErrRootNotExist) {
			return err
		}
	}
	return os.RemoveAll(dir)
}

// Sweep removes what dead Benches left: the state of Benches whose runner is
// gone (unless kept) and the sandbox's leftovers (cgroups). Every shed command
// that opens a store calls it, so a SIGKILLed shed leaves nothing for long.
func Sweep(s *store.Store) (int, error) {
	n := 0
	ents, err := os.ReadDir(Dir(s))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return 0, err
	}
	for _, e := range ents {
		if !e.IsDir() {
			continue // .names.lock
		}
		dir := filepath.Join(Dir(s), e.Name())
		if running(dir) {
			continue
		}
		if b, err := os.ReadFile(filepath.Join(dir, "bench.json")); err == nil {
			var rec Record
			if json.Unmarshal(b, &rec) == nil && (rec.Keep || rec.Paused != nil) {
				continue
			}
		} else if fi, err := os.Stat(dir); err == nil && time.Since(fi.ModTime()) < 10*time.Second {
			continue // being created: no record yet
		}
		if os.RemoveAll(dir) == nil {
			n++
		}
	}
	// The uppers of Benches that have no state any more (their runner was killed, or removed the
	// state and not the upper), if they are mounted.
	if f, err := upper.OpenMounted(s.Root()); err != nil {
		return n, err
	} else if f != nil {
		if m, err := f.SweepParts("benches", time.Minute); err == nil {
			n += m
		}
		ups, err := f.List("benches")
		if err != nil {
			return n, err
		}
		for _, id := range ups {
			// One branched for a Bench about to launch (a fork's child) has no state yet: its
			// work directory, emptied as it was made, says how new it is.
			if fi, err := os.Stat(filepath.Join(f.Dir(UpperName(id)), "work")); err == nil && time.Since(fi.ModTime()) < time.Minute {
				continue
			}
			if _, err := os.Lstat(filepath.Join(Dir(s), id)); errors.Is(err, os.ErrNotExist) {
				if f.Remove(UpperName(id)) == nil {
					n++
				}
			}
		}
	}
	m, err := sandbox.Sweep()
	return n + m, err
}
