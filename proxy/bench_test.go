package proxy_test

import (
	"io"
	"net/http"
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
