package app

import (
	"cmp"
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"toolshed.dev/shed/audit"
	"toolshed.dev/shed/internal/nospace"
	"toolshed.dev/shed/records"
)

func init() {
	op("audit.ls", (*Service).AuditList)
	op("audit.verify", (*Service).AuditVerify)
}

// reads are the operations that change nothing: not audited (everything else is, refusals too).
var reads = map[string]bool{
	"bench.ls": true, "workshop.ls": true, "workshop.show": true, "workshop.log": true, "workshop.diff": true,
	"workshop.launchable": true, "workshop.tags": true, "key.show": true, "store.ls": true, "store.info": true, "store.stats": true, "root.ls": true,
	"why": true, "diff": true, "log": true, "bench.logs": true, "proposal.show": true, "bench.read_file": true,
	"bench.list_files": true, "bench.stat_file": true, "bench.watch_dir": true, "bench.metrics": true, "audit.ls": true, "audit.verify": true, "agent.key_ls": true, "store.verify": true,
	"bench.network": true, "k8s.manifests": true, "bench.watcher_create": true, "bench.watcher_events": true, "bench.watcher_remove": true,
	"secret.ls": true,
}

// authority are the operations that change what the supervisor trusts or keeps: the store itself,
// Workshop records and who may use them, proposals and promotion, the signing key and the trusted
// keys, API keys, locks, the store's paths, roots and signatures (add, sign, import, copy, gc, and
// store.verify when it repairs). They must not act unrecorded: each is written to the audit log,
// durably, before it acts (an intent), and refused if that cannot be done; its outcome follows. It
// is every operation only operators may call that is not a read, and bench.propose and
// workshop.submit (a proposal, or an operator's version; policy's tests check this against its table). docs/supervisor.md lists them.
var authority = map[string]bool{
	"init": true, "lock": true, "instantiate": true, "workshop.add": true, "workshop.submit": true, "workshop.rm": true, "workshop.tag": true, "workshop.allow": true, "workshop.promote": true,
	"bench.propose": true, "key.rotate": true, "key.trust": true, "key.untrust": true, "agent.key_create": true,
	"agent.key_rm": true, "store.add": true, "store.sign": true, "store.verify": true, "root.add": true, "root.rm": true,
	"store.optimise": true, "gc": true, "copy": true, "import": true,
}

// Audited says whether op with req is written to the audit log: everything but reads.
func Audited(op string, req any) bool {
	if r, ok := req.(*VerifyRequest); ok && op == "store.verify" {
		return r.Repair // a repair puts bytes back in the store; a check reads
	}
	return !reads[op]
}

// FailsClosed says whether op with req must not act unrecorded: it is written to the audit log
// durably before it acts, and refused if it cannot be.
func FailsClosed(op string, req any) bool { return authority[op] && Audited(op, req) }

// auditHint is what to do about an audit log that cannot be written.
const auditHint = "the supervisor's audit log (<root>/audit) cannot be written: an operator checks that disk, and `shed audit verify`"

// auditHintFor is auditHint, or what to do about the resource whose lack kept the log from being
// written (a full disk, open files).
func auditHintFor(err error) string {
	if h := resourceHint(err); h != "" {
		return h
	}
	return auditHint
}

// recordIntent writes, durably, that op is about to act for c: its seq, or an error that refuses op.
func (s *Service) recordIntent(c *Call, op string, req any, bench string) (int64, error) {
	if s.Audit == nil || !FailsClosed(op, req) {
		return 0, nil
	}
	e := entry(c, op, req, nil, nil, bench)
	e.Intent = true
	w, err := s.Audit.Append(e)
	err = nospace.Check(s.Root, err) // the log is under the root: a full disk is named as one
	if err != nil {
		return 0, &Error{Code: CodeFailed, Err: fmt.Errorf("%s not done: the audit log cannot record it: %w", op, err), Hint: auditHintFor(err)}
	}
	return w.Seq, nil
}

