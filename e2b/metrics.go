package e2b

import (
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"toolshed.dev/shed/app"
	"toolshed.dev/shed/metrics"
)

// sandboxMetric is E2B's SandboxMetric: one sample of a sandbox's use.
type sandboxMetric struct {
	Timestamp     time.Time `json:"timestamp"`
	TimestampUnix int64     `json:"timestampUnix"`
	CPUCount      int       `json:"cpuCount"`
	CPUUsedPct    float64   `json:"cpuUsedPct"`
	MemUsed       int64     `json:"memUsed"`
	MemTotal      int64     `json:"memTotal"`
	MemCache      int64     `json:"memCache"`
	DiskUsed      int64     `json:"diskUsed"`
	DiskTotal     int64     `json:"diskTotal"`
}

func metricOf(x metrics.Sample) sandboxMetric {
	return sandboxMetric{
		Timestamp: x.Time, TimestampUnix: x.Time.Unix(), CPUCount: x.CPUCount, CPUUsedPct: x.CPUUsedPct,
		MemUsed: x.MemUsed, MemTotal: x.MemTotal, MemCache: x.MemCache, DiskUsed: x.DiskUsed, DiskTotal: x.DiskTotal,
	}
}

// unixParam is the query parameter name as unix seconds (0 when absent), or answers 400: E2B's
// spec says an integer, at least 0.
func unixParam(w http.ResponseWriter, r *http.Request, name string) (int64, bool) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return 0, true
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		writeError(w, http.StatusBadRequest, "Invalid format for parameter %s: %q is not a unix time in seconds (a whole number, 0 or more)", name, v)
		return 0, false
	}
	return n, true
}

// metrics answers GET /sandboxes/{id}/metrics: the sandbox's samples from start to end (unix
// seconds; by default its start and now), oldest first, every 5 s (coarser for a long-running
// sandbox, whose history keeps at most metrics.Capacity samples).
func (s *Server) metrics(w http.ResponseWriter, r *http.Request) {
	c, sb, _ := s.lookup(w, r)
	if sb == nil {
		return
	}
	start, ok := unixParam(w, r, "start")
	if !ok {
		return
	}
	end, ok := unixParam(w, r, "end")
	if !ok {
		return
	}
	if end != 0 && start > end {
		// E2B: "Invalid time range for metrics" (start time cannot be after end time).
		writeError(w, http.StatusBadRequest, "Invalid time range for metrics: start (%d) is after end (%d)", start, end)
		return
	}
	res, err := s.Service.Do(r.Context(), &app.Call{Caller: c}, "bench.metrics", &app.BenchMetricsRequest{Benches: []string{sb.bench}, Start: start, End: end})
	if err != nil {
		writeAppError(w, err)
		return
	}
	out := []sandboxMetric{}
	for _, b := range res.(*app.BenchMetricsResult).Benches {
		for _, x := range b.Samples {
			out = append(out, metricOf(x))
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// listMetrics answers GET /sandboxes/metrics?sandbox_ids=A,B: the newest sample of each of the
// caller's running sandboxes among them, by id; an id that is none of them is left out, as E2B does.
func (s *Server) listMetrics(w http.ResponseWriter, r *http.Request) {
	c := s.authorized(w, r)
	if c == nil {
		return
	}
	var ids []string
	for _, v := range r.URL.Query()["sandbox_ids"] {
		for _, id := range strings.Split(v, ",") {
			if id = strings.TrimSpace(id); id != "" && !slices.Contains(ids, id) {
				ids = append(ids, id)
			}
			if len(ids) > app.MaxMetricsBenches {
				writeError(w, http.StatusBadRequest, "Too many sandboxes requested, maximum is %d", app.MaxMetricsBenches)
				return
			}
		}
	}
	if len(ids) == 0 {
		writeError(w, http.StatusBadRequest, "sandbox_ids is required: the comma-separated ids of your sandboxes")
		return
	}
	sbs, _, ok := s.running(w, r, c)
	if !ok {
		return
	}
	var benches []string
	byBench := map[string]string{}
	for _, sb := range sbs {
		if slices.Contains(ids, sb.id) {
			benches = append(benches, sb.bench)
			byBench[sb.bench] = sb.id
		}
	}
	out := map[string]sandboxMetric{}
	if len(benches) > 0 {
		res, err := s.Service.Do(r.Context(), &app.Call{Caller: c}, "bench.metrics", &app.BenchMetricsRequest{Benches: benches, Latest: true})
		if err != nil {
			writeAppError(w, err)
			return
		}
		for _, b := range res.(*app.BenchMetricsResult).Benches {
			if len(b.Samples) > 0 {
				out[byBench[b.ID]] = metricOf(b.Samples[len(b.Samples)-1])
			}
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"sandboxes": out})
}
