package e2b

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	"toolshed.dev/shed/proxy"
)

// TestTransforms: create's network.rules become the proxy's injections (host canonical, 443 as 0,
// header names canonical, values as given); malformed shapes, unknown fields, a bare *, a CIDR
// block, a header that is no token or is the proxy's, a control character, an unresolvable ${e2b.}
// reference and the same host or header twice are refused with the field named.
func TestTransforms(t *testing.T) {
	got, msg := transforms(json.RawMessage(`{
		"API.example.com": [{"transform": {"headers": {"authorization": "Bearer ${e2b.secrets.tok}", "X-Two": "${e2b.secrets.a}:${e2b.secrets.b}"}}}, {}, {"transform": null}, {"transform": {}}],
		"*.example.org:8443": [{"transform": {"headers": {"X-Key": "k"}}}],
		"198.51.100.2:443": [{"transform": {"headers": {"X-Ip": "v"}}}],
		"[2001:db8::1]": [],
		"empty.example": []
	}`), "network.rules")
	want := []proxy.Injection{
		{Host: "*.example.org", Port: 8443, Header: "X-Key", Value: "k"},
		{Host: "198.51.100.2", Header: "X-Ip", Value: "v"},
		{Host: "api.example.com", Header: "Authorization", Value: "Bearer ${e2b.secrets.tok}"},
		{Host: "api.example.com", Header: "X-Two", Value: "${e2b.secrets.a}:${e2b.secrets.b}"},
	}
	if msg != "" || !slices.Equal(got, want) {
		t.Errorf("transforms: %v %q\nwant %v", got, msg, want)
	}
	for _, empty := range []string{``, `null`, `{}`} {
		if got, msg := transforms(json.RawMessage(empty), "network.rules"); got != nil || msg != "" {
			t.Errorf("rules %q: %v %q, want none", empty, got, msg)
		}
	}
	rule := func(host, headers string) string {
		return `{"` + host + `": [{"transform": {"headers": ` + headers + `}}]}`
	}
	for _, c := range []struct{ rules, want string }{
		{`[]`, "network.rules: want an object of host"},
		{`{"a.example": {"transform": {}}}`, `network.rules["a.example"]: want a list of rules`},
		{`{"a.example": null}`, `network.rules["a.example"]: want a list of rules`},
		{`{"a.example": [null]}`, `network.rules["a.example"][0]: want a rule`},
		{`{"a.example": ["x"]}`, `network.rules["a.example"][0]: want an object with transform`},
		{`{"a.example": [{"transform": {"headers": {"A": "b"}}, "match": "/x"}]}`, `network.rules["a.example"][0].match: unknown field`},
		{`{"a.example": [{"transform": {"headers": {"A": "b"}, "body": "x"}}]}`, `network.rules["a.example"][0].transform.body: unknown field`},
		{`{"a.example": [{"transform": "x"}]}`, `network.rules["a.example"][0].transform: want an object with headers`},
		{`{"a.example": [{"transform": {"headers": ["A"]}}]}`, `network.rules["a.example"][0].transform.headers: want an object of header name`},
		{`{"a.example": [{"transform": {"headers": {"A": 1}}}]}`, `transform.headers: want an object of header name to a string value`},
		{rule("a.example", `{"A": null}`), `["A"]: want a string value`},
		{rule("*", `{"A": "b"}`), `network.rules["*"]: a bare * would send`},
		{rule("", `{"A": "b"}`), `network.rules[""]: an empty host`},
		{rule("10.0.0.0/8", `{"A": "b"}`), `network.rules["10.0.0.0/8"]: a CIDR block`},
		{rule("a b", `{"A": "b"}`), `network.rules["a b"]: not a host`},
		{rule("a.*.example", `{"A": "b"}`), `not a host`},
		{rule("a.example:0", `{"A": "b"}`), `port "0": 1 to 65535`},
		{rule("fe80::1%eth0", `{"A": "b"}`), `an IP address with a zone`},
		{`{"a.example": [], "A.example:443": []}`, `network.rules["a.example"]: the same host as "A.example:443"`},
		{rule("a.example", `{"Bad Name": "b"}`), `["Bad Name"]: not a header name`},
		{rule("a.example", `{"": "b"}`), `[""]: not a header name`},
		{rule("a.example", `{"host": "b"}`), `["host"]: not a header a transform may set`},
		{rule("a.example", `{"Proxy-Authorization": "b"}`), `["Proxy-Authorization"]: not a header a transform may set`},
		{rule("a.example", `{"Content-Length": "1"}`), `not a header a transform may set`},
		{rule("a.example", `{"Transfer-Encoding": "chunked"}`), `not a header a transform may set`},
		{rule("a.example", `{"A": "b\r\nHost: evil"}`), `["A"]: the value holds a control character`},
		{rule("a.example", `{"A": "b\u0000"}`), `control character`},
		{rule("a.example", `{"A": "${e2b.iam.tokens.aws}"}`), `not ${e2b.secrets.NAME}`},
		{rule("a.example", `{"A": "${e2b.secrets.}"}`), `not ${e2b.secrets.NAME}`},
		{rule("a.example", `{"X-A": "1", "x-a": "2"}`), `the same header as`},
		{rule("a.example", `{"A": "`+strings.Repeat("x", maxHeaderValue+1)+`"}`), `at most 8192`},
	} {
		got, msg := transforms(json.RawMessage(c.rules), "network.rules")
		if got != nil || !strings.Contains(msg, c.want) {
			t.Errorf("rules %.80s: %v %q, want a refusal with %q", c.rules, got, msg, c.want)
		}
	}
	var many strings.Builder
	many.WriteString(`{"a.example": [{"transform": {"headers": {`)
	for i := range maxInjections + 1 {
		if i > 0 {
			many.WriteString(",")
		}
		many.WriteString(`"X-` + strings.Repeat("a", i+1) + `": "v"`)
	}
	many.WriteString(`}}}]}`)
	if _, msg := transforms(json.RawMessage(many.String()), "network.rules"); !strings.Contains(msg, "more than 256 headers") {
		t.Errorf("%d headers: %q", maxInjections+1, msg)
	}
}

