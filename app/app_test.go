package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"regexp"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"toolshed.dev/shed/audit"
	"toolshed.dev/shed/bench"
	"toolshed.dev/shed/sandbox"
)

var auditOpen = audit.Open

type panicRequest struct{}

func init() {
	op("test.panic", func(s *Service, ctx context.Context, c *Call, req *panicRequest) (*Empty, error) {
		var b []byte
		return nil, errors.New(string(b[1:])) // a bug: out of range
	})
}

// TestDoRecovers: a panicking operation is an internal error for its caller, not the end of the
// process that serves everyone else.
func TestDoRecovers(t *testing.T) {
	s := &Service{Root: t.TempDir(), Policy: func(*Service, *Caller, string, any) error { return nil }}
	_, err := s.Do(context.Background(), &Call{Caller: &Caller{Role: Operator}}, "test.panic", &panicRequest{})
	var e *Error
	if !errors.As(err, &e) || e.Code != CodeInternal {
		t.Errorf("a panicking operation: %v", err)
	}
}

// TestDoFailsClosed: without a policy, or a caller, or with a request of another type, nothing runs.
func TestDoFailsClosed(t *testing.T) {
	ctx := context.Background()
	ran := false
	s := &Service{Root: t.TempDir()}
	if _, err := s.Do(ctx, &Call{Caller: &Caller{Role: Operator}}, "test.panic", &panicRequest{}); Classify(err).Code != CodeDenied {
		t.Errorf("no policy: %v", err)
	}
	s.Policy = func(*Service, *Caller, string, any) error { ran = true; return nil }
	if _, err := s.Do(ctx, &Call{}, "test.panic", &panicRequest{}); Classify(err).Code != CodeDenied || ran {
		t.Errorf("no caller: %v", err)
	}
	if _, err := s.Do(ctx, &Call{Caller: &Caller{Role: Operator}}, "gc", &panicRequest{}); Classify(err).Code != CodeBadRequest {
		t.Errorf("a request of another type: %v", err)
	}
	if _, err := s.Do(ctx, &Call{Caller: &Caller{Role: Operator}}, "no.such", &panicRequest{}); Classify(err).Code != CodeUnknownOperation {
		t.Errorf("an unknown operation: %v", err)
	}
}

// TestAuditFailedOperation: an operation that fails returns a nil result of its type; recording it
// in the audit log must not take the caller down (it did: a nil *PromoteResult).
func TestAuditFailedOperation(t *testing.T) {
	s := &Service{Root: t.TempDir(), Policy: func(*Service, *Caller, string, any) error { return nil }}
	s.Audit = auditOpen(s.Root)
	for _, op := range []string{"workshop.promote", "workshop.add", "bench.create", "bench.propose", "realize"} {
		o, _ := Lookup(op)
		_, err := s.Do(context.Background(), &Call{Caller: &Caller{Role: Operator, User: "root"}}, op, o.New())
		if Classify(err).Code == CodeInternal {
			t.Errorf("%s: %v", op, err)
		}
	}
}

// TestDefaultKeyName: two stores made on one host get keys of different names, each the host's and
// ending in -1 (so that rotation makes -2).
func TestDefaultKeyName(t *testing.T) {
	a, b := defaultKeyName(), defaultKeyName()
	if a == b {
		t.Fatalf("two stores' keys are both named %s", a)
	}
	for _, n := range []string{a, b} {
		if !regexp.MustCompile(`^[A-Za-z0-9.-]+-[0-9a-f]{6}-1$`).MatchString(n) || len(n) > 64 {
			t.Errorf("key name %q: want HOST-XXXXXX-1", n)
		}
	}
	if got := nextKeyName(a); got != strings.TrimSuffix(a, "1")+"2" {
		t.Errorf("nextKeyName(%s) = %s", a, got)
	}
}

// TestNetworkHints: a refused connection, a name that does not resolve and a timeout each get a hint
// that says what to check, through the wrapping a fetch gives them.
func TestNetworkHints(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{&net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", unix.ECONNREFUSED)}, "nothing answers"},
		{&net.DNSError{Err: "no such host", Name: "mirror.example"}, "does not resolve"},
		{os.ErrDeadlineExceeded, "did not answer in time"},
	} {
		err := fmt.Errorf("fetch http://mirror/x: %w", &url.Error{Op: "Get", URL: "http://mirror/x", Err: c.err})
		if h := Classify(err).Hint; !strings.Contains(h, c.want) {
			t.Errorf("%v: hint %q, want %q", err, h, c.want)
		}
	}
}

// TestGrantMissingHint: a grant of a directory that is not there is told to make it, by its name
// (quoted for a shell when it needs to be), not about the recipe's bounds.
func TestGrantMissingHint(t *testing.T) {
	for path, want := range map[string]string{
		"/srv/project/new": "`mkdir -p /srv/project/new`",
		"/srv/it's here":   `mkdir -p '/srv/it'\''s here'`,
	} {
		err := fmt.Errorf("bench: %w", &bench.MissingError{Path: path, Err: unix.ENOENT})
		if e := Classify(err); e.Code != CodeUsage || !strings.Contains(e.Hint, want) || strings.Contains(e.Hint, "bounds") {
			t.Errorf("%v: code %s, hint %q, want %q", err, e.Code, e.Hint, want)
		}
	}
}

// TestResourceHints: running out of a resource gets a hint that names it and what to do.
func TestResourceHints(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("launch: %w", sandbox.ErrNoIDs), "`shed bench ls`"},
		{fmt.Errorf("store: %w", &os.PathError{Op: "open", Path: "/x", Err: unix.EMFILE}), "ulimit -n"},
		{fmt.Errorf("store: %w", &os.PathError{Op: "open", Path: "/x", Err: unix.ENFILE}), "fs.file-max"},
	} {
		if h := Classify(c.err).Hint; !strings.Contains(h, c.want) {
			t.Errorf("%v: hint %q, want %q", c.err, h, c.want)
		}
	}
}

// TestAuditResourceHint: an audit log that cannot be written for want of a resource says which.
func TestAuditResourceHint(t *testing.T) {
	emfile := fmt.Errorf("audit: %w", &os.PathError{Op: "open", Path: "/x/audit/head", Err: unix.EMFILE})
	if h := auditFailed("init", nil, emfile).(*Error).Hint; !strings.Contains(h, "ulimit -n") {
		t.Errorf("hint %q", h)
	}
	if h := auditFailed("init", nil, errors.New("audit: chain broken")).(*Error).Hint; h != auditHint {
		t.Errorf("hint %q", h)
	}
}
