package bench

import (
	"errors"
	"strings"
	"testing"
)

// TestAccount: a Bench's accounts are root (always) and its Workshop's; no name is its default user
// (root when the Workshop names none); an unknown name is ErrNoAccount, naming what there is, bounded.
func TestAccount(t *testing.T) {
	user := Account{Name: "user", UID: 1000, GID: 1000, Home: "/home/user"}
	rec := &Record{Name: "b", User: "user", Accounts: []Account{user}}
	for name, want := range map[string]Account{"": user, "user": user, "root": Root} {
		if got, err := rec.Account(name); got != want || err != nil {
			t.Errorf("Account(%q) = %v, %v; want %v", name, got, err, want)
		}
	}
	if got, _ := (&Record{Name: "b"}).Account(""); got != Root {
		t.Errorf("the default of a Bench with no user: %v, want root", got)
	}
	_, err := rec.Account(strings.Repeat("x", 1<<16))
	if !errors.Is(err, ErrNoAccount) || len(err.Error()) > 200 || !strings.Contains(err.Error(), "root, user") {
		t.Errorf("an unknown user: %.300v", err)
	}
	if a, ok := rec.accountOfUID(1000); !ok || a != user {
		t.Errorf("accountOfUID(1000) = %v, %v", a, ok)
	}
}
