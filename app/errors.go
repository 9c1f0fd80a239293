package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"toolshed.dev/shed/bench"
	"toolshed.dev/shed/builder"
	"toolshed.dev/shed/cache"
	"toolshed.dev/shed/internal/hint"
	"toolshed.dev/shed/internal/nospace"
	"toolshed.dev/shed/proposal"
	"toolshed.dev/shed/recipe"
	"toolshed.dev/shed/records"
	"toolshed.dev/shed/sandbox"
	"toolshed.dev/shed/store"
	"toolshed.dev/shed/trust"
	"toolshed.dev/shed/why"
)

// Code says what kind of failure an Error is, the same on the wire as in process (docs/api.md).
type Code string

// The error codes.
const (
	CodeFailed           Code = "failed"            // the operation failed (I/O, store, build, network)
	CodeUsage            Code = "usage"             // a request field is wrong (a bad grant, size, version)
	CodeInvalid          Code = "invalid"           // a recipe or other input file breaks the rules
	CodeProblems         Code = "problems"          // verification found problems
	CodeDenied           Code = "denied"            // the caller's role does not allow it
	CodeNotFound         Code = "not_found"         // no such record, Bench, proposal, path or root
	CodeConflict         Code = "conflict"          // a record changed, a proposal was used
	CodeBadRequest       Code = "bad_request"       // a request that does not decode (unknown field, wrong type)
	CodeUnknownOperation Code = "unknown_operation" // no such operation
	CodeBusy             Code = "busy"              // the supervisor has too many requests in flight
	CodeNoCommand        Code = "no_command"        // the command to run is not in the Bench (the CLI exits 127, as a shell does)
	CodeInternal         Code = "internal"          // a bug in shed (the supervisor logged it)
)

// Error is an operation's failure: what kind, what happened, and what to do.
type Error struct {
	Code Code
	Err  error
	Hint string
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

func fail(code Code, err error, hint string) error { return &Error{Code: code, Err: err, Hint: hint} }

func usage(hint, format string, args ...any) error {
	return &Error{Code: CodeUsage, Err: fmt.Errorf(format, args...), Hint: hint}
}

// Classify returns err as an *Error: its own code and hint if it is one, else the code and hint that
// fit the package error it wraps. The hint is written here, once, for the CLI and every API client.
func Classify(err error) *Error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		if e.Hint == "" {
			e.Hint = hintFor(err)
		}
		return e
	}
	var re *recipe.Error
	if errors.As(err, &re) {
		return &Error{Code: CodeInvalid, Err: err, Hint: re.Hint}
	}
	var se *sandbox.SetupError
	if errors.As(err, &se) && se.Op == "exec" && errors.Is(se.Err, unix.ENOENT) {
		return &Error{Code: CodeNoCommand, Err: err, Hint: "the Workshop does not have it: add its package to the recipe's [apt] packages " +
			"(`apt-file search bin/NAME` finds which), or install it in a Bench and propose; or name it by its absolute path"}
	}
	code := CodeFailed
	switch {
	case errors.Is(err, ErrDenied):
		code = CodeDenied
	case errors.Is(err, records.ErrNoRecord), errors.Is(err, bench.ErrNoBench), errors.Is(err, proposal.ErrNoProposal),
		errors.Is(err, store.ErrNotExist), errors.Is(err, store.ErrRootNotExist):
		code = CodeNotFound
	case errors.Is(err, records.ErrConflict), errors.Is(err, proposal.ErrUsed), errors.Is(err, proposal.ErrChanged),
		errors.Is(err, bench.ErrPaused), errors.Is(err, bench.ErrNotPaused), errors.Is(err, bench.ErrNoRunner), errors.Is(err, bench.ErrBusy):
		code = CodeConflict
	case errors.Is(err, bench.ErrGrant), errors.Is(err, store.ErrBadName), errors.Is(err, bench.ErrNetworkRules), errors.Is(err, bench.ErrNoAccount),
		errors.Is(err, bench.ErrNotBranchable):
		code = CodeUsage
	}
	return &Error{Code: code, Err: err, Hint: hintFor(err)}
}

