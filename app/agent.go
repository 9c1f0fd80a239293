package app

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"toolshed.dev/shed/bench"
	"toolshed.dev/shed/proposal"
	"toolshed.dev/shed/records"
	"toolshed.dev/shed/sandbox"
	"toolshed.dev/shed/store"
)

// The operations an agent harness uses (MCP, the E2B API): Benches that outlive the request that
// made them, commands whose output comes back in the result, and files.
func init() {
	op("workshop.launchable", (*Service).Launchable)
	op("bench.create", (*Service).BenchCreate)
	op("bench.write_file", (*Service).WriteFile)
	op("bench.read_file", (*Service).ReadFile)
	op("bench.list_files", (*Service).ListFiles)
}

// Detached runs the Benches that outlive their request (bench.create): only a long-lived process, the
// supervisor, has them. Its context bounds them all; Wait waits for them to end.
type Detached struct {
	Ctx context.Context
	wg  sync.WaitGroup
}

// Wait waits for every detached Bench to end (after Ctx is done).
func (d *Detached) Wait() { d.wg.Wait() }

// holdArgv is a created Bench's main command: it only holds the Bench open for exec and files.
var holdArgv = []string{"sleep", "infinity"}

// LaunchableRequest asks for the Workshops the caller may launch.
type LaunchableRequest struct{}

// LaunchableResult lists them, each record's current version.
type LaunchableResult struct {
	Workshops []*records.Version `json:"workshops"` // the records the caller may realize and launch
}

// Launchable lists the Workshop records the caller may launch: every record for an operator, the ones
// that allow them (by name or @group) for a user.
func (s *Service) Launchable(ctx context.Context, c *Call, req *LaunchableRequest) (*LaunchableResult, error) {
	all, err := s.WorkshopList(ctx, c, &WorkshopListRequest{})
	if err != nil {
		return nil, err
	}
	res := &LaunchableResult{Workshops: []*records.Version{}}
	for _, v := range all.Records {
		if c.Caller.Role == Operator || Allows(c.Caller, v.Users) {
			res.Workshops = append(res.Workshops, v)
		}
	}
	return res, nil
}

// Allows says whether caller is among users (names, or @group).
func Allows(caller *Caller, users []string) bool {
	for _, u := range users {
		if g, ok := strings.CutPrefix(u, "@"); ok {
			for _, cg := range caller.Groups {
				if cg == g {
					return true
				}
			}
		} else if u == caller.User {
			return true
		}
	}
	return false
}

// BenchCreateRequest asks for a Bench that stays up after the request, for later exec and files.
type BenchCreateRequest struct {
	Workshop    string `json:"workshop"`               // a record's name (or, for an operator, a recipe file)
	Name        string `json:"name,omitempty"`         // the Bench's name (default: the Workshop's and a random suffix)
	LifetimeS   int64  `json:"lifetime_s,omitempty"`   // seconds after which the supervisor removes it (0: the supervisor's default)
	Net         string `json:"net,omitempty"`          // "recipe" (default) or "none"
	MemoryBytes int64  `json:"memory_bytes,omitempty"` // memory limit in bytes (0: none, or the users' bound)
	Pids        int64  `json:"pids,omitempty"`         // limit on the number of processes (0: none, or the users' bound)
}

// BenchCreateResult names the Bench made.
type BenchCreateResult struct {
	Bench   string    `json:"bench"`   // its name
	ID      string    `json:"id"`      // its id
	Expires time.Time `json:"expires"` // when the supervisor removes it
}

// DefaultLifetime is a created Bench's lifetime when the request names none; MaxLifetime bounds it.
const (
	DefaultLifetime = time.Hour
	MaxLifetime     = 24 * time.Hour
)

// BenchCreate realizes a Workshop and starts a Bench of it that lives until it is removed or its
// lifetime ends: what an agent harness asks for, then runs commands in.
func (s *Service) BenchCreate(ctx context.Context, c *Call, req *BenchCreateRequest) (*BenchCreateResult, error) {
	if s.Detached == nil {
		return nil, usage("start the supervisor (`shed daemon`, docs/supervisor.md) and call it", "bench.create needs the supervisor: a Bench it makes outlives the command that asked")
	}
	life := time.Duration(req.LifetimeS) * time.Second
	switch {
	case req.LifetimeS < 0:
		return nil, usage("a number of seconds", "lifetime_s %d", req.LifetimeS)
	case life == 0:
		life = DefaultLifetime
	case life > MaxLifetime:
		return nil, usage(fmt.Sprintf("at most %d seconds", int(MaxLifetime/time.Second)), "lifetime_s %d is too long", req.LifetimeS)
	}
	limits := s.limitsFor(c, sandbox.Limits{MemoryBytes: req.MemoryBytes, Pids: req.Pids})
	w, err := s.realize(ctx, c, req.Workshop, false, nil)
	if err != nil {
		return nil, err
	}
	started := make(chan *bench.Record, 1)
	failed := make(chan error, 1)
	expires := time.Now().Add(life).UTC().Truncate(time.Second)
	s.Detached.wg.Add(1)
	go func() {
		defer s.Detached.wg.Done()
		defer w.st.Close() // its temporary roots hold the layers while the Bench runs
		bctx, cancel := context.WithDeadline(s.Detached.Ctx, expires)
		defer cancel()
		warm := s.Pool.Take()
		if warm != nil {
			defer warm.Close() // a no-op once used
		}
		_, err := bench.Run(bctx, w.st, w.r, w.plan.Layers, bench.Options{
			Name: req.Name, Owner: c.Caller.User, Net: req.Net, Argv: holdArgv, Limits: limits, Init: warm,
			Started: func(rec *bench.Record) { started <- rec },
			Event:   s.benchEvents(c, req.Workshop),
			Propose: s.agentProposes,
		})
		if err != nil {
			failed <- err
			s.log().Info("created bench ended", "owner", c.Caller.User, "err", err)
		}
	}()
	select {
	case rec := <-started:
		return &BenchCreateResult{Bench: rec.Name, ID: rec.ID, Expires: expires}, nil
	case err := <-failed:
		return nil, err
	case <-ctx.Done():
		// The caller went away before its Bench was up: the Bench ends with its lifetime, or now.
		return nil, ctx.Err()
	}
}

