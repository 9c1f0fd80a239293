package app

import (
	"context"
	"errors"
	"strings"
	"testing"

	"toolshed.dev/shed/records"
)

// TestAllowKnownUsersOnly: a record allows only users and groups that exist, as `shed agent key
// create` makes keys only for users that exist: an unknown name is refused (usage) with the command
// that makes it, before anything is read or written; a known one goes on to the record.
func TestAllowKnownUsersOnly(t *testing.T) {
	s := &Service{Root: t.TempDir()}
	op := &Call{Caller: &Caller{User: "root", Role: Operator, Dir: "/"}}
	ctx := context.Background()
	for users, hint := range map[string]string{
		"no-such-user-i24":          "useradd --system no-such-user-i24",
		"nobody @no-such-group-i24": "groupadd no-such-group-i24",
	} {
		list := strings.Fields(users)
		_, err := s.WorkshopAllow(ctx, op, &WorkshopAllowRequest{Name: "tools", Users: list})
		if e := Classify(err); e == nil || e.Code != CodeUsage || !strings.Contains(e.Hint, hint) {
			t.Errorf("workshop.allow %v: %v (hint %q), want a usage error whose hint says %q", list, err, Classify(err).Hint, hint)
		}
		_, err = s.WorkshopAdd(ctx, op, &WorkshopAddRequest{File: "/nonexistent/workshop.toml", Allow: list})
		if e := Classify(err); e == nil || e.Code != CodeUsage || !strings.Contains(e.Hint, hint) {
			t.Errorf("workshop.add --allow %v: %v, want the same refusal before the file is read", list, err)
		}
	}
	// Users and groups that exist pass: the refusal is then the record's (there is none).
	if _, err := s.WorkshopAllow(ctx, op, &WorkshopAllowRequest{Name: "tools", Users: []string{"nobody", "@root"}}); !errors.Is(err, records.ErrNoRecord) {
		t.Errorf("workshop.allow nobody @root: %v, want no record", err)
	}
}
