package proxy_test

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"

	"toolshed.dev/shed/proxy"
)

const (
	brokerValue = "sk-live-7f3a9c1e5b2d4f6a8c0e"
	brokerPH    = "shed-secret-00112233445566778899aabbccddeeff"
	queryPH     = "shed-secret-ffeeddccbbaa99887766554433221100"
	basicPH     = "shed-secret-0123456789abcdef0123456789abcdef"
)

// seen records every request a server got, whole: the replay check reads it.
type seen struct {
	mu  sync.Mutex
	all bytes.Buffer
}

func (s *seen) add(r *http.Request) []byte {
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	defer s.mu.Unlock()
	r.Header.Write(&s.all)
	s.all.WriteString(r.URL.String() + "\n")
	s.all.Write(body)
	return body
}

func (s *seen) holds(b string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return bytes.Contains(s.all.Bytes(), []byte(b))
}

// secretForms are the value and the forms of it an exfiltration might use.
func secretForms(v string) []string {
	return []string{v, base64.StdEncoding.EncodeToString([]byte(v)), hex.EncodeToString([]byte(v))}
}

type brokerFixture struct {
	px        *running
	api       *httptest.Server // requires the real token
	attacker  *httptest.Server // an allowed HTTPS host without secrets: records what it gets
	plain     *httptest.Server // an allowed plain-HTTP host: records what it gets
	apiSeen   *seen
	attSeen   *seen
	plainSeen *seen
	client    *http.Client
	creds     sync.Map // name -> *proxy.Credential; Delete revokes
}

func newBrokerFixture(t *testing.T, inject []proxy.Injection) *brokerFixture {
	f := &brokerFixture{apiSeen: &seen{}, attSeen: &seen{}, plainSeen: &seen{}}
	f.api = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body := f.apiSeen.add(r)
		switch r.URL.Path {
		case "/api":
			if r.Header.Get("Authorization") != "Bearer "+brokerValue {
				http.Error(w, "401 bad token", http.StatusUnauthorized)
				return
			}
			io.WriteString(w, "welcome")
		case "/query":
			if r.URL.Query().Get("key") != brokerValue {
				http.Error(w, "bad key", http.StatusUnauthorized)
				return
			}
			io.WriteString(w, "query ok")
		case "/basic":
			if u, p, _ := r.BasicAuth(); u != "x-token" || p != brokerValue {
				http.Error(w, "bad basic", http.StatusUnauthorized)
				return
			}
			io.WriteString(w, "basic ok")
		case "/injected":
			if r.Header.Get("X-Api-Key") != "key "+brokerValue {
				http.Error(w, "bad injected", http.StatusUnauthorized)
				return
			}
			io.WriteString(w, "injected ok")
		case "/echo":
			// A server that shows what it got: the answer must not carry the value back.
			w.Header().Set("X-Echo", r.Header.Get("Authorization"))
			r.Header.Write(w)
			w.Write(body)
		}
	}))
	f.attacker = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { f.attSeen.add(r) }))
	f.plain = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { f.plainSeen.add(r) }))
	t.Cleanup(f.api.Close)
	t.Cleanup(f.attacker.Close)
	t.Cleanup(f.plain.Close)
	apiHost, apiPort := hostPort(t, f.api.URL)
	bound := []proxy.Rule{{Host: apiHost, Port: apiPort}}
	f.creds.Store("tok", &proxy.Credential{Value: []byte(brokerValue), Hosts: bound, Place: proxy.Place{Header: "Authorization", Template: "Bearer {}"}})
	f.creds.Store("q", &proxy.Credential{Value: []byte(brokerValue), Hosts: bound, Place: proxy.Place{Query: "key"}})
	f.creds.Store("b", &proxy.Credential{Value: []byte(brokerValue), Hosts: bound, Place: proxy.Place{Basic: true}})
	f.creds.Store("unbound", &proxy.Credential{Value: []byte(brokerValue)})
	ca, err := proxy.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(f.api.Certificate())
	for i := range inject {
		inject[i].Host, inject[i].Port = apiHost, apiPort
	}
	var allow []proxy.Rule
	for _, s := range []*httptest.Server{f.api, f.attacker, f.plain} {
		h, p := hostPort(t, s.URL)
		allow = append(allow, proxy.Rule{Host: h, Port: p})
	}
	f.px = start(t, proxy.Config{Allow: allow, AllowPrivate: true, Broker: &proxy.Broker{
		CA:      ca,
		Secrets: []proxy.Brokered{{Name: "tok", Placeholder: brokerPH}, {Name: "q", Placeholder: queryPH}, {Name: "b", Placeholder: basicPH}},
		Inject:  inject,
		Roots:   roots,
		Lookup: func(name string) (*proxy.Credential, error) {
			c, ok := f.creds.Load(name)
			if !ok {
				return nil, nil
			}
			return c.(*proxy.Credential), nil
		},
	}})
	// The sandbox trusts its CA, and the attacker's own certificate (a host it reaches end to end).
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.PEM())
	pool.AddCert(f.attacker.Certificate())
	f.client = clientVia(f.px.url, &tls.Config{RootCAs: pool})
	return f
}

