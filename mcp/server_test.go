package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"toolshed.dev/shed/app"
	"toolshed.dev/shed/metrics"
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
