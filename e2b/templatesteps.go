package e2b

import (
	"cmp"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"toolshed.dev/shed/app"
	"toolshed.dev/shed/recipe"
)

// A template's steps become a recipe when each is a declaration the recipe can hold: the base
// (fromImage, fromDebianImage, fromBaseImage, fromTemplate), the exact commands the SDK's aptInstall
// and pipInstall generate, setEnvs, setUser and setWorkdir. Anything else (runCmd of another
// command, copy, gitClone, npmInstall, a start command...) is not a declaration: it is refused,
// naming the step and what to declare instead, never run, because a Workshop is a readable recipe,
// not the result of commands.

// templateSpec is E2B's TemplateBuildStartV2.
type templateSpec struct {
	FromImage         string          `json:"fromImage"`
	FromTemplate      string          `json:"fromTemplate"`
	FromImageRegistry json.RawMessage `json:"fromImageRegistry"`
	Force             bool            `json:"force"`
	Steps             []templateStep  `json:"steps"`
	StartCmd          string          `json:"startCmd"`
	ReadyCmd          string          `json:"readyCmd"`
}

// templateStep is E2B's TemplateStep.
type templateStep struct {
	Type      string   `json:"type"`
	Args      []string `json:"args"`
	FilesHash string   `json:"filesHash"`
	Force     bool     `json:"force"`
}

// translated is a build's recipe, the record it starts from (fromTemplate), and what the build's
// log should say about the translation.
type translated struct {
	recipe string
	base   string
	notes  []string
}

// defaultBaseImage is what the SDK's fromBaseImage (and a template naming no base) asks for: E2B's
// base image, which is the Workshop record `base` here.
const defaultBaseImage = "e2bdev/base"