func (f *brokerFixture) do(t *testing.T, method, url, auth, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := f.client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var h strings.Builder
	resp.Header.Write(&h)
	return resp.StatusCode, h.String() + string(b)
}

// checkNoValue fails if anything the sandbox got, or a host other than the bound one, holds the value.
func (f *brokerFixture) checkNoValue(t *testing.T, what string, got ...string) {
	t.Helper()
	for _, form := range secretForms(brokerValue) {
		for _, g := range got {
			if strings.Contains(g, form) {
				t.Errorf("%s: the sandbox got the secret (%q) back: %q", what, form, g)
			}
		}
		if f.attSeen.holds(form) || f.plainSeen.holds(form) {
			t.Errorf("%s: another host than the bound one got the secret (%q)", what, form)
		}
	}
}

func TestBrokerHeader(t *testing.T) {
	f := newBrokerFixture(t, nil)
	code, body := f.do(t, "GET", f.api.URL+"/api", "Bearer "+brokerPH, "")
	if code != 200 || !strings.HasSuffix(body, "welcome") {
		t.Fatalf("brokered request: %d %q", code, body)
	}
	// Without the placeholder the server sees no token: nothing is added where none was asked for.
	if code, _ := f.do(t, "GET", f.api.URL+"/api", "Bearer guess", ""); code != 401 {
		t.Errorf("request without the placeholder: %d, want 401", code)
	}
	// An echoing server gets the value and the sandbox does not get it back.
	code, body = f.do(t, "POST", f.api.URL+"/echo", "Bearer "+brokerPH, "body "+brokerPH)
	if code != 200 || !strings.Contains(body, "Bearer ***") {
		t.Fatalf("echo: %d %q", code, body)
	}
	// The placeholder in a body is not replaced (headers only, as the operator said nothing else).
	if !f.apiSeen.holds("body " + brokerPH) {
		t.Error("the body's placeholder was changed on its way to the bound host")
	}
	f.checkNoValue(t, "echo", body)
	ds := f.px.rec.wait(t, 3) // the CONNECT is still open: the client keeps it
	for _, d := range ds {
		if !d.Brokered || !d.Allowed {
			t.Errorf("decision %+v: want brokered and allowed", d)
		}
	}
}

func TestBrokerPlaces(t *testing.T) {
	f := newBrokerFixture(t, []proxy.Injection{{Header: "X-Api-Key", Value: "key ${e2b.secrets.unbound}"}})
	for _, c := range []struct{ url, auth, want string }{
		{f.api.URL + "/query?key=" + queryPH + "&x=1", "", "query ok"},
		{strings.Replace(f.api.URL, "https://", "https://x-token:"+basicPH+"@", 1) + "/basic", "", "basic ok"},
		{f.api.URL + "/injected", "", "injected ok"},
	} {
		code, body := f.do(t, "GET", c.url, c.auth, "")
		if code != 200 || !strings.HasSuffix(body, c.want) {
			t.Errorf("GET %s: %d %q, want 200 %q", c.url, code, body, c.want)
		}
		f.checkNoValue(t, c.url, body)
	}
	// A placeholder at another place than its secret's is not replaced.
	if code, _ := f.do(t, "GET", f.api.URL+"/query?other="+queryPH+"&key=x", "", ""); code != 401 {
		t.Errorf("placeholder in another parameter: %d, want 401", code)
	}
}

