package tests

import (
	"archive/tar"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestE2BTemplate is a harness's flow through the real `e2b` SDK: Template.exists, a build from a
// task image in a loopback registry (apt packages, variables, a workdir), Sandbox.create of the
// template and a command in it; tags; builds whose steps are not declarations refused, naming the
// step; another user's build made a proposal, and the record unchanged by it; an operator's delete.
func TestE2BTemplate(t *testing.T) {
	parallel(t)
	requireRoot(t)
	root := sharedRoot(t)
	task := tarLayer(t, &tar.Header{Name: "etc/task-id", Typeflag: tar.TypeReg, Mode: 0o644, Linkname: "task one\n"})
	reg := startRegistry(t, "")
	image := fmt.Sprintf("127.0.0.1:%d/swe/task-one:v1", reg.port)
	pushImage(t, image, debianLayer(t, root), task)

	addr := freeLoopback(t)
	sock, _ := daemonWith(t, root, "--e2b", addr)
	dir := npmPackage(t, "e2b", "e2b", "2.51.0")
	client := filepath.Join(dir, "e2b-template.mjs")
	writeFile(t, client, string(must(os.ReadFile("testdata/e2b-template.mjs"))))
	key := func(user string) string {
		var k struct{ Key string }
		if err := json.Unmarshal([]byte(via(t, sock, 0, "", "--json", "agent", "key", "create", user).stdout), &k); err != nil || k.Key == "" {
			t.Fatalf("agent key create %s: %v", user, err)
		}
		return k.Key
	}
	name := fmt.Sprintf("swe-task-%d", os.Getpid())
	cmd := exec.Command("node", client, image, name)
	cmd.Env = append(os.Environ(), "HOME=/", "E2B_API_URL=http://"+addr, "E2B_SANDBOX_URL=http://"+addr, "E2B_API_KEY="+key("root"), "USER_KEY="+key("nobody"))
	cmd.Dir = "/"
	uid := nobodyUID(t)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the harness: %v\n%s", err, out)
	}
	steps := clientSteps(out)
	check := func(step string, ok bool, want string) {
		t.Helper()
		var s struct {
			OK    bool            `json:"ok"`
			Value json.RawMessage `json:"value"`
			Error string          `json:"error"`
		}
		json.Unmarshal(steps[step], &s)
		if s.OK != ok || !strings.Contains(string(s.Value)+s.Error, want) {
			t.Errorf("%s: %s, want ok=%v with %q", step, steps[step], ok, want)
		}
	}
	check("exists-before", true, "false")
	check("build", true, `"tags":["v1"],"logged":true`)
	check("exists-after", true, "true")
	check("run", true, `"exitCode":0,"stdout":"task one\n/testbed\none\n2\n"`)
	check("by-tag", true, "true")
	check("tags", true, `["default","v1"]`)
	check("assign", true, `["stable"]`)
	check("not-declarative", false, `runCmd("make install") is not a declaration`)
	check("copy", false, "copy: a template's steps must be declarations")
	check("user-build", false, "the build is proposal")
	check("user-exists", true, "false")
	check("user-delete", false, "workshop.rm is for operators")
	check("delete", true, "true")
	check("exists-deleted", true, "false")

	// The record it made, as any other: its recipe readable, its version by root's key.
	if r := via(t, sock, 0, "", "workshop", "ls"); strings.Contains(r.stdout, name+" ") {
		t.Errorf("workshop ls after the delete:\n%s", r.stdout)
	}
	gone, _ := filepath.Glob(filepath.Join(root, "workshops", ".removed", name+"-*", "1", "workshop.toml"))
	if len(gone) != 1 {
		t.Fatalf("the retired record's recipe: %v", gone)
	}
	recipeText := string(must(os.ReadFile(gone[0])))
	for _, want := range []string{`seed = "oci://` + image + `"`, `packages = ["jq"]`, `workdir = "/testbed"`, "[env]\nTASK = \"one\""} {
		if !strings.Contains(recipeText, want) {
			t.Errorf("the template's recipe lacks %q:\n%s", want, recipeText)
		}
	}
	// The other user's build is a proposal an operator can read, for a record of its own.
	props, _ := filepath.Glob(filepath.Join(root, "proposals", "*", "proposal.json"))
	found := false
	for _, p := range props {
		b := string(must(os.ReadFile(p)))
		if strings.Contains(b, `"workshop": "`+name+`-user"`) && strings.Contains(b, `"proposer": "nobody"`) {
			found = true
		}
	}
	if !found {
		t.Errorf("no proposal of %s-user by nobody among %v", name, props)
	}
	mustShed(t, root, "store", "verify")
}
