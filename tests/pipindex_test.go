package tests

import (
	"archive/zip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
)

// pipIndex is a PEP 503 simple index on 127.0.0.1 serving test wheels. The
// machines running the tests cannot reach PyPI; this stands in for it, with
// switches to make single files go missing, corrupt or cut off.
type pipIndex struct {
	server *httptest.Server
	body   map[string][]byte // file name → its true bytes
	sum    map[string]string // file name → hex sha256 of body

	mu                       sync.Mutex
	removed, corrupt, midway map[string]bool
	downloads                map[string]int
}

// newPipIndex starts an index serving every wheel of pipWheels(t).
func newPipIndex(t *testing.T) *pipIndex {
	t.Helper()
	x := &pipIndex{body: map[string][]byte{}, sum: map[string]string{}, downloads: map[string]int{}}
	x.Restore()
	for name, path := range pipWheels(t) {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		s := sha256.Sum256(b)
		x.body[name], x.sum[name] = b, hex.EncodeToString(s[:])
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /simple/{$}", x.serveRoot)
	mux.HandleFunc("GET /simple/{project}/{$}", x.serveProject)
	mux.HandleFunc("GET /simple/{project}", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/simple/"+pep503(r.PathValue("project"))+"/", http.StatusMovedPermanently)
	})
	mux.HandleFunc("GET /files/{file}", x.serveFile)
	x.server = httptest.NewServer(mux)
	t.Cleanup(x.server.Close)
	// httptest falls back to [::1] when 127.0.0.1 is unavailable; the
	// callers were promised 127.0.0.1.
	if !strings.HasPrefix(x.server.URL, "http://127.0.0.1:") {
		t.Fatalf("index listens on %s, want 127.0.0.1", x.server.URL)
	}
	return x
}

// URL is the index URL, as given to pip's --index-url.
func (x *pipIndex) URL() string { return x.server.URL + "/simple/" }

// Downloads is how many times GET /files/<file> started sending the body.
func (x *pipIndex) Downloads(file string) int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.downloads[file]
}

func (x *pipIndex) ResetDownloads() {
	x.mu.Lock()
	defer x.mu.Unlock()
	clear(x.downloads)
}

// Remove unlists file and makes GET /files/<file> a 404.
func (x *pipIndex) Remove(file string) { x.set(x.removed, file) }

// Corrupt keeps file listed with its true sha256 but serves other bytes of
// the same length.
func (x *pipIndex) Corrupt(file string) { x.set(x.corrupt, file) }

// FailMidway makes GET /files/<file> announce the full length, send half and
// drop the connection.
func (x *pipIndex) FailMidway(file string) { x.set(x.midway, file) }

// Restore undoes every Remove, Corrupt and FailMidway.
func (x *pipIndex) Restore() {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.removed, x.corrupt, x.midway = map[string]bool{}, map[string]bool{}, map[string]bool{}
}

func (x *pipIndex) set(m map[string]bool, file string) {
	if _, ok := x.body[file]; !ok {
		// A typo would otherwise make a test pass for the wrong reason.
		panic(fmt.Sprintf("pipIndex: no wheel %q", file))
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	m[file] = true
}

// pep503 normalizes a project name: lowercase, runs of -_. become one "-".
func pep503(name string) string {
	return strings.ToLower(regexp.MustCompile(`[-_.]+`).ReplaceAllString(name, "-"))
}

// projectOf is the normalized project of a wheel file name: its first
// dash-separated component (the name part never holds a dash in a wheel).
func projectOf(file string) string {
	name, _, _ := strings.Cut(file, "-")
	return pep503(name)
}

func writeHTML(w http.ResponseWriter, links []string) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	fmt.Fprintf(w, "<!DOCTYPE html><html><body>\n%s</body></html>\n", strings.Join(links, ""))
}

func (x *pipIndex) serveRoot(w http.ResponseWriter, r *http.Request) {
	var projects []string
	for file := range x.body {
		projects = append(projects, projectOf(file))
	}
	slices.Sort(projects)
	var links []string
	for _, p := range slices.Compact(projects) {
		links = append(links, fmt.Sprintf("<a href=\"/simple/%s/\">%s</a><br>\n", p, p))
	}
	writeHTML(w, links)
}

