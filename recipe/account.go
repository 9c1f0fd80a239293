package recipe

import (
	"fmt"
	"path"
	"strconv"
	"strings"
)

// Account is a user account the recipe declares ([[account]]): a declaration, like a package, that
// the builder realizes in a layer of its own (useradd in a sandbox, BuilderAccountsLayer), so the
// account is in that layer's hash and in the lock. Its group is a user private group of the same
// name and id (Debian's USERGROUPS).
type Account struct {
	Name  string
	UID   int    // also its group's gid
	Home  string // absolute; made from /etc/skel, owned by the account
	Shell string // absolute
	Sudo  bool   // may run any command as root through sudo, without a password
}

// Account ids: Debian's range for ordinary users (adduser.conf's FIRST_UID..LAST_UID). Below are
// system accounts and root; above, Debian's global allocations and nobody (65534).
const (
	FirstUID = 1000
	LastUID  = 59999
)

// DefaultShell is an account's shell when the recipe names none: bash, as adduser's DSHELL (and
// E2B's user) has it; bash is Essential in Debian.
const DefaultShell = "/bin/bash"

// reservedAccounts are the users and groups of Debian's base-passwd (and nogroup): an account of one
// of these names would clash with the seed's, or (a group) hand the account what the group may do.
var reservedAccounts = map[string]bool{
	"root": true, "daemon": true, "bin": true, "sys": true, "sync": true, "games": true, "man": true,
	"lp": true, "mail": true, "news": true, "uucp": true, "proxy": true, "www-data": true, "backup": true,
	"list": true, "irc": true, "gnats": true, "nobody": true, "nogroup": true, "adm": true, "tty": true,
	"disk": true, "kmem": true, "dialout": true, "fax": true, "voice": true, "cdrom": true, "floppy": true,
	"tape": true, "sudo": true, "audio": true, "dip": true, "operator": true, "src": true, "shadow": true,
	"utmp": true, "video": true, "sasl": true, "plugdev": true, "staff": true, "users": true,
	"systemd-journal": true, "systemd-network": true, "systemd-resolve": true, "messagebus": true,
}

// accountNameRe is Debian's adduser NAME_REGEX (^[a-z][-a-z0-9_]*$, without the trailing "$" of
// machine accounts), at most 32 characters as useradd allows.
var accountNameRe = lazyRegexp(`^[a-z][a-z0-9_-]{0,31}$`)

// checkAccountName checks an account's name against Debian's rules and the reserved names.
func checkAccountName(s string) *Error {
	if e := checkText(s); e != nil {
		return e
	}
	if reservedAccounts[s] {
		if s == "root" {
			return &Error{Msg: `"root" is always there`,
				Hint: `root needs no declaration: user = "root" (or no user) runs commands as root`}
		}
		return &Error{Msg: fmt.Sprintf("%q is a system account or group of Debian's (base-passwd)", s),
			Hint: `choose another name, e.g. "user" or "agent": an account of that name would clash with the seed's`}
	}
	if !accountNameRe().MatchString(s) {
		return &Error{Msg: fmt.Sprintf("invalid account name %q", s),
			Hint: "as Debian's adduser wants it: 1 to 32 lowercase letters, digits, '_' or '-', starting with a letter, e.g. user"}
	}
	return nil
}

