package proxy

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Filter narrows what a Proxy lets through, within its allowlist (the recipe's network profile): the
// per-sandbox egress rules of E2B's allowOut and denyOut. An entry is an IP address, a CIDR block, a
// DNS name, a wildcard name ("*.example.com": its subdomains, not the name itself), or the all-traffic
// selector ("0.0.0.0/0" or "::/0": every address, of either family).
//
// A destination passes when its name is allowed, or, address by address, when the address is allowed
// or not denied: allow takes precedence over deny, and what neither list names passes (E2B's default).
// A Filter never widens the allowlist: the Proxy checks the allowlist first.
type Filter struct {
	Allow []string // the entries as given, for display
	Deny  []string
	allow matcher
	deny  matcher
}

// MaxFilterEntries bounds each list of a Filter: a sandbox names its destinations, it does not ship a
// blocklist of the internet (the checks are linear, and a list past this is a caller's mistake).
const MaxFilterEntries = 1024

// RuleError is a refused entry of a Filter: which list, which entry, why.
type RuleError struct {
	List  string // "allow" or "deny"
	Index int
	Entry string
	Msg   string
}

func (e *RuleError) Error() string {
	return fmt.Sprintf("%s entry %d (%q): %s", e.List, e.Index, e.Entry, e.Msg)
}

// ErrTooManyRules is returned by ParseFilter for a list longer than MaxFilterEntries.
var ErrTooManyRules = errors.New("too many network rules")

type matcher struct {
	all      bool
	names    map[string]bool
	suffixes []string // ".example.com" for "*.example.com"
	nets     []netip.Prefix
}

// name reports whether the matcher names host (canonical: lowercased, or an IP literal).
func (m *matcher) name(host string) bool {
	if m.all || m.names[host] {
		return true
	}
	for _, s := range m.suffixes {
		if strings.HasSuffix(host, s) {
			return true
		}
	}
	return false
}

func (m *matcher) addr(a netip.Addr) bool {
	if m.all {
		return true
	}
	a = a.WithZone("").Unmap()
	for _, p := range m.nets {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

func (m *matcher) add(list string, i int, s string) error {
	bad := func(msg string) error { return &RuleError{List: list, Index: i, Entry: s, Msg: msg} }
	switch {
	case s == "":
		return bad("empty: write an IP address, a CIDR block, or a domain name")
	case s == "0.0.0.0/0" || s == "::/0":
		m.all = true
		return nil
	case strings.Contains(s, "/"):
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return bad("malformed CIDR block: write it as 8.8.8.0/24 or 2001:db8::/32")
		}
		if p.Addr().Is4In6() {
			return bad("IPv4-mapped CIDR block: write the IPv4 block itself")
		}
		m.nets = append(m.nets, p.Masked())
		return nil
	}
	if a, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")); err == nil {
		if a.Zone() != "" {
			return bad("zoned addresses are not supported")
		}
		a = a.Unmap()
		m.nets = append(m.nets, netip.PrefixFrom(a, a.BitLen()))
		return nil
	}
	h := strings.ToLower(s)
	if rest, ok := strings.CutPrefix(h, "*."); ok {
		if err := checkName(rest); err != nil || strings.ContainsAny(rest, "*?") {
			return bad("malformed wildcard name: write *.example.com")
		}
		m.suffixes = append(m.suffixes, "."+rest)
		return nil
	}
	if strings.ContainsAny(h, "*?") {
		return bad("a wildcard goes only at the start, as *.example.com")
	}
	if strings.Contains(h, ":") {
		return bad("not an address, a CIDR block or a name (a rule names no port: the recipe's network profile decides ports)")
	}
	if err := checkName(h); err != nil {
		return bad(err.Error())
	}
	if m.names == nil {
		m.names = map[string]bool{}
	}
	m.names[h] = true
	return nil
}

// ParseFilter checks allow and deny entries and returns the Filter they make. The first bad entry is
// the error (a *RuleError, or ErrTooManyRules), and no Filter is made.
func ParseFilter(allow, deny []string) (*Filter, error) {
	f := &Filter{Allow: slices.Clone(allow), Deny: slices.Clone(deny)}
	for _, l := range []struct {
		name    string
		entries []string
		m       *matcher
	}{{"allow", allow, &f.allow}, {"deny", deny, &f.deny}} {
		if len(l.entries) > MaxFilterEntries {
			return nil, fmt.Errorf("%w: %d %s entries, at most %d: name blocks (8.8.8.0/24) or the all-traffic selector (0.0.0.0/0) instead of their addresses",
				ErrTooManyRules, len(l.entries), l.name, MaxFilterEntries)
		}
		for i, s := range l.entries {
			if err := l.m.add(l.name, i, s); err != nil {
				return nil, err
			}
		}
	}
	return f, nil
}

// Empty reports whether f restricts nothing.
func (f *Filter) Empty() bool { return f == nil || len(f.Allow) == 0 && len(f.Deny) == 0 }

// Within checks that every allow entry names some destination of the allowlist rules (a recipe's
// network profile): a name or wildcard must match one of its names, an address or block must hold one
// of its IP literals; the all-traffic selector stands for the whole allowlist. An entry that names
// nothing of it is refused: it could only be meant to reach what the recipe does not allow. (Deny
// entries only narrow, so any is accepted.) What an entry allows is always cut to the allowlist.
func (f *Filter) Within(rules []Rule) error {
	if f == nil {
		return nil
	}
	var hosts []string
	for _, r := range rules {
		if h, err := ruleHost(r.Host); err == nil {
			hosts = append(hosts, h)
		}
	}
	for i, s := range f.Allow {
		var m matcher
		_ = m.add("allow", i, s) // parsed already
		if m.all || slices.ContainsFunc(hosts, func(h string) bool {
			a, err := netip.ParseAddr(h)
			if err == nil {
				return m.addr(a)
			}
			return m.name(h)
		}) {
			continue
		}
		return &RuleError{List: "allow", Index: i, Entry: s, Msg: fmt.Sprintf(
			"outside the recipe's network profile, which allows %s: a Bench's rules can only narrow its recipe's network (an operator widens the recipe's [network] allow)",
			profileText(rules))}
	}
	return nil
}

// profileText names an allowlist in an error, shortly.
func profileText(rules []Rule) string {
	if len(rules) == 0 {
		return "nothing"
	}
	var s []string
	for i, r := range rules {
		if i == 8 {
			s = append(s, fmt.Sprintf("and %d more", len(rules)-i))
			break
		}
		h := r.Host
		if strings.Contains(h, ":") {
			h = "[" + h + "]"
		}
		if r.Port != 0 {
			h += fmt.Sprintf(":%d", r.Port)
		}
		s = append(s, h)
	}
	return strings.Join(s, ", ")
}

// refusesName reports whether f refuses host whatever its addresses: no lookup is needed to refuse it.
func (f *Filter) refusesName(host string) bool {
	if f == nil || f.allow.all || f.allow.name(host) || len(f.allow.nets) > 0 {
		return false
	}
	return f.deny.name(host)
}

// pass returns the addresses of host that f lets through (all of them for a nil Filter).
func (f *Filter) pass(host string, addrs []netip.Addr) []netip.Addr {
	if f == nil || f.allow.name(host) {
		return addrs
	}
	denied := f.deny.name(host)
	var out []netip.Addr
	for _, a := range addrs {
		if f.allow.addr(a) || !denied && !f.deny.addr(a) {
			out = append(out, a)
		}
	}
	return out
}

// errCut ends an exchange that a new Filter no longer allows.
var errCut = errors.New("cut: the sandbox's network rules no longer allow it")

// exchange is a tunnel or a forwarded request in flight: what SetFilter checks against the new rules.
type exchange struct {
	host  string
	addrs []netip.Addr // the addresses it may be connected to
	cut   func()
}

// Filter returns the Filter in force (nil: none).
func (p *Proxy) Filter() *Filter { return p.filter.Load() }

// SetFilter puts f in force (nil: none) for the next connection, and cuts the tunnels and forwarded
// requests in flight that f no longer lets through: their clients see the connection close. It returns
// how many it cut. Call f.Within(allowlist) first: SetFilter does not check it.
func (p *Proxy) SetFilter(f *Filter) int {
	p.activeMu.Lock()
	p.filter.Store(f)
	n := 0
	for ex := range p.active {
		if len(f.pass(ex.host, ex.addrs)) < len(ex.addrs) {
			ex.cut()
			delete(p.active, ex)
			n++
		}
	}
	servers := slices.Collect(func(yield func(*server) bool) {
		for s := range p.servers {
			if !yield(s) {
				return
			}
		}
	})
	p.activeMu.Unlock()
	// An idle pooled connection may lead to an address now denied: the next request dials anew.
	for _, s := range servers {
		s.transport.CloseIdleConnections()
	}
	return n
}

// begin registers ex, unless the Filter in force (which may have changed since the request was
// checked) refuses it; end removes it. Under one lock with SetFilter, so that an exchange is either
// seen by an update or checked against its rules.
func (p *Proxy) begin(ex *exchange) bool {
	p.activeMu.Lock()
	defer p.activeMu.Unlock()
	if len(p.filter.Load().pass(ex.host, ex.addrs)) < len(ex.addrs) {
		return false
	}
	if p.active == nil {
		p.active = map[*exchange]struct{}{}
	}
	p.active[ex] = struct{}{}
	return true
}

func (p *Proxy) end(ex *exchange) {
	p.activeMu.Lock()
	defer p.activeMu.Unlock()
	delete(p.active, ex)
}
