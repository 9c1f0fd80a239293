package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"

	"toolshed.dev/shed/api"
	"toolshed.dev/shed/app"
)

// TestE2BUsers: a Workshop that declares E2B's account `user` (home, passwordless sudo) as its
// default user, driven through the real `e2b` SDK: commands run as user in its home, sudo works
// without a password, relative paths and ~ resolve against the home, what the API writes is the
// user's and owners come back as names, root stays available (user: 'root'), and an unknown user is
// refused, leaving the sandbox working.
func TestE2BUsers(t *testing.T) {
	parallel(t) // see parallelTests in main_test.go
	requireRoot(t)
	root := sharedRoot(t)
	addr := freeLoopback(t)
	sock, _ := daemonWith(t, root, "--e2b", addr)
	dir := npmPackage(t, "e2b", "e2b", "2.51.0")
	client := filepath.Join(dir, "e2b-users.mjs")
	writeFile(t, client, string(must(os.ReadFile("testdata/e2b-users.mjs"))))
	uid := nobodyUID(t)

	name := "e2b-users-" + strconv.Itoa(os.Getpid())
	f := writeFile(t, filepath.Join(t.TempDir(), "workshop.toml"), fmt.Sprintf(`name = %q
seed = "debian/bookworm"
user = "user"
[apt]
packages = ["sudo"]
[[account]]
name = "user"
sudo = true
`, name))
	if r := via(t, sock, 0, "", "workshop", "add", "--allow", "nobody", f); r.code != 0 {
		t.Fatalf("workshop add: %s", r.stderr)
	}
	made := via(t, sock, 0, "", "--json", "agent", "key", "create", "nobody")
	var key struct{ Key string }
	if err := json.Unmarshal([]byte(made.stdout), &key); err != nil {
		t.Fatalf("agent key create: %v %q %s", err, made.stdout, made.stderr)
	}

	cmd := exec.Command("node", client, name)
	cmd.Env = append(os.Environ(), "HOME=/", "E2B_API_URL=http://"+addr, "E2B_SANDBOX_URL=http://"+addr, "E2B_API_KEY="+key.Key)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the e2b client: %v\n%s\n%s", err, out, stderr.String())
	}
	steps := clientSteps(out)
	type step struct {
		OK    bool            `json:"ok"`
		Value json.RawMessage `json:"value"`
		Error string          `json:"error"`
	}
	check := func(n string, want any) {
		t.Helper()
		var s step
		if err := json.Unmarshal(steps[n], &s); err != nil {
			t.Fatalf("step %s: %v (%s)\nall output:\n%s\n%s", n, err, steps[n], out, stderr.String())
		}
		if !s.OK {
			t.Errorf("step %s: %s", n, s.Error)
			return
		}
		got := any(nil)
		json.Unmarshal(s.Value, &got)
		wantJSON, _ := json.Marshal(want)
		var w any
		json.Unmarshal(wantJSON, &w)
		if diff := cmp.Diff(w, got); diff != "" {
			t.Errorf("step %s (-want +got):\n%s", n, diff)
		}
	}
	refused := func(n, want string) {
		t.Helper()
		var s step
		json.Unmarshal(steps[n], &s)
		if s.OK || !strings.Contains(s.Error, want) {
			t.Errorf("step %s: ok %v, error %q, want an error with %q", n, s.OK, s.Error, want)
		}
	}
	type own struct {
		Path  string `json:"path"`
		Owner string `json:"owner"`
		Group string `json:"group"`
	}
	check("whoami", "user")
	check("env", "/home/user /home/user user")
	check("sudo", "root")
	check("root", "root /root /root")
	check("cwd", "/home/user/work/sub")
	check("write", map[string]string{"path": "/home/user/notes/a.txt", "read": "relative"})
	check("info", []own{{"/home/user/notes/a.txt", "user", "user"}, {"/home/user/notes", "user", "user"}})
	check("shell-owner", "user:user\nuser:user\nuser:user\nuser:user")
	check("list", []own{{"/home/user/notes", "user", "user"}, {"/home/user/work", "user", "user"}})
	check("rename", own{"/home/user/moved/b.txt", "user", "user"})
	check("tilde", "relative")
	check("user-edits", "relativemore")
	check("root-write", map[string]string{"path": "/root/r.txt", "owner": "root", "group": "root"})
	check("root-file", "root:root")
	refused("unknown-command", `no user "nosuchuser"`)
	refused("unknown-file", `no user "nosuchuser"`)
	refused("unknown-rpc", `no user "nosuchuser"`)
	check("after", "user")

	// The CLI follows the Workshop's user as podman follows an image's USER; --user picks another.
	for _, c := range []struct {
		flags []string
		want  string
	}{
		{nil, "user /home/user /home/user"},
		{[]string{"--user", "root"}, "root /root /root"},
		{[]string{"-u", "user"}, "user /home/user /home/user"},
	} {
		args := append(append([]string{"bench", "run", "-f", name}, c.flags...), "--", "sh", "-c", `echo "$(id -un) $PWD $HOME"`)
		if r := via(t, sock, 0, "", args...); r.code != 0 || strings.TrimSpace(r.stdout) != c.want {
			t.Errorf("shed %s: exit %d, %q, want %q (%s)", strings.Join(args, " "), r.code, r.stdout, c.want, r.stderr)
		}
	}
	// The socket's file operations (MCP's bench_write_file among them) give what they make to the
	// Bench's default user too, or to the user named.
	cl := &api.Client{Socket: sock}
	ctx := context.Background()
	var created app.BenchCreateResult
	if err := cl.Call(ctx, "bench.create", &app.BenchCreateRequest{Workshop: name}, &created); err != nil {
		t.Fatal(err)
	}
	defer cl.Call(ctx, "bench.rm", &app.BenchRemoveRequest{Benches: []string{created.Bench}}, &app.Empty{})
	if created.User != "user" || len(created.Accounts) != 1 || created.Accounts[0].Home != "/home/user" {
		t.Errorf("bench.create: user %q, accounts %+v", created.User, created.Accounts)
	}
	for _, w := range []app.WriteFileRequest{
		{Bench: created.Bench, Path: "/home/user/one/a.txt", Content: "a"},
		{Bench: created.Bench, Path: "/srv/two/b.txt", Content: "b", User: "root"},
	} {
		if err := cl.Call(ctx, "bench.write_file", &w, &app.Empty{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := cl.Call(ctx, "bench.make_dir", &app.BenchPathRequest{Bench: created.Bench, Path: "/home/user/three/four"}, &app.MadeResult{}); err != nil {
		t.Fatal(err)
	}
	var res app.ExecResult
	err = cl.Call(ctx, "bench.exec", &app.BenchExecRequest{Bench: created.Bench, Capture: true,
		Shell: "stat -c '%n %U:%G' one one/a.txt /srv/two /srv/two/b.txt three three/four"}, &res)
	want := "one user:user\none/a.txt user:user\n/srv/two root:root\n/srv/two/b.txt root:root\nthree user:user\nthree/four user:user\n"
	if err != nil || res.Stdout != want {
		t.Errorf("owners of what the socket's operations made: %v %q, want %q (%s)", err, res.Stdout, want, res.Stderr)
	}

	if r := via(t, sock, 0, "", "bench", "run", "-f", name, "--user", "nosuchuser", "--", "true"); r.code == 0 || !strings.Contains(r.stderr, `has no user "nosuchuser" (its accounts: root, user)`) {
		t.Errorf("--user nosuchuser: exit %d, %s", r.code, r.stderr)
	}
}
