package e2b

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"toolshed.dev/shed/app"
	"toolshed.dev/shed/bench"
	"toolshed.dev/shed/proxy"
	"toolshed.dev/shed/records"
)

// maxBody bounds a control-plane request's body.
const maxBody = 1 << 20

// newSandbox is the body of POST /sandboxes: what shed serves, and the fields it refuses rather than
// silently ignore.
type newSandbox struct {
	TemplateID          string            `json:"templateID"`
	Alias               string            `json:"alias"`
	Timeout             *int64            `json:"timeout"` // seconds
	Metadata            map[string]string `json:"metadata"`
	EnvVars             map[string]string `json:"envVars"`
	AllowInternetAccess *bool             `json:"allow_internet_access"`
	Secure              *bool             `json:"secure"`
	AutoPause           *bool             `json:"autoPause"`
	Network             json.RawMessage   `json:"network"`
	IAM                 json.RawMessage   `json:"iam"`
	MCP                 json.RawMessage   `json:"mcp"` // accepted and left alone, as E2B's API: the SDK starts the template's mcp-gateway itself
	VolumeMounts        json.RawMessage   `json:"volumeMounts"`
	AutoResume          json.RawMessage   `json:"autoResume"`
	AutoPauseMemory     json.RawMessage   `json:"autoPauseMemory"`
}

// sandboxJSON is E2B's Sandbox and ListedSandbox (create, connect, get and list answer with it).
type sandboxJSON struct {
	SandboxID       string            `json:"sandboxID"`
	TemplateID      string            `json:"templateID"`
	Alias           string            `json:"alias,omitempty"`
	ClientID        string            `json:"clientID"`
	EnvdVersion     string            `json:"envdVersion"`
	EnvdAccessToken string            `json:"envdAccessToken,omitempty"`
	Domain          *string           `json:"domain"`
	StartedAt       *time.Time        `json:"startedAt,omitempty"`
	EndAt           *time.Time        `json:"endAt,omitempty"`
	State           string            `json:"state,omitempty"`
	CPUCount        int               `json:"cpuCount"`
	MemoryMB        int64             `json:"memoryMB"`
	DiskSizeMB      int64             `json:"diskSizeMB"`
	Metadata        map[string]string `json:"metadata,omitempty"`
	Lifecycle       *lifecycleJSON    `json:"lifecycle,omitempty"` // E2B's SandboxLifecycle (branch.go)

	// TrafficAccessToken is what a sandbox made with allowPublicTraffic false wants of its ports'
	// clients (ports.go).
	TrafficAccessToken string `json:"trafficAccessToken,omitempty"`
}

// apiError is the control plane's error body: the SDK shows message.
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, format string, args ...any) {
	writeJSON(w, status, apiError{Code: status, Message: fmt.Sprintf(format, args...)})
}

// writeAppError answers with an operation's error: its message and hint, under the HTTP status that
// its code means.
func writeAppError(w http.ResponseWriter, err error) {
	e := app.Classify(err)
	msg := e.Error()
	if e.Hint != "" {
		msg += " (hint: " + e.Hint + ")"
	}
	writeError(w, httpStatus(e.Code), "%s", msg)
}

func httpStatus(c app.Code) int {
	switch c {
	case app.CodeUsage, app.CodeInvalid, app.CodeBadRequest:
		return http.StatusBadRequest
	case app.CodeDenied:
		return http.StatusForbidden
	case app.CodeNotFound:
		return http.StatusNotFound
	case app.CodeConflict:
		return http.StatusConflict
	case app.CodeBusy:
		return http.StatusTooManyRequests
	}
	return http.StatusInternalServerError
}

// authorized is the caller of a control-plane request, from its X-API-Key; nil after answering 401.
func (s *Server) authorized(w http.ResponseWriter, r *http.Request) *app.Caller {
	c, _, err := s.callerOfKey(r.Header.Get("X-API-Key"))
	if err != nil {
		writeError(w, http.StatusUnauthorized, "%v", errNoKey)
		return nil
	}
	return c
}