func TestBrokerRefusals(t *testing.T) {
	f := newBrokerFixture(t, nil)
	// To an allowed plain-HTTP host: refused, and the host gets nothing.
	code, body := f.do(t, "GET", f.plain.URL+"/steal", "Bearer "+brokerPH, "")
	if code != 403 || !strings.Contains(body, "secret tok: secrets go over https only") {
		t.Errorf("placeholder over plain http: %d %q", code, body)
	}
	// In a body to that host: stopped before the placeholder leaves.
	code, body = f.do(t, "POST", f.plain.URL+"/steal", "", strings.Repeat("a", 100<<10)+brokerPH+"tail")
	if code != 403 {
		t.Errorf("placeholder in a body over plain http: %d %q", code, body)
	}
	if f.plainSeen.holds(brokerPH) || f.plainSeen.holds(brokerPH[:len(brokerPH)-1]) {
		t.Error("the plain host got the placeholder of a body")
	}
	// To an HTTPS host without secrets: an end-to-end tunnel; the host gets the placeholder, worthless.
	if code, _ := f.do(t, "GET", f.attacker.URL+"/replay", "Bearer "+brokerPH, ""); code != 200 {
		t.Errorf("tunnel to the attacker host: %d", code)
	}
	if !f.attSeen.holds(brokerPH) {
		t.Error("the attacker host did not get the placeholder: the test did not reach it")
	}
	// Inside the bound host's tunnel, a Host header naming another host is refused.
	req, _ := http.NewRequest("GET", f.api.URL+"/api", nil)
	req.Host = "attacker.example"
	req.Header.Set("Authorization", "Bearer "+brokerPH)
	resp, err := f.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMisdirectedRequest {
		t.Errorf("another Host inside the tunnel: %d, want 421", resp.StatusCode)
	}
	// Revoked while the sandbox runs: refused at the next request, on a connection already open.
	if code, _ := f.do(t, "GET", f.api.URL+"/api", "Bearer "+brokerPH, ""); code != 200 {
		t.Fatalf("before revoking: %d", code)
	}
	f.creds.Delete("tok")
	code, body = f.do(t, "GET", f.api.URL+"/api", "Bearer "+brokerPH, "")
	if code != 403 || !strings.Contains(body, "secret tok: revoked") {
		t.Errorf("after revoking: %d %q", code, body)
	}
	f.checkNoValue(t, "refusals")
	var refused []proxy.Decision
	f.px.rec.mu.Lock()
	ds := append([]proxy.Decision(nil), f.px.rec.ds...)
	f.px.rec.mu.Unlock()
	for _, d := range ds {
		if d.Secret != "" {
			refused = append(refused, d)
			if d.Allowed || d.Reason == "" {
				t.Errorf("refusal %+v: want refused with a reason", d)
			}
		}
	}
	if len(refused) != 3 {
		t.Errorf("%d refusals name a secret, want 3: %+v", len(refused), refused)
	}
}

// TestBrokerImpostor: a bound host whose certificate the proxy's roots do not trust (an impostor: a
// DNS answer or a path the attacker controls) never gets the request, nor the value.
func TestBrokerImpostor(t *testing.T) {
	var got seen
	imp := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got.add(r) }))
	defer imp.Close()
	host, port := hostPort(t, imp.URL)
	bound := []proxy.Rule{{Host: host, Port: port}}
	ca, _ := proxy.NewCA("test")
	cred := &proxy.Credential{Value: []byte(brokerValue), Hosts: bound, Place: proxy.Place{Header: "Authorization", Template: "Bearer {}"}}
	px := start(t, proxy.Config{Allow: bound, AllowPrivate: true, Broker: &proxy.Broker{
		CA: ca, Roots: x509.NewCertPool(), Secrets: []proxy.Brokered{{Name: "tok", Placeholder: brokerPH}},
		Lookup: func(string) (*proxy.Credential, error) { return cred, nil },
	}})
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.PEM())
	req, _ := http.NewRequest("GET", imp.URL+"/", nil)
	req.Header.Set("Authorization", "Bearer "+brokerPH)
	client := clientVia(px.url, &tls.Config{RootCAs: pool})
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway {
		t.Errorf("an untrusted bound host: %d, want 502", resp.StatusCode)
	}
	if got.holds("GET") {
		t.Errorf("the impostor got the request: %s", got.all.String())
	}
	// The GET's decision, and the CONNECT's, written when its tunnel ends: closed here, so that both
	// are there whichever the proxy writes first (CI once saw the CONNECT's before a wait for one).
	client.CloseIdleConnections()
	ds := px.rec.wait(t, 2)
	i := slices.IndexFunc(ds, func(d proxy.Decision) bool { return d.Method == "GET" })
	if i < 0 {
		t.Fatalf("no decision of the GET: %+v", ds)
	}
	if d := ds[i]; d.Allowed || !strings.Contains(d.Reason, "certificate") || strings.Contains(d.Reason, brokerValue) {
		t.Errorf("decision: %+v", d)
	}
}

