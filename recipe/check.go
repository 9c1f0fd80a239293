package recipe

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"
)

// checker walks the decoded document and collects every problem with its
// position; first returns the earliest. Collecting and sorting, rather than
// stopping at the first problem met, is what makes the reported error the
// first in file order: tables are walked one after the other, but a table's
// keys and the tables themselves can come in any order in the file.
type checker struct {
	doc       *document
	forbidden []string
	problems  []problem
	lines     map[string]int // each string's line by its field's name: Recipe.ErrorAt
}

type problem struct {
	off int
	err *Error
}

func (c *checker) first() *Error {
	if len(c.problems) == 0 {
		return nil
	}
	sort.SliceStable(c.problems, func(i, j int) bool { return c.problems[i].off < c.problems[j].off })
	return c.problems[0].err
}

// fail records a problem with field f, at f's position.
func (c *checker) fail(f field, msg, hint string) {
	c.failAt(f, f.name, msg, hint)
}

// failAt records a problem with the field named name, at at's position (used
// for a missing key, which has no position of its own).
func (c *checker) failAt(at field, name, msg, hint string) {
	off := c.doc.offset(at)
	line := c.doc.line(off)
	if off < 0 {
		off = noOffset
	}
	c.problems = append(c.problems, problem{off, &Error{Line: line, Field: name, Msg: msg, Hint: hint}})
}

func (c *checker) failErr(f field, e *Error) { c.fail(f, e.Msg, e.Hint) }

// line returns the line of f, for messages that name another line.
func (c *checker) line(f field) int { return c.doc.line(c.doc.offset(f)) }

// Keys of each table, in the order the documentation lists them.
var (
	topKeys     = []string{"name", "seed", "user", "workdir", "env", "apt", "pip", "network", "grant", "account"}
	aptKeys     = []string{"mirror", "packages", "source"}
	sourceKeys  = []string{"url", "suite", "components", "key"}
	pipKeys     = []string{"index", "packages"}
	networkKeys = []string{"profile", "allow", "secrets"}
	grantKeys   = []string{"path", "mode"}
	accountKeys = []string{"name", "uid", "home", "shell", "sudo"}
)

func (c *checker) recipe() *Recipe {
	r := &Recipe{
		Apt:     Apt{Mirror: DefaultMirror},
		Pip:     Pip{Index: DefaultIndex},
		Network: Network{Profile: "none"},
	}
	root, top := c.doc.root, field{}
	c.unknown(root, top, "top-level keys", topKeys)

	if s, f, ok := c.str(root, top, "name", `name = "jq-tools"`, true); ok {
		if e := checkName(s); e != nil {
			c.failErr(f, e)
		} else {
			r.Name = s
		}
	}
	seedS, seedF, seedOK := c.str(root, top, "seed", `seed = "debian/bookworm"`, true)
	if seedOK {
		if seed, e := parseSeed(seedS); e != nil {
			c.failErr(seedF, e)
		} else {
			r.Seed = seed
		}
	}
	if t, f, ok := c.table(root, top, "apt"); ok {
		c.apt(t, f, &r.Apt)
	}
	// Debian's mirror serves Debian's suites, which are known here: a near miss is a typo. Another
	// mirror may serve other names; realize asks it.
	if r.Seed.Kind == "debian" && strings.TrimSuffix(r.Apt.Mirror, "/") == DefaultMirror {
		if e := checkDebianSuite(r.Seed); e != nil {
			c.failErr(seedF, e)
		}
	}
	if t, f, ok := c.table(root, top, "pip"); ok {
		c.pip(t, f, &r.Pip)
	}
	if t, f, ok := c.table(root, top, "network"); ok {
		c.network(t, f, &r.Network)
	}
	c.grants(root, top, r)
	c.accounts(root, top, r)
	if s, f, ok := c.str(root, top, "workdir", `workdir = "/work"`, false); ok {
		if e := checkWorkdir(s); e != nil {
			c.failErr(f, e)
		} else {
			r.Workdir = s
		}
	}
	if t, f, ok := c.table(root, top, "env"); ok {
		c.env(t, f, r)
	}
	return r
}

