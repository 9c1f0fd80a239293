package tests

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"toolshed.dev/shed/api"
)

// TestRootlessBesideDaemon (issue 24): the README's "Without root" block, as written, run by a new
// user with subordinate ids on a machine where root's `shed daemon` listens on its default socket.
// The user names no supervisor, so init makes the user's own store and every command after it works
// on that store; before init, the user's commands are the supervisor's, and its refusal of a recipe
// file names `shed init`; SHED_SOCKET still reaches the supervisor afterwards.
//
// The supervisor listens on a socket of its own (other tests run beside this one): each of the
// user's commands runs in a private mount namespace where that socket's directory is bound on the
// default socket's, so shed finds it at /run/toolshed/shed.sock as it would on a real machine.
func TestRootlessBesideDaemon(t *testing.T) {
	parallel(t) // see parallelTests in main_test.go: its own user, stores and supervisor
	requireRoot(t)
	requireRootless(t)
	block := readmeWithoutRoot(t)
	u := newHostUser(t, "shed-rd-", true)
	supRoot := newRoot(t)
	sock := daemon(t, supRoot)
	defaultDir := filepath.Dir(api.DefaultSocket)
	if err := os.MkdirAll(defaultDir, 0o755); err != nil { // root's shed makes it too: nothing new for the host
		t.Fatal(err)
	}
	supKey := strings.TrimSpace(mustShed(t, supRoot, "key", "export").stdout)

	// run runs a command line as the user, in its home, with a clean environment (no SHED_*
	// variable but env), shed first on PATH, and the supervisor at the default socket.
	runAs := func(u *hostUser, env []string, line string) result {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "unshare", "--mount", "--propagation", "private", "sh", "-c",
			`mount --bind "$1" "$2" && exec setpriv --reuid="$3" --regid="$4" --init-groups -- bash -o pipefail -c "$5"`,
			"sh", filepath.Dir(sock), defaultDir, fmt.Sprint(u.uid), fmt.Sprint(u.gid), line)
		cmd.Dir = u.home
		cmd.Env = append([]string{
			"HOME=" + u.home, "USER=" + u.name, "LOGNAME=" + u.name, "LANG=C.UTF-8",
			"PATH=" + u.shareDir + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		}, env...)
		cmd.SysProcAttr = dieWithTests()
		return runResult(t, cmd)
	}
	run := func(env []string, line string) result { t.Helper(); return runAs(u, env, line) }
	// followHint runs, as u, the command that the hint of r (a failure) names in backquotes, starting
	// with want; it must work.
	followHint := func(u *hostUser, what string, r result, want string) {
		t.Helper()
		m := regexp.MustCompile("shed: hint: .*`(" + regexp.QuoteMeta(want) + "[^`]*)`").FindStringSubmatch(r.stderr)
		if r.code == 0 || m == nil {
			t.Errorf("%s as %s: exit %d\n%s\nwant an error whose hint names `%s...`", what, u.name, r.code, r.stderr, want)
			return
		}
		t.Logf("%s as %s:\n%s", what, u.name, r.stderr)
		if r := runAs(u, nil, m[1]); r.code != 0 {
			t.Errorf("%s as %s: its hint's command %s: exit %d\n%s%s", what, u.name, m[1], r.code, r.stdout, r.stderr)
		}
	}

	// The control: with no store of its own, the user's shed reaches the supervisor at the default
	// socket (its key is the supervisor store's).
	if r := run(nil, "shed key export"); r.code != 0 || strings.TrimSpace(r.stdout) != supKey {
		t.Fatalf("shed key export as %s before init: exit %d, %q\n%s\nwant the supervisor's key %q: is the supervisor at %s?", u.name, r.code, r.stdout, r.stderr, supKey, api.DefaultSocket)
	}
	// Before init, a recipe file is the supervisor's to refuse: its hint names the way.
	u.give(t, filepath.Join(u.home, "examples", "jq", "workshop.toml"), string(must(os.ReadFile("../examples/jq/workshop.toml"))), 0o644)
	if r := run(nil, "shed realize examples/jq/workshop.toml"); r.code == 0 || !strings.Contains(r.stderr, "shed: hint:") || !strings.Contains(r.stderr, "`shed init`") {
		t.Errorf("shed realize FILE as %s, no store of its own, beside a supervisor: exit %d\n%s\nwant a refusal whose hint names `shed init`", u.name, r.code, r.stderr)
	}
	for _, op := range []string{"gc", "store verify"} {
		if r := run(nil, "shed "+op); r.code == 0 || !strings.Contains(r.stderr, "`shed init`") {
			t.Errorf("shed %s as %s, no store of its own, beside a supervisor: exit %d\n%s\nwant a refusal whose hint names `shed init`", op, u.name, r.code, r.stderr)
		}
	}

	// The README's block, as written.
	store := filepath.Join(u.home, ".local", "share", "toolshed")
	for _, c := range block {
		start := time.Now()
		r := run(nil, c.text)
		t.Logf("README.md:%d: $ %s: exit %d in %.1f s", c.line, c.text, r.code, time.Since(start).Seconds())
		if r.code != 0 {
			t.Fatalf("README.md:%d: $ %s: as %s beside a supervisor: exit %d\nstdout:\n%s\nstderr:\n%s", c.line, c.text, u.name, r.code, r.stdout, r.stderr)
		}
		lines := strings.Split(r.stdout+r.stderr, "\n")
		next := 0
		for _, l := range c.shown {
			re := shownPattern(strings.ReplaceAll(l.text, "/home/alice", u.home), store)
			if re == nil {
				continue
			}
			i := next
			for i < len(lines) && !re.MatchString(lines[i]) {
				i++
			}
			if i == len(lines) {
				t.Errorf("README.md:%d: $ %s: no line of the output matches line %d, %q (as %s)\nstdout:\n%s\nstderr:\n%s", c.line, c.text, l.line, l.text, re, r.stdout, r.stderr)
				continue
			}
			next = i + 1
		}
	}
	if _, err := os.Stat(filepath.Join(store, "config.toml")); err != nil {
		t.Errorf("the user's store: %v", err)
	}

	// The user's commands now go to the user's store; SHED_SOCKET names the supervisor.
	if r := run(nil, "shed key export"); r.code != 0 || strings.TrimSpace(r.stdout) == supKey || strings.TrimSpace(r.stdout) == "" {
		t.Errorf("shed key export as %s after init: exit %d, %q\n%s\nwant the user's own key, not the supervisor's", u.name, r.code, r.stdout, r.stderr)
	}
	if r := run([]string{"SHED_SOCKET=" + api.DefaultSocket}, "shed key export"); r.code != 0 || strings.TrimSpace(r.stdout) != supKey {
		t.Errorf("SHED_SOCKET=%s shed key export as %s: exit %d, %q\n%s\nwant the supervisor's key", api.DefaultSocket, u.name, r.code, r.stdout, r.stderr)
	}
	// A record's name is looked for in the user's store: the hint says how to reach the supervisor's.
	viaSup := "SHED_SOCKET=" + api.DefaultSocket + " shed workshop ls"
	followHint(u, "shed realize jq-tools (a record's name) with a store of its own", run(nil, "shed realize jq-tools"), viaSup)

	// A user with no subordinate ids gets no store of its own; the hint names both ways.
	u0 := newHostUser(t, "shed-rd0-", false)
	r := runAs(u0, nil, "shed init")
	if !strings.Contains(r.stderr, "usermod --add-subuids") {
		t.Errorf("shed init as %s (no subordinate ids) beside a supervisor: exit %d\n%s\nwant the usermod hint", u0.name, r.code, r.stderr)
	}
	followHint(u0, "shed init with no subordinate ids", r, viaSup)

	// Nothing of the user's went to the supervisor's store.
	if r := mustShed(t, supRoot, "store", "ls"); strings.TrimSpace(r.stdout) != "" {
		t.Errorf("the supervisor's store has paths after the user's commands:\n%s", r.stdout)
	}
}

// readmeWithoutRoot returns the commands of the README's "Without root" block ("$ CMD" lines) and
// the output shown for each.
func readmeWithoutRoot(t *testing.T) []shownCommand {
	t.Helper()
	lines := strings.Split(string(must(os.ReadFile("../README.md"))), "\n")
	var cmds []shownCommand
	section, in := false, false
	for i, l := range lines {
		switch {
		case l == "### Without root":
			section = true
		case !section:
		case !in && l == "```console":
			in = true
		case !in && strings.HasPrefix(l, "#"):
			t.Fatalf("README.md: the \"Without root\" section has no console block")
		case !in:
		case l == "```":
			if len(cmds) == 0 {
				t.Fatalf("README.md:%d: the \"Without root\" block has no command", i+1)
			}
			return cmds
		case strings.HasPrefix(l, "$ "):
			cmds = append(cmds, shownCommand{line: i + 1, text: strings.TrimPrefix(l, "$ ")})
		case len(cmds) > 0:
			cmds[len(cmds)-1].shown = append(cmds[len(cmds)-1].shown, shownLine{i + 1, l})
		}
	}
	t.Fatalf("README.md has no \"### Without root\" section with a console block")
	return nil
}
