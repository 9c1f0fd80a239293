package bench

import (
	"errors"
	"fmt"
	"sync"

	"toolshed.dev/shed/proxy"
)

// ErrNetworkRules marks network rules that are refused (malformed, too many, or outside the recipe's
// network profile): nothing changed.
var ErrNetworkRules = errors.New("network rules refused")

// ErrNotHere is returned for a Bench that runs in another process than the one asked (a `shed bench
// run` without the supervisor): only the process that serves its proxy can change its rules.
var ErrNotHere = errors.New("the bench's network is served by another process")

// liveNet is a running Bench's network: the profile (its recipe's allowlist, the upper bound), the rules
// in force within it, and its proxy (nil when the Bench has none: --net none, or a profile of nothing).
type liveNet struct {
	mu      sync.Mutex
	profile []proxy.Rule
	rules   *proxy.Filter
	px      *proxy.Proxy
}

// nets are the Benches of this process by id, while they run.
var nets sync.Map // string -> *liveNet

// NetworkRules parses allow and deny entries (proxy.ParseFilter) into rules for Options.Rules and
// SetNetwork; an error wraps ErrNetworkRules. No entries: nil, the profile alone.
func NetworkRules(allow, deny []string) (*proxy.Filter, error) {
	if len(allow) == 0 && len(deny) == 0 {
		return nil, nil
	}
	f, err := proxy.ParseFilter(allow, deny)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNetworkRules, err)
	}
	return f, nil
}

// within checks f against a profile; its error wraps ErrNetworkRules.
func within(f *proxy.Filter, profile []proxy.Rule) error {
	if err := f.Within(profile); err != nil {
		return fmt.Errorf("%w: %w", ErrNetworkRules, err)
	}
	return nil
}

// SetNetwork replaces the network rules of the running Bench id (nil: none, the profile alone), all
// or nothing: rules outside its profile are refused and the old ones stay. The new rules apply to the
// next connection; connections open that they no longer allow are cut (the count is returned).
func SetNetwork(id string, f *proxy.Filter) (int, error) {
	v, ok := nets.Load(id)
	if !ok {
		return 0, ErrNotHere
	}
	n := v.(*liveNet)
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := within(f, n.profile); err != nil {
		return 0, err
	}
	n.rules = f
	if n.px == nil {
		return 0, nil
	}
	return n.px.SetFilter(f), nil
}

// Network returns the rules in force in the running Bench id (nil: none), and false if it does not
// run in this process.
func Network(id string) (*proxy.Filter, bool) {
	v, ok := nets.Load(id)
	if !ok {
		return nil, false
	}
	n := v.(*liveNet)
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.rules, true
}