func (c *checker) apt(t map[string]any, tf field, a *Apt) {
	c.unknown(t, tf, "keys in [apt]", aptKeys)
	if s, f, ok := c.str(t, tf, "mirror", `mirror = "`+DefaultMirror+`"`, false); ok {
		if e := checkURL(s); e != nil {
			c.failErr(f, e)
		} else {
			a.Mirror = s
		}
	}
	items, fields, _ := c.strList(t, tf, "packages", `packages = ["jq", "curl=7.88.1-10+deb12u5"]`)
	seen := make(map[string]field)
	for i, s := range items {
		p, err := ParseAptPackage(s)
		if err != nil {
			c.failErr(fields[i], err.(*Error))
			continue
		}
		if prev, dup := seen[p.Name]; dup {
			c.fail(fields[i], fmt.Sprintf("duplicate package %q (also at line %d)", p.Name, c.line(prev)),
				"list each package once; to pin it, keep a single entry name=VERSION")
			continue
		}
		seen[p.Name] = fields[i]
		a.Packages = append(a.Packages, p)
	}
	for _, st := range c.tables(t, tf, "source", "[[apt.source]]") {
		if src, ok := c.source(st.m, st.f); ok {
			a.Sources = append(a.Sources, src)
		}
	}
}

func (c *checker) source(t map[string]any, tf field) (AptSource, bool) {
	n := len(c.problems)
	c.unknown(t, tf, "keys in [[apt.source]]", sourceKeys)
	var src AptSource
	if s, f, ok := c.str(t, tf, "url", `url = "https://vendor.example.com/apt"`, true); ok {
		if e := checkURL(s); e != nil {
			c.failErr(f, e)
		}
		src.URL = s
	}
	if s, f, ok := c.str(t, tf, "suite", `suite = "stable"`, true); ok {
		if e := checkSuite(s); e != nil {
			c.failErr(f, e)
		}
		src.Suite = s
	}
	const compExample = `components = ["main"]`
	items, fields, present := c.strList(t, tf, "components", compExample)
	if !present {
		c.failAt(tf, tf.key("components").name, "required key is missing", "add a line such as "+compExample)
	} else if arr, ok := t["components"].([]any); ok && len(arr) == 0 {
		c.fail(tf.key("components"), "no components", "list at least one, e.g. "+compExample)
	}
	seen := make(map[string]field)
	for i, s := range items {
		if e := checkComponent(s); e != nil {
			c.failErr(fields[i], e)
			continue
		}
		if prev, dup := seen[s]; dup {
			c.fail(fields[i], fmt.Sprintf("duplicate component %q (also at line %d)", s, c.line(prev)),
				"list each component once")
			continue
		}
		seen[s] = fields[i]
		src.Components = append(src.Components, s)
	}
	if _, present := t["key"]; !present {
		c.failAt(tf, tf.key("key").name, "required key is missing: an unsigned repository is refused",
			`add key = "keys/vendor.asc": the path, relative to the recipe's directory, of the ASCII-armored OpenPGP public key that signs the repository`)
	} else if s, f, ok := c.str(t, tf, "key", `key = "keys/vendor.asc"`, true); ok {
		if e := checkKeyPath(s); e != nil {
			c.failErr(f, e)
		}
		src.Key = s
	}
	return src, len(c.problems) == n
}

func (c *checker) pip(t map[string]any, tf field, p *Pip) {
	c.unknown(t, tf, "keys in [pip]", pipKeys)
	if s, f, ok := c.str(t, tf, "index", `index = "`+DefaultIndex+`"`, false); ok {
		if e := checkURL(s); e != nil {
			c.failErr(f, e)
		} else {
			p.Index = s
		}
	}
	items, fields, _ := c.strList(t, tf, "packages", `packages = ["requests==2.31.0", "attrs"]`)
	seen := make(map[string]int) // normalized name → index in items
	for i, s := range items {
		pkg, err := ParsePipPackage(s)
		if err != nil {
			c.failErr(fields[i], err.(*Error))
			continue
		}
		norm := NormalizePipName(pkg.Name)
		if j, dup := seen[norm]; dup {
			prev, _ := ParsePipPackage(items[j])
			msg := fmt.Sprintf("duplicate package %q (also at line %d)", pkg.Name, c.line(fields[j]))
			if prev.Name != pkg.Name {
				msg = fmt.Sprintf("duplicate package %q: same as %q at line %d", pkg.Name, prev.Name, c.line(fields[j]))
			}
			c.fail(fields[i], msg,
				`list each package once (pip compares names ignoring case and treating "-", "_" and "." alike); to pin it, keep a single entry name==VERSION`)
			continue
		}
		seen[norm] = i
		p.Packages = append(p.Packages, pkg)
	}
}