// checkAccountPath checks an account's home or shell: absolute, clean, of plain characters, and
// (a home) not where a Bench mounts something of its own.
func checkAccountPath(p, what, example string) *Error {
	if e := checkText(p); e != nil {
		return e
	}
	switch {
	case !strings.HasPrefix(p, "/"):
		return &Error{Msg: fmt.Sprintf("%s %q is not absolute", what, p), Hint: "write an absolute path, e.g. " + example}
	case hasDotDot(p):
		return &Error{Msg: fmt.Sprintf(`%s %q has a ".." element`, what, p), Hint: "write the path it means, e.g. " + example}
	case path.Clean(p) != p:
		return &Error{Msg: fmt.Sprintf("%s %q is not clean", what, p), Hint: fmt.Sprintf("write %q", path.Clean(p))}
	case p == "/":
		return &Error{Msg: fmt.Sprintf("%s is the root directory", what), Hint: "write a path of its own, e.g. " + example}
	case strings.Trim(p, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._+-") != "":
		return &Error{Msg: fmt.Sprintf("%s %q has characters other than letters, digits and /._+-", what, p), Hint: "write it plainly, e.g. " + example}
	}
	if what == "home" {
		for _, d := range []string{"/proc", "/sys", "/dev", "/tmp", "/run"} {
			if p == d || strings.HasPrefix(p, d+"/") {
				return &Error{Msg: fmt.Sprintf("home %s is in %s, which a Bench mounts afresh", p, d),
					Hint: "a home is made in a layer: put it where a Bench keeps what the layers hold, e.g. " + example}
			}
		}
	}
	return nil
}

// AccountArg is an account as its layer derivation's argument: name:uid:home:shell:sudo, the fields
// as passwd(5) orders them (none may hold a ':'); sudo is "sudo" or "".
func (a Account) AccountArg() string {
	sudo := ""
	if a.Sudo {
		sudo = "sudo"
	}
	return strings.Join([]string{a.Name, strconv.Itoa(a.UID), a.Home, a.Shell, sudo}, ":")
}

// LockedAccount is an account as the lock records it: what the recipe declares, every default
// filled in, so that the lock says which accounts the Workshop's layers hold.
type LockedAccount struct {
	Name  string `toml:"name"`
	UID   int    `toml:"uid"`
	GID   int    `toml:"gid"`
	Home  string `toml:"home"`
	Shell string `toml:"shell"`
	Sudo  bool   `toml:"sudo"`
}

// LockAccounts returns r's accounts as a lock records them.
func LockAccounts(r *Recipe) []LockedAccount {
	var out []LockedAccount
	for _, a := range r.Accounts {
		out = append(out, LockedAccount{Name: a.Name, UID: a.UID, GID: a.UID, Home: a.Home, Shell: a.Shell, Sudo: a.Sudo})
	}
	return out
}

// accounts checks the [[account]] tables and the top-level user.
func (c *checker) accounts(root map[string]any, top field, r *Recipe) {
	type seenAt struct {
		name string
		f    field
	}
	names, uids, homes := map[string]field{}, map[int]seenAt{}, map[string]seenAt{}
	var sudoF *field
	tables := c.tables(root, top, "account", "[[account]]")
	// Accounts without a uid get the first free one from FirstUID up, in order, skipping those given.
	explicit := map[int]bool{}
	for _, at := range tables {
		if v, ok := at.m["uid"].(int64); ok {
			explicit[int(v)] = true
		}
	}
	next := FirstUID
	for _, at := range tables {
		c.unknown(at.m, at.f, "keys in [[account]]", accountKeys)
		a := Account{Shell: DefaultShell}
		ok := true
		s, f, present := c.str(at.m, at.f, "name", `name = "user"`, true)
		switch {
		case !present:
			ok = false
		case checkAccountName(s) != nil:
			c.failErr(f, checkAccountName(s))
			ok = false
		default:
			if prev, dup := names[s]; dup {
				c.fail(f, fmt.Sprintf("duplicate account %q (also at line %d)", s, c.line(prev)), "declare each account once")
				ok = false
			}
			names[s] = f
			a.Name = s
		}
		uf := at.f.key("uid")
		if v, present := at.m["uid"]; present {
			n, isInt := v.(int64)
			switch {
			case !isInt:
				c.fail(uf, fmt.Sprintf("wrong type: %s, want an integer", typeName(v)), "write it like this: uid = 1000")
				ok = false
			case n == 0:
				c.fail(uf, "uid 0 is root's", `root is always there: user = "root" runs commands as root; an account gets a uid of its own`)
				ok = false
			case n < FirstUID || n > LastUID:
				c.fail(uf, fmt.Sprintf("uid %d is outside %d-%d", n, FirstUID, LastUID),
					fmt.Sprintf("Debian keeps uids below %d for system accounts and above %d for its own allocations and nobody: choose one from %d to %d, or leave uid out for the first free one", FirstUID, LastUID, FirstUID, LastUID))
				ok = false
			default:
				a.UID = int(n)
			}
		} else {
			for explicit[next] || uids[next].name != "" {
				next++
			}
			a.UID = next
			next++
		}
		if a.UID != 0 {
			if prev, dup := uids[a.UID]; dup && prev.name != "" {
				msg := fmt.Sprintf("uid %d is also account %q's (line %d)", a.UID, prev.name, c.line(prev.f))
				c.fail(uf, msg, "give each account a uid of its own, or leave uid out for the first free one")
				ok = false
			} else if a.Name != "" {
				uids[a.UID] = seenAt{a.Name, at.f.key("name")}
			}
		}
		a.Home = "/home/" + a.Name
		if s, f, present := c.str(at.m, at.f, "home", `home = "/home/user"`, false); present {
			if e := checkAccountPath(s, "home", "/home/"+a.Name); e != nil {
				c.failErr(f, e)
				ok = false
			} else {
				a.Home = s
			}
		}
		if prev, dup := homes[a.Home]; dup && a.Name != "" {
			c.fail(at.f.key("home"), fmt.Sprintf("home %s is also account %q's (line %d)", a.Home, prev.name, c.line(prev.f)),
				"give each account a home of its own")
			ok = false
		} else if a.Name != "" {
			homes[a.Home] = seenAt{a.Name, at.f.key("name")}
		}
		if s, f, present := c.str(at.m, at.f, "shell", `shell = "/bin/bash"`, false); present {
			if e := checkAccountPath(s, "shell", DefaultShell); e != nil {
				c.failErr(f, e)
				ok = false
			} else {
				a.Shell = s
			}
		}
		sf := at.f.key("sudo")
		if v, present := at.m["sudo"]; present {
			b, isBool := v.(bool)
			if !isBool {
				c.fail(sf, fmt.Sprintf("wrong type: %s, want true or false", typeName(v)), "write it like this: sudo = true")
				ok = false
			} else if a.Sudo = b; b && sudoF == nil {
				sudoF = &sf
			}
		}
		if ok {
			r.Accounts = append(r.Accounts, a)
		}
	}
	// Passwordless sudo is the sudo package's: on a Debian seed it must be declared like any package
	// (an OCI image may hold it already: its accounts layer checks).
	if sudoF != nil && r.Seed.Kind == "debian" && !slicesHasApt(r.Apt.Packages, "sudo") {
		c.fail(*sudoF, "sudo = true needs the sudo package, which [apt] packages does not list",
			`add "sudo" to [apt] packages: passwordless sudo is sudo's, installed like any package`)
	}
	if s, f, present := c.str(root, top, "user", `user = "user"`, false); present {
		_, declared := names[s]
		switch {
		case s == "root" || declared:
			r.User = s
		default:
			var known []string
			for n := range names {
				known = append(known, n)
			}
			hint := fmt.Sprintf(`declare it ([[account]] with name = %q) or name one that is declared, or "root"`, s)
			if g := Suggest(s, append(known, "root"), 2); len(g) > 0 {
				hint = fmt.Sprintf("did you mean %q? %s", g[0], hint)
			}
			c.fail(f, fmt.Sprintf("no account %q: root and the [[account]] tables are the Workshop's accounts", s), hint)
		}
	}
}

func slicesHasApt(ps []AptPackage, name string) bool {
	for _, p := range ps {
		if p.Name == name {
			return true
		}
	}
	return false
}
