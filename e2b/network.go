package e2b

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"toolshed.dev/shed/app"
	"toolshed.dev/shed/proxy"
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
// denied when internet access is off), or a message naming what shed does not do. Its rules (header
// transforms) are read apart: transforms at create, checkUpdateRules for an update.
func (n *networkJSON) rules(where string, internet *bool) (allow, deny []string, msg string) {
	set := func(m json.RawMessage) bool {
		s := strings.TrimSpace(string(m))
		return s != "" && s != "null" && s != "{}"
	}
	switch {
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
	c, sb, rec := s.lookup(w, r)
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
		msg = checkUpdateRules(n.Rules, "body.rules", len(rec.Inject) > 0)
	}
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

// A create's network.rules are E2B's header transforms: an object of host to a list of rules, each
// {transform: {headers: {NAME: VALUE}}}. Each header becomes an injection of the Bench's proxy
// (proxy.Injection): set, replacing what the sandbox sent, on every HTTPS request to the host that
// the rules name best (an exact host over a wildcard, the longest wildcard over the others; the
// headers of different keys are not merged), which the proxy opens with the Bench's own CA. A value
// may name the caller's secrets as ${e2b.secrets.NAME} (the SDK's Secret.fill): the proxy puts the
// value in at each request, from the supervisor's store, and masks it in the answer. The Bench holds
// neither the value nor the headers. The transforms are the Bench's for its life: an update cannot
// change them (checkUpdateRules).

// Bounds of a create's transforms: the headers in all, and one header's value.
const (
	maxInjections  = 256
	maxHeaderValue = 8 << 10
)

// transformHostRE is a DNS name, as secret's hosts are.
var transformHostRE = regexp.MustCompile(`^([a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?\.)*[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?$`)

// secretRefRE is a reference as the proxy resolves it (proxy.SecretRefs).
var secretRefRE = regexp.MustCompile(`\$\{e2b\.secrets\.([^{}]+)\}`)

// unsettable are the headers a transform may not set: the request's routing and framing are the
// proxy's (Host, hop-by-hop headers, the body's length), and Proxy-* are the proxy's own.
var unsettable = []string{"Host", "Connection", "Keep-Alive", "Content-Length", "Transfer-Encoding", "Te", "Trailer", "Upgrade"}

// transforms reads a create's network.rules (where names it in messages) as the Bench's injections,
// or says what is wrong with them.
func transforms(raw json.RawMessage, where string) ([]proxy.Injection, string) {
	if t := strings.TrimSpace(string(raw)); t == "" || t == "null" {
		return nil, ""
	}
	var hosts map[string]json.RawMessage
	if err := json.Unmarshal(raw, &hosts); err != nil {
		return nil, where + `: want an object of host to a list of rules, such as {"api.example.com": [{"transform": {"headers": {"Authorization": "Bearer ${e2b.secrets.NAME}"}}}]}`
	}
	keys := make([]string, 0, len(hosts))
	for k := range hosts {
		keys = append(keys, k)
	}
	slices.Sort(keys) // the messages, and the injections, in one order
	var out []proxy.Injection
	named := map[string]string{} // host:port as the proxy matches it, to the key that named it
	for _, key := range keys {
		at := fmt.Sprintf("%s[%q]", where, key)
		host, port, msg := transformHost(key)
		if msg != "" {
			return nil, at + ": " + msg
		}
		hp := net.JoinHostPort(host, strconv.Itoa(cmp.Or(port, 443)))
		if other, ok := named[hp]; ok {
			return nil, fmt.Sprintf("%s: the same host as %q: name it once", at, other)
		}
		named[hp] = key
		var rules []json.RawMessage
		if err := json.Unmarshal(hosts[key], &rules); err != nil || rules == nil {
			return nil, at + `: want a list of rules, such as [{"transform": {"headers": {"NAME": "VALUE"}}}]`
		}
		for i, raw := range rules {
			at := fmt.Sprintf("%s[%d]", at, i)
			rule, msg := jsonObject(raw, at, "transform")
			if msg != "" {
				return nil, msg
			}
			if rule == nil {
				return nil, at + `: want a rule, {"transform": {"headers": {"NAME": "VALUE"}}}`
			}
			tf, msg := jsonObject(rule["transform"], at+".transform", "headers")
			if msg != "" || tf == nil {
				if msg == "" {
					continue // no transform: a rule that does nothing, as E2B's
				}
				return nil, msg
			}
			at += ".transform.headers"
			var headers map[string]*string
			if t := strings.TrimSpace(string(tf["headers"])); t == "" || t == "null" {
				continue
			}
			if err := json.Unmarshal(tf["headers"], &headers); err != nil {
				return nil, at + ": want an object of header name to a string value"
			}
			names := make([]string, 0, len(headers))
			for name := range headers {
				names = append(names, name)
			}
			slices.SortFunc(names, func(a, b string) int {
				return cmp.Or(strings.Compare(http.CanonicalHeaderKey(a), http.CanonicalHeaderKey(b)), strings.Compare(a, b))
			})
			seen := map[string]string{}
			for _, name := range names {
				v := headers[name]
				if msg := checkHeader(name, v); msg != "" {
					return nil, fmt.Sprintf("%s[%q]: %s", at, name, msg)
				}
				canon := http.CanonicalHeaderKey(name)
				if other, ok := seen[canon]; ok {
					return nil, fmt.Sprintf("%s[%q]: the same header as %q", at, name, other)
				}
				seen[canon] = name
				if len(out) == maxInjections {
					return nil, fmt.Sprintf("%s: more than %d headers in all", where, maxInjections)
				}
				out = append(out, proxy.Injection{Host: host, Port: port, Header: canon, Value: *v})
			}
		}
	}
	return out, ""
}

// jsonObject reads raw as an object whose keys are among allowed: nil for null or nothing, or a
// message (naming at) for anything else.
func jsonObject(raw json.RawMessage, at string, allowed ...string) (map[string]json.RawMessage, string) {
	if t := strings.TrimSpace(string(raw)); t == "" || t == "null" {
		return nil, ""
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Sprintf("%s: want an object with %s", at, strings.Join(allowed, ", "))
	}
	for k := range m {
		if !slices.Contains(allowed, k) {
			return nil, fmt.Sprintf("%s.%s: unknown field (E2B's is %s)", at, k, strings.Join(allowed, ", "))
		}
	}
	if m == nil {
		m = map[string]json.RawMessage{}
	}
	return m, ""
}

// transformHost reads a key of network.rules: a DNS name, "*.NAME" (NAME's subdomains, at any
// depth), or an IP address, with ":PORT" if not 443 (port 0). Canonical: lower case, an IP as netip
// writes it.
func transformHost(key string) (host string, port int, msg string) {
	h := strings.ToLower(strings.TrimSpace(key))
	if hh, p, err := net.SplitHostPort(h); err == nil {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return "", 0, fmt.Sprintf("port %q: 1 to 65535", p)
		}
		h, port = hh, n
		if port == 443 {
			port = 0
		}
	}
	switch {
	case h == "":
		return "", 0, "an empty host: name the host whose requests get the headers"
	case h == "*" || h == "*.":
		return "", 0, "a bare * would send the headers (and the secrets they name) to every host: name the host (api.example.com), or its subdomains (*.example.com)"
	case strings.Contains(h, "/"):
		return "", 0, "a CIDR block: a transform names a host (api.example.com, *.example.com, or an IP address), whose HTTPS requests the proxy opens to set the headers"
	}
	if a, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")); err == nil {
		if a.Zone() != "" {
			return "", 0, "an IP address with a zone: name the address alone"
		}
		return a.Unmap().String(), port, ""
	}
	name, wild := strings.CutPrefix(h, "*.")
	if !transformHostRE.MatchString(name) {
		return "", 0, "not a host: a DNS name (api.example.com), *.NAME for its subdomains, or an IP address, with :PORT if not 443"
	}
	if wild {
		return "*." + name, port, ""
	}
	return name, port, ""
}

