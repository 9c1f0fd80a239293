package secret_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"toolshed.dev/shed/secret"
)

func TestStore(t *testing.T) {
	root := t.TempDir()
	st := secret.Open(root)
	value := []byte("sk-the-value-1234")
	h, _ := secret.ParseHost("API.example.com")
	p, err := secret.ParsePlace("header:authorization: Bearer {}")
	if err != nil || p.Header != "Authorization" || p.Template != "Bearer {}" {
		t.Fatalf("ParsePlace: %+v %v", p, err)
	}
	sec, err := st.Add(secret.Secret{Name: "gh-token", Hosts: []secret.Host{h}, Place: p, Owner: "alice"}, value, false)
	if err != nil || sec.Env != "GH_TOKEN" || sec.Version != 1 || !strings.HasPrefix(sec.ID, "sec_") {
		t.Fatalf("Add: %+v %v", sec, err)
	}
	for path, mode := range map[string]os.FileMode{st.Dir(): 0o700 | os.ModeDir, filepath.Join(st.Dir(), "gh-token"): 0o600} {
		if fi, err := os.Stat(path); err != nil || fi.Mode() != mode {
			t.Errorf("%s: %v %v, want %v", path, fi.Mode(), err, mode)
		}
	}
	if _, err := st.Add(secret.Secret{Name: "gh-token"}, value, false); !errors.Is(err, secret.ErrExist) {
		t.Errorf("Add again: %v", err)
	}
	all, _ := st.List()
	b, _ := json.Marshal(all)
	if len(all) != 1 || strings.Contains(string(b), "sk-the-value") || strings.Contains(string(b), "value") {
		t.Errorf("List holds the value: %s", b)
	}
	byID, v, err := st.Value(sec.ID)
	if err != nil || string(v) != string(value) || byID.Name != "gh-token" || !byID.Hosts[0].Matches("api.example.com", 443) {
		t.Errorf("Value by id: %+v %q %v", byID, v, err)
	}
	up, err := st.Update("GH-TOKEN", []byte("new"), map[string]string{"k": "v"})
	if err != nil || up.Version != 2 || up.ID != sec.ID || up.Metadata["k"] != "v" || up.Owner != "alice" {
		t.Errorf("Update: %+v %v", up, err)
	}
	if _, err := st.Remove("gh-token"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.Value("gh-token"); !errors.Is(err, secret.ErrNotFound) {
		t.Errorf("after Remove: %v", err)
	}
}

func TestRefused(t *testing.T) {
	st := secret.Open(t.TempDir())
	for _, c := range []struct {
		sec   secret.Secret
		value string
	}{
		{secret.Secret{Name: "Upper"}, "v"},
		{secret.Secret{Name: "../escape"}, "v"},
		{secret.Secret{Name: "sec_123"}, "v"},
		{secret.Secret{Name: "ok"}, ""},
		{secret.Secret{Name: "ok"}, "line\r\nX-Injected: 1"},
		{secret.Secret{Name: "ok"}, strings.Repeat("a", secret.MaxValue+1)},
		{secret.Secret{Name: "ok", Env: "1BAD"}, "v"},
		{secret.Secret{Name: "ok", Hosts: []secret.Host{{Name: "a.example"}}}, "v"},
	} {
		if _, err := st.Add(c.sec, []byte(c.value), false); err == nil {
			t.Errorf("Add(%+v, %q) succeeded", c.sec, c.value)
		}
	}
	for _, p := range []string{"header:Authorization: Bearer", "header:Authorization: {} {}", "header:Host: {}", "header:Proxy-Authorization: {}", "header:Bad Name: {}", "query:", "query:a&b", "basic:x", "cookie:x"} {
		if _, err := secret.ParsePlace(p); err == nil {
			t.Errorf("ParsePlace(%q) succeeded", p)
		}
	}
	for _, h := range []string{"", "a b", "host:0", "host:99999", "-x.example", "fe80::1%eth0"} {
		if _, err := secret.ParseHost(h); err == nil {
			t.Errorf("ParseHost(%q) succeeded", h)
		}
	}
	if h, err := secret.ParseHost("[::ffff:198.51.100.2]:8443"); err != nil || h.Name != "198.51.100.2" || h.Port != 8443 {
		t.Errorf("ParseHost of a mapped v6 literal: %+v %v", h, err)
	}
}