// TestUpdateRules: an update may leave rules out, or give none to a sandbox made without any;
// anything else is refused, saying that rules are set at create.
func TestUpdateRules(t *testing.T) {
	for _, c := range []struct {
		rules string
		has   bool
		want  string
	}{
		{``, true, ""}, {`null`, true, ""}, {`{}`, false, ""}, {` { } `, false, ""},
		{`{}`, true, "body.rules: {} would clear the sandbox's header transforms, but here they are set at create"},
		{`{"a.example":[{"transform":{"headers":{"A":"b"}}}]}`, false, "body.rules: header transforms are not supported in an update: here they are set at create (Sandbox.create's network.rules)"},
		{`{"a.example":[]}`, true, "set at create"},
		{`[]`, false, "set at create"},
	} {
		if msg := checkUpdateRules(json.RawMessage(c.rules), "body.rules", c.has); (c.want == "") != (msg == "") || !strings.Contains(msg, c.want) {
			t.Errorf("update rules %q (transforms at create: %v): %q, want %q", c.rules, c.has, msg, c.want)
		}
	}
}

// TestSecretsAPI: E2B's secrets endpoints over the supervisor's store, as the key's user: create
// (201, E2B's Secret, never the value; a name taken is 409, a bad one 400), list a page at a time by
// name (X-Next-Token), get by id and by name, update (a new version, metadata replaced only when
// given), delete (204, then 404), and the refusals in E2B's shape.
func TestSecretsAPI(t *testing.T) {
	hs, key, _ := server(t)
	const value = "value-that-never-comes-back"
	var first secretJSON
	for i, name := range []string{"Beta-Token", "alpha", "gamma"} {
		body := `{"name":"` + name + `","value":"` + value + `"` + map[bool]string{true: `,"metadata":{"team":"x"}`}[i == 0] + `}`
		status, out := do(t, hs, "POST", "/secrets", key, body)
		if status != 201 || strings.Contains(out, value) {
			t.Fatalf("create %s: %d %s", name, status, out)
		}
		var s secretJSON
		if err := json.Unmarshal([]byte(out), &s); err != nil || !strings.HasPrefix(s.SecretID, "sec_") || s.CurrentVersion != 1 || s.Metadata == nil || s.CreatedAt.IsZero() {
			t.Fatalf("create %s: %v %s", name, err, out)
		}
		if i == 0 {
			first = s
			if s.Name != "beta-token" || s.Metadata["team"] != "x" {
				t.Errorf("create: %s, want the name lower-cased and the metadata", out)
			}
		} else if !strings.Contains(out, `"metadata":{}`) {
			t.Errorf("create without metadata: %s, want metadata {}", out)
		}
	}
	// Pages of one, by name.
	var names []string
	next := ""
	for range 5 {
		req, _ := http.NewRequest("GET", hs.URL+"/secrets?limit=1&nextToken="+next, nil)
		req.Header.Set("X-API-Key", key)
		resp, err := hs.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var page []secretJSON
		json.NewDecoder(resp.Body).Decode(&page)
		resp.Body.Close()
		for _, s := range page {
			names = append(names, s.Name)
		}
		if next = resp.Header.Get("X-Next-Token"); next == "" {
			break
		}
	}
	if !slices.Equal(names, []string{"alpha", "beta-token", "gamma"}) {
		t.Errorf("list by pages of 1: %v", names)
	}
	if status, out := do(t, hs, "GET", "/secrets", key, ""); status != 200 || strings.Count(out, "secretID") != 3 || strings.Contains(out, value) {
		t.Errorf("list: %d %s", status, out)
	}
	for _, ref := range []string{first.SecretID, "beta-token", "BETA-TOKEN"} {
		if status, out := do(t, hs, "GET", "/secrets/"+ref, key, ""); status != 200 || !strings.Contains(out, `"secretID":"`+first.SecretID+`"`) || strings.Contains(out, value) {
			t.Errorf("get %s: %d %s", ref, status, out)
		}
	}
	status, out := do(t, hs, "POST", "/secrets/"+first.SecretID, key, `{"value":"new-value"}`)
	if status != 200 || !strings.Contains(out, `"currentVersion":2`) || !strings.Contains(out, `"metadata":{"team":"x"}`) || strings.Contains(out, "new-value") {
		t.Errorf("update without metadata: %d %s, want version 2 and the metadata kept", status, out)
	}
	status, out = do(t, hs, "POST", "/secrets/beta-token", key, `{"value":"newer","metadata":{"k":"v"}}`)
	if status != 200 || !strings.Contains(out, `"currentVersion":3`) || !strings.Contains(out, `"metadata":{"k":"v"}`) {
		t.Errorf("update with metadata: %d %s", status, out)
	}
	if status, out := do(t, hs, "DELETE", "/secrets/"+first.SecretID, key, ""); status != 204 || out != "" {
		t.Errorf("delete: %d %s", status, out)
	}
	tooMany := map[string]string{}
	for i := range maxSecretMetadata + 1 {
		tooMany[strings.Repeat("k", i+1)] = "v"
	}
	manyJSON, _ := json.Marshal(tooMany)
	for _, c := range []struct {
		name, method, path, key, body string
		status                        int
		want                          string
	}{
		{"no key", "GET", "/secrets", "", "", 401, "E2B_API_KEY"},
		{"no key create", "POST", "/secrets", "", `{"name":"x","value":"y"}`, 401, "E2B_API_KEY"},
		{"taken", "POST", "/secrets", key, `{"name":"Alpha","value":"y"}`, 409, `secret \"alpha\" exists already`},
		{"bad name", "POST", "/secrets", key, `{"name":"a b","value":"y"}`, 400, "secret name"},
		{"reserved prefix", "POST", "/secrets", key, `{"name":"sec_x","value":"y"}`, 400, "sec_"},
		{"no name", "POST", "/secrets", key, `{"value":"y"}`, 400, "name: required"},
		{"no value", "POST", "/secrets", key, `{"name":"x"}`, 400, "value: required"},
		{"empty value", "POST", "/secrets", key, `{"name":"x","value":""}`, 400, "value: required"},
		{"a line break", "POST", "/secrets", key, `{"name":"x","value":"a\nb"}`, 400, "control character"},
		{"value not a string", "POST", "/secrets", key, `{"name":"x","value":7}`, 400, "body:"},
		{"unknown field", "POST", "/secrets", key, `{"name":"x","value":"y","hosts":["a"]}`, 400, `unknown field \"hosts\"`},
		{"metadata too many", "POST", "/secrets", key, `{"name":"x","value":"y","metadata":` + string(manyJSON) + `}`, 400, "33 entries, at most 32"},
		{"metadata key too long", "POST", "/secrets", key, `{"name":"x","value":"y","metadata":{"` + strings.Repeat("k", 129) + `":"v"}}`, 400, "at most 128"},
		{"bad json", "POST", "/secrets", key, `{"name":`, 400, "body:"},
		{"get gone", "GET", "/secrets/beta-token", key, "", 404, "not found"},
		{"get unknown id", "GET", "/secrets/sec_000000000000000000000000", key, "", 404, "not found"},
		{"update gone", "POST", "/secrets/beta-token", key, `{"value":"v"}`, 404, "no such secret"},
		{"update without value", "POST", "/secrets/alpha", key, `{}`, 400, "value: required"},
		{"delete gone", "DELETE", "/secrets/" + first.SecretID, key, "", 404, "no such secret"},
		{"bad limit", "GET", "/secrets?limit=0", key, "", 400, "from 1 to 100"},
		{"forged nextToken", "GET", "/secrets?nextToken=%21", key, "", 400, "X-Next-Token"},
		{"other method", "PUT", "/secrets/alpha", key, "{}", 404, "no route"},
	} {
		status, out := do(t, hs, c.method, c.path, c.key, c.body)
		var e apiError
		if status != c.status || !strings.Contains(out, c.want) || json.Unmarshal([]byte(out), &e) != nil || e.Code != status {
			t.Errorf("%s: %d %s, want %d with %q in E2B's error", c.name, status, out, c.status, c.want)
		}
	}
	if status, out := do(t, hs, "GET", "/secrets", key, ""); status != 200 || strings.Count(out, "secretID") != 2 {
		t.Errorf("list after: %d %s, want alpha and gamma", status, out)
	}
}
