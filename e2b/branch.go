package e2b

import (
	"cmp"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"toolshed.dev/shed/app"
	"toolshed.dev/shed/bench"
	"toolshed.dev/shed/records"
)

// E2B's pause, resume (connect), fork and snapshots, over app's branching operations (bench.pause,
// bench.resume, bench.fork, snapshot.*). A paused sandbox keeps its processes frozen in memory and
// its files; it is task state that expires (the supervisor's --task-state-ttl). A snapshot's id is
// shed's (stable: what deleteSnapshot deletes); a named one's names are E2B's "OWNER/NAME:default",
// and NAME, OWNER/NAME and either with ":default" name it wherever a snapshot is asked for.

// snapshotTag is the one tag a shed snapshot's name has (E2B's default tag).
const snapshotTag = "default"

// stateOf is a sandbox's E2B state: its Bench's record's.
func stateOf(rec *bench.Record) string {
	if rec != nil && rec.Paused != nil {
		return "paused"
	}
	return "running"
}

// lifecycleJSON is E2B's SandboxLifecycle (getInfo's lifecycle).
type lifecycleJSON struct {
	OnTimeout  string `json:"onTimeout"`
	AutoResume bool   `json:"autoResume"` // a request to one of its ports resumes it (wake)
}

// endOf is a sandbox's endAt: a paused one's is when it expires as task state (the supervisor's
// --task-state-ttl after its pause), a running one's its timeout's end.
func (s *Server) endOf(rec *bench.Record) *time.Time {
	if rec.Paused != nil {
		t := rec.Paused.Add(cmp.Or(s.Service.TaskStateTTL, app.DefaultTaskStateTTL))
		return &t
	}
	return rec.Expires
}

func (sb *sandbox) lifecycle() *lifecycleJSON {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	on := cmp.Or(sb.onTimeout, "kill")
	if on == "pause-cold" {
		on = "pause" // E2B's values are kill and pause; a filesystem-only one is pause too
	}
	return &lifecycleJSON{OnTimeout: on, AutoResume: sb.autoResume}
}

func (sb *sandbox) setOnTimeout(v string) {
	if v == "" {
		return
	}
	sb.mu.Lock()
	sb.onTimeout = v
	sb.mu.Unlock()
}

