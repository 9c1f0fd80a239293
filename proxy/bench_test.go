package proxy_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"toolshed.dev/shed/proxy"
)

// benchGet fetches url with each client in turn, b.N times, and reports both throughputs and their ratio:
// interleaving keeps the two measurements under the same load on a shared machine.
func benchGet(b *testing.B, url string, direct, via *http.Client) {
	get := func(c *http.Client) time.Duration {
		start := time.Now()
		resp, err := c.Get(url)
		if err != nil {
			b.Fatal(err)
		}
		n, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil || n != bigSize {
			b.Fatalf("got %d bytes, %v", n, err)
		}
		return time.Since(start)
	}
	get(direct) // warm up connections and the upstream
	get(via)
	var dDirect, dVia time.Duration
	n := 0
	for b.Loop() {
		dDirect += get(direct)
		dVia += get(via)
		n++
	}
	mbps := func(d time.Duration) float64 { return float64(n) * bigSize / 1e6 / d.Seconds() }
	b.ReportMetric(mbps(dDirect), "direct-MB/s")
	b.ReportMetric(mbps(dVia), "proxy-MB/s")
	b.ReportMetric(mbps(dVia)/mbps(dDirect), "proxy/direct")
}

// BenchmarkGet50MB: a 50 MB plain-HTTP download through the proxy against the same download direct.
func BenchmarkGet50MB(b *testing.B) {
	up := newUpstream(b, false)
	host, port := hostPort(b, up.URL)
	px := start(b, proxy.Config{Allow: []proxy.Rule{{Host: host, Port: port}}, AllowPrivate: true, Log: func(proxy.Decision) {}})
	direct, via := &http.Client{Transport: &http.Transport{}}, clientVia(px.url, nil)
	defer direct.CloseIdleConnections()
	defer via.CloseIdleConnections()
	benchGet(b, up.URL+"/big", direct, via)
}

// BenchmarkConnect50MB: the same over HTTPS, direct against through a CONNECT tunnel (TLS on both).
func BenchmarkConnect50MB(b *testing.B) {
	up := newUpstream(b, true)
	host, port := hostPort(b, up.URL)
	px := start(b, proxy.Config{Allow: []proxy.Rule{{Host: host, Port: port}}, AllowPrivate: true, Log: func(proxy.Decision) {}})
	tlsConfig := up.Client().Transport.(*http.Transport).TLSClientConfig
	direct, via := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsConfig}}, clientVia(px.url, tlsConfig)
	defer direct.CloseIdleConnections()
	defer via.CloseIdleConnections()
	benchGet(b, up.URL+"/big", direct, via)
}

// BenchmarkBrokered: the same small HTTPS request through the proxy, brokered (the CONNECT
// terminated with the sandbox's CA, the placeholder replaced, a TLS connection of the proxy's own to
// the server) against unbrokered (a tunnel, the client sending the real token end to end),
// interleaved. new-conn opens a connection per request (as a curl per call does: every handshake
// counted); keep-alive reuses one. Reported: each one's median and the median added by brokering.
func BenchmarkBrokered(b *testing.B) {
	for _, keep := range []bool{false, true} {
		name := "new-conn"
		if keep {
			name = "keep-alive"
		}
		b.Run(name, func(b *testing.B) {
			up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get("Authorization") != "Bearer "+brokerValue {
					http.Error(w, "no", http.StatusUnauthorized)
					return
				}
				io.WriteString(w, "ok")
			}))
			// An ECDSA certificate, as the proxy's are: the same handshake cost both ways (httptest's
			// own is RSA, whose handshake alone would make the tunnel look slower).
			up.TLS = &tls.Config{Certificates: []tls.Certificate{ecdsaCert(b)}}
			up.StartTLS()
			defer up.Close()
			host, port := hostPort(b, up.URL)
			allow := []proxy.Rule{{Host: host, Port: port}}
			ca, err := proxy.NewCA("bench")
			if err != nil {
				b.Fatal(err)
			}
			roots := x509.NewCertPool()
			roots.AddCert(must(x509.ParseCertificate(up.TLS.Certificates[0].Certificate[0])))
			cred := &proxy.Credential{Value: []byte(brokerValue), Hosts: allow, Place: proxy.Place{Header: "Authorization", Template: "Bearer {}"}}
			plain := start(b, proxy.Config{Allow: allow, AllowPrivate: true, Log: func(proxy.Decision) {}})
			brokered := start(b, proxy.Config{Allow: allow, AllowPrivate: true, Log: func(proxy.Decision) {}, Broker: &proxy.Broker{
				CA: ca, Roots: roots, Secrets: []proxy.Brokered{{Name: "tok", Placeholder: brokerPH}},
				Lookup: func(string) (*proxy.Credential, error) { return cred, nil },
			}})
			caPool := x509.NewCertPool()
			caPool.AppendCertsFromPEM(ca.PEM())
			client := func(px *running, pool *x509.CertPool) *http.Client {
				return &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(px.url), TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: !keep}}
			}
			cPlain, cBroker := client(plain, roots), client(brokered, caPool)
			defer cPlain.CloseIdleConnections()
			defer cBroker.CloseIdleConnections()
			get := func(c *http.Client, token string) time.Duration {
				req, _ := http.NewRequest("GET", up.URL+"/", nil)
				req.Header.Set("Authorization", "Bearer "+token)
				t0 := time.Now()
				resp, err := c.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					b.Fatalf("status %d", resp.StatusCode)
				}
				return time.Since(t0)
			}
			get(cPlain, brokerValue)
			get(cBroker, brokerPH)
			var dp, db []time.Duration
			for b.Loop() {
				dp = append(dp, get(cPlain, brokerValue))
				db = append(db, get(cBroker, brokerPH))
			}
			med := func(d []time.Duration) float64 {
				slices.Sort(d)
				return float64(d[len(d)/2].Microseconds()) / 1000
			}
			mp, mb := med(dp), med(db)
			b.ReportMetric(mp, "unbrokered-ms")
			b.ReportMetric(mb, "brokered-ms")
			b.ReportMetric(mb-mp, "added-ms")
		})
	}
}

// ecdsaCert is a self-signed P-256 certificate for 127.0.0.1.
func ecdsaCert(b *testing.B) tls.Certificate {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, IsCA: true, BasicConstraintsValid: true,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		b.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
