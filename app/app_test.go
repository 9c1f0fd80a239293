package app

import (
	"context"
	"errors"
	"testing"
)

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