// auditFailed is an operation's error when its entry could not be written: the operation's own
// (its code and hint kept) with the audit's added, or, if it succeeded, the audit's.
func auditFailed(op string, err, aerr error) error {
	if err == nil {
		return &Error{Code: CodeFailed, Err: fmt.Errorf("%s was done, but the audit log could not record it: %w", op, aerr), Hint: auditHintFor(aerr)}
	}
	ce := Classify(err)
	return &Error{Code: ce.Code, Err: fmt.Errorf("%w (and the audit log could not record it: %v)", err, aerr), Hint: ce.Hint}
}

// record appends what an operation did (or was refused) to the audit log; intent is the seq of the
// entry written before it acted (0: none). Its error is the append's: the caller's to see.
func (s *Service) record(c *Call, op string, req, res any, err error, intent int64, bench string) (aerr error) {
	if s.Audit == nil || !Audited(op, req) {
		return nil
	}
	// Recording runs after the operation's own recovery: a bug here must not take the caller down.
	defer func() {
		if p := recover(); p != nil {
			s.log().Error("audit record panicked", "op", op, "panic", p)
			aerr = fmt.Errorf("audit: recording %s failed inside shed (a bug: the supervisor logged it)", op)
		}
	}()
	e := entry(c, op, req, res, err, bench)
	e.Of = intent
	// A user can make refusals as fast as it can connect: each would cost an fsync and a line. Past
	// a rate they are counted, and the count written as its own entry (audit.dropped). The outcome
	// of an operation whose intent was written is always written.
	if err != nil && c.Caller.Role != Operator && intent == 0 {
		allowed, flush := s.refusals.take(c.Caller, op, e.Error)
		if flush != nil {
			if ferr := s.writeDropped(flush); ferr != nil {
				return ferr
			}
		}
		if !allowed {
			s.refusals.arm(s, c.Caller)
			return nil
		}
	}
	if err == nil && !c.wrote.Load() && noted(op, req, res) {
		aerr = s.Audit.Note(e)
	} else {
		_, aerr = s.Audit.Append(e)
	}
	return nospace.Check(s.Root, aerr)
}

// noted says whether op's entry, when it succeeded, is written without waiting for its fsync (noted,
// as a running Bench's events are: synced by the next durable entry, or within audit.FlushDelay while
// the process runs): the operations whose own effects no fsync keeps either, so that an OS crash
// which could lose their entry could lose what they did too. A command or a file operation in a
// Bench (its upper is not synced), a launch whose Bench is not kept (its record is not synced and its
// upper goes), and a realize that found everything in the store (it changed nothing); neither when it
// wrote a lock or added to the store on the way (Call.wrote). The rest wait: an operation that
// changes authority (its intent too), a refusal or a failure, a kept Bench's launch, a Bench's
// creation, removal, network or lifetime, a realize that added to the store or wrote a lock.
func noted(op string, req, res any) bool {
	switch op {
	case "bench.exec", "bench.write_file", "bench.write_files", "bench.make_dir", "bench.remove_file", "bench.move_file":
		return true
	case "bench.run":
		r, ok := req.(*BenchRunRequest)
		return ok && !r.Keep
	case "realize":
		r, ok := res.(*RealizeResult)
		return ok && r != nil && len(r.Built)+len(r.Fetched)+len(r.Substituted)+len(r.Check) == 0
	}
	return false
}

// benchNamed is the Bench a request names (by name or id, as its caller chose), or "".
func benchNamed(req any) string {
	switch r := req.(type) {
	case *BenchExecRequest:
		return r.Bench
	case *BenchRequest:
		return r.Bench
	case *WriteFileRequest:
		return r.Bench
	case *WriteFilesRequest:
		return r.Bench
	case *ReadFileRequest:
		return r.Bench
	case *ListFilesRequest:
		return r.Bench
	case *BenchPathRequest:
		return r.Bench
	case *MoveFileRequest:
		return r.Bench
	case *SetLifetimeRequest:
		return r.Bench
	case *SetNetworkRequest:
		return r.Bench
	case *BenchRemoveRequest:
		if len(r.Benches) == 1 {
			return r.Benches[0]
		}
	}
	return ""
}

