package bench

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"toolshed.dev/shed/internal/hint"
	"toolshed.dev/shed/proxy"
	"toolshed.dev/shed/secret"
	"toolshed.dev/shed/store"
)

// Secrets is what a Bench may use without holding it (docs/proxy.md, "Brokered credentials"): the
// secrets it names, whose placeholders it finds in their variables, and E2B's transform headers.
type Secrets struct {
	Names []string
	// Refs are the secrets as they were when the launch was allowed (Names and those Inject's values
	// name): Lookup answers a secret only while it is the same one (its id) with the same owner, so
	// one removed and added again under its name, or given to someone else, is revoked here.
	Refs   []SecretRef
	Inject []proxy.Injection
	// Lookup reads a secret as it is now; nil and no error if it is gone. The Bench's proxy asks at
	// every request, so that a revoked secret stops at the next one.
	Lookup func(name string) (*secret.Secret, []byte, error)
}

// SecretRef is a secret a Bench was allowed, as it was then.
type SecretRef struct {
	Name  string `json:"name"`
	ID    string `json:"id"`
	Owner string `json:"owner,omitempty"`
}

// Lookup is sc.Lookup narrowed to Refs: a secret is answered only while it is the one allowed.
func (sc *Secrets) lookup(n string) (*secret.Secret, []byte, error) {
	sec, v, err := sc.Lookup(n)
	if err != nil || sec == nil {
		return nil, nil, err
	}
	for _, r := range sc.Refs {
		if r.Name == sec.Name {
			if r.ID != sec.ID || r.Owner != sec.Owner {
				return nil, nil, nil
			}
			return sec, v, nil
		}
	}
	return nil, nil, nil
}

// CABundle is where a brokered Bench finds the system's certificates and its proxy's CA: Debian's
// system bundle, in its upper (the layers' copy, with the CA after it).
const CABundle = "/etc/ssl/certs/ca-certificates.crt"

// caEnv points the usual clients at the bundle: OpenSSL and Go, Node, Python's requests, pip.
func caEnv() []string {
	return []string{"SSL_CERT_FILE=" + CABundle, "NODE_EXTRA_CA_CERTS=" + CABundle, "REQUESTS_CA_BUNDLE=" + CABundle, "PIP_CERT=" + CABundle}
}

// Credential turns a stored secret into what the proxy needs of it.
func Credential(sec *secret.Secret, value []byte) *proxy.Credential {
	c := &proxy.Credential{Value: value, Body: sec.Body, Place: proxy.Place{Header: sec.Place.Header, Template: sec.Place.Template, Basic: sec.Place.Basic, Query: sec.Place.Query}}
	for _, h := range sec.Hosts {
		c.Hosts = append(c.Hosts, proxy.Rule{Host: h.Name, Port: h.Port})
	}
	return c
}

// broker makes the Bench's broker: its CA, a placeholder per secret, and the variables and files
// that hand them to the Bench. A secret that does not exist, or none of whose hosts the Bench's
// network allows, fails the launch.
func (sc *Secrets) broker(name string, rules []proxy.Rule, s *store.Store, layers []store.Path) (*proxy.Broker, []string, []byte, error) {
	b := &proxy.Broker{Inject: sc.Inject, Lookup: func(n string) (*proxy.Credential, error) {
		sec, v, err := sc.lookup(n)
		if err != nil || sec == nil {
			return nil, err
		}
		return Credential(sec, v), nil
	}}
	var env []string
	for _, n := range sc.Names {
		sec, _, err := sc.lookup(n)
		if err == nil && sec == nil {
			err = fmt.Errorf("secret %s: %w", n, secret.ErrNotFound)
		}
		if err != nil {
			return nil, nil, nil, hint.Wrap(err, "`shed secret ls` lists the secrets; an operator adds one with `shed secret add`")
		}
		if len(sec.Hosts) > 0 && !reaches(sec.Hosts, rules) {
			return nil, nil, nil, hint.Wrap(fmt.Errorf("bench %s: secret %s is bound to %s, which this Bench's network allows none of", name, n, hostList(sec.Hosts)),
				"add the host to the recipe's [network] allow, or bind the secret to a host it allows")
		}
		for _, h := range sec.Hosts {
			b.Terminate = append(b.Terminate, proxy.Rule{Host: h.Name, Port: h.Port})
		}
		ph := secret.Placeholder()
		b.Secrets = append(b.Secrets, proxy.Brokered{Name: n, Placeholder: ph})
		env = append(env, sec.Env+"="+ph)
	}
	ca, err := proxy.NewCA(name)
	if err != nil {
		return nil, nil, nil, err
	}
	b.CA = ca
	bundle, err := layerBundle(s, layers)
	if err != nil {
		return nil, nil, nil, err
	}
	if len(bundle) > 0 && !bytes.HasSuffix(bundle, []byte("\n")) {
		bundle = append(bundle, '\n')
	}
	return b, append(env, caEnv()...), append(bundle, ca.PEM()...), nil
}

func reaches(hosts []secret.Host, rules []proxy.Rule) bool {
	for _, h := range hosts {
		for _, r := range rules {
			if strings.EqualFold(r.Host, h.Name) && (r.Port == h.Port || r.Port == 0 && (h.Port == 0 || h.Port == 443) || r.Port == 443 && h.Port == 0) {
				return true
			}
		}
	}
	return false
}

func hostList(hosts []secret.Host) string {
	var s []string
	for _, h := range hosts {
		s = append(s, h.String())
	}
	return strings.Join(s, ", ")
}

// maxBundle bounds the layers' bundle (Debian's is about 200 KB).
const maxBundle = 4 << 20

// layerBundle is the system bundle the Bench's layers have: the topmost layer's, unless one above
// removed it (an overlay whiteout); none when no layer has one. Read within each layer (a symlink
// resolves inside it).
func layerBundle(s *store.Store, layers []store.Path) ([]byte, error) {
	rel := strings.TrimPrefix(CABundle, "/")
	for i := len(layers) - 1; i >= 0; i-- {
		dir := s.Location(layers[i])
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(dir, rel), &st); err == nil && st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0 {
			return nil, nil // removed by this layer
		}
		root, err := os.Open(dir)
		if err != nil {
			return nil, err
		}
		fd, err := unix.Openat2(int(root.Fd()), rel, &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NOCTTY | unix.O_NONBLOCK, Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS})
		root.Close()
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read the layers' CA bundle: %w", err)
		}
		f := os.NewFile(uintptr(fd), CABundle)
		b, err := io.ReadAll(io.LimitReader(f, maxBundle+1))
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("read the layers' CA bundle: %w", err)
		}
		if len(b) > maxBundle {
			return nil, fmt.Errorf("the layers' CA bundle %s is over %d bytes", CABundle, maxBundle)
		}
		return b, nil
	}
	return nil, nil
}
