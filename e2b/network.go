package e2b

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"

	"toolshed.dev/shed/app"
)

// networkJSON is E2B's SandboxNetworkConfig (create's network) and SandboxNetworkUpdateConfig (the
// body of PUT /sandboxes/{id}/network, which also carries allow_internet_access).
type networkJSON struct {
	AllowOut            []string        `json:"allowOut"`
	DenyOut             []string        `json:"denyOut"`
	Rules               json.RawMessage `json:"rules"`
	EgressProxy         json.RawMessage `json:"egressProxy"`
	AllowPublicTraffic  *bool           `json:"allowPublicTraffic"`
	MaskRequestHost     *string         `json:"maskRequestHost"`
	AllowInternetAccess *bool           `json:"allow_internet_access"`
}

var networkKeys = []string{"allowOut", "denyOut", "rules", "egressProxy", "allowPublicTraffic", "maskRequestHost", "allow_internet_access"}

// parseNetwork reads a network object; where names it in messages ("network" at create, "body" for an
// update). A key E2B does not define is refused rather than ignored: a rule the caller believes in
// force must not be dropped silently.
func parseNetwork(raw json.RawMessage, where string) (*networkJSON, string) {
	n := &networkJSON{}
	if s := strings.TrimSpace(string(raw)); s == "" || s == "null" {
		return n, ""
	}
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(raw, &keys); err != nil {
		return nil, fmt.Sprintf("%s: want an object with allowOut and denyOut: %v", where, err)
	}
	for k := range keys {
		if !slices.Contains(networkKeys, k) {
			return nil, fmt.Sprintf("%s.%s: unknown field (E2B's are %s)", where, k, strings.Join(networkKeys, ", "))
		}
	}
	if err := json.Unmarshal(raw, n); err != nil {
		return nil, fmt.Sprintf("%s: allowOut and denyOut are lists of strings: %v", where, err)
	}
	return n, ""
}

// rules is what a network object asks of the Bench's proxy: allow and deny entries (allTraffic
// denied when internet access is off), or a message naming what shed does not do.
func (n *networkJSON) rules(where string, internet *bool) (allow, deny []string, msg string) {
	set := func(m json.RawMessage) bool {
		s := strings.TrimSpace(string(m))
		return s != "" && s != "null" && s != "{}"
	}
	switch {
	case set(n.Rules):
		return nil, nil, where + ".rules: header transforms are not supported: a secret injected on the way out would pass through shed's proxy, which relays TLS without opening it; give the Bench what it needs another way"
	case set(n.EgressProxy):
		return nil, nil, where + ".egressProxy: tunneling through a SOCKS5 proxy is not supported: the Bench's traffic leaves through shed's own proxy, within the Workshop's network profile"
	case n.MaskRequestHost != nil:
		// Create takes both out first (ports.go): here they are an update's.
		return nil, nil, where + ".maskRequestHost is set at create only (the sandbox's ports keep it)"
	case n.AllowPublicTraffic != nil && !*n.AllowPublicTraffic:
		return nil, nil, where + ".allowPublicTraffic: false is set at create only (its trafficAccessToken is create's answer)"
	}
	if internet == nil {
		internet = n.AllowInternetAccess
	}
	deny = n.DenyOut
	if internet != nil && !*internet {
		// E2B: the same as denyOut 0.0.0.0/0.
		deny = append(slices.Clone(deny), "0.0.0.0/0")
	}
	return n.AllowOut, deny, ""
}

// updateNetwork is PUT /sandboxes/{id}/network: the egress rules replaced, all or nothing (a field
// left out is cleared, as E2B does), always within the Workshop's network profile.
func (s *Server) updateNetwork(w http.ResponseWriter, r *http.Request) {
	c, sb, _ := s.lookup(w, r)
	if sb == nil {
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil || len(body) > maxBody {
		writeError(w, http.StatusBadRequest, "body: at most %d bytes of JSON", maxBody)
		return
	}
	n, msg := parseNetwork(body, "body")
	if msg == "" {
		var allow, deny []string
		if allow, deny, msg = n.rules("body", nil); msg == "" {
			_, err := s.Service.Do(r.Context(), &app.Call{Caller: c}, "bench.set_network", &app.SetNetworkRequest{Bench: sb.bench, Allow: allow, Deny: deny})
			if err != nil {
				writeAppError(w, err)
				return
			}
			w.WriteHeader(http.StatusNoContent)
			return
		}
	}
	writeError(w, http.StatusBadRequest, "%s", msg)
}

// sandboxDetail is E2B's SandboxDetail: the sandbox and its network rules in force.
type sandboxDetail struct {
	sandboxJSON
	Network *networkInfo `json:"network,omitempty"`
}

type networkInfo struct {
	AllowOut []string `json:"allowOut"`
	DenyOut  []string `json:"denyOut"`
}

// detail adds the Bench's network rules (bench.network) to what describe says; rules that cannot be
// read (the Bench ended meanwhile) are left out rather than failing the info.
func (s *Server) detail(r *http.Request, c *app.Caller, sb *sandbox, out sandboxJSON) sandboxDetail {
	d := sandboxDetail{sandboxJSON: out}
	if res, err := s.Service.Do(r.Context(), &app.Call{Caller: c}, "bench.network", &app.BenchRequest{Bench: sb.bench}); err == nil {
		n := res.(*app.NetworkResult)
		d.Network = &networkInfo{AllowOut: n.Allow, DenyOut: n.Deny}
	}
	return d
}
