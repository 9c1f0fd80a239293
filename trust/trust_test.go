package trust_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"toolshed.dev/shed/store"
	"toolshed.dev/shed/trust"
)

const storeDir = "/var/lib/toolshed/store"

func info(t *testing.T, name string) *store.PathInfo {
	t.Helper()
	p, err := store.MakePath("output", name, storeDir, name)
	if err != nil {
		t.Fatal(err)
	}
	ref, _ := store.MakePath("output", "dep", storeDir, "dep")
	return &store.PathInfo{Path: p, ContentHash: store.Sum([]byte(name)), Size: 42, References: []store.Path{ref}}
}

func signed(t *testing.T, k *trust.SecretKey, i *store.PathInfo, when time.Time) []byte {
	t.Helper()
	env, err := trust.Sign(k, trust.New(storeDir, i, &trust.Facts{Fetches: []trust.Fetch{{URL: "http://x/y.deb", SHA256: strings.Repeat("a", 64), Size: 3}}}, "test", k.Public(), when))
	if err != nil {
		t.Fatal(err)
	}
	return env
}

// edit decodes an envelope, lets f change it, and encodes it again.
func edit(t *testing.T, env []byte, f func(m map[string]any)) []byte {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(env, &m); err != nil {
		t.Fatal(err)
	}
	f(m)
	b, _ := json.Marshal(m)
	return b
}

func TestCheck(t *testing.T) {
	k, _ := trust.GenerateKey("builder-1")
	other, _ := trust.GenerateKey("builder-1") // same name, another key
	pol := &trust.Policy{Trusted: []trust.PublicKey{k.Public()}}
	a := info(t, "a")
	env := signed(t, k, a, time.Now())
	p, err := pol.Check(storeDir, a, env)
	if err != nil {
		t.Fatal(err)
	}
	if p.Path != storeDir+"/"+a.Path.String() || p.Fetches[0].URL != "http://x/y.deb" || p.Builder.Key != k.Public().String() {
		t.Errorf("provenance: %+v", p)
	}

	b := info(t, "b")
	tampered := edit(t, env, func(m map[string]any) {
		payload, _ := base64.StdEncoding.DecodeString(m["payload"].(string))
		payload = []byte(strings.Replace(string(payload), `"size":42`, `"size":43`, 1))
		m["payload"] = base64.StdEncoding.EncodeToString(payload)
	})
	grown := *a
	grown.Size = 43
	drv, _ := store.MakePath("text", "a", storeDir, "a.drv")
	evilDrv, _ := store.MakePath("text", "evil", storeDir, "a.drv")
	withDeriver, withCA := *a, *a
	withDeriver.Deriver, withCA.CA = drv, "fixed:sha256:"+strings.Repeat("a", 64)
	otherDeriver, otherCA := withDeriver, withCA
	otherDeriver.Deriver, otherCA.CA = evilDrv, "source"
	for _, i := range []*store.PathInfo{&withDeriver, &withCA} {
		if _, err := pol.Check(storeDir, i, signed(t, k, i, time.Now())); err != nil {
			t.Errorf("signed with deriver %s and content address %q: %v", i.Deriver, i.CA, err)
		}
	}
	for _, c := range []struct {
		name string
		info *store.PathInfo
		env  []byte
		pol  *trust.Policy
		want error
	}{
		{"no provenance", a, nil, pol, trust.ErrUnsigned},
		{"stripped signature", a, edit(t, env, func(m map[string]any) { m["signatures"] = []any{} }), pol, trust.ErrUnsigned},
		{"untrusted key", a, signed(t, other, a, time.Now()), pol, trust.ErrUntrusted},
		{"no trusted keys", a, env, &trust.Policy{}, trust.ErrUntrusted},
		{"tampered payload", &grown, tampered, pol, trust.ErrBadSignature},
		{"signature moved to another path", b, env, pol, trust.ErrMismatch},
		{"other bytes", &store.PathInfo{Path: a.Path, ContentHash: store.Sum([]byte("evil")), Size: 42, References: a.References}, env, pol, trust.ErrMismatch},
		{"other size", &grown, env, pol, trust.ErrMismatch},
		{"other references", &store.PathInfo{Path: a.Path, ContentHash: a.ContentHash, Size: 42}, env, pol, trust.ErrMismatch},
		{"garbage", a, []byte("{"), pol, trust.ErrUnsigned},
		{"a deriver not signed", &withDeriver, env, pol, trust.ErrMismatch},
		{"a content address not signed", &withCA, env, pol, trust.ErrMismatch},
		{"another deriver than signed", &otherDeriver, signed(t, k, &withDeriver, time.Now()), pol, trust.ErrMismatch},
		{"another content address than signed", &otherCA, signed(t, k, &withCA, time.Now()), pol, trust.ErrMismatch},
	} {
		if _, err := c.pol.Check(storeDir, c.info, c.env); !errors.Is(err, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.want)
		}
	}
	// A provenance for another store directory is another path.
	if _, err := pol.Check("/other/store", a, env); !errors.Is(err, trust.ErrMismatch) {
		t.Errorf("other store dir: %v", err)
	}
}