func (x *pipIndex) serveProject(w http.ResponseWriter, r *http.Request) {
	project := r.PathValue("project")
	if n := pep503(project); n != project {
		http.Redirect(w, r, "/simple/"+n+"/", http.StatusMovedPermanently)
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	known := false
	var links []string
	for _, file := range slices.Sorted(maps.Keys(x.body)) {
		if projectOf(file) != project {
			continue
		}
		known = true // a project whose files are all removed still exists
		if !x.removed[file] {
			links = append(links, fmt.Sprintf("<a href=\"/files/%s#sha256=%s\">%s</a><br>\n", file, x.sum[file], file))
		}
	}
	if !known {
		http.NotFound(w, r)
		return
	}
	writeHTML(w, links)
}

func (x *pipIndex) serveFile(w http.ResponseWriter, r *http.Request) {
	file := r.PathValue("file")
	x.mu.Lock()
	body, ok := x.body[file]
	ok = ok && !x.removed[file]
	corrupt, midway := x.corrupt[file], x.midway[file]
	if ok && r.Method == http.MethodGet {
		x.downloads[file]++
	}
	x.mu.Unlock()
	if !ok {
		http.NotFound(w, r)
		return
	}
	if corrupt {
		body = slices.Clone(body)
		body[len(body)/2] ^= 0xff
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", fmt.Sprint(len(body)))
	if !midway {
		w.Write(body)
		return
	}
	w.WriteHeader(http.StatusOK)
	w.Write(body[:len(body)/2])
	rc := http.NewResponseController(w)
	rc.Flush() // Hijack flushes the connection's buffer, not the response's
	conn, _, err := rc.Hijack()
	if err != nil {
		panic(http.ErrAbortHandler) // drops the connection all the same
	}
	conn.Close()
}

// wheelSpec is one test wheel: a setuptools project of one module.
type wheelSpec struct {
	file             string // the wheel file name setuptools must produce
	project, version string
	module, source   string // module name, its .py content
	requires         []string
}

var testWheels = []wheelSpec{
	{"shedtest_alpha-1.0-py3-none-any.whl", "shedtest-alpha", "1.0", "shedtest_alpha", "VERSION = \"1.0\"\n", nil},
	{"shedtest_alpha-2.0-py3-none-any.whl", "shedtest-alpha", "2.0", "shedtest_alpha", "VERSION = \"2.0\"\n", nil},
	{"shedtest_beta-1.0-py3-none-any.whl", "shedtest-beta", "1.0", "shedtest_beta",
		"import shedtest_alpha\n\n\ndef hello():\n    return \"beta \" + shedtest_alpha.VERSION\n",
		[]string{"shedtest-alpha>=1.0"}},
	{"shedtest_gamma-1.0-py3-none-any.whl", "shedtest-gamma", "1.0", "shedtest_gamma",
		"VERSION = \"1.0\"\n\n\ndef hello():\n    return \"gamma\"\n", nil},
}

// debianPython is Debian's interpreter, named in full: PATH may lead to
// another Python (pyenv) that lacks Debian's setuptools and wheel.
const debianPython = "/usr/bin/python3"

var builtWheels struct {
	once  sync.Once
	files map[string]string
	err   error
}

// pipWheels returns the test wheels and Debian's pip and setuptools wheels,
// base name → absolute path, built once per test binary.
func pipWheels(t *testing.T) map[string]string {
	t.Helper()
	builtWheels.once.Do(func() { builtWheels.files, builtWheels.err = buildPipWheels() })
	if builtWheels.err != nil {
		t.Fatal(builtWheels.err)
	}
	return maps.Clone(builtWheels.files)
}

func buildPipWheels() (map[string]string, error) {
	tools, err := exec.Command(debianPython, "-c", "import sys, setuptools, wheel; print(sys.version, setuptools.__version__, wheel.__version__)").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("%s cannot build wheels (apt-get install python3 python3-setuptools python3-wheel): %v\n%s", debianPython, err, tools)
	}
	var debian []string
	for _, w := range []struct{ glob, pkg string }{{"pip-*.whl", "python3-pip-whl"}, {"setuptools-*.whl", "python3-setuptools-whl"}} {
		m, _ := filepath.Glob(filepath.Join("/usr/share/python-wheels", w.glob))
		if len(m) == 0 {
			return nil, fmt.Errorf("no /usr/share/python-wheels/%s (apt-get install %s)", w.glob, w.pkg)
		}
		debian = append(debian, m...)
	}

	// The wheels are reproducible (SOURCE_DATE_EPOCH), so a directory named
	// by everything that goes into them serves every later run too.
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%#v\n", tools, testWheels)
	for _, path := range debian {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		h.Write(b)
	}
	dir := filepath.Join(os.TempDir(), "shed-pipwheels-"+hex.EncodeToString(h.Sum(nil))[:16])
	files := map[string]string{}
	for _, s := range testWheels {
		files[s.file] = filepath.Join(dir, s.file)
	}
	for _, path := range debian {
		files[filepath.Base(path)] = filepath.Join(dir, filepath.Base(path))
	}
	complete := func() bool {
		for _, path := range files {
			if _, err := os.Stat(path); err != nil {
				return false
			}
		}
		return true
	}
	if complete() {
		return files, nil
	}
	os.RemoveAll(dir) // partial: a tmp cleaner pruned it

	tmp, err := os.MkdirTemp("", "shed-pipwheels-build-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	out := filepath.Join(tmp, "out")
	if err := os.Mkdir(out, 0o755); err != nil {
		return nil, err
	}
	for i, s := range testWheels {
		if err := buildWheel(s, filepath.Join(tmp, fmt.Sprint(i)), out); err != nil {
			return nil, err
		}
	}
	for _, path := range debian {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(out, filepath.Base(path)), b, 0o644); err != nil {
			return nil, err
		}
	}
	// Atomic, so no run sees a half-built directory; if another test binary
	// got there first, its identical wheels do.
	if err := os.Rename(out, dir); err != nil && !complete() {
		return nil, err
	}
	return files, nil
}

// buildWheel builds s in src with setuptools and moves the wheel into out.
func buildWheel(s wheelSpec, src, out string) error {
	quoted := make([]string, len(s.requires))
	for i, r := range s.requires {
		quoted[i] = fmt.Sprintf("%q", r)
	}
	setup := fmt.Sprintf("from setuptools import setup\n\nsetup(name=%q, version=%q, py_modules=[%q], install_requires=[%s])\n",
		s.project, s.version, s.module, strings.Join(quoted, ", "))
	if err := os.MkdirAll(src, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(src, "setup.py"), []byte(setup), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(src, s.module+".py"), []byte(s.source), 0o644); err != nil {
		return err
	}
	dist := filepath.Join(src, "dist")
	cmd := exec.Command(debianPython, "setup.py", "-q", "bdist_wheel", "--dist-dir", dist)
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "SOURCE_DATE_EPOCH=1700000000")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build %s: %v\n%s", s.file, err, b)
	}
	ents, err := os.ReadDir(dist)
	if err != nil {
		return err
	}
	if len(ents) != 1 || ents[0].Name() != s.file {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		return fmt.Errorf("build %s: setuptools made %v", s.file, names)
	}
	return os.Rename(filepath.Join(dist, s.file), filepath.Join(out, s.file))
}

