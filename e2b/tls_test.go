package e2b

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"net/http"
	"testing"
	"time"
)

// TestTLS: with a certificate the address is served over TLS: /health, a port's name (here a
// sandbox that is not running: E2B's 502), and a loopback client is still known by its uid through
// the TLS layer (a secure-false sandbox's request from root gets past the token's check).
func TestTLS(t *testing.T) {
	s, key, _ := newServer(t)
	k, _ := s.Keys.Lookup(key)
	s.add(&sandbox{id: "tools-open", bench: "no-such-bench", user: "nobody", keyID: k.ID, token: "t1", files: make(chan struct{}, 1)})
	priv, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "e2b.localhost"},
		DNSNames: []string{"e2b.localhost", "*.e2b.localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &priv.PublicKey, priv)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	s.TLS = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: priv}}, NextProtos: []string{"http/1.1"}}
	s.Domain = "e2b.localhost"
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-done })
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	url := "https://" + ln.Addr().String()
	for _, c := range []struct {
		host, path string
		hdr        map[string]string
		want       int
	}{
		{"", "/health", nil, http.StatusNoContent},
		{"3000-gone.e2b.localhost", "/", nil, http.StatusBadGateway},
		{"", "/files?path=/x", map[string]string{"E2b-Sandbox-Id": "tools-open"}, http.StatusForbidden},
	} {
		req, _ := http.NewRequest("GET", url+c.path, nil)
		if c.host != "" {
			req.Host = c.host
		}
		for k, v := range c.hdr {
			req.Header.Set(k, v)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", c.host, c.path, err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want || resp.TLS == nil {
			t.Errorf("%s %s: %s (tls %v), want %d", c.host, c.path, resp.Status, resp.TLS != nil, c.want)
		}
	}
	// Plain HTTP to the TLS address is not served.
	if resp, err := http.Get("http://" + ln.Addr().String() + "/health"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusNoContent {
			t.Error("plain HTTP answered on the TLS address")
		}
	}
}