func isDNSError(err error) bool {
	var de *net.DNSError
	return errors.As(err, &de)
}

// hintFor suggests what to do about errors that come from packages, which know what went wrong but
// not what the caller asked.
func hintFor(err error) string {
	if h := resourceHint(err); h != "" {
		return h
	}
	if h := hint.Of(err); h != "" { // the package that made the error knew what to do
		return h
	}
	var me *bench.MissingError
	if errors.As(err, &me) {
		return fmt.Sprintf("a grant mounts a directory that is there: create it (`mkdir -p %s`), or check the path", shellWord(me.Path))
	}
	var be *builder.BuildError
	if errors.As(err, &be) {
		return "the build log says more: `shed log " + be.Path.String() + "` (" + be.Log + ")"
	}
	switch {
	case errors.Is(err, bench.ErrGrantRoot):
		return "give the directory to the user the Bench works for (chown -R USER DIR), or grant it :ro"
	case errors.Is(err, bench.ErrGrantStore):
		return "grant a directory that holds no store of shed's, such as a project directory (keep stores out of granted directories)"
	case errors.Is(err, bench.ErrGrantNotOwn):
		return "grant it :ro, or copy what the Bench should change into a directory of yours; as root (or through the supervisor) a Bench may act as another owner"
	case errors.Is(err, bench.ErrGrantGroup):
		return "give the directory to a group of its owner's (chgrp GROUP DIR; `id OWNER` lists them), and to a user of this host"
	case errors.Is(err, bench.ErrGrantSymlink):
		return "grants follow no symlink: name the directory it points to, inside the recipe's [[grant]] bounds"
	case errors.Is(err, bench.ErrGrant):
		return "a launch may narrow the recipe's [[grant]] bounds (a sub-path, ro instead of rw), never widen them"
	case errors.Is(err, bench.ErrNoBench):
		return "`shed bench ls` lists your Benches"
	case errors.Is(err, proposal.ErrUnfinished):
		return "finish or undo it in the Bench (`dpkg --configure -a`, `apt-get -f install`, or remove the package), then propose again"
	case errors.Is(err, proposal.ErrNoProposal):
		return "`shed bench propose BENCH` prints a proposal's id"
	case errors.Is(err, proposal.ErrUsed), errors.Is(err, proposal.ErrChanged), errors.Is(err, records.ErrConflict):
		return "`shed bench propose` makes a fresh proposal against the current record"
	case errors.Is(err, records.ErrNoRecord):
		return "`shed workshop ls` lists the records; `shed workshop add FILE` makes one"
	case errors.Is(err, why.ErrNoSuchFile):
		return "paths are as a Bench sees them, e.g. /usr/bin/jq"
	case errors.Is(err, builder.ErrGone):
		return "the mirror (or index) no longer serves that pinned version: a store that has it still realizes; " +
			"otherwise pin a version it serves (`shed lock --update PKG`), or for Debian packages use a snapshot seed"
	case errors.Is(err, builder.ErrHashMismatch):
		return "the bytes served are not the ones the lock pinned: nothing was stored; check the mirror (or a proxy in between) and run again"
	case errors.Is(err, builder.ErrMissing), errors.Is(err, builder.ErrOffline):
		return "run once with network (without --offline), or import the paths from a cache"
	case errors.Is(err, builder.ErrNoPip):
		return "add python3 and python3-pip to [apt] packages: pip packages are installed by the Workshop's own pip"
	case errors.Is(err, builder.ErrPipResolve):
		return "check the names and pins against the index (its /simple/NAME/ page lists every file); shed installs wheels only: " +
			"a package that ships only an sdist must be built into a wheel (pip wheel NAME) and served from your index, or taken from Debian as python3-NAME"
	case errors.Is(err, builder.ErrResolve):
		return "check the package names and pins against the mirror (apt-cache policy NAME on a Debian machine)"
	case errors.Is(err, cache.ErrUnauthorized):
		return "set SHED_REGISTRY_USERNAME and SHED_REGISTRY_PASSWORD (or log in: `docker login HOST` or `podman login HOST`; shed reads their credentials files)"
	case errors.Is(err, trust.ErrNoKey):
		return "run `shed init`: it makes the store's signing key (the store was made before shed signed what it builds)"
	case errors.Is(err, trust.ErrUntrusted):
		return "trust the signer's public key if you mean to (`shed key trust NAME:BASE64`); without it the path is built here, or refused offline"
	case errors.Is(err, trust.ErrUnsigned), errors.Is(err, trust.ErrBadSignature), errors.Is(err, trust.ErrMismatch), errors.Is(err, trust.ErrReplay):
		return "nothing was registered; the cache served something the policy refuses (docs/trust.md): build locally, or check the cache"
	case errors.Is(err, sandbox.ErrNoLimits):
		return "shed without root cannot enforce --memory or --pids (the host's cgroups are root's): run without them, or through the supervisor (`shed daemon`, as root), which enforces them"
	case errors.Is(err, store.ErrNotInitialized):
		return "run `shed init` first, or point --root / SHED_ROOT at an initialized store"
	case errors.Is(err, store.ErrUnsafe):
		return "the store must be owned by you and writable by nobody else: check the owner and run `chmod go-w` on it"
	case errors.Is(err, os.ErrPermission):
		return "if the store is another user's (root's is /var/lib/toolshed), use your own (shed without root defaults to ~/.local/share/toolshed) or run shed as its owner"
	case errors.Is(err, store.ErrBadPath):
		return "a store path looks like /var/lib/toolshed/store/<32-char hash>-<name>; `shed store ls` lists them"
	case errors.Is(err, store.ErrBadName):
		return "pass --name with letters, digits and +-._?="
	case errors.Is(err, store.ErrNotExist):
		return "`shed store ls` lists the valid paths"
	case errors.Is(err, store.ErrRootNotExist):
		return "`shed root ls` lists the roots"
	case errors.Is(err, unix.ECONNREFUSED):
		return "nothing answers at that address: check the recipe's [apt] mirror (or [pip] index) and that the server is up; " +
			"paths already in the store realize offline (--offline)"
	case isDNSError(err):
		return "the name does not resolve: check the recipe's [apt] mirror (or [pip] index) and this host's DNS (/etc/resolv.conf)"
	case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded):
		return "the server did not answer in time: check the network to it and run again (what was fetched is kept)"
	case errors.Is(err, context.Canceled):
		return "interrupted: nothing half-written was kept; run the command again to finish"
	}
	return ""
}