func (s *Server) create(w http.ResponseWriter, r *http.Request) {
	c, k, err := s.callerOfKey(r.Header.Get("X-API-Key"))
	if err != nil {
		writeError(w, http.StatusUnauthorized, "%v", errNoKey)
		return
	}
	var req newSandbox
	if err := json.NewDecoder(io.LimitReader(r.Body, maxBody)).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "request body: %v", err)
		return
	}
	// The sandbox's URLs' access (ports.go); the network's other fields are checked below.
	public, mask, rest, err := networkAccess(req.Network)
	if err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	req.Network = rest
	if msg := unsupportedCreate(&req); msg != "" {
		writeError(w, http.StatusBadRequest, "%s", msg)
		return
	}
	for name, value := range req.EnvVars {
		if !envName(name) || strings.ContainsRune(value, 0) {
			writeError(w, http.StatusBadRequest, "envVars: %q is not a variable name, or its value holds a NUL", name)
			return
		}
	}
	timeout := int64(DefaultTimeout / time.Second)
	if req.Timeout != nil {
		if *req.Timeout <= 0 || *req.Timeout > int64(app.MaxLifetime/time.Second) {
			writeError(w, http.StatusBadRequest, "timeout %d: a number of seconds from 1 to %d", *req.Timeout, int64(app.MaxLifetime/time.Second))
			return
		}
		timeout = *req.Timeout
	}
	// "name:tag" launches the record when the tag names its current version (templates.go).
	if name, msg := s.launchTag(r, c, req.TemplateID); msg != "" {
		writeError(w, http.StatusBadRequest, "%s", msg)
		return
	} else if name != req.TemplateID && records.IsName(name) {
		req.TemplateID = name
	}
	call := &app.Call{Caller: c}
	// Forget the caller's sandboxes that ended (their timeout, `shed bench rm`): the table holds only
	// what may still be asked for.
	if _, _, ok := s.running(w, r, c); !ok {
		return
	}
	// A template is a record the caller may launch, never a file: a key of an operator must not reach
	// the files an operator's request may name.
	res, err := s.Service.Do(r.Context(), call, "workshop.launchable", &app.LaunchableRequest{})
	if err != nil {
		writeAppError(w, err)
		return
	}
	// A templateID that is no Workshop may name a snapshot of the caller's (Sandbox.create(snapshotId)).
	var snap *app.SnapshotInfo
	if !slices.ContainsFunc(res.(*app.LaunchableResult).Workshops, func(v *records.Version) bool { return v.Name == req.TemplateID }) {
		snap = s.snapshotNamed(r, call.Caller, req.TemplateID)
	}
	if snap == nil && !slices.ContainsFunc(res.(*app.LaunchableResult).Workshops, func(v *records.Version) bool { return v.Name == req.TemplateID }) {
		writeError(w, http.StatusNotFound, "template %q: no Workshop record of that name that %s may launch (`shed workshop ls` lists them; an operator allows one with `shed workshop allow NAME USER`)", req.TemplateID, c.User)
		return
	}
	// The Bench's own network rules, within its Workshop's network profile (internet access off is
	// E2B's denyOut 0.0.0.0/0: the proxy stays, so that an update can open it again).
	nw, msg := parseNetwork(req.Network, "network")
	var allow, deny []string
	var inject []proxy.Injection
	if msg == "" {
		allow, deny, msg = nw.rules("network", req.AllowInternetAccess)
	}
	if msg == "" {
		// Its header transforms (network.go): the proxy's injections, for the Bench's life.
		inject, msg = transforms(nw.Rules, "network.rules")
	}
	if msg != "" {
		writeError(w, http.StatusBadRequest, "%s", msg)
		return
	}
	onTimeout := ""
	if req.AutoPause != nil && *req.AutoPause {
		onTimeout = "pause" // the lifetime's end pauses it
		if filesystemOnly(&req) {
			onTimeout = "pause-cold" // filesystem-only: its processes end, connect boots it again
		}
	}
	breq := &app.BenchCreateRequest{
		Workshop: req.TemplateID, Name: req.Alias, LifetimeS: timeout, NetAllow: allow, NetDeny: deny, OnTimeout: onTimeout,
		Inject: inject,
	}
	template := req.TemplateID
	if snap != nil {
		breq.Workshop, breq.Snapshot, template = "", snap.ID, snap.ID
	}
	created, err := s.Service.Do(r.Context(), call, "bench.create", breq)
	if err != nil {
		writeAppError(w, err)
		return
	}
	b := created.(*app.BenchCreateResult)
	sb := &sandbox{
		id: b.Bench, bench: b.ID, template: template, keyID: k.ID, user: c.User, token: newToken(),
		started: time.Now().UTC(), envs: req.EnvVars, metadata: req.Metadata, procs: map[uint32]*proc{},
		files: make(chan struct{}, maxFileOps), secure: req.Secure == nil || *req.Secure, maskHost: mask,
		defaultUser: b.User, accounts: b.Accounts, onTimeout: onTimeout,
		autoResume: onTimeout == "pause" && autoResumes(req.AutoResume), timeoutS: timeout,
	}
	if !public {
		sb.traffic = newToken()
	}
	s.add(sb)
	s.save(sb)
	out := s.describe(sb, &b.Expires)
	if sb.secure {
		out.EnvdAccessToken = sb.token
	}
	writeJSON(w, http.StatusCreated, out)
}

