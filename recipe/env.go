package recipe

import (
	"fmt"
	"path"
	"slices"
	"strings"
)

// EnvVar is a variable the recipe sets for its Benches' commands ([env]). Like `user`, it shapes
// Benches, not what is built, and it is part of the recipe: readable, recorded, diffed, so never a
// secret (a secret stays in the supervisor).
type EnvVar struct {
	Name  string
	Value string
}

// envNameRe is a POSIX shell's name: what `export NAME=...` accepts.
var envNameRe = lazyRegexp(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)

// envOwned are the variables a Bench's network profile and account set: a recipe setting one would
// be overridden, or would send clients past the proxy that the profile routes them through.
var envOwned = []string{"HOME", "USER", "LOGNAME", "http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY",
	"no_proxy", "NO_PROXY", "all_proxy", "ALL_PROXY", "OWN"}

// env reads [env]: NAME = "value" lines.
func (c *checker) env(t map[string]any, tf field, r *Recipe) {
	for _, k := range sortedKeys(t) {
		f := tf.key(k)
		switch {
		case !envNameRe().MatchString(k):
			c.fail(f, fmt.Sprintf("%.64q is not a variable name", k), "a name is letters, digits and _, not starting with a digit, e.g. PYTHONPATH")
			continue
		case slices.Contains(envOwned, k):
			c.fail(f, k+" is set by the Bench", "HOME, USER and LOGNAME are the account's (user = ...); the proxy variables are the network profile's; OWN is shed's file helpers'")
			continue
		}
		s, _, ok := c.str(t, tf, k, k+` = "value"`, true)
		if !ok {
			continue
		}
		r.Env = append(r.Env, EnvVar{Name: k, Value: s})
	}
}

// checkWorkdir checks `workdir`: the directory a Bench's commands start in. /proc, /sys and /dev are
// the kernel's, mounted afresh in every Bench: no command's home.
func checkWorkdir(s string) *Error {
	if !strings.HasPrefix(s, "/") || path.Clean(s) != s {
		return &Error{Msg: fmt.Sprintf("workdir %q is not a clean absolute path", s), Hint: `write it like this: workdir = "/work"`}
	}
	for _, d := range []string{"/proc", "/sys", "/dev"} {
		if s == d || strings.HasPrefix(s, d+"/") {
			return &Error{Msg: fmt.Sprintf("workdir %q is in %s, which every Bench mounts afresh", s, d), Hint: `name a directory of the Workshop's own, e.g. workdir = "/work"`}
		}
	}
	return nil
}

func sortedKeys(m map[string]any) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// Environ is the recipe's [env] as NAME=value strings, sorted by name.
func (r *Recipe) Environ() []string {
	out := make([]string, 0, len(r.Env))
	for _, e := range r.Env {
		out = append(out, e.Name+"="+e.Value)
	}
	return out
}
