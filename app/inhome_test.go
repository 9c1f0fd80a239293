package app_test

import (
	"testing"

	"toolshed.dev/shed/app"
)

// TestInHome: paths of a Bench resolve as envd resolves them for a user: "" and ~ are the home, a
// relative path and ~/x are under it, an absolute one is itself (clean); ~user is refused.
func TestInHome(t *testing.T) {
	for in, want := range map[string]string{
		"": "/home/user", "~": "/home/user", "x": "/home/user/x", "a/../b": "/home/user/b", "~/x/y": "/home/user/x/y",
		"/etc/x": "/etc/x", "/a//b/": "/a/b", "../..": "/",
	} {
		if got, err := app.InHome(in, "/home/user"); got != want || err != nil {
			t.Errorf("InHome(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if got, err := app.InHome("~root/x", "/home/user"); err == nil {
		t.Errorf("InHome(~root/x) = %q, want an error", got)
	}
}
