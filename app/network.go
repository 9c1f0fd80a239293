package app

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"toolshed.dev/shed/bench"
)

func init() {
	op("bench.set_network", (*Service).SetNetwork)
	op("bench.network", (*Service).Network)
}

// SetNetworkRequest replaces a running Bench's network rules: E2B's allowOut and denyOut, within the
// recipe's network profile (which stays the upper bound). No entries: the profile alone.
type SetNetworkRequest struct {
	Bench string   `json:"bench"`           // the Bench, by name or id
	Allow []string `json:"allow,omitempty"` // IP addresses, CIDR blocks, names, *.names, 0.0.0.0/0: taken over deny
	Deny  []string `json:"deny,omitempty"`  // the same; 0.0.0.0/0 denies everything allow does not name
}

// NetworkResult is a Bench's network rules after a change, and how many open connections it cut.
type NetworkResult struct {
	Bench string   `json:"bench"`
	ID    string   `json:"id"`
	Allow []string `json:"allow"`
	Deny  []string `json:"deny"`
	Cut   int      `json:"cut"` // tunnels and requests in flight that the new rules ended
}

// SetNetwork replaces the network rules of a running Bench, all or nothing: malformed entries, more
// than proxy.MaxFilterEntries, or an allow entry outside the recipe's profile are refused and the old
// rules stay. The new rules apply to the next connection and cut those open that they deny.
func (s *Service) SetNetwork(ctx context.Context, c *Call, req *SetNetworkRequest) (*NetworkResult, error) {
	rules, err := bench.NetworkRules(req.Allow, req.Deny)
	if err != nil {
		return nil, err
	}
	st, rec, err := s.runningBench(c, req.Bench)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	n, err := bench.SetNetwork(rec.ID, rules)
	if errors.Is(err, bench.ErrNotHere) {
		return nil, fail(CodeFailed, fmt.Errorf("bench %s: %w", rec.Name, err),
			"a Bench of `shed bench run` without the supervisor has its rules from its launch: launch it through `shed daemon`")
	}
	if err != nil {
		return nil, err
	}
	// Its record keeps them: a Bench launched again (a resume after a restart, a reset) gets them.
	if rec.Disk {
		if err := bench.RecordNetwork(st, rec.ID, rules); err != nil {
			return nil, err
		}
	}
	res := &NetworkResult{Bench: rec.Name, ID: rec.ID, Allow: []string{}, Deny: []string{}, Cut: n}
	if rules != nil {
		res.Allow, res.Deny = append(res.Allow, rules.Allow...), append(res.Deny, rules.Deny...)
	}
	return res, nil
}

// Network returns the network rules in force in a running Bench (none: its profile alone).
func (s *Service) Network(ctx context.Context, c *Call, req *BenchRequest) (*NetworkResult, error) {
	st, rec, err := s.runningBench(c, req.Bench)
	if err != nil {
		return nil, err
	}
	st.Close()
	rules, ok := bench.Network(rec.ID)
	if !ok {
		return nil, fail(CodeFailed, fmt.Errorf("bench %s: %w", rec.Name, bench.ErrNotHere),
			"a Bench of `shed bench run` without the supervisor has its rules from its launch: launch it through `shed daemon`")
	}
	res := &NetworkResult{Bench: rec.Name, ID: rec.ID, Allow: []string{}, Deny: []string{}}
	if rules != nil {
		res.Allow, res.Deny = append(res.Allow, rules.Allow...), append(res.Deny, rules.Deny...)
	}
	return res, nil
}

// netSummary is what an audit entry says of network rules: a few entries and the counts (an update
// may hold a thousand).
func netSummary(allow, deny []string) string {
	list := func(name string, l []string) string {
		if len(l) > 4 {
			return fmt.Sprintf("%s %s and %d more", name, strings.Join(l[:4], " "), len(l)-4)
		}
		return name + " " + strings.Join(l, " ")
	}
	var parts []string
	if len(allow) > 0 {
		parts = append(parts, list("allow", allow))
	}
	if len(deny) > 0 {
		parts = append(parts, list("deny", deny))
	}
	if len(parts) == 0 {
		return "network: the profile alone"
	}
	s := "network: " + strings.Join(parts, "; ")
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return s
}