// The commands the SDK's aptInstall and pipInstall generate (js-sdk src/template/index.ts), run as
// root: nothing else matches.
var (
	aptInstallRE = sync.OnceValue(func() *regexp.Regexp {
		return regexp.MustCompile(`^apt-get update && DEBIAN_FRONTEND=noninteractive DEBCONF_NOWARNINGS=yes apt-get install -y (--no-install-recommends )?(--fix-missing )?(\S.*)$`)
	})
	pipInstallRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^pip install (\S.*)$`) })
)

// translate makes name's recipe of spec; base returns the recipe text of a record (fromTemplate).
func translate(name string, spec *templateSpec, base func(string) (string, error)) (*translated, error) {
	tr := &translated{}
	if s := strings.TrimSpace(string(spec.FromImageRegistry)); s != "" && s != "null" {
		return nil, &errStep{"base", "fromImage with registry credentials: credentials never go in a template; the supervisor's own registry auth file (docker's config.json or podman's auth.json, for root) has them, and fromImage names the image alone"}
	}
	text, err := baseRecipe(name, spec, base, tr)
	if err != nil {
		return nil, err
	}
	if spec.Force {
		tr.notes = append(tr.notes, "skipCache: nothing to skip: a recipe's paths are keyed by what they are built from, and realize builds what the store lacks")
	}
	r, err := recipe.Parse("workshop.toml", []byte(text), recipe.Options{})
	if err != nil {
		return nil, &errStep{"base", fmt.Sprintf("the base's recipe: %v", err)}
	}
	apt, pip := names(r.Apt.Packages), pipNames(r.Pip.Packages)
	aptList, pipList := aptStrings(r.Apt.Packages), pipStrings(r.Pip.Packages)
	accounts := map[string]bool{"root": true}
	for _, a := range r.Accounts {
		accounts[a.Name] = true
	}
	var env [][2]string
	workdir, user := "", ""
	for i, st := range spec.Steps {
		step := strconv.Itoa(i + 1)
		refuse := func(format string, args ...any) error {
			return &errStep{step, fmt.Sprintf("step %s (%s): ", step, describeStep(st)) + fmt.Sprintf(format, args...)}
		}
		switch st.Type {
		case "RUN":
			if len(st.Args) == 0 || len(st.Args) > 2 {
				return nil, refuse("a RUN step has a command and an optional user")
			}
			cmd, asUser := st.Args[0], ""
			if len(st.Args) == 2 {
				asUser = st.Args[1]
			}
			if m := aptInstallRE().FindStringSubmatch(cmd); m != nil && asUser == "root" {
				if m[1] == "" {
					tr.notes = append(tr.notes, "aptInstall: packages are installed without their recommends, as --no-install-recommends does")
				}
				for _, p := range strings.Fields(m[3]) {
					if _, err := recipe.ParseAptPackage(p); err != nil {
						return nil, refuse("%q is not a Debian package a recipe can name: %v", p, err)
					}
					if n, _, _ := strings.Cut(p, "="); !apt[n] {
						apt[n], aptList = true, append(aptList, p)
					}
				}
				continue
			}
			if m := pipInstallRE().FindStringSubmatch(cmd); m != nil && asUser == "root" {
				for _, p := range strings.Fields(m[1]) {
					if strings.HasPrefix(p, "-") || p == "." || strings.ContainsAny(p, "/") {
						return nil, refuse("pip install %s installs from files or with options, not named packages: declare the packages by name (pipInstall(['requests==2.32.3']))", p)
					}
					q, err := recipe.ParsePipPackage(p)
					if err != nil {
						return nil, refuse("%q is not a pip requirement a recipe can name: %v", p, err)
					}
					if n := recipe.NormalizePipName(q.Name); !pip[n] {
						pip[n], pipList = true, append(pipList, p)
					}
				}
				continue
			}
			return nil, refuse("%s is not a declaration: a Workshop's recipe names packages, not commands; declare Debian packages with aptInstall(...) or pip packages with pipInstall(...), put the rest in an image (fromImage), or run it after Sandbox.create (commands.run)", sdkMethod(cmd, asUser))
		case "ENV":
			if len(st.Args)%2 != 0 || len(st.Args) == 0 {
				return nil, refuse("setEnvs has pairs of a name and a value")
			}
			for j := 0; j < len(st.Args); j += 2 {
				env = append(env, [2]string{st.Args[j], st.Args[j+1]})
			}
		case "WORKDIR":
			if len(st.Args) != 1 || !strings.HasPrefix(st.Args[0], "/") {
				return nil, refuse("setWorkdir wants an absolute path here (a recipe's workdir is one directory, not relative to another)")
			}
			workdir = st.Args[0]
		case "USER":
			if len(st.Args) != 1 {
				return nil, refuse("setUser names one user")
			}
			user = st.Args[0]
		case "COPY":
			return nil, refuse("copy is not a declaration: a Workshop's recipe never holds files; put them in an image (fromImage) or write them after Sandbox.create (files.write)")
		default:
			return nil, refuse("a step of type %q is not one shed knows", st.Type)
		}
	}
	if spec.StartCmd != "" || spec.ReadyCmd != "" {
		return nil, &errStep{"finalize", "setStartCmd/setReadyCmd: a Workshop starts no process of its own; start it with commands.run({background: true}) after Sandbox.create"}
	}
	if len(aptList) > len(r.Apt.Packages) {
		if b, err := recipe.SetArray([]byte(text), "apt", "packages", aptList); err == nil {
			text = string(b)
		} else {
			return nil, &errStep{"base", err.Error()}
		}
	}
	if len(pipList) > len(r.Pip.Packages) {
		if b, err := recipe.SetArray([]byte(text), "pip", "packages", pipList); err == nil {
			text = string(b)
		} else {
			return nil, &errStep{"base", err.Error()}
		}
	}
	set := func(table, key, value string) error {
		b, err := recipe.SetString([]byte(text), table, key, value)
		if err != nil {
			return &errStep{"base", err.Error()}
		}
		text = string(b)
		return nil
	}
	if workdir != "" {
		if err := set("", "workdir", workdir); err != nil {
			return nil, err
		}
	}
	for _, kv := range env {
		if err := set("env", kv[0], kv[1]); err != nil {
			return nil, err
		}
	}
	if user != "" {
		if !accounts[user] {
			// The user a template's steps run as is an account the Workshop declares: it is made in
			// a layer of its own (useradd), from /etc/skel.
			text += fmt.Sprintf("\n[[account]]\nname = %q\n", user)
			tr.notes = append(tr.notes, fmt.Sprintf("setUser(%q): declared as an account of the Workshop ([[account]])", user))
		}
		if err := set("", "user", user); err != nil {
			return nil, err
		}
	}
	if _, err := recipe.Parse("workshop.toml", []byte(text), recipe.Options{}); err != nil {
		return nil, &errStep{"base", fmt.Sprintf("the template's recipe: %v", err)}
	}
	tr.recipe = text
	return tr, nil
}

// baseRecipe is the recipe the steps go over: a record's (fromTemplate, and fromBaseImage: the
// record `base`), or one with the image as its seed.
func baseRecipe(name string, spec *templateSpec, base func(string) (string, error), tr *translated) (string, error) {
	from := spec.FromTemplate
	image := spec.FromImage
	if from == "" && (image == "" || image == defaultBaseImage) {
		from = "base"
		tr.notes = append(tr.notes, "fromBaseImage: E2B's base image is the Workshop record base here")
	}
	if from != "" {
		recName, tag := splitName(from)
		if tag != "" && tag != "default" {
			return "", &errStep{"base", fmt.Sprintf("fromTemplate(%q): a build starts from a record's current version; name it without a tag", from)}
		}
		text, err := base(recName)
		if err != nil {
			e := app.Classify(err)
			return "", &errStep{"base", fmt.Sprintf("fromTemplate(%q): %v (`shed workshop ls` lists the records; an operator records one with `shed workshop add`)", recName, e.Error())}
		}
		b, err := recipe.SetString([]byte(text), "", "name", name)
		if err != nil {
			return "", &errStep{"base", err.Error()}
		}
		tr.base = recName
		return string(b), nil
	}
	seed, err := imageSeed(image)
	if err != nil {
		return "", err
	}
	tr.notes = append(tr.notes, fmt.Sprintf("fromImage(%q): the seed %s", image, seed))
	return fmt.Sprintf("name = %q\nseed = %q\n", name, seed), nil
}

// debianVersions are Debian images' numeric tags.
var debianVersions = map[string]string{"10": "buster", "11": "bullseye", "12": "bookworm", "13": "trixie", "14": "forky"}

// imageSeed is the seed of an image reference: Debian's images are Debian seeds (shed builds them
// from the mirror, as the image was), any other image is an oci:// seed of its registry (Docker
// Hub's when the reference names none).
func imageSeed(image string) (string, error) {
	name, digest, _ := strings.Cut(image, "@")
	repo, tag := name, ""
	if i := strings.LastIndex(name, ":"); i > strings.LastIndex(name, "/") {
		repo, tag = name[:i], name[i+1:]
	}
	if digest == "" && (repo == "debian" || repo == "library/debian" || repo == "docker.io/library/debian") {
		suite := strings.TrimSuffix(cmp.Or(tag, "stable"), "-slim")
		if v, ok := debianVersions[suite]; ok {
			suite = v
		}
		seed := "debian/" + suite
		if _, err := recipe.Parse("workshop.toml", fmt.Appendf(nil, "name = \"x\"\nseed = %q\n", seed), recipe.Options{}); err != nil {
			return "", &errStep{"base", fmt.Sprintf("fromImage(%q): Debian's images are Debian seeds here, and %s is not one: %v", image, seed, err)}
		}
		return seed, nil
	}
	first, _, hasSlash := strings.Cut(image, "/")
	ref := image
	if !hasSlash || !(strings.ContainsAny(first, ".:") || first == "localhost") {
		// Docker Hub, as docker pull reads a reference without a registry.
		if !hasSlash {
			ref = "docker.io/library/" + image
		} else {
			ref = "docker.io/" + image
		}
	}
	seed := "oci://" + ref
	if _, err := recipe.Parse("workshop.toml", fmt.Appendf(nil, "name = \"x\"\nseed = %q\n", seed), recipe.Options{}); err != nil {
		return "", &errStep{"base", fmt.Sprintf("fromImage(%q): %v", image, err)}
	}
	return seed, nil
}

// describeStep shows a step as its type and arguments, short.
func describeStep(st templateStep) string {
	s := st.Type + " " + strings.Join(st.Args, " ")
	if len(s) > 120 {
		s = s[:117] + "..."
	}
	return strings.TrimSpace(s)
}

// sdkMethod names the SDK call that generated a command, for the refusal.
func sdkMethod(cmd, user string) string {
	switch {
	case strings.HasPrefix(cmd, "git clone "):
		return "gitClone"
	case strings.HasPrefix(cmd, "npm install"):
		return "npmInstall"
	case strings.HasPrefix(cmd, "bun install"):
		return "bunInstall"
	case strings.HasPrefix(cmd, "pip install"):
		return "pipInstall of this form (as " + cmp.Or(user, "the default user") + ")"
	case strings.HasPrefix(cmd, "apt-get update"):
		return "this apt-get (not aptInstall's own command, as root)"
	case strings.HasPrefix(cmd, "rm "):
		return "remove"
	case strings.HasPrefix(cmd, "mv "):
		return "rename"
	case strings.HasPrefix(cmd, "mkdir -p"):
		return "makeDir"
	case strings.HasPrefix(cmd, "ln -s"):
		return "makeSymlink"
	}
	return fmt.Sprintf("runCmd(%.60q)", cmd)
}

func names(ps []recipe.AptPackage) map[string]bool {
	m := map[string]bool{}
	for _, p := range ps {
		m[p.Name] = true
	}
	return m
}

func pipNames(ps []recipe.PipPackage) map[string]bool {
	m := map[string]bool{}
	for _, p := range ps {
		m[recipe.NormalizePipName(p.Name)] = true
	}
	return m
}

func aptStrings(ps []recipe.AptPackage) []string {
	out := []string{}
	for _, p := range ps {
		out = append(out, p.String())
	}
	return out
}

func pipStrings(ps []recipe.PipPackage) []string {
	out := []string{}
	for _, p := range ps {
		out = append(out, p.String())
	}
	return out
}
