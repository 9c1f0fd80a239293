package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"toolshed.dev/shed/app"
	"toolshed.dev/shed/metrics"
	"toolshed.dev/shed/records"
)

// session connects a client to s over the SDK's in-memory transport.
func session(t *testing.T, s *Server) *sdk.ClientSession {
	t.Helper()
	ct, st := sdk.NewInMemoryTransports()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go s.Run(ctx, st)
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// TestMetricsTool: bench_metrics is one bench.metrics request of the Bench and range asked, its
// samples back in the tool's shape; a Bench that is not running is a tool error, and an error of the
// operation reaches the agent with its code and hint and without the host's paths.
func TestMetricsTool(t *testing.T) {
	at := time.Unix(1_800_000_000, 0).UTC()
	var asked []*app.BenchMetricsRequest
	running := true
	fail := error(nil)
	s := &Server{Hosts: app.HostPaths{Root: "/var/lib/toolshed-test"}, Call: func(ctx context.Context, op string, req, resp any) error {
		if op != "bench.metrics" {
			t.Fatalf("op %s", op)
		}
		if fail != nil {
			return fail
		}
		asked = append(asked, req.(*app.BenchMetricsRequest))
		*resp.(*app.BenchMetricsResult) = app.BenchMetricsResult{Benches: []app.BenchMetrics{{Bench: "b", ID: "1", Running: running,
			Samples: []metrics.Sample{{Time: at, CPUCount: 2, CPUUsedPct: 12.5, MemUsed: 3, MemCache: 4, MemTotal: 5, DiskUsed: 6, DiskTotal: 7}}}}}
		return nil
	}}
	cs := session(t, s)
	call := func(args map[string]any) (*sdk.CallToolResult, string) {
		t.Helper()
		r, err := cs.CallTool(context.Background(), &sdk.CallToolParams{Name: "bench_metrics", Arguments: args})
		if err != nil {
			t.Fatal(err)
		}
		var text strings.Builder
		for _, c := range r.Content {
			if tc, ok := c.(*sdk.TextContent); ok {
				text.WriteString(tc.Text)
			}
		}
		return r, text.String()
	}
	r, _ := call(map[string]any{"bench": "b", "start": 10, "end": 20})
	got, _ := json.Marshal(r.StructuredContent)
	want := `{"samples":[{"cpu_count":2,"cpu_used_pct":12.5,"disk_total":7,"disk_used":6,"mem_cache":4,"mem_total":5,"mem_used":3,"time":"2027-01-15T08:00:00Z"}]}`
	if r.IsError || string(got) != want {
		t.Errorf("bench_metrics: %v %s, want %s", r.IsError, got, want)
	}
	if len(asked) != 1 || len(asked[0].Benches) != 1 || asked[0].Benches[0] != "b" || asked[0].Start != 10 || asked[0].End != 20 || asked[0].Latest {
		t.Errorf("the request: %+v", asked)
	}
	running = false
	if r, text := call(map[string]any{"bench": "b"}); !r.IsError || !strings.Contains(text, "not running") {
		t.Errorf("a Bench that is not running: %v %q", r.IsError, text)
	}
	fail = &app.Error{Code: app.CodeUsage, Err: errors.New("start (10) is after end (5) in /var/lib/toolshed-test/benches"), Hint: "give a start before the end"}
	if r, text := call(map[string]any{"bench": "b", "start": 10, "end": 5}); !r.IsError || !strings.Contains(text, "(usage)\nhint: give a start before the end") || strings.Contains(text, "/var/lib/toolshed-test") {
		t.Errorf("an operation's error: %v %q", r.IsError, text)
	}
}

// callTool calls a tool and returns its result's structured content as JSON, or its text if it is an
// error.
func callTool(t *testing.T, cs *sdk.ClientSession, name string, args map[string]any) (bool, string) {
	t.Helper()
	r, err := cs.CallTool(context.Background(), &sdk.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatal(err)
	}
	if r.IsError {
		var text strings.Builder
		for _, c := range r.Content {
			if tc, ok := c.(*sdk.TextContent); ok {
				text.WriteString(tc.Text)
			}
		}
		return true, text.String()
	}
	b, _ := json.Marshal(r.StructuredContent)
	return false, string(b)
}

// TestNetworkTool: bench_network with only a Bench shows its rules (bench.network); with rules it
// replaces them (bench.set_network), allow_internet_access false mapped as the E2B API maps it (deny
// 0.0.0.0/0); clear with rules is refused before any request; bench_create passes the same rules.
func TestNetworkTool(t *testing.T) {
	var ops []string
	var asked []any
	s := &Server{Call: func(ctx context.Context, op string, req, resp any) error {
		ops, asked = append(ops, op), append(asked, req)
		switch r := req.(type) {
		case *app.SetNetworkRequest:
			*resp.(*app.NetworkResult) = app.NetworkResult{Bench: r.Bench, Allow: r.Allow, Deny: r.Deny, Cut: 2}
		case *app.BenchRequest:
			*resp.(*app.NetworkResult) = app.NetworkResult{Bench: r.Bench}
		case *app.LaunchableRequest:
			*resp.(*app.LaunchableResult) = app.LaunchableResult{Workshops: []*records.Version{{Name: "w"}}}
		case *app.BenchCreateRequest:
			*resp.(*app.BenchCreateResult) = app.BenchCreateResult{Bench: "b"}
		default:
			t.Fatalf("op %s %T", op, req)
		}
		return nil
	}}
	cs := session(t, s)
	if e, out := callTool(t, cs, "bench_network", map[string]any{"bench": "b"}); e || out != `{"allow_out":[],"deny_out":[]}` || ops[0] != "bench.network" {
		t.Errorf("show: %v %s %v", e, out, ops)
	}
	ops = nil
	e, out := callTool(t, cs, "bench_network", map[string]any{"bench": "b", "allow_out": []string{"1.2.3.4"}, "deny_out": []string{"10.0.0.0/8"}, "allow_internet_access": false})
	if e || out != `{"allow_out":["1.2.3.4"],"cut":2,"deny_out":["10.0.0.0/8","0.0.0.0/0"]}` || len(ops) != 1 || ops[0] != "bench.set_network" {
		t.Errorf("replace: %v %s %v", e, out, ops)
	}
	ops = nil
	if e, out := callTool(t, cs, "bench_network", map[string]any{"bench": "b", "clear": true}); e || out != `{"allow_out":[],"cut":2,"deny_out":[]}` || ops[0] != "bench.set_network" {
		t.Errorf("clear: %v %s %v", e, out, ops)
	}
	ops = nil
	if e, out := callTool(t, cs, "bench_network", map[string]any{"bench": "b", "clear": true, "deny_out": []string{"1.2.3.4"}}); !e || !strings.Contains(out, "clear") || len(ops) != 0 {
		t.Errorf("clear with rules: %v %s %v", e, out, ops)
	}
	asked = nil
	if e, out := callTool(t, cs, "bench_create", map[string]any{"workshop": "w", "allow_internet_access": false, "allow_out": []string{"a.example"}}); e {
		t.Fatalf("create: %s", out)
	}
	if r, ok := asked[len(asked)-1].(*app.BenchCreateRequest); !ok || fmt.Sprint(r.NetAllow, r.NetDeny) != "[a.example] [0.0.0.0/0]" {
		t.Errorf("create's request: %+v", asked[len(asked)-1])
	}
}

// TestWriteMetadataTool: bench_write_file with metadata is one bench.write_files of the file and its
// metadata; without, the plain bench.write_file.
func TestWriteMetadataTool(t *testing.T) {
	var asked []any
	s := &Server{Call: func(ctx context.Context, op string, req, resp any) error {
		asked = append(asked, req)
		if r, ok := req.(*app.WriteFilesRequest); ok {
			*resp.(*app.WriteFilesResult) = app.WriteFilesResult{Paths: []string{r.Files[0].Path}}
		}
		return nil
	}}
	cs := session(t, s)
	if e, out := callTool(t, cs, "bench_write_file", map[string]any{"bench": "b", "path": "/f", "content": "x", "metadata": map[string]string{"k": "v"}}); e || out != `{"path":"/f"}` {
		t.Errorf("with metadata: %v %s", e, out)
	}
	if r, ok := asked[0].(*app.WriteFilesRequest); !ok || r.Bench != "b" || len(r.Files) != 1 || r.Files[0].Content != "x" || r.Metadata["k"] != "v" {
		t.Errorf("with metadata, the request: %#v", asked[0])
	}
	if e, out := callTool(t, cs, "bench_write_file", map[string]any{"bench": "b", "path": "/f", "content": "x"}); e || out != `{"path":"/f"}` {
		t.Errorf("without: %v %s", e, out)
	}
	if _, ok := asked[1].(*app.WriteFileRequest); !ok {
		t.Errorf("without metadata, the request: %#v", asked[1])
	}
}

// TestWatchTools: the watch tools are the polled watcher's operations; events come back as name and
// type.
func TestWatchTools(t *testing.T) {
	var ops []string
	s := &Server{Call: func(ctx context.Context, op string, req, resp any) error {
		ops = append(ops, op)
		switch r := resp.(type) {
		case *app.WatcherResult:
			*r = app.WatcherResult{Bench: "b", Watcher: "w1"}
		case *app.WatcherEventsResult:
			*r = app.WatcherEventsResult{Events: []app.FileEvent{{Name: "a/b", Type: "create"}}}
		}
		return nil
	}}
	cs := session(t, s)
	if e, out := callTool(t, cs, "bench_watch_start", map[string]any{"bench": "b", "path": "/d", "recursive": true}); e || out != `{"watcher":"w1"}` {
		t.Errorf("start: %v %s", e, out)
	}
	if e, out := callTool(t, cs, "bench_watch_events", map[string]any{"bench": "b", "watcher": "w1"}); e || out != `{"events":[{"name":"a/b","type":"create"}]}` {
		t.Errorf("events: %v %s", e, out)
	}
	if e, out := callTool(t, cs, "bench_watch_stop", map[string]any{"bench": "b", "watcher": "w1"}); e || out != `{"stopped":"w1"}` {
		t.Errorf("stop: %v %s", e, out)
	}
	if fmt.Sprint(ops) != "[bench.watcher_create bench.watcher_events bench.watcher_remove]" {
		t.Errorf("ops: %v", ops)
	}
}