func (c *checker) network(t map[string]any, tf field, n *Network) {
	c.unknown(t, tf, "keys in [network]", networkKeys)
	if s, f, ok := c.str(t, tf, "profile", `profile = "none"`, false); ok {
		if s != "none" && s != "debian" {
			hint := `use "none" (no network, the default) or "debian" (the apt mirror and sources); list other destinations in allow`
			if g := Suggest(s, []string{"none", "debian"}, 1); len(g) > 0 {
				hint = fmt.Sprintf("did you mean %q? %s", g[0], hint)
			}
			c.fail(f, fmt.Sprintf("unknown profile %q", s), hint)
		} else {
			n.Profile = s
		}
	}
	items, fields, _ := c.strList(t, tf, "allow", `allow = ["api.github.com", "example.org:8443"]`)
	seen := make(map[Host]field)
	for i, s := range items {
		h, err := ParseHost(s)
		if err != nil {
			c.failErr(fields[i], err.(*Error))
			continue
		}
		if prev, dup := seen[h]; dup {
			c.fail(fields[i], fmt.Sprintf("duplicate host %q (also at line %d)", h.String(), c.line(prev)),
				"list each destination once")
			continue
		}
		seen[h] = fields[i]
		n.Allow = append(n.Allow, h)
	}
	names, fields, _ := c.strList(t, tf, "secrets", `secrets = ["github-token"]`)
	named := make(map[string]field)
	for i, s := range names {
		if !secretNameRE().MatchString(s) {
			c.fail(fields[i], fmt.Sprintf("secret name %q: lowercase letters, digits, '-', '_' and '.'", s),
				"name a secret of `shed secret ls`; the recipe holds names, never values")
			continue
		}
		if prev, dup := named[s]; dup {
			c.fail(fields[i], fmt.Sprintf("duplicate secret %q (also at line %d)", s, c.line(prev)), "list each secret once")
			continue
		}
		named[s] = fields[i]
		n.Secrets = append(n.Secrets, s)
	}
}

