package e2b

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"toolshed.dev/shed/app"
	"toolshed.dev/shed/records"
)

// E2B's Template API. A template is a Workshop record (its name is the template's id and alias); a
// build is a recipe made from the build's steps when every step is a declaration (templatesteps.go)
// and submitted (workshop.submit): an operator's key records it as the record's next version, any
// other key's becomes a proposal that an operator promotes, and the build's status says so. Builds
// run in the supervisor; their status and logs are kept in its memory until it stops (the record or
// the proposal is what lasts).

// maxBuilds bounds the builds whose status the server keeps: the oldest finished go first.
const maxBuilds = 256

// maxBuildsRunning bounds the builds that run at once, of one user and in all: each locks and
// realizes a recipe, which holds a core and the store's disk.
const (
	maxBuildsRunning     = 8
	maxUserBuildsRunning = 2
)

// maxLogEntries bounds a build's log, and maxLogPage a status answer's page of it (E2B's 100).
const (
	maxLogEntries = 10_000
	maxLogPage    = 100
)

type logEntry struct {
	Timestamp time.Time `json:"timestamp"`
	Level     string    `json:"level"`
	Message   string    `json:"message"`
}

type buildReason struct {
	Message    string     `json:"message"`
	Step       string     `json:"step,omitempty"`
	LogEntries []logEntry `json:"logEntries"`
}

// templateBuild is one build: requested (waiting), triggered (building), then ready or error.
type templateBuild struct {
	id, name string
	tags     []string
	user     string // the key's user: only they (and operators) see it
	created  time.Time

	mu     sync.Mutex
	status string
	logs   []logEntry
	reason *buildReason
}

func (b *templateBuild) log(level, format string, args ...any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.logs) < maxLogEntries {
		b.logs = append(b.logs, logEntry{Timestamp: time.Now().UTC(), Level: level, Message: fmt.Sprintf(format, args...)})
	}
}

func (b *templateBuild) finish(status string, reason *buildReason) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.status, b.reason = status, reason
}

// buildLog takes what a submit reports (notices, steps, the builds' own output) as log lines. It is
// a builder.Status, written from the goroutines that copy a build's stdout and stderr at once.
type buildLog struct {
	b       *templateBuild
	mu      sync.Mutex
	partial []byte
}

func (l *buildLog) Begin(what string)   { l.b.log("info", "%s", what) }
func (l *buildLog) Bytes(done, _ int64) {}
func (l *buildLog) End() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.flush()
}

func (l *buildLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.partial = append(l.partial, p...)
	for {
		i := slices.Index(l.partial, '\n')
		if i < 0 {
			break
		}
		if line := strings.TrimRight(string(l.partial[:i]), "\r"); line != "" {
			l.b.log("debug", "%s", line)
		}
		l.partial = l.partial[i+1:]
	}
	if len(l.partial) > 4096 {
		l.flush()
	}
	return len(p), nil
}

// flush logs what is left of a line; the caller holds mu.
func (l *buildLog) flush() {
	if len(l.partial) > 0 {
		l.b.log("debug", "%s", l.partial)
		l.partial = nil
	}
}

func newUUID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return formatUUID(b, 4)
}

// versionBuildID is the build id a record version answers to in the tags API: derived from its
// name and number, so that it is the same on every call.
func versionBuildID(name string, n int) string {
	sum := sha256.Sum256([]byte("shed template build\x00" + name + "\x00" + strconv.Itoa(n)))
	var b [16]byte
	copy(b[:], sum[:])
	return formatUUID(b, 8)
}