// TestBrokerMaskForms: a value with characters that URLs and base64 change comes back in none of the
// forms the request carried it in: basic auth echoed, a query string kept by a redirect, a trailer, a
// value stored by one request and read by another that carries none.
func TestBrokerMaskForms(t *testing.T) {
	const value = "ab/cd+ef==x"
	var stored string
	up := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/basic":
			w.Header().Set("X-Echo", r.Header.Get("Authorization"))
		case "/redirect":
			w.Header().Set("Location", "/next/?"+r.URL.RawQuery)
			w.WriteHeader(http.StatusMovedPermanently)
		case "/trailer":
			w.Header().Set("Trailer", "X-T")
			io.WriteString(w, "body")
			w.Header().Set("X-T", r.Header.Get("Authorization"))
		case "/store":
			stored = r.URL.Query().Get("key")
		case "/read":
			io.WriteString(w, "stored: "+stored)
		}
	}))
	defer up.Close()
	host, port := hostPort(t, up.URL)
	bound := []proxy.Rule{{Host: host, Port: port}}
	creds := map[string]*proxy.Credential{
		"b": {Value: []byte(value), Hosts: bound, Place: proxy.Place{Basic: true}},
		"q": {Value: []byte(value), Hosts: bound, Place: proxy.Place{Query: "key"}},
		"h": {Value: []byte(value), Hosts: bound, Place: proxy.Place{Header: "Authorization", Template: "Bearer {}"}},
	}
	ca, _ := proxy.NewCA("test")
	roots := x509.NewCertPool()
	roots.AddCert(up.Certificate())
	px := start(t, proxy.Config{Allow: bound, AllowPrivate: true, Broker: &proxy.Broker{
		CA: ca, Roots: roots,
		Secrets: []proxy.Brokered{{Name: "b", Placeholder: basicPH}, {Name: "q", Placeholder: queryPH}, {Name: "h", Placeholder: brokerPH}},
		Lookup:  func(n string) (*proxy.Credential, error) { return creds[n], nil },
	}})
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.PEM())
	tr := &http.Transport{Proxy: http.ProxyURL(px.url), TLSClientConfig: &tls.Config{RootCAs: pool}}
	client := &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	get := func(path, auth string) string {
		req, _ := http.NewRequest("GET", up.URL+path, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var all strings.Builder
		io.Copy(&all, resp.Body)
		resp.Header.Write(&all)
		resp.Trailer.Write(&all)
		return all.String()
	}
	got := []string{
		get("/basic", "Basic "+base64.StdEncoding.EncodeToString([]byte("x-token:"+basicPH))),
		get("/redirect?a=1&key="+queryPH+"&z=2", ""),
		get("/trailer", "Bearer "+brokerPH),
	}
	get("/store?key="+queryPH, "")
	got = append(got, get("/read", ""))
	if !strings.Contains(got[1], "a=1&key=") || !strings.Contains(got[1], "&z=2") {
		t.Errorf("the query's order changed: %q", got[1])
	}
	if stored != value {
		t.Fatalf("the server stored %q, want the value: the query was not brokered", stored)
	}
	for i, g := range got {
		for _, form := range []string{value, url.QueryEscape(value), base64.StdEncoding.EncodeToString([]byte("x-token:" + value)), base64.StdEncoding.EncodeToString([]byte(value))} {
			if strings.Contains(g, form) {
				t.Errorf("answer %d carries the value as %q: %q", i, form, g)
			}
		}
	}
}
