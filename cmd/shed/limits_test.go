package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLimitFlagErrors: every limit flag's bad value (malformed, too small, too large) is a usage
// error that names the flag and the form it takes, and says "without a unit" only of a number
// that has none.
func TestLimitFlagErrors(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.toml")
	os.WriteFile(good, []byte("name = \"x\"\nseed = \"debian/bookworm\"\n"), 0o644)
	run1 := func(args ...string) (int, string) {
		var out, errb bytes.Buffer
		code := run(append([]string{"shed", "--root", filepath.Join(dir, "none")}, args...), &out, &errb)
		return code, errb.String()
	}
	benchRun := func(flags ...string) []string {
		return append(append([]string{"bench", "run", "-f", good}, flags...), "--", "true")
	}
	for _, c := range []struct {
		args []string
		want []string // in the error and hint
		not  string
	}{
		{benchRun("--memory", "1M"), []string{"--memory 1M", "below the least", "16.0 MiB", "at least 16M"}, "without a unit"},
		{benchRun("--memory", "64"), []string{"--memory 64", "without a unit is bytes", "64M"}, ""},
		{benchRun("--memory", "lots"), []string{`--memory "lots"`, "not a size", "512M"}, ""},
		{benchRun("--memory", "-5M"), []string{`--memory "-5M"`, "not negative"}, ""},
		{benchRun("--memory", "9999999999T"), []string{"too large", "at most"}, ""},
		{benchRun("--pids", "1"), []string{"--pids 1", "below the least, 2", "at least 2"}, ""},
		{benchRun("--pids", "-3"), []string{"--pids -3", "at least 2"}, ""},
		{benchRun("--pids", "many"), []string{`--pids "many"`, "not a number", "whole number"}, "-pids:"},
		{[]string{"bench", "exec", "--timeout", "500ms", "b", "--", "true"}, []string{"--timeout 500ms", "least, 1s"}, ""},
		{[]string{"bench", "exec", "--timeout", "30", "b", "--", "true"}, []string{`--timeout "30"`, "needs a unit", "30s"}, ""},
		{[]string{"bench", "exec", "--timeout", "soon", "b", "--", "true"}, []string{`--timeout "soon"`, "not a duration", "30s"}, ""},
		{[]string{"gc", "--max-freed", "lots"}, []string{`--max-freed "lots"`, "not a size", "512M"}, ""},
		// The supervisor's bounds are read before it listens (these need root to get that far).
		{[]string{"daemon", "--socket", filepath.Join(dir, "s"), "--user-memory", "8M"}, []string{"--user-memory 8M", "below the least"}, "without a unit"},
		{[]string{"daemon", "--socket", filepath.Join(dir, "s"), "--user-pids", "1"}, []string{"--user-pids 1", "at least 2"}, ""},
		{[]string{"daemon", "--socket", filepath.Join(dir, "s"), "--user-benches", "eight"}, []string{`--user-benches "eight"`, "whole number"}, ""},
		{[]string{"daemon", "--socket", filepath.Join(dir, "s"), "--user-kept", "-1"}, []string{"--user-kept -1", "at least 0"}, ""},
		{[]string{"daemon", "--socket", filepath.Join(dir, "s"), "--warm", "100"}, []string{"--warm 100", "from 0 to 64"}, ""},
		{[]string{"daemon", "--socket", filepath.Join(dir, "s"), "--user-disk", "lots"}, []string{`--user-disk "lots"`, "not a size", "512M"}, ""},
		{[]string{"daemon", "--socket", filepath.Join(dir, "s"), "--user-disk", "-1G"}, []string{`--user-disk "-1G"`, "not negative"}, ""},
	} {
		if c.args[0] == "daemon" && os.Geteuid() != 0 {
			continue // the supervisor runs as root, and says so first
		}
		code, stderr := run1(c.args...)
		if code != exitUsage {
			t.Errorf("%s: exit %d, want %d\n%s", strings.Join(c.args, " "), code, exitUsage, stderr)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(stderr, w) {
				t.Errorf("%s: %q not said:\n%s", strings.Join(c.args, " "), w, stderr)
			}
		}
		if c.not != "" && strings.Contains(stderr, c.not) {
			t.Errorf("%s: says %q:\n%s", strings.Join(c.args, " "), c.not, stderr)
		}
	}
	for _, c := range []struct {
		size string
		want int64
	}{{"0", 0}, {"512", 512}, {"10K", 10 << 10}, {"512M", 512 << 20}, {"4G", 4 << 30}, {"2GiB", 2 << 30}, {"1TB", 1 << 40}} {
		if n, err := parseSize(c.size); err != nil || n != c.want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", c.size, n, err, c.want)
		}
	}
}
