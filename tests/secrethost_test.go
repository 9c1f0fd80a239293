package tests

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// secretHosts are two hosts outside this machine's network as far as a Bench can tell, in a network
// namespace of the test's behind a veth pair: the API, at 198.51.100.N+1, which answers only a
// request that carries the real token, and the attacker, at 198.51.100.N+2, an allowed host that
// records whatever it gets (the replay check). Both serve HTTPS on 443 with certificates of a CA of
// the test's (CAFile: what the supervisor is told to trust, as SSL_CERT_FILE); the attacker serves
// plain HTTP on 80 too. Each test gets its own /29, so tests using them may run in parallel.
type secretHosts struct {
	API, Attacker string // their addresses
	CAFile        string // the test CA's certificate, PEM
	Token         string // the value the API wants: "Authorization: Bearer TOKEN", or ?key=TOKEN

	mu       sync.Mutex
	apiGot   bytes.Buffer // every request the API got, whole
	attGot   bytes.Buffer // every request the attacker got, whole
	apiCalls atomic.Int32
}

var secretNets atomic.Int32

// startSecretHosts makes the hosts, with token as the API's real token.
func startSecretHosts(t *testing.T, token string) *secretHosts {
	t.Helper()
	n := int(secretNets.Add(1))
	if n > 30 {
		t.Fatal("more than 30 secret hosts in one run")
	}
	base := 8 * (n + 1) // 198.51.100.16/29 and up: startTestHost has .0/30
	h := &secretHosts{Token: token, API: fmt.Sprintf("198.51.100.%d", base+2), Attacker: fmt.Sprintf("198.51.100.%d", base+3)}
	ns := fmt.Sprintf("shedsec-%d-%d", os.Getpid(), n)
	veth := fmt.Sprintf("shs%d", (os.Getpid()*10+n)%100000)
	peer := fmt.Sprintf("shq%d", (os.Getpid()*10+n)%100000)
	script := fmt.Sprintf(`ip netns add %[1]s
ip link add %[2]s type veth peer name %[3]s
ip link set %[3]s netns %[1]s
ip addr add 198.51.100.%[4]d/29 dev %[2]s
ip link set %[2]s up
ip -n %[1]s addr add %[5]s/29 dev %[3]s
ip -n %[1]s addr add %[6]s/29 dev %[3]s
ip -n %[1]s link set %[3]s up
ip -n %[1]s link set lo up`, ns, veth, peer, base+1, h.API, h.Attacker)
	if out, err := exec.Command("sh", "-ec", script).CombinedOutput(); err != nil {
		t.Fatalf("make the secret hosts: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		exec.Command("ip", "netns", "del", ns).Run()
		exec.Command("ip", "link", "del", veth).Run()
	})

	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "shed tests' API CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	h.CAFile = filepath.Join(t.TempDir(), "api-ca.pem")
	writeFile(t, h.CAFile, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})))
	cert := func(ip string) tls.Certificate {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: ip},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
			IPAddresses: []net.IP{net.ParseIP(ip)}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	}
	record := func(buf *bytes.Buffer, r *http.Request) []byte {
		body, _ := io.ReadAll(r.Body)
		h.mu.Lock()
		defer h.mu.Unlock()
		fmt.Fprintf(buf, "%s %s %s\n", r.Method, r.Host, r.URL.RequestURI())
		r.Header.Write(buf)
		buf.Write(body)
		buf.WriteString("\n")
		return body
	}
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body := record(&h.apiGot, r)
		h.apiCalls.Add(1)
		auth := r.Header.Get("Authorization") == "Bearer "+token || r.URL.Query().Get("key") == token
		switch {
		case r.URL.Path == "/echo":
			// A server that shows what it got: the Bench must not get the value back from it.
			w.Header().Set("X-Echo-Authorization", r.Header.Get("Authorization"))
			fmt.Fprintf(w, "%s %s\n", r.Method, r.URL.RequestURI())
			r.Header.Write(w)
			w.Write(body)
		case !auth:
			http.Error(w, "401: the API wants its token", http.StatusUnauthorized)
		default:
			io.WriteString(w, "welcome to the API\n")
		}
	})
	attacker := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		record(&h.attGot, r)
		io.WriteString(w, "thanks\n")
	})
	serve := func(addr string, handler http.Handler, c *tls.Certificate) {
		l := listenInNetns(t, ns, addr)
		srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
		if c != nil {
			srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{*c}}
			go srv.ServeTLS(l, "", "")
		} else {
			go srv.Serve(l)
		}
		t.Cleanup(func() { srv.Close() })
	}
	apiCert, attCert := cert(h.API), cert(h.Attacker)
	serve(h.API+":443", api, &apiCert)
	serve(h.Attacker+":443", attacker, &attCert)
	serve(h.Attacker+":80", attacker, nil)
	return h
}

// listenInNetns listens on addr inside the named network namespace: the socket stays there, served
// from this process.
func listenInNetns(t *testing.T, ns, addr string) net.Listener {
	t.Helper()
	type res struct {
		l   net.Listener
		err error
	}
	ch := make(chan res, 1)
	go func() {
		// The thread goes into the namespace and back before it is given back to the runtime.
		// Never let it end locked instead: a thread's end delivers Pdeathsig to every process it
		// started (dieWithTests), and this thread may have started another test's supervisor.
		runtime.LockOSThread()
		self, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			ch <- res{nil, err}
			return
		}
		defer unix.Close(self)
		fd, err := unix.Open("/run/netns/"+ns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			ch <- res{nil, err}
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- res{nil, err}
			return
		}
		l, err := net.Listen("tcp", addr)
		if unix.Setns(self, unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		} else {
			// Stuck in the namespace: this thread must end with the goroutine. Rare, and then
			// the run may lose a helper process; say so.
			err = errors.Join(err, errors.New("could not return to the test's network namespace"))
		}
		ch <- res{l, err}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatalf("listen on %s in %s: %v", addr, ns, r.err)
	}
	return r.l
}

// apiSaw and attackerSaw are everything each host got.
func (h *secretHosts) apiSaw() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.apiGot.String()
}

func (h *secretHosts) attackerSaw() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.attGot.String()
}

// secretForms are a value and the forms of it an exfiltration might use: base64 (padded, unpadded,
// URL-safe) and hex (both cases).
func secretForms(v string) map[string]string {
	b := []byte(v)
	return map[string]string{
		"value": v, "base64": base64.StdEncoding.EncodeToString(b), "base64 unpadded": base64.RawStdEncoding.EncodeToString(b),
		"base64url": base64.RawURLEncoding.EncodeToString(b), "hex": hex.EncodeToString(b), "HEX": fmt.Sprintf("%X", b),
	}
}

// secretsNowhere hands check every process's environment and command line, and every file under
// root but the secrets' own directory (the supervisor's, 0600: the one place a value is kept).
func secretsNowhere(t *testing.T, root string, check func(where string, b []byte)) {
	t.Helper()
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		for _, f := range []string{"environ", "cmdline"} {
			if b, err := os.ReadFile(filepath.Join(p, f)); err == nil {
				check(p+"/"+f, b)
			}
		}
	}
	files := 0
	secretsDir := filepath.Join(root, "secrets")
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if p == secretsDir {
			return filepath.SkipDir
		}
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		if b, err := os.ReadFile(p); err == nil {
			files++
			check(p, b)
		}
		return nil
	})
	if files < 100 {
		t.Errorf("looked in only %d files of %s", files, root)
	}
}