// limitsFor fills a user's unset limits with the users' bounds (the policy refused any above them).
func (s *Service) limitsFor(c *Call, l sandbox.Limits) sandbox.Limits {
	if c.Caller.Role != Operator {
		if l.MemoryBytes == 0 {
			l.MemoryBytes = s.UserLimits.MemoryBytes
		}
		if l.Pids == 0 {
			l.Pids = s.UserLimits.Pids
		}
	}
	return l
}

// agentProposes is what a Bench's propose socket does: bench.propose, through the policy, as that
// Bench's agent.
func (s *Service) agentProposes(ctx context.Context, id string) (string, error) {
	agent := &Call{Caller: &Caller{User: "agent of bench " + id, Role: Agent, Bench: id, Dir: "/"}}
	res, err := s.Do(ctx, agent, "bench.propose", &BenchProposeRequest{Bench: id})
	if err != nil {
		return "", err
	}
	p := res.(*ProposeResult)
	return proposal.Visible(p.Diff) + fmt.Sprintf("shed: proposal %s: an operator promotes it with `shed workshop promote %s`\n", p.Proposal.ID, p.Proposal.ID), nil
}

// capture is a bounded buffer for a command's output returned in a result.
type capture struct {
	buf       bytes.Buffer
	max       int
	truncated bool
}

func (b *capture) Write(p []byte) (int, error) {
	if room := b.max - b.buf.Len(); len(p) > room {
		b.truncated = true
		b.buf.Write(p[:max(room, 0)])
		return len(p), nil
	}
	return b.buf.Write(p)
}

// MaxOutput bounds each of a captured command's stdout and stderr.
const MaxOutput = 1 << 20

// execIn runs argv in a running Bench with stdin from in, and returns its exit code and output.
func (s *Service) execIn(ctx context.Context, st *store.Store, rec *bench.Record, er sandbox.ExecRequest, in io.Reader, maxOut int) (int, *capture, *capture, error) {
	out, errb := &capture{max: maxOut}, &capture{max: MaxOutput}
	code, err := bench.Exec(ctx, st, rec.ID, er, sandbox.Stdio{Stdin: in, Stdout: out, Stderr: errb})
	return code, out, errb, err
}

// benchFile checks a path in a Bench: absolute, clean, no NUL.
func benchFile(p string) (string, error) {
	if !path.IsAbs(p) || strings.ContainsRune(p, 0) {
		return "", usage("an absolute path, as the Bench sees it (/root/notes.txt)", "path %q", p)
	}
	return path.Clean(p), nil
}

// WriteFileRequest asks to write a file in a Bench.
type WriteFileRequest struct {
	Bench   string `json:"bench"`          // the Bench, by name or id
	Path    string `json:"path"`           // absolute, as the Bench sees it; missing directories are made
	Content string `json:"content"`        // the file's bytes
	Mode    string `json:"mode,omitempty"` // octal, e.g. "0755" (default 0644)
}

// WriteFile writes a file in a running Bench, as its root, from inside: the path is resolved in the
// Bench's own mount namespace by its own processes, never on the host.
func (s *Service) WriteFile(ctx context.Context, c *Call, req *WriteFileRequest) (*Empty, error) {
	p, err := benchFile(req.Path)
	if err != nil {
		return nil, err
	}
	mode := "0644"
	if req.Mode != "" {
		if m, err := strconv.ParseUint(req.Mode, 8, 32); err != nil || m > 0o7777 {
			return nil, usage("octal, e.g. 0755", "mode %q", req.Mode)
		}
		mode = req.Mode
	}
	st, rec, err := s.runningBench(c, req.Bench)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	script := `set -e; mkdir -p -- "$(dirname -- "$1")"; cat > "$1"; chmod "$2" -- "$1"`
	er := sandbox.ExecRequest{Argv: []string{"/bin/sh", "-c", script, "sh", p, mode}, Dir: "/", Env: agentEnv}
	code, _, errb, err := s.execIn(ctx, st, rec, er, strings.NewReader(req.Content), 0)
	if err != nil {
		return nil, err
	}
	if code != 0 {
		return nil, fail(CodeFailed, fmt.Errorf("write %s in bench %s: %s", p, rec.Name, firstLine(errb.buf.String(), code)), "")
	}
	return &Empty{}, nil
}

