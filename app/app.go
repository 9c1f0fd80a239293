// Package app is Toolshed's application layer: every operation shed offers (realize, lock, Benches,
// proposals, records, the store, keys, caches), as a typed request and a typed result, for a Caller.
//
// It prints nothing and parses no command line: cmd/shed turns flags into requests and results into
// text, and the supervisor's socket (package api) carries the same requests. Who may ask what is not
// decided here but by the Policy the Service is given (package policy), on the decoded request,
// before the operation runs: one table for the CLI as root and for every caller of the daemon.
package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"runtime/debug"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"toolshed.dev/shed/audit"
	"toolshed.dev/shed/builder"
	"toolshed.dev/shed/internal/nospace"
	"toolshed.dev/shed/metrics"
	"toolshed.dev/shed/records"
	"toolshed.dev/shed/sandbox"
	"toolshed.dev/shed/store"
	"toolshed.dev/shed/trust"
)

// Role is what a caller is to the supervisor.
type Role string

// The roles. The kernel says who a caller is (SO_PEERCRED); the role follows from that alone.
const (
	// Operator: root, a member of the supervisor's operators group, or whoever works on a store
	// directly (the CLI without a daemon owns the store it opens).
	Operator Role = "operator"
	// User: any other local user. Runs the Workshop records an operator allowed them, and acts on
	// the Benches they launched.
	User Role = "user"
	// Agent: a process inside a Bench (its host uid is one of the sandboxes'). It may propose from its
	// own Bench, nothing else.
	Agent Role = "agent"
)

// Caller is who asks for an operation.
type Caller struct {
	UID, GID uint32
	PID      int32    // the process that asked, when known (for the daemon's log)
	User     string   // name, or the uid in decimal
	Groups   []string // group names
	Role     Role
	// Dir is the caller's working directory (absolute): a relative path in a request is relative to
	// it. Through the daemon it is what the client says, so it is used only for callers who may
	// name any path anyway (operators).
	Dir string
	// Bench is, for an agent, the Bench it is in.
	Bench string
	// Via says how the caller reached the supervisor when it was not its socket: "e2b key ID" (an API
	// key's public id, never the key).
	Via string
}

// IO is what an operation may reach of the caller besides its request and result: the caller's
// stdio (a Bench's command's, and the terminal raw mode and size come from Stdin), a stream of
// notices, and build progress.
type IO struct {
	Stdin          *os.File
	Stdout, Stderr io.Writer
	// Resize receives when the caller's terminal was resized (through the daemon, the client tells).
	Resize <-chan struct{}
	// Winsize gives a command's terminal its sizes when the caller's stdin is not a terminal (the
	// E2B API's pty: its client tells the size); the first is BenchExecRequest's Rows and Cols.
	Winsize <-chan sandbox.Winsize
	// Signal delivers signals for a command (bench.exec) to its process.
	Signal <-chan syscall.Signal
	// Watch receives a bench.watch_dir's events.
	Watch *WatchIO
	// Progress draws build progress; nil draws none.
	Progress builder.ProgressReporter
	// Notice receives what the caller should know as it happens (what is being locked, warnings).
	Notice func(Notice)
	// BuildOutput, if set, gets the builds' own output (--verbose).
	BuildOutput io.Writer
	// Status, if set, shows the long step that runs, between its start and end notices (on a
	// terminal, a line redrawn in place: not with BuildOutput on the same terminal).
	Status builder.Status
}

// Notice is one thing an operation tells its caller while it runs.
type Notice struct {
	Kind    string `json:"kind"` // "info" or "warning"
	Message string `json:"message"`
}

// Call is one operation's caller and IO.
type Call struct {
	Caller *Caller
	IO     *IO

	// wrote says that the operation wrote what outlasts it beyond a Bench (a lock, store paths):
	// its audit entry then waits for its fsync (noted).
	wrote atomic.Bool
}

func (c *Call) notice(kind, format string, args ...any) {
	if c.IO != nil && c.IO.Notice != nil {
		c.IO.Notice(Notice{Kind: kind, Message: fmt.Sprintf(format, args...)})
	}
}

func (c *Call) stdin() *os.File {
	if c.IO != nil && c.IO.Stdin != nil {
		return c.IO.Stdin
	}
	return devNull()
}

// devNull is /dev/null, opened once, for calls with no stdin (an agent's proposal).
var devNull = sync.OnceValue(func() *os.File {
	f, err := os.Open(os.DevNull)
	if err != nil {
		panic(err) // no /dev/null: nothing of a sandbox would work either
	}
	return f
})

func (c *Call) stdout() io.Writer {
	if c.IO != nil && c.IO.Stdout != nil {
		return c.IO.Stdout
	}
	return io.Discard
}

func (c *Call) stderr() io.Writer {
	if c.IO != nil && c.IO.Stderr != nil {
		return c.IO.Stderr
	}
	return io.Discard
}

