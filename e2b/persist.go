package e2b

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"toolshed.dev/shed/bench"
	"toolshed.dev/shed/internal/atomicfile"
)

// The sandbox table outlives the supervisor for the sandboxes that do: a Bench paused when the
// supervisor stops (or the host restarts) keeps its files, and a client connects to it again by its
// id, which resumes it (docs/bench.md). So each sandbox is written, as it is made and as what it
// keeps changes, to <root>/e2b-sandboxes/<its Bench's id>.json (root's, 0600), and read back when the
// API starts; one whose Bench is gone is forgotten then, or when its Bench ends. Its secrets are not
// in it (no token is ever at rest, tests/e2b_test.go's noSecrets): a restored sandbox gets a new
// access token (and traffic token), which connect returns, as it does after every resume.

const savedDir = "e2b-sandboxes"

// saved is what a sandbox keeps across a restart: all but what lives only while it runs.
type saved struct {
	ID          string            `json:"id"`
	Bench       string            `json:"bench"`
	Template    string            `json:"template"`
	KeyID       string            `json:"key_id"`
	User        string            `json:"user"`
	Started     time.Time         `json:"started"`
	Envs        map[string]string `json:"envs,omitempty"`
	Metadata    map[string]string `json:"metadata,omitempty"`
	Secure      bool              `json:"secure"`
	Traffic     bool              `json:"traffic,omitempty"` // it has a traffic token (a new one after a restart)
	MaskHost    string            `json:"mask_host,omitempty"`
	DefaultUser string            `json:"default_user,omitempty"`
	Accounts    []bench.Account   `json:"accounts,omitempty"`
	OnTimeout   string            `json:"on_timeout,omitempty"`
	AutoResume  bool              `json:"auto_resume,omitempty"`
	TimeoutS    int64             `json:"timeout_s,omitempty"`
}

func (s *Server) savedPath(benchID string) string {
	return filepath.Join(s.Service.Root, savedDir, benchID+".json")
}

// save writes sb's entry (a failure is logged: the sandbox runs all the same, and only a restart
// while it is paused would lose it from the API, not its files).
func (s *Server) save(sb *sandbox) {
	sb.mu.Lock()
	v := saved{ID: sb.id, Bench: sb.bench, Template: sb.template, KeyID: sb.keyID, User: sb.user,
		Started: sb.started, Envs: sb.envs, Metadata: sb.metadata, Secure: sb.secure, Traffic: sb.traffic != "",
		MaskHost: sb.maskHost, DefaultUser: sb.defaultUser, Accounts: sb.accounts, OnTimeout: sb.onTimeout,
		AutoResume: sb.autoResume, TimeoutS: sb.timeoutS}
	sb.mu.Unlock()
	b, err := json.Marshal(v)
	if err == nil {
		if err = os.MkdirAll(filepath.Join(s.Service.Root, savedDir), 0o700); err == nil {
			// Not synced: a sandbox that runs dies with the supervisor anyway; a pause syncs the store.
			err = atomicfile.Replace(s.savedPath(sb.bench), b, 0o600)
		}
	}
	if err != nil {
		s.log().Warn("e2b: save a sandbox for a restart", "sandbox", sb.id, "err", err)
	}
}

// unsave forgets the entry of the sandbox of Bench id.
func (s *Server) unsave(benchID string) {
	if err := os.Remove(s.savedPath(benchID)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		s.log().Warn("e2b: forget a sandbox", "bench", benchID, "err", err)
	}
}

// restore reads back the sandboxes whose Benches are still there (paused, after a restart); the
// others' entries go.
func (s *Server) restore() {
	dir := filepath.Join(s.Service.Root, savedDir)
	ents, err := os.ReadDir(dir)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			s.log().Warn("e2b: read the saved sandboxes", "err", err)
		}
		return
	}
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok {
			continue
		}
		var v saved
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err == nil {
			err = json.Unmarshal(b, &v)
		}
		rec, ferr := bench.FindIn(filepath.Join(s.Service.Root, "benches"), id)
		if err != nil || ferr != nil || v.Bench != id || rec.Name != v.ID {
			s.unsave(id)
			continue
		}
		sb := &sandbox{id: v.ID, bench: v.Bench, template: v.Template, keyID: v.KeyID, user: v.User, token: newToken(),
			started: v.Started, envs: v.Envs, metadata: v.Metadata, procs: map[uint32]*proc{},
			files: make(chan struct{}, maxFileOps), secure: v.Secure, maskHost: v.MaskHost,
			defaultUser: v.DefaultUser, accounts: v.Accounts, onTimeout: v.OnTimeout, autoResume: v.AutoResume,
			timeoutS: v.TimeoutS}
		if v.Traffic {
			sb.traffic = newToken()
		}
		s.add(sb)
	}
}