// unsupportedCreate names what a create asks that shed does not do, or "".
func unsupportedCreate(r *newSandbox) string {
	set := func(m json.RawMessage) bool { s := strings.TrimSpace(string(m)); return s != "" && s != "null" }
	switch {
	case r.TemplateID == "":
		return "templateID: name a Workshop record (`shed workshop ls`)"
	case autoResumes(r.AutoResume) && (r.AutoPause == nil || !*r.AutoPause):
		return "autoResume: it wakes a sandbox paused at its timeout: set autoPause (lifecycle.onTimeout \"pause\") too"
	case autoResumes(r.AutoResume) && filesystemOnly(r):
		return "autoResume with autoPauseMemory false: a filesystem-only pause is resumed by connect, not by traffic"
	case set(r.IAM):
		return "iam tokens are not supported"
	case set(r.VolumeMounts) && strings.TrimSpace(string(r.VolumeMounts)) != "[]":
		return "volume mounts are not supported: an operator grants directories in the Workshop's recipe"
	}
	return ""
}

// filesystemOnly says whether a create's auto-pause is E2B's filesystem-only one (autoPauseMemory
// false; absent or null is true, E2B's default).
func filesystemOnly(r *newSandbox) bool {
	var keep bool
	return json.Unmarshal(r.AutoPauseMemory, &keep) == nil && strings.TrimSpace(string(r.AutoPauseMemory)) != "null" && !keep
}

// autoResumes says whether a create's autoResume ({enabled}) asks for it.
func autoResumes(m json.RawMessage) bool {
	if t := strings.TrimSpace(string(m)); t == "" || t == "null" {
		return false
	}
	var v struct {
		Enabled *bool `json:"enabled"`
	}
	if json.Unmarshal(m, &v) != nil {
		return true // not E2B's shape: refused with the reason (autoPause unset) rather than ignored
	}
	return v.Enabled != nil && *v.Enabled
}

// describe is the control plane's view of a sandbox.
func (s *Server) describe(sb *sandbox, expires *time.Time) sandboxJSON {
	started := sb.started
	domain := s.domain()
	return sandboxJSON{
		SandboxID: sb.id, TemplateID: sb.template, Alias: sb.id, ClientID: "shed", EnvdVersion: EnvdVersion,
		StartedAt: &started, EndAt: expires, State: "running", CPUCount: 1, Metadata: sb.metadata,
		Domain: &domain, TrafficAccessToken: sb.traffic,
	}
}

