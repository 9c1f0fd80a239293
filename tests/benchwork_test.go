package tests

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// benchWorkChecks runs in a Bench that has the agent's tools and prints one line per tool.
const benchWorkChecks = `set -e
git --version
ssh -V 2>&1
sudo -V | head -1
man -w git >/dev/null && echo "man finds git's page"
printf '#include <stdio.h>\nint main(void){puts("compiled and ran");return 0;}\n' > /tmp/hello.c
gcc -o /tmp/hello /tmp/hello.c && /tmp/hello
make --version | head -1
id postgres
psql --version
python3 -m venv /tmp/venv && /tmp/venv/bin/python -c 'print("venv works")'
python3 -c 'import shedtest_gamma; print("pip package:", shedtest_gamma.hello())'
dpkg --audit && echo "dpkg has nothing unfinished"
`

// TestBenchWork: an agent does in a Bench what it does on any Debian machine: apt-get install of
// ordinary packages (recommends included) that chown files, add users and groups (postgresql),
// ship setuid binaries (sudo) and run triggers (man-db), from Debian's mirror through the recipe's
// network profile, and pip install from an index. It proposes the result; a human promotes it; a
// fresh Bench of the promoted Workshop, with no network at all, has every tool working.
func TestBenchWork(t *testing.T) {
	parallel(t) // see parallelTests in main_test.go
	requireRoot(t)
	root := sharedRoot(t)
	host := startTestHost(t, pipStatic(t))
	sock := daemon(t, root)
	file := writeFile(t, filepath.Join(t.TempDir(), "workshop.toml"), fmt.Sprintf(`name = "work"
seed = "debian/bookworm"
[pip]
index = "http://%s/simple/"
[network]
profile = "debian"
allow = ["%s"]
`, host, host))
	if r := via(t, sock, 0, "", "workshop", "add", file); r.code != 0 {
		t.Fatalf("workshop add: %s", r.stderr)
	}
	agent := fmt.Sprintf(`set -e
apt-get -q update >/dev/null
apt-get -q install -y git sudo openssh-client man-db build-essential postgresql python3-venv python3-pip > /tmp/apt.log 2>&1 || { tail -30 /tmp/apt.log; exit 1; }
pip install -q --break-system-packages --root-user-action=ignore --index-url http://%s/simple/ --trusted-host %s shedtest-gamma
%s
%s`, host, host, benchWorkChecks, proposeFromInside)
	r := via(t, sock, 0, "", "bench", "run", "-f", "work", "--name", "worker", "--", "sh", "-c", agent)
	if r.code != 0 {
		t.Fatalf("the agent's Bench: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	wantTools(t, "the agent's Bench", r.stdout)
	m := regexp.MustCompile(`proposal ([0-9a-f]{16}) for Workshop work, version 1`).FindStringSubmatch(r.stdout)
	if m == nil {
		t.Fatalf("no proposal in the agent's output:\n%s\n%s", r.stdout, r.stderr)
	}
	for _, pkg := range []string{"git=", "sudo=", "openssh-client=", "man-db=", "build-essential=", "postgresql=", "python3-venv=", "python3-pip=", `"shedtest-gamma==1.0"`} {
		if !strings.Contains(r.stdout, pkg) {
			t.Errorf("the proposal's diff lacks %s:\n%s", pkg, r.stdout)
		}
	}
	out, err := promote(t, sock, m[1])
	if err != nil || !strings.Contains(out, "promoted work version 2") {
		t.Fatalf("promote: %v\n%s", err, out)
	}
	// The promoted Workshop, realized from its lock, offline.
	cmd := exec.Command("unshare", "--net", shedBin, "--root", root, "bench", "run", "--offline", "-f", "work", "--", "sh", "-c", benchWorkChecks)
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the promoted Workshop's Bench: %v\n%s", err, b)
	}
	wantTools(t, "the promoted Workshop's Bench", string(b))
	mustShed(t, root, "store", "verify")
}

func wantTools(t *testing.T, where, out string) {
	t.Helper()
	for _, want := range []string{"git version 2.", "OpenSSH_", "Sudo version", "man finds git's page", "compiled and ran",
		"GNU Make", "uid=", "(postgres)", "psql (PostgreSQL)", "venv works", "pip package: gamma", "dpkg has nothing unfinished"} {
		if !strings.Contains(out, want) {
			t.Errorf("%s: no %q in:\n%s", where, want, out)
		}
	}
}

// TestProposeUnfinished: a Bench whose dpkg left a package half configured (its postinst failed) is
// not promoted silently: proposing it fails, from outside and from inside, and says what to do.
func TestProposeUnfinished(t *testing.T) {
	requireRoot(t)
	root := sharedRoot(t)
	file, _ := benchWorkshop(t)
	script := `set -e
mkdir -p /tmp/bad/DEBIAN
printf 'Package: shed-broken\nVersion: 1\nArchitecture: all\nMaintainer: t <t@localhost>\nDescription: fails\n' > /tmp/bad/DEBIAN/control
printf '#!/bin/sh\nexit 1\n' > /tmp/bad/DEBIAN/postinst && chmod 755 /tmp/bad/DEBIAN/postinst
dpkg-deb --root-owner-group -b /tmp/bad /tmp/bad.deb >/dev/null
dpkg -i /tmp/bad.deb >/dev/null 2>&1 || echo "postinst failed"
echo ready
read x
`
	cmd := shedCmd(t, root, "bench", "run", "-f", file, "--name", "unfinished", "--", "sh", "-c", script)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); cmd.Wait() }()
	buf := make([]byte, 4096)
	var got string
	for !strings.Contains(got, "ready") {
		n, err := stdout.Read(buf)
		if err != nil {
			t.Fatalf("the Bench: %v (%q)", err, got)
		}
		got += string(buf[:n])
	}
	if !strings.Contains(got, "postinst failed") {
		t.Fatalf("the broken package installed cleanly: %q", got)
	}
	r := shed(t, root, nil, "bench", "propose", "unfinished")
	if r.code != 1 || !strings.Contains(r.stderr, "shed-broken (half-configured)") || !strings.Contains(r.stderr, "dpkg --configure -a") {
		t.Errorf("propose of a Bench with a half-configured package: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if ents, _ := os.ReadDir(filepath.Join(root, "proposals")); len(ents) != 0 {
		for _, e := range ents {
			if b, err := os.ReadFile(filepath.Join(root, "proposals", e.Name(), "proposal.json")); err == nil && strings.Contains(string(b), `"unfinished"`) {
				t.Errorf("a proposal was written: %s", b)
			}
		}
	}
}