// benchName is the name of the Bench req names, whether it names it by name or by id ("" when it
// names none, or none that exists). Every entry of a Bench carries its name: an E2B sandbox's data
// plane names its Bench by id, `shed bench exec` by name, and `shed audit --bench` must find both.
// It is read before the operation runs: after a bench.rm the Bench is gone.
func (s *Service) benchName(op string, req any) string {
	named := benchNamed(req)
	if s.Audit == nil || named == "" || !Audited(op, req) {
		return ""
	}
	rec, err := FindBench(s.Root, named)
	if err != nil {
		return ""
	}
	return rec.Name
}

// entry is the audit entry of op for c, with what its request and result say; bench is the name of
// the Bench the request names (benchName), if it resolved.
func entry(c *Call, op string, req, res any, err error, bench string) audit.Entry {
	e := entryOf(c, op, req, res, err)
	if bench != "" {
		e.Bench = bench
	}
	return e
}

func entryOf(c *Call, op string, req, res any, err error) audit.Entry {
	e := audit.Entry{User: c.Caller.User, Role: string(c.Caller.Role), Via: c.Caller.Via, Event: op}
	switch r := req.(type) {
	case *RealizeRequest:
		e.Workshop = r.Workshop
	case *BenchRunRequest:
		e.Workshop, e.Bench = r.Workshop, r.Name
	case *BenchCreateRequest:
		e.Workshop, e.Bench = r.Workshop, r.Name
		if len(r.NetAllow)+len(r.NetDeny) > 0 {
			e.Detail = netSummary(r.NetAllow, r.NetDeny)
		}
	case *BenchExecRequest:
		e.Bench = r.Bench
	case *BenchRequest:
		e.Bench = r.Bench
	case *WriteFileRequest:
		e.Bench, e.Detail = r.Bench, r.Path
	case *WriteFilesRequest:
		e.Bench, e.Detail = r.Bench, r.summary()
	case *BenchPathRequest:
		e.Bench, e.Detail = r.Bench, r.Path
	case *MoveFileRequest:
		e.Bench, e.Detail = r.Bench, r.From+" -> "+r.To
	case *SetLifetimeRequest:
		e.Bench, e.Detail = r.Bench, fmt.Sprintf("lifetime %ds", r.LifetimeS)
	case *SetNetworkRequest:
		e.Bench, e.Detail = r.Bench, netSummary(r.Allow, r.Deny)
	case *BenchRemoveRequest:
		if len(r.Benches) == 1 {
			e.Bench = r.Benches[0]
		}
	case *WorkshopAddRequest:
		e.Workshop = r.File
	case *WorkshopAllowRequest:
		e.Workshop = r.Name
	case *PromoteRequest:
		e.DiffSHA256, e.Detail = r.DiffSHA256, "proposal "+r.ID
	case *KeyRequest:
		e.Detail = r.Key // a public key: never a secret
	case *KeyCreateRequest:
		e.Detail = "for " + r.User
	case *KeyRemoveRequest:
		e.Detail = r.ID
	case *SecretAddRequest:
		e.Detail = "secret " + strings.ToLower(r.Name) // its name: never its value
	case *SecretRequest:
		e.Detail = "secret " + r.Name
	case *SecretUpdateRequest:
		e.Detail = "secret " + r.Name
	}
	switch r := res.(type) {
	case *records.Version:
		if r != nil {
			e.Workshop, e.Version = r.Name, r.N
		}
	case *PromoteResult:
		if r != nil && r.Version != nil {
			e.Workshop, e.Version = r.Version.Name, r.Version.N
		}
	case *BenchCreateResult:
		if r != nil {
			e.Bench = r.Bench
		}
	case *ProposeResult:
		if r != nil && r.Proposal != nil {
			e.Bench, e.Workshop, e.Version, e.DiffSHA256 = r.Proposal.Bench, r.Proposal.Workshop, r.Proposal.Base, r.Proposal.DiffSHA256
			e.Detail = "proposal " + r.Proposal.ID
		}
	case *RealizeResult:
		if r != nil {
			e.Workshop = r.Workshop
		}
	case *KeyCreateResult, *KeyListResult:
		if d := keyDetail(r); d != "" {
			e.Detail = d
		}
	}
	if err != nil {
		e.Error = string(Classify(err).Code)
	}
	return e
}

