package app

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"toolshed.dev/shed/audit"
	"toolshed.dev/shed/records"
)

func init() {
	op("audit.ls", (*Service).AuditList)
	op("audit.verify", (*Service).AuditVerify)
}

// reads are the operations that change nothing: not audited (everything else is, refusals too).
var reads = map[string]bool{
	"bench.ls": true, "workshop.ls": true, "workshop.show": true, "workshop.log": true, "workshop.diff": true,
	"workshop.launchable": true, "key.show": true, "store.ls": true, "store.info": true, "root.ls": true,
	"why": true, "diff": true, "log": true, "bench.logs": true, "proposal.show": true, "bench.read_file": true,
	"bench.list_files": true, "bench.stat_file": true, "audit.ls": true, "audit.verify": true, "agent.key_ls": true, "store.verify": true,
}

// record appends what an operation did (or was refused) to the audit log.
func (s *Service) record(c *Call, op string, req, res any, err error) {
	if s.Audit == nil || reads[op] {
		return
	}
	// Recording runs after the operation's own recovery: a bug here must not take the caller down.
	defer func() {
		if p := recover(); p != nil {
			s.log().Error("audit record panicked", "op", op, "panic", p)
		}
	}()
	e := audit.Entry{User: c.Caller.User, Role: string(c.Caller.Role), Via: c.Caller.Via, Event: op}
	switch r := req.(type) {
	case *RealizeRequest:
		e.Workshop = r.Workshop
	case *BenchRunRequest:
		e.Workshop, e.Bench = r.Workshop, r.Name
	case *BenchCreateRequest:
		e.Workshop, e.Bench = r.Workshop, r.Name
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
		// A user can make refusals as fast as it can connect: each costs an fsync and a line. Past a
		// rate they are counted, not written one by one.
		if c.Caller.Role != Operator && !s.refusals.allow(c.Caller.UID) {
			return
		}
	}
	s.appendAudit(e)
}

// limiter allows a few events per uid per second (a token bucket each).
type limiter struct {
	mu      sync.Mutex
	buckets map[uint32]*bucket
}

type bucket struct {
	tokens float64
	last   time.Time
}

const (
	refusalRate  = 5  // per second
	refusalBurst = 20 // at once
)

func (l *limiter) allow(uid uint32) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.buckets == nil {
		l.buckets = map[uint32]*bucket{}
	}
	now := time.Now()
	b := l.buckets[uid]
	if b == nil {
		b = &bucket{tokens: refusalBurst, last: now}
		l.buckets[uid] = b
	}
	b.tokens = min(refusalBurst, b.tokens+now.Sub(b.last).Seconds()*refusalRate)
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// maxNetEvents bounds the network destinations one Bench writes to the audit log: an agent makes
// one with every request. Past it, one "net.dropped" entry says so; network.log keeps more.
const maxNetEvents = 1000

func (s *Service) appendAudit(e audit.Entry) {
	if err := s.Audit.Append(e); err != nil {
		s.log().Error("audit log", "err", err, "event", e.Event, "user", e.User)
	}
}

// benchEvents is a Bench's audit hook: its start and end, and each network destination its proxy
// allowed or refused.
func (s *Service) benchEvents(c *Call, workshop string) func(bench, event, dest, detail string) {
	if s.Audit == nil {
		return nil
	}
	var mu sync.Mutex
	nets := 0
	return func(bench, event, dest, detail string) {
		if strings.HasPrefix(event, "net.") {
			mu.Lock()
			nets++
			n := nets
			mu.Unlock()
			switch {
			case n == maxNetEvents+1:
				event, dest, detail = "net.dropped", "", fmt.Sprintf("more than %d destinations: the rest are in the Bench's network log", maxNetEvents)
			case n > maxNetEvents:
				return
			}
		}
		if err := s.Audit.Note(audit.Entry{User: c.Caller.User, Role: string(c.Caller.Role), Via: c.Caller.Via, Event: event, Bench: bench, Workshop: workshop, Dest: dest, Detail: detail}); err != nil {
			s.log().Error("audit log", "err", err, "event", event, "bench", bench)
		}
	}
}

// AuditRequest selects audit entries: by user, by Bench.
type AuditRequest struct {
	User  string `json:"user,omitempty"`  // only this user's entries
	Bench string `json:"bench,omitempty"` // only this Bench's
}

// AuditResult is the entries, oldest first.
type AuditResult struct {
	Entries []audit.Entry `json:"entries"` // seq, time, user, role, event, bench, workshop, version, diff_sha256, dest, error, detail, prev, hash
}

// AuditList returns the audit log's entries.
func (s *Service) AuditList(ctx context.Context, c *Call, req *AuditRequest) (*AuditResult, error) {
	es, err := audit.Open(s.Root).Entries(audit.Filter{User: req.User, Bench: req.Bench})
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

// AuditVerify checks that no entry was changed, removed or reordered, and that none was cut from the end.
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