// pause is POST /sandboxes/{id}/pause: 204, or E2B's 409 when it is paused already (the SDK's pause
// then returns false). {memory: false} (E2B's filesystem-only pause) is a cold pause: the processes
// end, the files stay, and connect launches the sandbox again over them.
func (s *Server) pause(w http.ResponseWriter, r *http.Request) {
	c, sb, rec := s.lookup(w, r)
	if sb == nil {
		return
	}
	var body struct {
		Memory *bool `json:"memory"`
	}
	if err := decodeOptional(r, &body); err != nil {
		writeError(w, http.StatusBadRequest, "request body: %v", err)
		return
	}
	if rec.Paused != nil {
		writeError(w, http.StatusConflict, "sandbox %q is already paused (connect resumes it)", sb.id)
		return
	}
	res, err := s.Service.Do(r.Context(), &app.Call{Caller: c}, "bench.pause", &app.BenchPauseRequest{Bench: sb.bench, Cold: body.Memory != nil && !*body.Memory})
	if err != nil {
		writeAppError(w, err)
		return
	}
	if !res.(*app.BenchStateResult).Changed {
		writeError(w, http.StatusConflict, "sandbox %q is already paused (connect resumes it)", sb.id)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// resumeBody is the body of connect ({timeout}) and of the deprecated resume ({timeout, autoPause}).
type resumeBody struct {
	Timeout   *int64 `json:"timeout"`
	AutoPause *bool  `json:"autoPause"`
}

// resume is the deprecated POST /sandboxes/{id}/resume: 201 with the sandbox, 409 if it runs.
func (s *Server) resume(w http.ResponseWriter, r *http.Request) {
	c, sb, rec := s.lookup(w, r)
	if sb == nil {
		return
	}
	var body resumeBody
	if err := decodeOptional(r, &body); err != nil {
		writeError(w, http.StatusBadRequest, "request body: %v", err)
		return
	}
	if rec.Paused == nil {
		writeError(w, http.StatusConflict, "sandbox %q is already running", sb.id)
		return
	}
	on := ""
	if body.AutoPause != nil {
		on = map[bool]string{true: "pause", false: "kill"}[*body.AutoPause]
	}
	s.thaw(w, r, c, sb, body.Timeout, on)
}

// thaw resumes a paused sandbox (bench.resume) for timeout seconds (nil: the default) and answers
// 201 with it, as create does.
func (s *Server) thaw(w http.ResponseWriter, r *http.Request, c *app.Caller, sb *sandbox, timeout *int64, onTimeout string) {
	secs := int64(DefaultTimeout / time.Second)
	if timeout != nil && *timeout > 0 {
		secs = *timeout
	}
	res, err := s.Service.Do(r.Context(), &app.Call{Caller: c}, "bench.resume", &app.BenchResumeRequest{Bench: sb.bench, LifetimeS: secs, OnTimeout: onTimeout})
	if err != nil {
		writeAppError(w, err)
		return
	}
	st := res.(*app.BenchStateResult)
	if onTimeout != "" {
		sb.setOnTimeout(onTimeout)
		s.save(sb)
	}
	if st.Relaunched {
		// Its processes are gone (the supervisor restarted while it was paused): their handles too.
		sb.mu.Lock()
		sb.procs = map[uint32]*proc{}
		sb.mu.Unlock()
	}
	out := s.describe(sb, &st.Expires)
	if sb.secure {
		out.EnvdAccessToken = sb.token
	}
	writeJSON(w, http.StatusCreated, out)
}

// wake resumes a paused sandbox made with autoResume, for its create's timeout, before a request to
// one of its ports is proxied (E2B's auto-resume on traffic); false if it could not (why is logged).
func (s *Server) wake(r *http.Request, c *app.Caller, sb *sandbox) bool {
	res, err := s.Service.Do(r.Context(), &app.Call{Caller: c}, "bench.ls", &app.BenchListRequest{})
	if err != nil {
		return false
	}
	for _, rec := range res.(*app.BenchListResult).Benches {
		if rec.ID != sb.bench {
			continue
		}
		if rec.Paused == nil {
			return true
		}
		if _, err := s.Service.Do(r.Context(), &app.Call{Caller: c}, "bench.resume", &app.BenchResumeRequest{Bench: sb.bench, LifetimeS: sb.timeoutS}); err != nil {
			s.log().Warn("e2b auto-resume", "sandbox", sb.id, "err", err)
			return false
		}
		return true
	}
	return false
}

// decodeOptional decodes a JSON body that may be absent.
func decodeOptional(r *http.Request, v any) error {
	err := json.NewDecoder(io.LimitReader(r.Body, maxBody)).Decode(v)
	if errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

// forkResult is E2B's SandboxForkResult: the child, or why it did not start.
type forkResult struct {
	Sandbox *sandboxJSON `json:"sandbox,omitempty"`
	Error   *apiError    `json:"error,omitempty"`
}

// fork is POST /sandboxes/{id}/fork {count, timeout}: 201 with one result a child, in order. The
// children's files are the parent's as of the call; each runs what a created sandbox runs (its
// processes are not cloned), with the parent's template, environment, metadata and access settings,
// and its own access token.
func (s *Server) fork(w http.ResponseWriter, r *http.Request) {
	c, k, err := s.callerOfKey(r.Header.Get("X-API-Key"))
	if err != nil {
		writeError(w, http.StatusUnauthorized, "%v", errNoKey)
		return
	}
	_, parent, _ := s.lookup(w, r)
	if parent == nil {
		return
	}
	var body struct {
		Timeout *int64 `json:"timeout"`
		Count   *int   `json:"count"`
	}
	if err := decodeOptional(r, &body); err != nil {
		writeError(w, http.StatusBadRequest, "request body: %v", err)
		return
	}
	count := 1
	if body.Count != nil {
		count = *body.Count
	}
	if count < 1 || count > app.MaxForks {
		writeError(w, http.StatusBadRequest, "count %d: a number of forks from 1 to %d", count, app.MaxForks)
		return
	}
	timeout := int64(DefaultTimeout / time.Second)
	if body.Timeout != nil {
		if *body.Timeout <= 0 || *body.Timeout > int64(app.MaxLifetime/time.Second) {
			writeError(w, http.StatusBadRequest, "timeout %d: a number of seconds from 1 to %d", *body.Timeout, int64(app.MaxLifetime/time.Second))
			return
		}
		timeout = *body.Timeout
	}
	res, err := s.Service.Do(r.Context(), &app.Call{Caller: c}, "bench.fork", &app.BenchForkRequest{Bench: parent.bench, Count: count, LifetimeS: timeout})
	if err != nil {
		writeAppError(w, err)
		return
	}
	out := []forkResult{}
	for _, ch := range res.(*app.BenchForkResult).Children {
		if ch.Error != "" {
			out = append(out, forkResult{Error: &apiError{Code: http.StatusInternalServerError, Message: ch.Error}})
			continue
		}
		sb := &sandbox{
			id: ch.Bench, bench: ch.ID, template: parent.template, keyID: k.ID, user: c.User, token: newToken(),
			started: time.Now().UTC(), envs: maps.Clone(parent.envs), metadata: maps.Clone(parent.metadata),
			procs: map[uint32]*proc{}, files: make(chan struct{}, maxFileOps), secure: parent.secure,
			maskHost: parent.maskHost, defaultUser: parent.defaultUser, accounts: parent.accounts,
		}
		if parent.traffic != "" {
			sb.traffic = newToken()
		}
		s.add(sb)
		s.save(sb)
		expires := ch.Expires
		d := s.describe(sb, &expires)
		if sb.secure {
			d.EnvdAccessToken = sb.token
		}
		out = append(out, forkResult{Sandbox: &d})
	}
	writeJSON(w, http.StatusCreated, out)
}

// snapshotJSON is E2B's SnapshotInfo.
type snapshotJSON struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

func snapshotOf(info *app.SnapshotInfo) snapshotJSON {
	out := snapshotJSON{SnapshotID: info.ID, Names: []string{}}
	if info.Name != "" {
		out.Names = append(out.Names, info.Owner+"/"+info.Name+":"+snapshotTag)
	}
	return out
}

// snapshotRef is shed's reference for what E2B names a snapshot by: NAME, OWNER/NAME (shed's too),
// either with ":default" (the only tag a shed snapshot has), or an id. Another tag is kept whole, and
// so names nothing.
func snapshotRef(s string) string {
	if base, tag, ok := strings.Cut(s, ":"); ok && tag == snapshotTag {
		s = base
	}
	return s
}

// createSnapshot is POST /sandboxes/{id}/snapshots {name}: 201 with the snapshot. The sandbox goes on
// (its processes are frozen only for the moment the snapshot takes).
func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request) {
	c, sb, _ := s.lookup(w, r)
	if sb == nil {
		return
	}
	var body struct {
		Name string `json:"name"`
	}
	if err := decodeOptional(r, &body); err != nil {
		writeError(w, http.StatusBadRequest, "request body: %v", err)
		return
	}
	// The name as E2B lists it again, OWNER/NAME, is the caller's NAME (another owner's is no name the
	// caller can give, and stays as it is to be refused).
	name := snapshotRef(body.Name)
	if owner, n, ok := strings.Cut(name, "/"); ok && owner == c.User {
		name = n
	}
	res, err := s.Service.Do(r.Context(), &app.Call{Caller: c}, "snapshot.create", &app.SnapshotCreateRequest{Bench: sb.bench, Name: name})
	if err != nil {
		writeAppError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, snapshotOf(res.(*app.SnapshotInfo)))
}

// listSnapshots is GET /snapshots (sandboxID, name, limit, nextToken): the caller's snapshots,
// oldest first; X-Next-Token names the next page while there is one.
func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) {
	c := s.authorized(w, r)
	if c == nil {
		return
	}
	v := r.URL.Query()
	req := &app.SnapshotListRequest{Bench: v.Get("sandboxID"), After: v.Get("nextToken")}
	if n := v.Get("name"); n != "" {
		req.Name = snapshotRef(n)
	}
	if l := v.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > maxListLimit {
			writeError(w, http.StatusBadRequest, "limit %q: a number from 1 to %d", l, maxListLimit)
			return
		}
		req.Limit = n
	}
	res, err := s.Service.Do(r.Context(), &app.Call{Caller: c}, "snapshot.ls", req)
	if err != nil {
		writeAppError(w, err)
		return
	}
	page := res.(*app.SnapshotListResult)
	if page.Next != "" {
		w.Header().Set("X-Next-Token", page.Next)
	}
	out := []snapshotJSON{}
	for i := range page.Snapshots {
		out = append(out, snapshotOf(&page.Snapshots[i]))
	}
	writeJSON(w, http.StatusOK, out)
}

