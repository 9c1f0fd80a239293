package bench

import (
	"errors"
	"testing"

	"toolshed.dev/shed/proxy"
)

// SetNetwork is all or nothing: rules outside the profile are refused and the old ones stay, in the
// registry and in the proxy; a Bench of another process is named as such.
func TestSetNetworkAtomic(t *testing.T) {
	profile := []proxy.Rule{{Host: "deb.debian.org"}, {Host: "198.51.100.2", Port: 8000}}
	old, err := NetworkRules(nil, []string{"198.51.100.2"})
	if err != nil {
		t.Fatal(err)
	}
	px, err := proxy.New(proxy.Config{Allow: profile, Filter: old})
	if err != nil {
		t.Fatal(err)
	}
	nets.Store("test-id", &liveNet{profile: profile, rules: old, px: px})
	defer nets.Delete("test-id")

	if _, err := NetworkRules([]string{"1.1.1.1/40"}, nil); !errors.Is(err, ErrNetworkRules) {
		t.Errorf("malformed: %v", err)
	}
	outside, err := NetworkRules([]string{"deb.debian.org", "1.1.1.1"}, []string{"0.0.0.0/0"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := SetNetwork("test-id", outside); !errors.Is(err, ErrNetworkRules) {
		t.Errorf("outside the profile: %v", err)
	}
	if f, _ := Network("test-id"); f != old || px.Filter() != old {
		t.Errorf("a refused update changed the rules: %v %v", f, px.Filter())
	}
	within, err := NetworkRules([]string{"deb.debian.org"}, []string{"0.0.0.0/0"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := SetNetwork("test-id", within); err != nil {
		t.Fatal(err)
	}
	if f, _ := Network("test-id"); f != within || px.Filter() != within {
		t.Errorf("the update is not in force: %v %v", f, px.Filter())
	}
	if _, err := SetNetwork("no-such-id", within); !errors.Is(err, ErrNotHere) {
		t.Errorf("another process's Bench: %v", err)
	}
}