// secretNameRE is package secret's name rule (recipe imports no package of the project).
var secretNameRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,62}$`) })

func (c *checker) grants(root map[string]any, top field, r *Recipe) {
	forbidden := c.forbidden
	seen := make(map[string]field)
	for _, gt := range c.tables(root, top, "grant", "[[grant]]") {
		c.unknown(gt.m, gt.f, "keys in [[grant]]", grantKeys)
		g := Grant{Mode: "ro"}
		ok := true
		if s, f, present := c.str(gt.m, gt.f, "path", `path = "/srv/project"`, true); present {
			if err := CheckGrantPath(s, forbidden); err != nil {
				c.failErr(f, err.(*Error))
				ok = false
			} else if prev, dup := seen[s]; dup {
				c.fail(f, fmt.Sprintf("duplicate grant %q (also at line %d)", s, c.line(prev)),
					`grant each path once; set mode = "rw" on that one entry to make it writable`)
				ok = false
			} else {
				seen[s] = f
				g.Path = s
			}
		} else {
			ok = false
		}
		if s, f, present := c.str(gt.m, gt.f, "mode", `mode = "ro"`, false); present {
			if s != "ro" && s != "rw" {
				hint := `use "ro" (read-only, the default) or "rw" (read-write)`
				if s == "wr" || s == "or" {
					hint = fmt.Sprintf("did you mean %q? %s", string([]byte{s[1], s[0]}), hint)
				}
				c.fail(f, fmt.Sprintf("unknown mode %q", s), hint)
				ok = false
			} else {
				g.Mode = s
			}
		}
		if ok {
			r.Grants = append(r.Grants, g)
		}
	}
}

// unknown reports each key of t that is not in allowed.
func (c *checker) unknown(t map[string]any, tf field, what string, allowed []string) {
	for k := range t {
		if contains(allowed, k) {
			continue
		}
		msg := "unknown key"
		if e := checkText(k); e != nil {
			msg += " (" + e.Msg + ")"
		}
		hint := "allowed " + what + ": " + strings.Join(allowed, ", ")
		if s := suggest(k, allowed); s != "" {
			hint += `; did you mean "` + s + `"?`
		}
		if strings.HasPrefix(tf.name, "apt.source[") {
			switch strings.ToLower(k) {
			case "trusted", "signed-by", "allow-insecure", "allow_insecure":
				hint = `every repository is verified against key = "keys/NAME.asc"; trusted or unsigned repositories are refused`
			}
		}
		c.fail(tf.key(k), msg, hint)
	}
}

// str returns the string at t[k]. ok is false when it is absent (reported if
// required) or invalid (reported).
func (c *checker) str(t map[string]any, tf field, k, example string, required bool) (string, field, bool) {
	f := tf.key(k)
	v, present := t[k]
	if !present {
		if required {
			c.failAt(tf, f.name, "required key is missing", "add a line such as "+example)
		}
		return "", f, false
	}
	s, isStr := v.(string)
	if !isStr {
		c.fail(f, fmt.Sprintf("wrong type: %s, want a string", typeName(v)), "write it like this: "+example)
		return "", f, false
	}
	if e := checkText(s); e != nil {
		c.failErr(f, e)
		return "", f, false
	}
	c.at(f)
	return s, f, true
}

// at keeps f's line for Recipe.ErrorAt.
func (c *checker) at(f field) {
	if c.lines == nil {
		c.lines = map[string]int{}
	}
	c.lines[f.name] = c.doc.line(c.doc.offset(f))
}

// strList returns the strings of the array at t[k] that are strings of plain
// ASCII, with their fields; the others are reported. present is false when
// t[k] is absent.
func (c *checker) strList(t map[string]any, tf field, k, example string) (items []string, fields []field, present bool) {
	f := tf.key(k)
	v, present := t[k]
	if !present {
		return nil, nil, false
	}
	arr, ok := v.([]any)
	if !ok {
		c.fail(f, fmt.Sprintf("wrong type: %s, want an array of strings", typeName(v)), "write it like this: "+example)
		return nil, nil, true
	}
	for i, e := range arr {
		ef := f.index(i)
		s, ok := e.(string)
		if !ok {
			c.fail(ef, fmt.Sprintf("wrong type: %s, want a string", typeName(e)), "write it like this: "+example)
			continue
		}
		if te := checkText(s); te != nil {
			c.failErr(ef, te)
			continue
		}
		c.at(ef)
		items = append(items, s)
		fields = append(fields, ef)
	}
	return items, fields, true
}

// table returns the table at t[k]; ok is false when absent or not a table.
func (c *checker) table(t map[string]any, tf field, k string) (map[string]any, field, bool) {
	f := tf.key(k)
	v, present := t[k]
	if !present {
		return nil, f, false
	}
	m, ok := v.(map[string]any)
	if !ok {
		c.fail(f, fmt.Sprintf("wrong type: %s, want a table", typeName(v)), "write it as a table: ["+f.name+"] on its own line, its keys below")
		return nil, f, false
	}
	return m, f, true
}

type tableAt struct {
	m map[string]any
	f field
}

// tables returns the tables of the array of tables at t[k].
func (c *checker) tables(t map[string]any, tf field, k, header string) []tableAt {
	f := tf.key(k)
	v, present := t[k]
	if !present {
		return nil
	}
	hint := "write " + header + " (double brackets) before each entry"
	arr, ok := v.([]any)
	if !ok {
		c.fail(f, fmt.Sprintf("wrong type: %s, want an array of tables", typeName(v)), hint)
		return nil
	}
	var out []tableAt
	for i, e := range arr {
		ef := f.index(i)
		m, ok := e.(map[string]any)
		if !ok {
			c.fail(ef, fmt.Sprintf("wrong type: %s, want a table", typeName(e)), hint)
			continue
		}
		out = append(out, tableAt{m, ef})
	}
	return out
}

// typeName names a decoded value's TOML type.
func typeName(v any) string {
	switch v.(type) {
	case string:
		return "string"
	case int64:
		return "integer"
	case float64:
		return "float"
	case bool:
		return "boolean"
	case []any:
		return "array"
	case map[string]any:
		return "table"
	case time.Time:
		return "datetime"
	default:
		return "date or time"
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// suggest returns the allowed key closest to k when it is a likely typo.
func suggest(k string, allowed []string) string {
	best, bestD := "", 3
	for _, a := range allowed {
		if d := editDistance(strings.ToLower(k), a); d < bestD && d < len(a) {
			best, bestD = a, d
		}
	}
	return best
}

// editDistance is the optimal string alignment distance (Levenshtein's, with a swap of two
// neighbouring letters one edit: "bookwrom"), for "did you mean" hints only.
func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return 1 << 30
	}
	before := make([]int, len(b)+1)
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], before[j-2]+1)
			}
		}
		before, prev, cur = prev, cur, before
	}
	return prev[len(b)]
}