func formatUUID(b [16]byte, version byte) string {
	b[6] = b[6]&0x0f | version<<4
	b[8] = b[8]&0x3f | 0x80
	h := fmt.Sprintf("%x", b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// splitName splits E2B's "name:tag".
func splitName(s string) (name, tag string) {
	name, tag, _ = strings.Cut(s, ":")
	return name, tag
}

// templateGet is GET /templates/aliases/{alias} and GET /templates/{templateID}/tags.
func (s *Server) templateGet(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.PathValue("templateID") == "aliases":
		s.templateAlias(w, r, r.PathValue("what"))
	case r.PathValue("what") == "tags":
		s.templateTags(w, r)
	default:
		if s.authorized(w, r) != nil {
			writeError(w, http.StatusNotImplemented, "GET %s: templates are Workshop records: the SDK's build, exists, tags and delete are served; `shed workshop ls` lists them", r.URL.Path)
		}
	}
}

// templateAlias is GET /templates/aliases/{alias}: 200 with the template when the caller may
// launch it, 403 when the record exists but is not theirs to launch (the SDK's exists says true),
// 404 when there is none.
func (s *Server) templateAlias(w http.ResponseWriter, r *http.Request, alias string) {
	c := s.authorized(w, r)
	if c == nil {
		return
	}
	name, _ := splitName(alias)
	if s.launchable(r, c, name) {
		writeJSON(w, http.StatusOK, map[string]any{"templateID": name, "public": false})
		return
	}
	if _, err := s.Service.Do(r.Context(), &app.Call{Caller: c}, "workshop.log", &app.WorkshopRequest{Name: name}); err == nil {
		writeError(w, http.StatusForbidden, "template %q is a Workshop record %s may not launch (an operator allows it: `shed workshop allow %s %s`)", name, c.User, name, c.User)
		return
	}
	writeError(w, http.StatusNotFound, "template %q not found: no Workshop record of that name (`shed workshop ls`)", name)
}

// requestBuild is POST /v3/templates (and the older /v2/templates, with alias): a build of name,
// waiting for its steps.
func (s *Server) requestBuild(w http.ResponseWriter, r *http.Request) {
	c := s.authorized(w, r)
	if c == nil {
		return
	}
	var req struct {
		Name     string   `json:"name"`
		Alias    string   `json:"alias"`
		Tags     []string `json:"tags"`
		CPUCount *int     `json:"cpuCount"`
		MemoryMB *int     `json:"memoryMB"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, maxBody)).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "request body: %v", err)
		return
	}
	name, tag := splitName(cmp.Or(req.Name, req.Alias))
	tags := slices.Clone(req.Tags)
	if tag != "" && !slices.Contains(tags, tag) {
		tags = append(tags, tag)
	}
	tags = slices.DeleteFunc(tags, func(t string) bool { return t == records.DefaultTag }) // always the new version
	if !records.IsName(name) {
		writeError(w, http.StatusBadRequest, "name %q: a template here is a Workshop record: lowercase letters, digits, '.', '_' and '-', at most 64", name)
		return
	}
	for _, t := range tags {
		if !records.IsTag(t) {
			writeError(w, http.StatusBadRequest, "tag %q: lowercase letters, digits, '.', '_' and '-', at most 64", t)
			return
		}
	}
	if len(tags) > 0 && c.Role != app.Operator {
		writeError(w, http.StatusForbidden, "tags %s: a tag names a recorded version, and %s's build becomes a proposal: build without tags, and an operator tags the version once it is promoted", strings.Join(tags, ", "), c.User)
		return
	}
	// cpuCount and memoryMB size a sandbox in E2B; here a Bench's limits are set at create.
	if s.buildsWaiting(c.User) >= maxBuilds/4 {
		writeError(w, http.StatusTooManyRequests, "%s has %d template builds requested and not triggered: trigger or abandon them first", c.User, maxBuilds/4)
		return
	}
	b := &templateBuild{id: newUUID(), name: name, tags: tags, user: c.User, created: time.Now().UTC(), status: "waiting"}
	b.log("info", "build %s of template %s requested by %s", b.id, name, c.User)
	s.addBuild(b)
	writeJSON(w, http.StatusAccepted, map[string]any{
		"templateID": name, "buildID": b.id, "public": false, "names": []string{name}, "aliases": []string{name}, "tags": append([]string{}, tags...),
	})
}

func (s *Server) addBuild(b *templateBuild) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.builds == nil {
		s.builds = map[string]*templateBuild{}
	}
	for len(s.builds) >= maxBuilds {
		var oldest *templateBuild
		for _, o := range s.builds {
			o.mu.Lock()
			done := o.status == "ready" || o.status == "error"
			o.mu.Unlock()
			if done && (oldest == nil || o.created.Before(oldest.created)) {
				oldest = o
			}
		}
		if oldest == nil {
			break // all in flight: keep them
		}
		delete(s.builds, oldest.id)
	}
	s.builds[b.id] = b
}

// buildsWaiting counts user's builds requested and not triggered.
func (s *Server) buildsWaiting(user string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, b := range s.builds {
		b.mu.Lock()
		if b.status == "waiting" && b.user == user {
			n++
		}
		b.mu.Unlock()
	}
	return n
}

// buildsRunning counts the builds that run, in all and of user.
func (s *Server) buildsRunning(user string) (all, mine int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, b := range s.builds {
		b.mu.Lock()
		if b.status == "building" {
			all++
			if b.user == user {
				mine++
			}
		}
		b.mu.Unlock()
	}
	return all, mine
}

// buildOf is the caller's build of templateID by id, or nil after answering 404.
func (s *Server) buildOf(w http.ResponseWriter, r *http.Request, c *app.Caller) *templateBuild {
	s.mu.Lock()
	b := s.builds[r.PathValue("buildID")]
	s.mu.Unlock()
	if b == nil || b.name != r.PathValue("templateID") || (b.user != c.User && c.Role != app.Operator) {
		writeError(w, http.StatusNotFound, "build %s of template %s not found (builds are kept in the supervisor's memory while it runs; what a build made is a record or a proposal: `shed workshop log`, `shed workshop promote ID`)", r.PathValue("buildID"), r.PathValue("templateID"))
		return nil
	}
	return b
}

// fileUploadLink is GET /templates/{templateID}/files/{hash}, which only a copy step asks for: a
// recipe has no files copied in, so the build is refused here, before anything is uploaded.
func (s *Server) fileUploadLink(w http.ResponseWriter, r *http.Request) {
	if s.authorized(w, r) == nil {
		return
	}
	writeError(w, http.StatusBadRequest, "copy: a template's steps must be declarations, and a copy is not one: a Workshop's recipe names packages (aptInstall, pipInstall), environment (setEnvs), user and workdir, never files; put the files in an image (fromImage) or write them into the sandbox after Sandbox.create (files.write)")
}

// triggerBuild is POST /v2/templates/{templateID}/builds/{buildID}: the build's steps. A step that is
// not a declaration is refused at once, naming it; otherwise the recipe is submitted in the
// background and the status endpoint follows it.
func (s *Server) triggerBuild(w http.ResponseWriter, r *http.Request) {
	c := s.authorized(w, r)
	if c == nil {
		return
	}
	b := s.buildOf(w, r, c)
	if b == nil {
		return
	}
	var spec templateSpec
	if err := json.NewDecoder(io.LimitReader(r.Body, maxBody)).Decode(&spec); err != nil {
		writeError(w, http.StatusBadRequest, "request body: %v", err)
		return
	}
	if all, mine := s.buildsRunning(c.User); all >= maxBuildsRunning || mine >= maxUserBuildsRunning {
		writeError(w, http.StatusTooManyRequests, "%d template builds are running (%d of them %s's; at most %d at once, %d a user): trigger this one when one has ended", all, mine, c.User, maxBuildsRunning, maxUserBuildsRunning)
		return
	}
	b.mu.Lock()
	status := b.status
	if status == "waiting" {
		b.status = "building"
	}
	b.mu.Unlock()
	if status != "waiting" {
		writeError(w, http.StatusConflict, "build %s was triggered already (%s)", b.id, status)
		return
	}
	base := func(name string) (string, error) {
		res, err := s.Service.Do(r.Context(), &app.Call{Caller: c}, "workshop.show", &app.WorkshopShowRequest{Name: name})
		if err != nil {
			return "", err
		}
		return res.(*app.WorkshopShowResult).Recipe, nil
	}
	tr, err := translate(b.name, &spec, base)
	if err != nil {
		b.finish("error", &buildReason{Message: err.Error(), Step: stepOf(err), LogEntries: []logEntry{}})
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	for _, n := range tr.notes {
		b.log("info", "%s", n)
	}
	b.log("info", "recipe of %s:\n%s", b.name, tr.recipe)
	ctx := s.baseCtx
	if ctx == nil {
		ctx = context.Background()
	}
	go s.runBuild(ctx, c, b, tr)
	w.WriteHeader(http.StatusAccepted)
}

func (s *Server) runBuild(ctx context.Context, c *app.Caller, b *templateBuild, tr *translated) {
	l := &buildLog{b: b}
	call := &app.Call{Caller: c, IO: &app.IO{Status: l, Notice: func(n app.Notice) {
		level := "info"
		if n.Kind == "warning" {
			level = "warn"
		}
		b.log(level, "%s", n.Message)
	}}}
	res, err := s.Service.Do(ctx, call, "workshop.submit", &app.WorkshopSubmitRequest{
		Name: b.name, Recipe: tr.recipe, Base: tr.base, Tags: b.tags, From: "e2b template build " + b.id,
	})
	l.End()
	if err != nil {
		e := app.Classify(err)
		msg := e.Error()
		if e.Hint != "" {
			msg += " (hint: " + e.Hint + ")"
		}
		b.log("error", "%s", msg)
		b.finish("error", &buildReason{Message: msg, LogEntries: []logEntry{}})
		s.log().Info("e2b template build failed", "template", b.name, "build", b.id, "user", c.User, "err", msg)
		return
	}
	sub := res.(*app.WorkshopSubmitResult)
	if sub.Proposal != nil {
		msg := fmt.Sprintf("the build is proposal %s: %s's template builds become proposals that an operator reviews and promotes (`shed workshop promote %s` shows its diff and asks); the template %s exists once it is promoted",
			sub.Proposal.ID, c.User, sub.Proposal.ID, b.name)
		b.log("info", "%s", msg)
		b.finish("error", &buildReason{Message: msg, LogEntries: []logEntry{}})
		return
	}
	b.log("info", "recorded %s version %d (%d layers)", sub.Version.Name, sub.Version.N, len(sub.Layers))
	b.finish("ready", nil)
}

// buildStatus is GET /templates/{templateID}/builds/{buildID}/status?logsOffset=N&limit=N&level=L.
func (s *Server) buildStatus(w http.ResponseWriter, r *http.Request) {
	c := s.authorized(w, r)
	if c == nil {
		return
	}
	b := s.buildOf(w, r, c)
	if b == nil {
		return
	}
	q := r.URL.Query()
	offset, _ := strconv.Atoi(q.Get("logsOffset"))
	limit, err := strconv.Atoi(q.Get("limit"))
	if err != nil || limit <= 0 || limit > maxLogPage {
		limit = maxLogPage
	}
	levels := map[string]int{"debug": 0, "info": 1, "warn": 2, "error": 3}
	min := levels[q.Get("level")]
	b.mu.Lock()
	var page []logEntry
	for i := max(offset, 0); i < len(b.logs) && len(page) < limit; i++ {
		if levels[b.logs[i].Level] >= min {
			page = append(page, b.logs[i])
		}
	}
	out := map[string]any{"templateID": b.name, "buildID": b.id, "status": b.status, "logs": []string{}, "logEntries": append([]logEntry{}, page...)}
	if b.reason != nil {
		out["reason"] = b.reason
	}
	b.mu.Unlock()
	writeJSON(w, http.StatusOK, out)
}

// assignTags is POST /templates/tags: tags for the version "name:tag" names (an operator's).
func (s *Server) assignTags(w http.ResponseWriter, r *http.Request) {
	c := s.authorized(w, r)
	if c == nil {
		return
	}
	var req struct {
		Target string   `json:"target"`
		Tags   []string `json:"tags"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, maxBody)).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "request body: %v", err)
		return
	}
	name, tag := splitName(req.Target)
	n := 0
	if tag != "" {
		v, ok := s.tagVersion(w, r, c, name, tag)
		if !ok {
			return
		}
		n = v
	}
	res, err := s.Service.Do(r.Context(), &app.Call{Caller: c}, "workshop.tag", &app.WorkshopTagRequest{Name: name, Version: n, Tags: req.Tags})
	if err != nil {
		writeAppError(w, err)
		return
	}
	for _, t := range res.(*app.WorkshopTagsResult).Tags {
		if slices.Contains(req.Tags, t.Tag) {
			n = t.Version
		}
	}
	writeJSON(w, http.StatusCreated, map[string]any{"tags": req.Tags, "buildID": versionBuildID(name, n)})
}