// checkHeader says what is wrong with a transform's header, or "".
func checkHeader(name string, value *string) string {
	switch {
	case !headerToken(name):
		return "not a header name (letters, digits and !#$%&'*+-.^_`|~)"
	case slices.ContainsFunc(unsettable, func(u string) bool { return strings.EqualFold(u, name) }) || strings.HasPrefix(strings.ToLower(name), "proxy-"):
		return "not a header a transform may set: the request's routing and framing are the proxy's"
	case value == nil:
		return "want a string value"
	case len(*value) > maxHeaderValue:
		return fmt.Sprintf("a value of %d bytes, at most %d", len(*value), maxHeaderValue)
	case strings.ContainsFunc(*value, func(r rune) bool { return r < 0x20 || r == 0x7f }):
		return "the value holds a control character (a line break?)"
	}
	// A reference the proxy would not resolve must not go out as it is.
	if rest := secretRefRE.ReplaceAllString(*value, ""); strings.Contains(rest, "${e2b.") {
		return "the value holds a ${e2b.…} reference that is not ${e2b.secrets.NAME} (the SDK's Secret.fill(NAME)): only secrets are resolved here"
	}
	return ""
}

func headerToken(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range []byte(s) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// checkUpdateRules says why an update's rules are refused, or "": rules are set at create and stay
// for the sandbox's life (its proxy's injections are fixed when its Bench starts), so an update may
// leave them out (they stay) or give none ({}) to a sandbox made without any.
func checkUpdateRules(raw json.RawMessage, where string, has bool) string {
	t := strings.TrimSpace(string(raw))
	if t == "" || t == "null" {
		return ""
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err == nil && len(m) == 0 {
		if !has {
			return ""
		}
		return where + ": {} would clear the sandbox's header transforms, but here they are set at create (Sandbox.create's network.rules) and stay for the sandbox's life: leave rules out of the update to keep them, or make a new sandbox without them"
	}
	return where + ": header transforms are not supported in an update: here they are set at create (Sandbox.create's network.rules) and stay for the sandbox's life, as its proxy's injections are fixed when its Bench starts; leave rules out of the update (the create's stay), or make a new sandbox with the rules it needs"
}