// The refusals of a caller (not an operator) written one by one: at most refusalRate a second, in
// bursts of refusalBurst, per caller and operation. Per operation, so that junk refusals of one
// cannot hide another's (a refused key.trust after a flood of refused realizes is still written
// whole); a caller's total is then bounded by the number of operations, which is fixed, and a
// user can write entries at least as fast with operations that succeed (each exec is one).
const (
	refusalRate  = 5  // per second
	refusalBurst = 20 // at once
	// dropFlush is how long after a caller's last dropped refusal its count is written, when no
	// refusal of theirs is written first (which writes it before its own).
	dropFlush = time.Second
)

// limiter is a token bucket per caller and operation, and the count of what each caller had dropped.
type limiter struct {
	mu      sync.Mutex
	buckets map[refusalKey]*bucket
	dropped map[callerKey]*drops
}

type callerKey struct {
	uid  uint32
	user string // the uid's name, an API key's user, or an agent's Bench: never chosen by the caller
}

type refusalKey struct {
	callerKey
	op string
}

type bucket struct {
	tokens float64
	last   time.Time
}

// The operations that fail closed a caller who is not an operator may start (bench.propose, an
// agent's only way to write to the log): at most authorityRate a second, in bursts of
// authorityBurst, per caller and operation. Each writes its intent and its outcome durably, a
// failure too (a proposal of an unchanged Bench), and past the rate it is refused before its intent,
// a refusal like any other (counted past the refusals' rate). Unbounded, one agent wrote 160 a second.
const (
	authorityRate  = 1
	authorityBurst = 10
)

// rateLimiter is a token bucket per caller and operation, of authorityRate and authorityBurst.
type rateLimiter struct {
	mu      sync.Mutex
	buckets map[refusalKey]*bucket
}

// take spends a token of c's bucket for op, and says whether there was one.
func (l *rateLimiter) take(c *Caller, op string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if l.buckets == nil {
		l.buckets = map[refusalKey]*bucket{}
	}
	if len(l.buckets) > 4096 { // a full bucket is as good as none
		for k, b := range l.buckets {
			if now.Sub(b.last).Seconds()*authorityRate >= authorityBurst {
				delete(l.buckets, k)
			}
		}
	}
	k := refusalKey{callerKey{c.UID, c.User}, op}
	b := l.buckets[k]
	if b == nil {
		b = &bucket{tokens: authorityBurst, last: now}
		l.buckets[k] = b
	}
	b.tokens = min(authorityBurst, b.tokens+now.Sub(b.last).Seconds()*authorityRate)
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// drops is what one caller had dropped since its last count was written.
type drops struct {
	callerKey
	role, via string
	n         int64
	what      map[string]int64 // "OPERATION CODE" -> count
	timer     *time.Timer
}

// take spends a token of c's bucket for op: allowed, or counted as dropped (code is the error's).
// If allowed, it also hands over what c had dropped, to be written first.
func (l *limiter) take(c *Caller, op, code string) (allowed bool, flush *drops) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.buckets == nil {
		l.buckets, l.dropped = map[refusalKey]*bucket{}, map[callerKey]*drops{}
	}
	now := time.Now()
	if len(l.buckets) > 4096 { // a full bucket is as good as none
		for k, b := range l.buckets {
			if now.Sub(b.last).Seconds()*refusalRate >= refusalBurst {
				delete(l.buckets, k)
			}
		}
	}
	ck := callerKey{c.UID, c.User}
	k := refusalKey{ck, op}
	b := l.buckets[k]
	if b == nil {
		b = &bucket{tokens: refusalBurst, last: now}
		l.buckets[k] = b
	}
	b.tokens = min(refusalBurst, b.tokens+now.Sub(b.last).Seconds()*refusalRate)
	b.last = now
	if b.tokens >= 1 {
		b.tokens--
		return true, l.takeDrops(ck)
	}
	d := l.dropped[ck]
	if d == nil {
		d = &drops{callerKey: ck, what: map[string]int64{}}
		l.dropped[ck] = d
	}
	d.role, d.via = string(c.Role), c.Via
	d.n++
	d.what[op+" "+code]++
	return false, nil
}