// running returns the caller's sandboxes that still run, by start, with their Benches' records;
// sandboxes whose Bench ended (a timeout, `shed bench rm`) are forgotten. A sandbox made while the
// Benches were listed is not in the list and not forgotten: in a burst of creates, one create's
// listing forgot the sandboxes others made meanwhile, and their first command was refused.
func (s *Server) running(w http.ResponseWriter, r *http.Request, c *app.Caller) ([]*sandbox, map[string]*bench.Record, bool) {
	listed := time.Now()
	res, err := s.Service.Do(r.Context(), &app.Call{Caller: c}, "bench.ls", &app.BenchListRequest{})
	if err != nil {
		writeAppError(w, err)
		return nil, nil, false
	}
	recs := map[string]*bench.Record{}
	for _, rec := range res.(*app.BenchListResult).Benches {
		if rec.Running || rec.Paused != nil { // a paused sandbox is E2B's still (state paused)
			recs[rec.ID] = rec
		}
	}
	s.mu.Lock()
	var out []*sandbox
	var gone []string
	for id, sb := range s.sandboxes {
		if sb.user != c.User && c.Role != app.Operator {
			continue
		}
		if recs[sb.bench] == nil {
			if sb.started.Before(listed) {
				delete(s.sandboxes, id) // its Bench ended: a created Bench is never kept
				gone = append(gone, sb.bench)
			}
			continue
		}
		out = append(out, sb)
	}
	s.mu.Unlock()
	for _, b := range gone {
		s.unsave(b)
	}
	slices.SortFunc(out, func(a, b *sandbox) int {
		if c := a.started.Compare(b.started); c != 0 {
			return c
		}
		return strings.Compare(a.id, b.id) // as a cursor orders them
	})
	return out, recs, true
}

// list is GET /v2/sandboxes (and the older GET /sandboxes, which pages nothing): the caller's
// running sandboxes that match its filters (metadata, state, template, startedAfter), ordered by
// start (order, newest first unless asc), a page of limit (1 to 100, default 100) at a time from
// nextToken; X-Next-Token names the next page while there is one.
func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	c := s.authorized(w, r)
	if c == nil {
		return
	}
	q, err := listQueryOf(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	sbs, recs, ok := s.running(w, r, c)
	if !ok {
		return
	}
	var match []*sandbox
	for _, sb := range sbs {
		state := stateOf(recs[sb.bench])
		if (q.template != "" && q.template != sb.template) || (state == "running" && !q.running) || (state == "paused" && !q.paused) || sb.started.Before(q.after) || !metadataMatches(sb.metadata, q.metadata) {
			continue
		}
		match = append(match, sb)
	}
	if q.running {
		n := 0
		for _, sb := range match {
			if stateOf(recs[sb.bench]) == "running" {
				n++
			}
		}
		w.Header().Set("X-Total-Running", strconv.Itoa(n))
	}
	match, next := q.page(match)
	if next != "" {
		w.Header().Set("X-Next-Token", next)
	}
	out := []sandboxJSON{}
	for _, sb := range match {
		d := s.describe(sb, s.endOf(recs[sb.bench]))
		d.State = stateOf(recs[sb.bench])
		out = append(out, d)
	}
	writeJSON(w, http.StatusOK, out)
}

// listQuery is a list's query, checked.
type listQuery struct {
	metadata, template string
	running, paused    bool // the states asked for
	after              time.Time
	desc               bool
	limit              int
	cursor             *cursor
}

// maxListLimit is E2B's largest page.
const maxListLimit = 100

