package app

import (
	"context"
	"strconv"
	"strings"

	"toolshed.dev/shed/bench"
	"toolshed.dev/shed/sandbox"
	"toolshed.dev/shed/store"
)

// linkScript prints, for each path xargs gives it, what the symlink resolves to inside the Bench:
// the resolved path, its type and its permission bits, each NUL-ended; three empty fields if it
// resolves to nothing (dangling, a loop).
const linkScript = `for f; do readlink -ze -- "$f" || printf '\0'; stat -L --printf '%F\0%a\0' -- "$f" 2>/dev/null || printf '\0\0'; done`

// resolveLinks fills the symlinks' Resolved, TargetType and TargetMode, by one command in the Bench
// for all of them (their paths on its stdin: as many as a listing holds). It is best effort, as
// envd's: a symlink it cannot resolve is left as find told it.
func (s *Service) resolveLinks(ctx context.Context, st *store.Store, rec *bench.Record, entries []FileEntry) {
	var links []int
	var in strings.Builder
	for i := range entries {
		if entries[i].Type == "symlink" {
			links = append(links, i)
			in.WriteString(entries[i].Path)
			in.WriteByte(0)
		}
	}
	if len(links) == 0 {
		return
	}
	argv := []string{"xargs", "-0", "/bin/sh", "-c", linkScript, "sh"}
	code, out, _, err := s.execIn(ctx, st, rec, sandbox.ExecRequest{Argv: argv, Dir: "/", Env: agentEnv}, strings.NewReader(in.String()), MaxText)
	if err != nil || code != 0 || out.truncated {
		return
	}
	f := strings.Split(out.buf.String(), "\x00")
	for n, i := range links {
		if 3*n+2 >= len(f) {
			return
		}
		resolved, kind, perm := f[3*n], f[3*n+1], f[3*n+2]
		if resolved == "" {
			continue
		}
		mode, _ := strconv.ParseUint(perm, 8, 32)
		t := map[string]string{"regular file": "file", "regular empty file": "file", "directory": "dir"}[kind]
		if t == "" {
			t = "other"
		}
		entries[i].Resolved, entries[i].TargetType, entries[i].TargetMode = resolved, t, uint32(mode)
	}
}