// takeDrops removes and returns what ck had dropped (nil: nothing). Called with l.mu held.
func (l *limiter) takeDrops(ck callerKey) *drops {
	d := l.dropped[ck]
	if d == nil {
		return nil
	}
	delete(l.dropped, ck)
	if d.timer != nil {
		d.timer.Stop()
	}
	return d
}

// putBack merges d, which could not be written, into what its caller has dropped since.
func (l *limiter) putBack(d *drops) *drops {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.dropped[d.callerKey]
	if now == nil {
		d.timer = nil
		l.dropped[d.callerKey] = d
		return d
	}
	now.n += d.n
	for k, v := range d.what {
		now.what[k] += v
	}
	return now
}

// arm (re)starts the timer that writes c's count dropFlush after its last drop.
func (l *limiter) arm(s *Service, c *Caller) { l.armKey(s, callerKey{c.UID, c.User}, dropFlush) }

func (l *limiter) armKey(s *Service, ck callerKey, after time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	d := l.dropped[ck]
	if d == nil {
		return
	}
	if d.timer != nil {
		d.timer.Reset(after)
		return
	}
	d.timer = time.AfterFunc(after, func() {
		l.mu.Lock()
		d := l.takeDrops(ck)
		l.mu.Unlock()
		if d != nil {
			s.writeDropped(d)
		}
	})
}

// writeDropped writes d's count as an audit.dropped entry. If it cannot, the count is kept (merged
// with what the caller drops meanwhile) and tried again later: it is not lost while the process runs.
func (s *Service) writeDropped(d *drops) error {
	var what []string
	for k, n := range d.what {
		what = append(what, fmt.Sprintf("%s %d", k, n))
	}
	sort.Strings(what)
	_, err := s.Audit.Append(audit.Entry{User: d.user, Role: d.role, Via: d.via, Event: "audit.dropped", Count: d.n,
		Detail: fmt.Sprintf("uid %d: %d refusals past %d a second of one operation, counted, not written one by one: %s",
			d.uid, d.n, refusalRate, strings.Join(what, ", "))})
	if err != nil {
		s.log().Error("audit log: the count of dropped refusals", "err", err, "user", d.user, "count", d.n)
		s.refusals.putBack(d)
		s.refusals.armKey(s, d.callerKey, 10*dropFlush)
	}
	return err
}

// StartAuditFlusher has the audit log's noted entries synced within audit.FlushDelay of each: for the
// supervisor, which lives on (FlushAudit at its stop syncs the rest). A command on the store leaves
// them to the next durable entry.
func (s *Service) StartAuditFlusher() {
	if s.Audit != nil {
		s.Audit.FlushWithin(audit.FlushDelay)
	}
}

// FlushAudit writes now the counts of refusals dropped that their timers would write soon, and syncs
// the noted entries: for a supervisor that stops.
func (s *Service) FlushAudit() {
	if s.Audit == nil {
		return
	}
	// Then the entries noted and not yet synced (a clean stop loses none of them).
	defer func() {
		if err := s.Audit.Close(); err != nil {
			s.log().Error("audit log: sync at stop", "err", err)
		}
	}()
	s.refusals.mu.Lock()
	var all []*drops
	for ck := range s.refusals.dropped {
		all = append(all, s.refusals.takeDrops(ck))
	}
	s.refusals.mu.Unlock()
	for _, d := range all {
		s.writeDropped(d)
	}
}