func listQueryOf(r *http.Request) (*listQuery, error) {
	v := r.URL.Query()
	q := &listQuery{metadata: v.Get("metadata"), template: v.Get("template"), running: true, paused: true, desc: true, limit: maxListLimit}
	if !strings.HasPrefix(r.URL.Path, "/v2/") {
		q.limit = math.MaxInt // the older list pages nothing
	}
	// state is a list, comma-joined as the SDK sends it, or repeated.
	if states := v["state"]; len(states) > 0 {
		q.running, q.paused = false, false
		for _, st := range strings.Split(strings.Join(states, ","), ",") {
			switch st {
			case "running":
				q.running = true
			case "paused":
				q.paused = true
			default:
				return nil, fmt.Errorf("state %q: running or paused", st)
			}
		}
	}
	if s := v.Get("startedAfter"); s != "" {
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return nil, fmt.Errorf("startedAfter %q: a date-time as RFC 3339 writes one (2006-01-02T15:04:05Z)", s)
		}
		q.after = t
	}
	switch v.Get("order") {
	case "", "desc":
	case "asc":
		q.desc = false
	default:
		return nil, fmt.Errorf("order %q: asc or desc", v.Get("order"))
	}
	if s := v.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > maxListLimit {
			return nil, fmt.Errorf("limit %q: a number from 1 to %d", s, maxListLimit)
		}
		q.limit = n
	}
	if s := v.Get("nextToken"); s != "" {
		c, err := parseCursor(s)
		if err != nil {
			return nil, fmt.Errorf("nextToken %q: not one this server's list gave (X-Next-Token)", s)
		}
		q.cursor = c
	}
	return q, nil
}

// page is the query's page of sandboxes (oldest first, as running gives them), and the token of
// the next page ("" if it is the last).
func (q *listQuery) page(sbs []*sandbox) ([]*sandbox, string) {
	sbs = slices.Clone(sbs)
	if q.desc {
		slices.Reverse(sbs)
	}
	if q.cursor != nil {
		sbs = slices.DeleteFunc(sbs, func(sb *sandbox) bool { return !q.cursor.before(sb, q.desc) })
	}
	if len(sbs) > q.limit {
		sbs = sbs[:q.limit]
		return sbs, cursorOf(sbs[len(sbs)-1])
	}
	return sbs, ""
}

// A cursor is where a page ended: its last sandbox's start and id. The next page is what comes
// after it in the list's order, so sandboxes made or ended meanwhile neither repeat nor shift it.
type cursor struct {
	started time.Time
	id      string
}

func cursorOf(sb *sandbox) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(sb.started.UnixNano(), 10) + "/" + sb.id))
}

func parseCursor(s string) (*cursor, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return nil, err
	}
	ns, id, ok := strings.Cut(string(b), "/")
	n, err := strconv.ParseInt(ns, 10, 64)
	if !ok || err != nil || id == "" {
		return nil, errors.New("not a cursor")
	}
	return &cursor{started: time.Unix(0, n), id: id}, nil
}

// before says whether sb comes after the cursor in the list's order.
func (c *cursor) before(sb *sandbox, desc bool) bool {
	cmp := sb.started.Compare(c.started)
	if cmp == 0 {
		cmp = strings.Compare(sb.id, c.id)
	}
	if desc {
		return cmp < 0
	}
	return cmp > 0
}

// metadataMatches applies list's metadata filter: key=value pairs joined by &, each URL-encoded.
func metadataMatches(have map[string]string, filter string) bool {
	if filter == "" {
		return true
	}
	for _, pair := range strings.Split(filter, "&") {
		k, v, _ := strings.Cut(pair, "=")
		if have[unescape(k)] != unescape(v) {
			return false
		}
	}
	return true
}

// lookup finds the caller's running sandbox named by the path, or answers 404.
func (s *Server) lookup(w http.ResponseWriter, r *http.Request) (*app.Caller, *sandbox, *bench.Record) {
	c := s.authorized(w, r)
	if c == nil {
		return nil, nil, nil
	}
	id := r.PathValue("id")
	sbs, recs, ok := s.running(w, r, c)
	if !ok {
		return nil, nil, nil
	}
	for _, sb := range sbs {
		if sb.id == id {
			return c, sb, recs[sb.bench]
		}
	}
	writeError(w, http.StatusNotFound, "sandbox %q not found", id)
	return nil, nil, nil
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) {
	c, sb, rec := s.lookup(w, r)
	if sb == nil {
		return
	}
	out := s.describe(sb, s.endOf(rec))
	out.State, out.Lifecycle = stateOf(rec), sb.lifecycle()
	writeJSON(w, http.StatusOK, s.detail(r, c, sb, out))
}