// pipClient never follows redirects, so the test sees them, and never uses a
// proxy: all traffic stays on loopback.
var pipClient = &http.Client{
	Transport:     &http.Transport{Proxy: nil, DisableKeepAlives: true},
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
}

// fetch GETs url; err is the error reading the body.
func fetch(t *testing.T, url string) (resp *http.Response, body []byte, err error) {
	t.Helper()
	resp, err = pipClient.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err = io.ReadAll(resp.Body)
	return resp, body, err
}

// mustFetch GETs url and wants the status code and a whole body.
func mustFetch(t *testing.T, url string, code int) []byte {
	t.Helper()
	resp, body, err := fetch(t, url)
	if err != nil || resp.StatusCode != code {
		t.Fatalf("GET %s: %d, %v; want %d", url, resp.StatusCode, err, code)
	}
	return body
}

// pageLinks is the anchors of an index page, href → text.
func pageLinks(page []byte) map[string]string {
	links := map[string]string{}
	for _, m := range regexp.MustCompile(`<a href="([^"]*)">([^<]*)</a>`).FindAllSubmatch(page, -1) {
		links[string(m[1])] = string(m[2])
	}
	return links
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// wheelMetadata is the Name, Version and Requires-Dist of a wheel's METADATA.
func wheelMetadata(t *testing.T, path string) (name, version string, requires []string) {
	t.Helper()
	z, err := zip.OpenReader(path)
	if err != nil {
		t.Fatal(err)
	}
	defer z.Close()
	for _, f := range z.File {
		if !regexp.MustCompile(`^[^/]+\.dist-info/METADATA$`).MatchString(f.Name) {
			continue
		}
		r, err := f.Open()
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(r)
		r.Close()
		if err != nil {
			t.Fatal(err)
		}
		// Headers end at the first blank line; the description follows.
		head, _, _ := strings.Cut(string(b), "\n\n")
		for line := range strings.SplitSeq(head, "\n") {
			k, v, _ := strings.Cut(line, ": ")
			switch k {
			case "Name":
				name = v
			case "Version":
				version = v
			case "Requires-Dist":
				// wheel 0.38 writes "shedtest-alpha (>=1.0)", newer ones
				// "shedtest-alpha>=1.0": the same requirement.
				requires = append(requires, strings.NewReplacer(" ", "", "(", "", ")", "").Replace(v))
			}
		}
		return name, version, requires
	}
	t.Fatalf("%s: no *.dist-info/METADATA", path)
	return
}

// TestPipIndex checks the fixture itself: the wheels, the PEP 503 pages and
// each way a file can be made to fail.
func TestPipIndex(t *testing.T) {
	x := newPipIndex(t)
	wheels := pipWheels(t)
	base := strings.TrimSuffix(x.URL(), "/simple/")
	const a1, a2, beta = "shedtest_alpha-1.0-py3-none-any.whl", "shedtest_alpha-2.0-py3-none-any.whl", "shedtest_beta-1.0-py3-none-any.whl"

	// The wheels carry the names and requirements pip will resolve.
	for file, want := range map[string][3]string{
		a1:                                    {"shedtest-alpha", "1.0", ""},
		a2:                                    {"shedtest-alpha", "2.0", ""},
		beta:                                  {"shedtest-beta", "1.0", "shedtest-alpha>=1.0"},
		"shedtest_gamma-1.0-py3-none-any.whl": {"shedtest-gamma", "1.0", ""},
	} {
		name, version, requires := wheelMetadata(t, wheels[file])
		if name != want[0] || version != want[1] || strings.Join(requires, ",") != want[2] {
			t.Errorf("%s: Name %q, Version %q, Requires-Dist %q; want %q", file, name, version, requires, want)
		}
	}
	// And their code runs: a wheel is importable straight from sys.path.
	cmd := exec.Command(debianPython, "-c", "import shedtest_beta, shedtest_gamma; print(shedtest_beta.hello(), shedtest_gamma.hello())")
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1", "PYTHONPATH="+wheels[a2]+":"+wheels[beta]+":"+wheels["shedtest_gamma-1.0-py3-none-any.whl"])
	if out, err := cmd.CombinedOutput(); err != nil || string(out) != "beta 2.0 gamma\n" {
		t.Errorf("import the wheels: %v\n%s", err, out)
	}

	// The root page lists every project by its normalized name.
	want := map[string]string{}
	for _, p := range []string{"pip", "setuptools", "shedtest-alpha", "shedtest-beta", "shedtest-gamma"} {
		want["/simple/"+p+"/"] = p
	}
	if got := pageLinks(mustFetch(t, x.URL(), 200)); !maps.Equal(got, want) {
		t.Errorf("/simple/ links %v, want %v", got, want)
	}
	for path, code := range map[string]int{
		"/simple/shedtest-alpha":  http.StatusMovedPermanently,
		"/simple/Shedtest_Alpha/": http.StatusMovedPermanently,
		"/simple/nope/":           http.StatusNotFound,
		"/files/nope.whl":         http.StatusNotFound,
	} {
		resp, _, _ := fetch(t, base+path)
		if resp.StatusCode != code || code == 301 && resp.Header.Get("Location") != "/simple/shedtest-alpha/" {
			t.Errorf("GET %s: %d to %q, want %d", path, resp.StatusCode, resp.Header.Get("Location"), code)
		}
	}

	// alpha is its two versions, each link's hash that of the bytes served;
	// listed tells whether the page lists file.
	alpha := func() map[string]string {
		resp, body, err := fetch(t, x.URL()+"shedtest-alpha/")
		if err != nil || resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
			t.Fatalf("project page: %d %q %v", resp.StatusCode, resp.Header.Get("Content-Type"), err)
		}
		return pageLinks(body)
	}
	listed := func(file string) string {
		for href, text := range alpha() {
			if text == file {
				return href
			}
		}
		return ""
	}
	links := alpha()
	if len(links) != 2 {
		t.Errorf("shedtest-alpha page: %v, want 2 files", links)
	}
	for _, file := range []string{a1, a2} {
		path, sum, _ := strings.Cut(listed(file), "#sha256=")
		if path != "/files/"+file {
			t.Fatalf("%s listed as %q", file, path)
		}
		local, _ := os.ReadFile(wheels[file])
		if got := mustFetch(t, base+path, 200); sha256Hex(got) != sum || sum != sha256Hex(local) {
			t.Errorf("%s: served sha256 %s, listed %s, file %s", file, sha256Hex(got), sum, sha256Hex(local))
		}
	}

	// Downloads counts bodies served.
	x.ResetDownloads()
	mustFetch(t, base+"/files/"+a1, 200)
	mustFetch(t, base+"/files/"+a1, 200)
	if n := x.Downloads(a1); n != 2 {
		t.Errorf("Downloads(%s) = %d, want 2", a1, n)
	}

	x.Remove(a1)
	mustFetch(t, base+"/files/"+a1, 404)
	if listed(a1) != "" || listed(a2) == "" {
		t.Errorf("after Remove(%s): %v", a1, alpha())
	}
	if n := x.Downloads(a1); n != 2 {
		t.Errorf("a 404 counted as a download: %d", n)
	}

	x.Corrupt(a2)
	_, sum, _ := strings.Cut(listed(a2), "#sha256=")
	got := mustFetch(t, base+"/files/"+a2, 200)
	if len(got) != len(x.body[a2]) || sha256Hex(got) == sum || sum != x.sum[a2] {
		t.Errorf("Corrupt: %d bytes, sha256 %s, listed %s; want %d bytes, other than %s", len(got), sha256Hex(got), sum, len(x.body[a2]), x.sum[a2])
	}

	x.FailMidway(beta)
	resp, got, err := fetch(t, base+"/files/"+beta)
	if !errors.Is(err, io.ErrUnexpectedEOF) || resp.ContentLength != int64(len(x.body[beta])) || len(got) != len(x.body[beta])/2 {
		t.Errorf("FailMidway: Content-Length %d, read %d bytes then %v; want %d, %d then %v",
			resp.ContentLength, len(got), err, len(x.body[beta]), len(x.body[beta])/2, io.ErrUnexpectedEOF)
	}
	if n := x.Downloads(beta); n != 1 {
		t.Errorf("Downloads(%s) after a cut transfer = %d, want 1", beta, n)
	}

	x.Restore()
	if len(alpha()) != 2 {
		t.Errorf("after Restore: %v", alpha())
	}
	for _, file := range []string{a1, a2, beta} {
		if got := mustFetch(t, base+"/files/"+file, 200); sha256Hex(got) != x.sum[file] {
			t.Errorf("after Restore, %s has sha256 %s, want %s", file, sha256Hex(got), x.sum[file])
		}
	}
}