// maxNetEvents bounds the network destinations one Bench writes to the audit log: an agent makes
// one with every request. Past it, one "net.dropped" entry says so; network.log keeps more.
const maxNetEvents = 1000

// benchAudit is a Bench's audit hook: its start and end, and each network destination its proxy
// allowed or refused, noted (no fsync: the next operation's entry makes them durable). Their fields
// are bounded by the log (a CONNECT to a 12,000-character host is a bounded dest).
type benchAudit struct {
	s        *Service
	c        *Call
	workshop string
	mu       sync.Mutex
	nets     int
	err      error // the first note that failed
}

func (s *Service) benchEvents(c *Call, workshop string) *benchAudit {
	return &benchAudit{s: s, c: c, workshop: workshop}
}

// hook is the bench.Options.Event for the Bench (nil without an audit log).
func (a *benchAudit) hook() func(bench, event, dest, detail string) {
	if a.s.Audit == nil {
		return nil
	}
	return func(bench, event, dest, detail string) {
		if strings.HasPrefix(event, "net.") {
			a.mu.Lock()
			a.nets++
			n := a.nets
			a.mu.Unlock()
			switch {
			case n == maxNetEvents+1:
				event, dest, detail = "net.dropped", "", fmt.Sprintf("more than %d destinations: the rest are in the Bench's network log", maxNetEvents)
			case n > maxNetEvents:
				return
			}
		}
		c := a.c.Caller
		if err := a.s.Audit.Note(audit.Entry{User: c.User, Role: string(c.Role), Via: c.Via, Event: event, Bench: bench, Workshop: a.workshop, Dest: dest, Detail: detail}); err != nil {
			a.s.log().Error("audit log", "err", err, "event", event, "bench", bench)
			a.mu.Lock()
			a.err = cmp.Or(a.err, nospace.Check(a.s.Root, err))
			a.mu.Unlock()
		}
	}
}

// failed is the first of the Bench's events that could not be written (nil: none).
func (a *benchAudit) failed() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.err
}

// AuditRequest selects audit entries: by user, by Bench.
type AuditRequest struct {
	User  string `json:"user,omitempty"`  // only this user's entries
	Bench string `json:"bench,omitempty"` // only this Bench's
}

// AuditResult is the entries, oldest first.
type AuditResult struct {
	Entries []audit.Entry `json:"entries"` // seq, time, user, role, via, event, bench, workshop, version, diff_sha256, dest, error, detail, count, intent, of, noted, prev, hash
}

// AuditList returns the audit log's entries.
func (s *Service) AuditList(ctx context.Context, c *Call, req *AuditRequest) (*AuditResult, error) {
	f := audit.Filter{User: req.User, Bench: req.Bench}
	// A Bench that still exists is asked for by either of its names: its entries carry its name, and
	// older ones whichever name their request used.
	if req.Bench != "" {
		if rec, err := FindBench(s.Root, req.Bench); err == nil {
			f.Bench, f.BenchAliases = rec.Name, []string{rec.ID}
		}
	}
	es, err := audit.Open(s.Root).Entries(f)
	if err != nil {
		return nil, err
	}
	return &AuditResult{Entries: es}, nil
}

// AuditVerifyRequest asks to check the audit log's chain.
type AuditVerifyRequest struct{}

// AuditVerifyResult says how many entries were checked and what is wrong.
type AuditVerifyResult struct {
	Entries  int             `json:"entries"`  // entries checked
	Problems []audit.Problem `json:"problems"` // what is wrong, by line
}

// AuditVerify checks that no entry was changed, removed or reordered, that none was cut from the end,
// that every line is exactly one entry (a line that is not is a problem, and the check goes on), and
// that the head does not lag.
func (s *Service) AuditVerify(ctx context.Context, c *Call, req *AuditVerifyRequest) (*AuditVerifyResult, error) {
	n, problems, err := audit.Open(s.Root).Verify()
	if err != nil {
		return nil, err
	}
	if problems == nil {
		problems = []audit.Problem{}
	}
	return &AuditVerifyResult{Entries: n, Problems: problems}, nil
}
