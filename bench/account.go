package bench

import (
	"errors"
	"fmt"
	"strings"

	"toolshed.dev/shed/internal/hint"
	"toolshed.dev/shed/recipe"
)

// Account is an account a Bench's commands may run as: root, or one its Workshop declares. The
// recipe is its truth (the accounts layer made it with these ids), so a Bench resolves a name without
// reading its /etc/passwd.
type Account struct {
	Name string `json:"name"`
	UID  uint32 `json:"uid"`
	GID  uint32 `json:"gid"`
	Home string `json:"home"`
}

// Root is the account every Bench has: root of its own user namespace.
var Root = Account{Name: "root", Home: "/root"}

// ErrNoAccount is returned for a user a Bench does not have.
var ErrNoAccount = errors.New("no such account")

// accountsOf is what a Bench of r records: its default user and its declared accounts.
func accountsOf(r *recipe.Recipe) (string, []Account) {
	var out []Account
	for _, a := range r.Accounts {
		out = append(out, Account{Name: a.Name, UID: uint32(a.UID), GID: uint32(a.UID), Home: a.Home})
	}
	return r.User, out
}

// sudoOf says whether an account of r may use sudo: the Bench then honours setuid bits.
func sudoOf(r *recipe.Recipe) bool {
	for _, a := range r.Accounts {
		if a.Sudo {
			return true
		}
	}
	return false
}

// Account returns the account name names in the Bench: "" is its default user (the Workshop's
// `user`, or root), "root" is always there, any other must be one its Workshop declares.
func (r *Record) Account(name string) (Account, error) {
	if name == "" {
		name = r.User
	}
	if name == "" || name == "root" {
		return Root, nil
	}
	names := []string{"root"}
	for _, a := range r.Accounts {
		if a.Name == name {
			return a, nil
		}
		names = append(names, a.Name)
	}
	return Account{}, hint.Wrap(fmt.Errorf("%w: bench %s has no user %.64q (its accounts: %s)", ErrNoAccount, r.Name, name, strings.Join(names, ", ")),
		"name one of them: a Workshop declares its accounts ([[account]] in workshop.toml)")
}

// accountOfUID is the account of uid in the Bench, for a command's HOME, USER and LOGNAME.
func (r *Record) accountOfUID(uid uint32) (Account, bool) {
	if uid == 0 {
		return Root, true
	}
	for _, a := range r.Accounts {
		if a.UID == uid {
			return a, true
		}
	}
	return Account{}, false
}

// accountEnv is what a command of the account has in its environment, as login(1) sets it.
func accountEnv(a Account) []string {
	return []string{"HOME=" + a.Home, "USER=" + a.Name, "LOGNAME=" + a.Name}
}