// path resolves a path the caller named against its working directory.
func (c *Call) path(p string) string {
	if p == "" || filepath.IsAbs(p) {
		return filepath.Clean(p)
	}
	if c.Caller != nil && c.Caller.Dir != "" {
		return filepath.Join(c.Caller.Dir, p)
	}
	if abs, err := filepath.Abs(p); err == nil {
		return abs
	}
	return p
}

// Policy decides whether caller may run op with req (decoded): nil, or an error wrapping ErrDenied.
type Policy func(s *Service, caller *Caller, op string, req any) error

// Service runs operations on the store at Root.
type Service struct {
	Root    string
	Version string // shed's version, signed into provenance
	Log     *slog.Logger
	Policy  Policy // required: without one every operation is refused
	// UserLimits bound the Benches users launch: a request above them is refused, an unset limit is
	// set to them. Zero: no bound.
	UserLimits sandbox.Limits
	// Audit, if set, hears every operation that is not a read (refusals too, at a bounded rate per
	// user) and every Bench event.
	Audit *audit.Log
	// Socket is the supervisor's socket, if this is one: a path an agent's face never shows.
	Socket   string
	refusals limiter
	// authority bounds how often a caller who is not an operator starts an operation that fails
	// closed (bench.propose): each writes two durable entries, its intent and its outcome, whether it
	// does anything or fails (an unchanged Bench's), which the refusals' limit does not count.
	authority rateLimiter

	sweepMu sync.Mutex
	swept   time.Time
	plans   planMemo // recipes and plans by the bytes they come from (plans.go)
	// Detached, set by the supervisor, runs the Benches that outlive their request (bench.create).
	Detached *Detached
	// Pool, if set, has inits ready for bench.create.
	Pool *Pool
	// Metrics, if set, holds the running Benches' histories of use (StartMetrics fills it); without it
	// bench.metrics reads a Bench when asked.
	Metrics *metrics.Sampler
	// UserBenches bounds the Benches (running or kept) each user may have at once. Zero: no bound.
	UserBenches int
	// UserKept bounds the kept Benches (their uppers are on the store's filesystem) each user may
	// have at once. Zero: no bound.
	UserKept int
	slots    slots // the launches holding a slot of their owner's (ReserveBench)
	// TaskStateTTL is how long a paused Bench and a snapshot live (0: DefaultTaskStateTTL).
	TaskStateTTL time.Duration
	// UserSnapshots bounds the snapshots each user may have at once. Zero: no bound.
	UserSnapshots int
	// UserDisk bounds the bytes each user's created Benches' uppers and snapshots hold together
	// (quota.go). Zero: no bound.
	UserDisk int64
	noQuotas sync.Once // the warning that UserDisk is not enforced, once
}

// Records returns the service's Workshop records.
func (s *Service) Records() *records.Workshops { return records.Open(s.Root) }

func (s *Service) log() *slog.Logger {
	if s.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Log
}

// openStore opens the store with its attestor, and sweeps what dead Benches left.
func (s *Service) openStore() (*store.Store, error) {
	st, err := store.Open(s.Root)
	if err != nil {
		return nil, err
	}
	// Every path this process registers is signed with the store's key, opened when the first one
	// is (most operations register none: an exec, a cache-hit launch). A store made before shed
	// signed its paths still opens, for reading; registering then fails with what to do.
	attest := sync.OnceValues(func() (*trust.Store, error) { return trust.Open(st, s.Version) })
	st.SetAttestor(func(info *store.PathInfo, facts any) ([]byte, error) {
		t, err := attest()
		if err != nil {
			return nil, err
		}
		return t.Attest(info, facts)
	})
	// What dead Benches left is swept by every operation that opens the store, at most once a second
	// in a long-lived supervisor: a SIGKILLed shed leaves nothing for long.
	s.sweepMu.Lock()
	if time.Since(s.swept) > time.Second {
		s.swept = time.Now()
		s.sweepMu.Unlock()
		sweep(st)
	} else {
		s.sweepMu.Unlock()
	}
	return st, nil
}

func (s *Service) openTrust(st *store.Store) (*trust.Store, error) { return trust.Open(st, s.Version) }

// Operation is one thing a caller may ask: its name on the wire, a fresh request to decode into, and
// how it runs.
type Operation struct {
	Name string
	// New returns a pointer to a zero request; NewResult one to a zero result (for docs and clients).
	New, NewResult func() any
	fn             any // the Service method that runs it
	run            func(ctx context.Context, s *Service, c *Call, req any) (any, error)
}

// Method is the name of the Service method that runs the operation (for docs/api.md); found when
// asked, not as every shed process registers its operations.
func (o *Operation) Method() string { return methodName(o.fn) }

var operations = map[string]*Operation{}