// removeTags is DELETE /templates/tags.
func (s *Server) removeTags(w http.ResponseWriter, r *http.Request) {
	c := s.authorized(w, r)
	if c == nil {
		return
	}
	var req struct {
		Name string   `json:"name"`
		Tags []string `json:"tags"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, maxBody)).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "request body: %v", err)
		return
	}
	name, _ := splitName(req.Name)
	if _, err := s.Service.Do(r.Context(), &app.Call{Caller: c}, "workshop.tag", &app.WorkshopTagRequest{Name: name, Remove: req.Tags}); err != nil {
		writeAppError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// templateTags is GET /templates/{templateID}/tags.
func (s *Server) templateTags(w http.ResponseWriter, r *http.Request) {
	c := s.authorized(w, r)
	if c == nil {
		return
	}
	name, _ := splitName(r.PathValue("templateID"))
	res, err := s.Service.Do(r.Context(), &app.Call{Caller: c}, "workshop.tags", &app.WorkshopRequest{Name: name})
	if err != nil {
		writeAppError(w, err)
		return
	}
	out := []map[string]any{}
	for _, t := range res.(*app.WorkshopTagsResult).Tags {
		out = append(out, map[string]any{"tag": t.Tag, "buildID": versionBuildID(name, t.Version), "createdAt": t.Time})
	}
	writeJSON(w, http.StatusOK, out)
}

// tagVersion is the version name's tag names, or false after answering.
func (s *Server) tagVersion(w http.ResponseWriter, r *http.Request, c *app.Caller, name, tag string) (int, bool) {
	res, err := s.Service.Do(r.Context(), &app.Call{Caller: c}, "workshop.tags", &app.WorkshopRequest{Name: name})
	if err != nil {
		writeAppError(w, err)
		return 0, false
	}
	for _, t := range res.(*app.WorkshopTagsResult).Tags {
		if t.Tag == tag {
			return t.Version, true
		}
	}
	writeError(w, http.StatusNotFound, "template %s has no tag %q (GET /templates/%s/tags lists them)", name, tag, name)
	return 0, false
}

// launchTag resolves create's "name:tag": the record's name when the tag names its current version
// (a Bench launches a record's current version); an error message otherwise.
func (s *Server) launchTag(r *http.Request, c *app.Caller, templateID string) (string, string) {
	name, tag := splitName(templateID)
	if tag == "" {
		return name, ""
	}
	res, err := s.Service.Do(r.Context(), &app.Call{Caller: c}, "workshop.tags", &app.WorkshopRequest{Name: name})
	if err != nil {
		return name, "" // create's own answer: no such template
	}
	cur, want := 0, -1
	for _, t := range res.(*app.WorkshopTagsResult).Tags {
		if t.Tag == records.DefaultTag {
			cur = t.Version
		}
		if t.Tag == tag {
			want = t.Version
		}
	}
	switch {
	case want < 0:
		return name, fmt.Sprintf("template %s has no tag %q (GET /templates/%s/tags lists them)", name, tag, name)
	case want != cur:
		return name, fmt.Sprintf("template %s:%s is version %d, and a sandbox launches a record's current version (%d): an operator makes it current by promoting, or name %s", name, tag, want, cur, name)
	}
	return name, ""
}

// errStep is a refusal of one step: Step is E2B's name of it ("base", "1"..., "finalize").
type errStep struct {
	Step string
	Msg  string
}

func (e *errStep) Error() string { return e.Msg }

func stepOf(err error) string {
	var e *errStep
	if errors.As(err, &e) {
		return e.Step
	}
	return ""
}