// agentEnv is what the commands shed runs in a Bench for files add to its environment.
var agentEnv = []string{"LC_ALL=C"}

func firstLine(s string, code int) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	if s == "" {
		return "exit " + strconv.Itoa(code)
	}
	return s
}

// ReadFileRequest asks for a file of a Bench.
type ReadFileRequest struct {
	Bench string `json:"bench"` // the Bench, by name or id
	Path  string `json:"path"`  // absolute, as the Bench sees it
}

// FileResult is a file's content.
type FileResult struct {
	Content string `json:"content"` // the file's bytes (at most MaxText)
}

// ReadFile reads a file of a running Bench, from inside it.
func (s *Service) ReadFile(ctx context.Context, c *Call, req *ReadFileRequest) (*FileResult, error) {
	p, err := benchFile(req.Path)
	if err != nil {
		return nil, err
	}
	st, rec, err := s.runningBench(c, req.Bench)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	er := sandbox.ExecRequest{Argv: []string{"cat", "--", p}, Dir: "/", Env: agentEnv}
	code, out, errb, err := s.execIn(ctx, st, rec, er, nil, MaxText)
	if err != nil {
		return nil, err
	}
	if code != 0 {
		return nil, fail(CodeNotFound, fmt.Errorf("read %s in bench %s: %s", p, rec.Name, firstLine(errb.buf.String(), code)), "")
	}
	if out.truncated {
		return nil, fail(CodeFailed, fmt.Errorf("read %s in bench %s: larger than %d bytes", p, rec.Name, MaxText), "read it in parts with bench.exec (head, tail, split)")
	}
	return &FileResult{Content: out.buf.String()}, nil
}

// ListFilesRequest asks for a directory's entries in a Bench.
type ListFilesRequest struct {
	Bench string `json:"bench"` // the Bench, by name or id
	Path  string `json:"path"`  // an absolute directory, as the Bench sees it
}

// FileEntry is one entry of a directory.
type FileEntry struct {
	Name string `json:"name"` // its name in the directory
	Path string `json:"path"` // its absolute path
	Type string `json:"type"` // "file", "dir", "symlink" or "other"
	Size int64  `json:"size"` // bytes
}

// ListFilesResult is a directory's entries, sorted by name.
type ListFilesResult struct {
	Entries []FileEntry `json:"entries"` // the entries
}

// ListFiles lists a directory of a running Bench, from inside it.
func (s *Service) ListFiles(ctx context.Context, c *Call, req *ListFilesRequest) (*ListFilesResult, error) {
	p, err := benchFile(req.Path)
	if err != nil {
		return nil, err
	}
	st, rec, err := s.runningBench(c, req.Bench)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	er := sandbox.ExecRequest{Argv: []string{"find", p, "-mindepth", "1", "-maxdepth", "1", "-printf", `%y %s %f\0`}, Dir: "/", Env: agentEnv}
	code, out, errb, err := s.execIn(ctx, st, rec, er, nil, MaxText)
	if err != nil {
		return nil, err
	}
	if code != 0 {
		return nil, fail(CodeNotFound, fmt.Errorf("list %s in bench %s: %s", p, rec.Name, firstLine(errb.buf.String(), code)), "")
	}
	res := &ListFilesResult{Entries: []FileEntry{}}
	for _, e := range strings.Split(out.buf.String(), "\x00") {
		kind, rest, ok := strings.Cut(e, " ")
		if !ok {
			continue
		}
		size, name, _ := strings.Cut(rest, " ")
		n, _ := strconv.ParseInt(size, 10, 64)
		t := map[string]string{"f": "file", "d": "dir", "l": "symlink"}[kind]
		if t == "" {
			t = "other"
		}
		res.Entries = append(res.Entries, FileEntry{Name: name, Path: path.Join(p, name), Type: t, Size: n})
	}
	slices.SortFunc(res.Entries, func(a, b FileEntry) int { return strings.Compare(a.Name, b.Name) })
	return res, nil
}

// runningBench opens the store and finds the caller's running Bench.
func (s *Service) runningBench(c *Call, nameOrID string) (*store.Store, *bench.Record, error) {
	st, err := s.openStore()
	if err != nil {
		return nil, nil, err
	}
	rec, err := ownBench(c, st, nameOrID)
	if err == nil && !rec.Running {
		err = fail(CodeFailed, fmt.Errorf("bench %s is not running", rec.Name), "`shed bench ls` lists your Benches")
	}
	if err != nil {
		st.Close()
		return nil, nil, err
	}
	return st, rec, nil
}
