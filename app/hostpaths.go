package app

import (
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// An agent's face (MCP, the E2B API) and an agent in a Bench never see a host path in an error:
// where the store is, a record's files under it, the supervisor's socket. They are the operator's
// layout, not the agent's business, and an agent relays what it reads to a model and to logs. The
// host's paths are replaced with what users call the things: a record's file by the record's name
// and version, the rest of the store by <store>, the socket by <supervisor socket>.

// agentFace says whether c reached the supervisor through an agent's face, or is an agent.
func agentFace(c *Call) bool {
	return c != nil && c.Caller != nil && (c.Caller.Via != "" || c.Caller.Role == Agent)
}

// hideHostPaths is err as an agent's face answers it: its code kept, its message and hint without
// the host's paths.
func (s *Service) hideHostPaths(err error) error {
	if err == nil {
		return nil
	}
	e := Classify(err)
	h := HostPaths{Root: s.Root, Socket: s.Socket}
	msg, hint := h.Hide(e.Error()), h.Hide(e.Hint)
	if msg == e.Error() && hint == e.Hint {
		return err
	}
	return &Error{Code: e.Code, Err: fmt.Errorf("%s", msg), Hint: hint}
}

// HostPaths are the paths of the host an agent's face hides.
type HostPaths struct {
	Root   string // the store's root
	Socket string // the supervisor's socket
}

// Hide replaces the host's paths in s.
func (h HostPaths) Hide(s string) string {
	if s == "" {
		return s
	}
	roots := []string{}
	for _, r := range []string{h.Root, realPath(h.Root)} {
		if r = filepath.Clean(r); r != "." && r != "/" && !slices.Contains(roots, r) {
			roots = append(roots, r)
		}
	}
	for _, r := range roots {
		// A record's file: NAME vN's FILE, as `shed workshop show NAME` shows it.
		rec := regexp.MustCompile(regexp.QuoteMeta(r+"/workshops/") + `([a-z0-9][a-z0-9._-]*)/([0-9]+)(?:/([^\s:'"()]+))?`)
		s = rec.ReplaceAllStringFunc(s, func(m string) string {
			p := rec.FindStringSubmatch(m)
			if p[3] == "" {
				return fmt.Sprintf("Workshop %s v%s", p[1], p[2])
			}
			return fmt.Sprintf("Workshop %s v%s's %s", p[1], p[2], p[3])
		})
		s = strings.ReplaceAll(s, r, "<store>")
	}
	if h.Socket != "" {
		s = strings.ReplaceAll(s, h.Socket, "<supervisor socket>")
		if dir := filepath.Dir(h.Socket); dir != "/" && dir != "." {
			s = strings.ReplaceAll(s, dir+"/", "<supervisor's directory>/")
		}
	}
	return s
}

func realPath(p string) string {
	if p == "" {
		return ""
	}
	if r, err := filepath.EvalSymlinks(p); err == nil {
		return r
	}
	return p
}