// shellWord is s as one word of a shell command line that a hint quotes: as is when that is safe.
func shellWord(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._-+=:,@%") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// nofile is this process's limit on open files.
func nofile() uint64 {
	var l unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &l) != nil {
		return 0
	}
	return l.Cur
}

// resourceHint is what to do about a resource that ran out (a full disk, a quota, open files, host
// ids), whatever operation ran into it; "" for any other error.
func resourceHint(err error) string {
	var ne *nospace.Error
	switch {
	case errors.As(err, &ne):
		what := "free space there"
		if ne.Quota {
			what = "free some of your quota there (`quota -s` shows it)"
		}
		return what + ": `shed gc` deletes the store paths no root needs (`shed gc --dry-run` lists them), " +
			"`shed bench ls` shows kept Benches to remove; or put the store on a larger filesystem (--root, SHED_ROOT). " +
			"Nothing half-written was kept: run the command again once there is room"
	case errors.Is(err, sandbox.ErrNoIDs):
		return "every range of host ids is held by a running Bench, build or warm init: `shed bench ls` lists the Benches, " +
			"`shed bench rm` ends those you are done with (a supervisor's --warm inits hold some too); or wait for some to end"
	case errors.Is(err, unix.EMFILE):
		return fmt.Sprintf("this process may have at most %d open files (RLIMIT_NOFILE): raise it (`ulimit -n 65536` in the shell that starts shed, "+
			"LimitNOFILE= in the supervisor's systemd unit), then run the command again", nofile())
	case errors.Is(err, unix.ENFILE):
		return "the whole system is out of open files (fs.file-max): `sysctl fs.file-nr` shows them; end what holds many, or raise fs.file-max"
	}
	return ""
}