func TestKeys(t *testing.T) {
	if _, err := trust.GenerateKey("bad name"); err == nil {
		t.Error("a key name with a space was accepted")
	}
	k, _ := trust.GenerateKey("host-1")
	pk, err := trust.ParsePublicKey(k.Public().String())
	if err != nil || pk.String() != k.Public().String() {
		t.Errorf("public key round trip: %v", err)
	}
	sk, err := trust.ParseSecretKey(k.String())
	if err != nil || sk.Public().String() != k.Public().String() {
		t.Errorf("secret key round trip: %v", err)
	}
	for _, bad := range []string{"", "host-1", "host-1:", "host-1:abc", ":" + strings.Repeat("A", 44), "a b:" + base64.StdEncoding.EncodeToString(make([]byte, 32))} {
		if _, err := trust.ParsePublicKey(bad); !errors.Is(err, trust.ErrBadKey) {
			t.Errorf("ParsePublicKey(%q): %v", bad, err)
		}
	}
}

func newStore(t *testing.T) (*store.Store, *trust.Store) {
	t.Helper()
	root := filepath.Join(t.TempDir(), "root")
	s, err := store.Init(root)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if _, _, err := trust.OpenKeys(root).Ensure("test-1"); err != nil {
		t.Fatal(err)
	}
	ts, err := trust.Open(s, "test")
	if err != nil {
		t.Fatal(err)
	}
	s.SetAttestor(ts.Attest)
	return s, ts
}