// connect answers as create did: 200 for a running sandbox, 201 for a paused one, which it resumes
// (branch.go) for its timeout; one that is neither is a 404, the SDK's SandboxNotFoundError.
func (s *Server) connect(w http.ResponseWriter, r *http.Request) {
	c, sb, rec := s.lookup(w, r)
	if sb == nil {
		return
	}
	var body struct {
		Timeout *int64 `json:"timeout"`
	}
	_ = json.NewDecoder(io.LimitReader(r.Body, maxBody)).Decode(&body)
	if rec.Paused != nil {
		s.thaw(w, r, c, sb, body.Timeout, "")
		return
	}
	out := s.describe(sb, rec.Expires)
	// E2B's connect only ever extends a sandbox's life ("TTL is only extended"); setTimeout may
	// shorten it. A timeout out of range goes to bench.set_lifetime, which says why not.
	if t := body.Timeout; t != nil && rec.Expires != nil && (*t <= 0 || *t > int64(app.MaxLifetime/time.Second) ||
		time.Now().Add(time.Duration(*t)*time.Second).Truncate(time.Second).After(*rec.Expires)) {
		exp, ok := s.extend(w, r, c, sb, *t)
		if !ok {
			return
		}
		out.EndAt = exp
	}
	if sb.secure {
		out.EnvdAccessToken = sb.token
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) kill(w http.ResponseWriter, r *http.Request) {
	c, sb, _ := s.lookup(w, r)
	if sb == nil {
		return
	}
	sb.killAll()
	if _, err := s.Service.Do(r.Context(), &app.Call{Caller: c}, "bench.rm", &app.BenchRemoveRequest{Benches: []string{sb.bench}}); err != nil {
		sb.killed.Store(false) // it still runs
		writeAppError(w, err)
		return
	}
	s.drop(sb.id)
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request) {
	s.retime(w, r, "timeout")
}

// refresh is the older SDKs' keep-alive: {duration} seconds more.
func (s *Server) refresh(w http.ResponseWriter, r *http.Request) {
	s.retime(w, r, "duration")
}

func (s *Server) retime(w http.ResponseWriter, r *http.Request, field string) {
	c, sb, _ := s.lookup(w, r)
	if sb == nil {
		return
	}
	var body map[string]int64
	if err := json.NewDecoder(io.LimitReader(r.Body, maxBody)).Decode(&body); err != nil || body[field] <= 0 {
		writeError(w, http.StatusBadRequest, "body: want {%q: SECONDS}, seconds above 0", field)
		return
	}
	if _, ok := s.extend(w, r, c, sb, body[field]); ok {
		w.WriteHeader(http.StatusNoContent)
	}
}

// extend sets a sandbox's end to seconds from now (bench.set_lifetime), as the caller who asked.
func (s *Server) extend(w http.ResponseWriter, r *http.Request, c *app.Caller, sb *sandbox, seconds int64) (*time.Time, bool) {
	res, err := s.Service.Do(r.Context(), &app.Call{Caller: c}, "bench.set_lifetime", &app.SetLifetimeRequest{Bench: sb.bench, LifetimeS: seconds})
	if err != nil {
		writeAppError(w, err)
		return nil, false
	}
	exp := res.(*app.BenchCreateResult).Expires
	return &exp, true
}

func unescape(s string) string {
	if u, err := url.QueryUnescape(s); err == nil {
		return u
	}
	return s
}

var envRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

func envName(s string) bool { return envRE.MatchString(s) }