// deleteTemplate is DELETE /templates/{id}, the SDK's deleteSnapshot and Template.delete: 204 when a
// snapshot of the caller's by that id or name was removed, or (an operator's key) the Workshop
// record of that name was retired; 404 when there is neither (the SDK's false).
func (s *Server) deleteTemplate(w http.ResponseWriter, r *http.Request) {
	c := s.authorized(w, r)
	if c == nil {
		return
	}
	id := r.PathValue("id")
	res, err := s.Service.Do(r.Context(), &app.Call{Caller: c}, "snapshot.rm", &app.SnapshotRemoveRequest{Snapshot: snapshotRef(id)})
	if err != nil {
		writeAppError(w, err)
		return
	}
	if res.(*app.SnapshotRemoveResult).Removed {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	// A Workshop record: an operator's key retires it (workshop.rm); another's is refused by policy.
	name, _ := splitName(id)
	if _, err := s.Service.Do(r.Context(), &app.Call{Caller: c}, "workshop.log", &app.WorkshopRequest{Name: name}); err == nil {
		if _, err := s.Service.Do(r.Context(), &app.Call{Caller: c}, "workshop.rm", &app.WorkshopRemoveRequest{Name: name}); err != nil {
			writeAppError(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
		return
	}
	writeError(w, http.StatusNotFound, "template or snapshot %q not found", id)
}

// launchable says whether name is a Workshop record the caller may launch.
func (s *Server) launchable(r *http.Request, c *app.Caller, name string) bool {
	res, err := s.Service.Do(r.Context(), &app.Call{Caller: c}, "workshop.launchable", &app.LaunchableRequest{})
	return err == nil && slices.ContainsFunc(res.(*app.LaunchableResult).Workshops, func(v *records.Version) bool { return v.Name == name })
}

// snapshotNamed is the caller's snapshot that a create's templateID names, if one does.
func (s *Server) snapshotNamed(r *http.Request, c *app.Caller, templateID string) *app.SnapshotInfo {
	res, err := s.Service.Do(r.Context(), &app.Call{Caller: c}, "snapshot.ls", &app.SnapshotListRequest{Name: snapshotRef(templateID)})
	if err != nil {
		return nil
	}
	if snaps := res.(*app.SnapshotListResult).Snapshots; len(snaps) > 0 {
		return &snaps[len(snaps)-1] // the newest (only the newest of a name has it)
	}
	return nil
}