// op registers an operation: fn takes *Req and returns *Resp.
func op[Req, Resp any](name string, fn func(s *Service, ctx context.Context, c *Call, req *Req) (*Resp, error)) {
	if _, dup := operations[name]; dup {
		panic("app: operation " + name + " registered twice")
	}
	operations[name] = &Operation{
		Name:      name,
		New:       func() any { return new(Req) },
		NewResult: func() any { return new(Resp) },
		fn:        fn,
		run: func(ctx context.Context, s *Service, c *Call, req any) (any, error) {
			r, ok := req.(*Req)
			if !ok {
				return nil, &Error{Code: CodeBadRequest, Err: fmt.Errorf("operation %s: a request of type %T", name, req)}
			}
			return fn(s, ctx, c, r)
		},
	}
}

// methodName is the name of the method fn is, "Realize" for (*Service).Realize.
func methodName(fn any) string {
	full := runtime.FuncForPC(reflect.ValueOf(fn).Pointer()).Name()
	return full[strings.LastIndexByte(full, '.')+1:]
}

// Lookup returns the operation called name.
func Lookup(name string) (*Operation, bool) {
	o, ok := operations[name]
	return o, ok
}

// Operations lists every operation's name, sorted.
func Operations() []string {
	var out []string
	for n := range operations {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Do runs op for c: the policy decides first, on the decoded request; a panic in the operation is an
// internal error, not the end of the process (the daemon serves everyone). What it did, or refused,
// goes to the audit log, and an append that fails is Do's error: an operation that changes authority
// (FailsClosed) is not done at all unless its intent was written first; any other has its result
// replaced by the error after the fact.
//
// A caller through an agent's face (MCP, E2B), or an agent, gets its errors without the host's paths.
func (s *Service) Do(ctx context.Context, c *Call, op string, req any) (any, error) {
	res, err := s.do(ctx, c, op, req)
	if err != nil && agentFace(c) {
		err = s.hideHostPaths(err)
	}
	return res, err
}

func (s *Service) do(ctx context.Context, c *Call, op string, req any) (res any, err error) {
	o, ok := operations[op]
	if !ok {
		return nil, &Error{Code: CodeUnknownOperation, Err: fmt.Errorf("no operation %q", op)}
	}
	if c == nil || c.Caller == nil {
		return nil, &Error{Code: CodeDenied, Err: fmt.Errorf("%w: no caller", ErrDenied)}
	}
	if s.Policy == nil {
		return nil, &Error{Code: CodeDenied, Err: fmt.Errorf("%w: no policy", ErrDenied)}
	}
	bench := s.benchName(op, req)
	if err := s.Policy(s, c.Caller, op, req); err != nil {
		if aerr := s.record(c, op, req, nil, err, 0, bench); aerr != nil {
			return nil, auditFailed(op, err, aerr)
		}
		return nil, err
	}
	if c.Caller.Role != Operator && FailsClosed(op, req) && !s.authority.take(c.Caller, op) {
		releaseHeld(req)
		err := &Error{Code: CodeBusy, Err: fmt.Errorf("%s: more than %d a second (bursts of %d): not done", op, authorityRate, authorityBurst), Hint: "try again in a second"}
		if aerr := s.record(c, op, req, nil, err, 0, bench); aerr != nil {
			return nil, auditFailed(op, err, aerr)
		}
		return nil, err
	}
	// An operation that changes authority acts only once the log holds that it is about to.
	intent, err := s.recordIntent(c, op, req, bench)
	if err != nil {
		releaseHeld(req)
		return nil, err
	}
	defer func() {
		if p := recover(); p != nil {
			s.log().Error("operation panicked", "op", op, "user", c.Caller.User, "panic", p, "stack", string(debug.Stack()))
			res, err = nil, &Error{Code: CodeInternal, Err: fmt.Errorf("operation %s failed inside shed (a bug: the supervisor logged it)", op)}
		}
		if aerr := s.record(c, op, req, res, err, intent, bench); aerr != nil {
			res, err = nil, auditFailed(op, err, aerr)
		}
	}()
	res, err = o.run(ctx, s, c, req)
	var ne *nospace.Error
	if nospace.Is(err) && !errors.As(err, &ne) {
		// The full filesystem is what the caller hears about (on the wire too), with the code of
		// what failed.
		e := &Error{Code: Classify(err).Code, Err: nospace.Check(fullDir(s.Root, err), err)}
		e.Hint = hintFor(e.Err)
		return res, e
	}
	return res, err
}

// fullDir is the directory to name when err is a full filesystem's: the store's root, or where the
// failed write was when that is outside it (a grant, a caller's file).
func fullDir(root string, err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) && filepath.IsAbs(pe.Path) && pe.Path != root && !strings.HasPrefix(pe.Path, root+"/") {
		return filepath.Dir(pe.Path)
	}
	return root
}

// ErrDenied is a request the caller's role does not allow.
var ErrDenied = errors.New("not allowed")