// TestStoreSigning: what the store registers is signed and verifies; a
// rotation keeps the old signatures valid; Accept refuses a replay.
func TestStoreSigning(t *testing.T) {
	ctx := context.Background()
	s, ts := newStore(t)
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "f"), []byte("data"), 0o644)
	pi, err := s.AddDir(ctx, src, "src", nil)
	if err != nil {
		t.Fatal(err)
	}
	prov, err := s.Provenance(pi.Path)
	if err != nil {
		t.Fatal(err)
	}
	if err := ts.Verify(pi, prov); err != nil {
		t.Fatalf("own signature: %v", err)
	}
	res, err := s.Verify(ctx, store.VerifyOptions{CheckProvenance: ts.Verify})
	if err != nil || len(res.Problems) != 0 {
		t.Fatalf("verify: %v %v", res.Problems, err)
	}

	// Rotate: the retired key still vouches for what it signed.
	old := ts.Key.Public()
	if _, _, err := ts.Keys.Rotate("test-2"); err != nil {
		t.Fatal(err)
	}
	ts2, err := trust.Open(s, "test")
	if err != nil {
		t.Fatal(err)
	}
	if err := ts2.Verify(pi, prov); err != nil {
		t.Errorf("after rotation, the retired key's signature: %v", err)
	}
	if err := ts2.Resign(ctx, pi.Path); err != nil {
		t.Fatal(err)
	}
	prov2, _ := s.Provenance(pi.Path)
	if !strings.Contains(string(prov2), "test-2:") || strings.Contains(string(prov2), old.String()) {
		t.Errorf("resigned provenance does not name the new key only:\n%s", prov2)
	}
	if err := ts2.Verify(pi, prov2); err != nil {
		t.Errorf("resigned: %v", err)
	}

	// A path arriving from elsewhere: an older provenance after a newer one is a replay.
	remote, _ := trust.GenerateKey("ci-1")
	if err := s.UpdateConfig(func(c *store.Config) error {
		c.TrustedPublicKeys = append(c.TrustedPublicKeys, remote.Public().String())
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	ts3, err := trust.Open(s, "test")
	if err != nil {
		t.Fatal(err)
	}
	x := info(t, "x")
	x.Path, _ = store.MakePath("output", "x", s.StoreDir(), "x")
	x.References = nil
	now := time.Now()
	newer, older := signed(t, remote, x, now), signed(t, remote, x, now.Add(-time.Hour))
	if err := ts3.Accept(x, newer); err != nil {
		t.Fatalf("accept: %v", err)
	}
	// Accept records nothing: until the path is registered with it, the newer one bounds nothing.
	if err := ts3.Accept(x, older); err != nil {
		t.Errorf("older provenance after a newer one that was never registered: %v", err)
	}
	if err := ts3.Accepted(x, newer); err != nil {
		t.Fatalf("accepted: %v", err)
	}
	if err := ts3.Accepted(x, signed(t, other(t), x, now)); !errors.Is(err, trust.ErrUntrusted) {
		t.Errorf("recording an untrusted provenance: %v", err)
	}
	if err := ts3.Accept(x, older); !errors.Is(err, trust.ErrReplay) {
		t.Errorf("older provenance after a newer one: %v, want ErrReplay", err)
	}
	if err := ts3.Accept(x, newer); err != nil {
		t.Errorf("the same provenance again: %v", err)
	}
}

func other(t *testing.T) *trust.SecretKey {
	t.Helper()
	k, err := trust.GenerateKey("other-1")
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// Build inputs are signed. A record may name fewer than were signed (an older shed pulled the path
// and kept none, which only lets gc free more), never one that was not.
func TestBuildInputsSigned(t *testing.T) {
	k, _ := trust.GenerateKey("builder-1")
	pol := &trust.Policy{Trusted: []trust.PublicKey{k.Public()}}
	deb1, _ := store.MakePath("output", "one", storeDir, "one.deb")
	deb2, _ := store.MakePath("output", "two", storeDir, "two.deb")
	evil, _ := store.MakePath("output", "evil", storeDir, "evil.deb")
	layer := info(t, "layer")
	layer.BuildInputs = []store.Path{deb1, deb2}
	env := signed(t, k, layer, time.Now())
	with := func(bi ...store.Path) *store.PathInfo { i := *layer; i.BuildInputs = bi; return &i }
	for _, i := range []*store.PathInfo{layer, with(), with(deb2)} {
		if _, err := pol.Check(storeDir, i, env); err != nil {
			t.Errorf("record with build inputs %v: %v", i.BuildInputs, err)
		}
	}
	for _, i := range []*store.PathInfo{with(deb1, deb2, evil), with(evil)} {
		if _, err := pol.Check(storeDir, i, env); !errors.Is(err, trust.ErrMismatch) {
			t.Errorf("record with unsigned build inputs %v: %v, want ErrMismatch", i.BuildInputs, err)
		}
	}
	// A provenance from before build inputs (none signed) fits a record that names none.
	old := signed(t, k, with(), time.Now())
	if _, err := pol.Check(storeDir, with(), old); err != nil {
		t.Errorf("old provenance: %v", err)
	}
	if _, err := pol.Check(storeDir, layer, old); !errors.Is(err, trust.ErrMismatch) {
		t.Errorf("build inputs over an old provenance: %v, want ErrMismatch", err)
	}
}
