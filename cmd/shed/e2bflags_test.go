//go:build !shed_lean

package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestE2BDomain(t *testing.T) {
	for _, c := range []struct {
		flag string
		port int
		tls  bool
		want string
	}{
		{"", 49982, false, "localhost:49982"},
		{"", 443, true, "localhost"},
		{"", 80, false, "localhost"},
		{"", 443, false, "localhost:443"},
		{"e2b.localhost", 443, true, "e2b.localhost"},
		{"sandboxes.example.com:8443", 8443, true, "sandboxes.example.com:8443"},
	} {
		if got, err := e2bDomain(c.flag, c.port, c.tls); err != nil || got != c.want {
			t.Errorf("%q %d %v: %q %v, want %q", c.flag, c.port, c.tls, got, err, c.want)
		}
	}
	for _, bad := range []string{"a b", "x/y", "h:0", "h:99999", "h:port", ":80", "user@h"} {
		if _, err := e2bDomain(bad, 49982, false); err == nil || !strings.Contains(err.Error(), "--e2b-domain") {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

// TestE2BTLSFlagErrors: the TLS pair's mistakes stop the daemon before it serves, with what to do.
func TestE2BTLSFlagErrors(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the daemon's flags are read after its root check")
	}
	dir := t.TempDir()
	junk := filepath.Join(dir, "junk.pem")
	os.WriteFile(junk, []byte("not a certificate"), 0o600)
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"--e2b", "127.0.0.1:0", "--e2b-tls-cert", junk}, []string{"go together"}},
		{[]string{"--e2b-tls-cert", junk, "--e2b-tls-key", junk}, []string{"name the address too"}},
		{[]string{"--e2b", "127.0.0.1:0", "--e2b-tls-cert", junk, "--e2b-tls-key", junk}, []string{"--e2b-tls-cert " + junk, "PEM", "openssl req"}},
		{[]string{"--e2b", "127.0.0.1:0", "--e2b-domain", "a b"}, []string{`--e2b-domain "a b"`}},
	} {
		var out, errb bytes.Buffer
		args := append([]string{"shed", "--root", filepath.Join(dir, "none"), "daemon", "--socket", filepath.Join(dir, "s.sock")}, c.args...)
		code := run(args, &out, &errb)
		for _, w := range c.want {
			if code == 0 || !strings.Contains(errb.String(), w) {
				t.Errorf("%q: exit %d, %q, want %q", c.args, code, errb.String(), w)
			}
		}
		if _, err := os.Stat(filepath.Join(dir, "s.sock")); err == nil {
			t.Errorf("%q: the daemon listened", c.args)
		}
	}
}
