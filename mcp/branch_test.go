package mcp

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"toolshed.dev/shed/app"
	"toolshed.dev/shed/bench"
	"toolshed.dev/shed/records"
)

// TestBranchTools: each branching tool is one typed request of its operation, with the arguments
// given, and its result in the tool's shape (no host path: a snapshot's recipe file is not shown, a
// fork child's error has the store's root hidden); bench_create passes snapshot and on_timeout, and
// with a snapshot needs no Workshop record.
func TestBranchTools(t *testing.T) {
	at := time.Unix(1_800_000_000, 0).UTC()
	var asked []string
	s := &Server{Hosts: app.HostPaths{Root: "/var/lib/toolshed-test"}, Call: func(ctx context.Context, op string, req, resp any) error {
		b, _ := json.Marshal(req)
		asked = append(asked, op+" "+string(b))
		switch r := resp.(type) {
		case *app.BenchStateResult:
			*r = app.BenchStateResult{Bench: "b", ID: "1", State: "paused", Expires: at, Changed: true}
		case *app.BenchForkResult:
			*r = app.BenchForkResult{Children: []app.ForkChild{{Bench: "c", ID: "2", Expires: at}, {Error: "no room in /var/lib/toolshed-test/uppers"}}}
		case *app.SnapshotInfo:
			*r = app.SnapshotInfo{ID: "s1", Name: "n", Owner: "u", Bench: "b", BenchID: "1", Workshop: "/var/lib/toolshed-test/benches/1/workshop.toml", Created: at, Expires: at}
		case *app.SnapshotListResult:
			*r = app.SnapshotListResult{Snapshots: []app.SnapshotInfo{{ID: "s1", Bench: "b", Created: at, Expires: at}}, Next: "s1"}
		case *app.SnapshotRemoveResult:
			*r = app.SnapshotRemoveResult{Removed: true}
		case *app.LaunchableResult:
			*r = app.LaunchableResult{Workshops: []*records.Version{{Name: "w", N: 1}}}
		case *app.BenchCreateResult:
			*r = app.BenchCreateResult{Bench: "b", Expires: at}
		case *app.ExecResult:
			return fmt.Errorf("%w: bench b", bench.ErrPaused)
		default:
			t.Fatalf("op %s: %T", op, resp)
		}
		return nil
	}}
	cs := session(t, s)
	for _, c := range []struct {
		tool string
		args map[string]any
		op   string // the request asked
		out  string // the structured result
	}{
		{"bench_pause", map[string]any{"bench": "b"}, `bench.pause {"bench":"b"}`,
			`{"bench":"b","changed":true,"expires":"2027-01-15T08:00:00Z","state":"paused"}`},
		{"bench_resume", map[string]any{"bench": "b", "lifetime_s": 60, "on_timeout": "pause"}, `bench.resume {"bench":"b","lifetime_s":60,"on_timeout":"pause"}`, ""},
		{"bench_fork", map[string]any{"bench": "b", "count": 2, "lifetime_s": 30}, `bench.fork {"bench":"b","count":2,"lifetime_s":30}`,
			`{"children":[{"bench":"c","expires":"2027-01-15T08:00:00Z"},{"error":"no room in \u003cstore\u003e/uppers"}]}`},
		{"bench_reset", map[string]any{"bench": "b", "snapshot": "n"}, `bench.reset {"bench":"b","snapshot":"n"}`, ""},
		{"snapshot_create", map[string]any{"bench": "b", "name": "n"}, `snapshot.create {"bench":"b","name":"n"}`,
			`{"bench":"b","created":"2027-01-15T08:00:00Z","expires":"2027-01-15T08:00:00Z","id":"s1","name":"n"}`},
		{"snapshot_list", map[string]any{"bench": "b", "limit": 1}, `snapshot.ls {"bench":"b","limit":1}`,
			`{"next":"s1","snapshots":[{"bench":"b","created":"2027-01-15T08:00:00Z","expires":"2027-01-15T08:00:00Z","id":"s1"}]}`},
		{"snapshot_remove", map[string]any{"snapshot": "n"}, `snapshot.rm {"snapshot":"n"}`, `{"removed":true}`},
		{"bench_create", map[string]any{"snapshot": "n", "on_timeout": "pause", "lifetime_s": 5}, `bench.create {"workshop":"","lifetime_s":5,"snapshot":"n","on_timeout":"pause"}`, ""},
	} {
		asked = nil
		r, err := cs.CallTool(context.Background(), &sdk.CallToolParams{Name: c.tool, Arguments: c.args})
		if err != nil {
			t.Fatal(err)
		}
		got, _ := json.Marshal(r.StructuredContent)
		if r.IsError || len(asked) == 0 || asked[len(asked)-1] != c.op {
			t.Errorf("%s: error %v, asked %q, want %s (%s)", c.tool, r.IsError, asked, c.op, got)
		}
		if c.out != "" && string(got) != c.out {
			t.Errorf("%s: %s, want %s", c.tool, got, c.out)
		}
	}
	// Both a Workshop and a snapshot: refused before any request.
	asked = nil
	r, _ := cs.CallTool(context.Background(), &sdk.CallToolParams{Name: "bench_create", Arguments: map[string]any{"workshop": "w", "snapshot": "n"}})
	if !r.IsError || len(asked) != 0 {
		t.Errorf("bench_create with workshop and snapshot: error %v, asked %q", r.IsError, asked)
	}
	// A paused Bench's exec: the operation's error, as the agent reads it.
	r, _ = cs.CallTool(context.Background(), &sdk.CallToolParams{Name: "bench_exec", Arguments: map[string]any{"bench": "b", "command": []string{"true"}}})
	var text strings.Builder
	for _, c := range r.Content {
		if tc, ok := c.(*sdk.TextContent); ok {
			text.WriteString(tc.Text)
		}
	}
	if !r.IsError || !strings.Contains(text.String(), "paused") {
		t.Errorf("bench_exec of a paused Bench: %v %q", r.IsError, text.String())
	}
}
