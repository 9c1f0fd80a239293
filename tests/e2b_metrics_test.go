package tests

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestE2BMetrics: what a Bench uses, as an agent reads it. The unmodified `e2b` SDK, as nobody, gets
// a sandbox's metrics with and without a range, sees them move after it writes 64 MiB and keeps a cpu
// busy (disk, memory, cpu), gets none for a range before the sandbox existed, a bounded answer for ten
// years, clear 400s for a range backwards and numbers that are none, and the newest sample of many
// sandboxes by id. Then the same Bench's figures in `shed bench ls` (JSON and columns) and through
// MCP (bench_metrics, bench_list), and after the kill, none. No read of metrics is in the audit log.
func TestE2BMetrics(t *testing.T) {
	parallel(t) // see parallelTests in main_test.go
	requireRoot(t)
	root := sharedRoot(t)
	addr := freeLoopback(t)
	sock, _ := daemonWith(t, root, "--e2b", addr, "--user-benches", "64") // the shared store holds other tests' Benches of nobody's
	dir := npmPackage(t, "e2b", "e2b", "2.51.0")
	client := filepath.Join(dir, "e2b-metrics.mjs")
	writeFile(t, client, string(must(os.ReadFile("testdata/e2b-metrics.mjs"))))
	mcpDir := npmPackage(t, "mcp", "@modelcontextprotocol/sdk", "1.32.2")
	mcpClient := filepath.Join(mcpDir, "mcp-calls-metrics.mjs")
	writeFile(t, mcpClient, string(must(os.ReadFile("testdata/mcp-calls.mjs"))))
	uid := nobodyUID(t)
	name := e2bRecord(t, sock) // the shared jq record (e2bShared)
	made := via(t, sock, 0, "", "--json", "agent", "key", "create", "nobody")
	var key struct{ Key string }
	if err := json.Unmarshal([]byte(made.stdout), &key); err != nil {
		t.Fatalf("agent key create: %v %q %s", err, made.stdout, made.stderr)
	}

	cmd := exec.Command("node", client, name)
	cmd.Env = append(os.Environ(), "HOME=/", "E2B_API_URL=http://"+addr, "E2B_SANDBOX_URL=http://"+addr, "E2B_API_KEY="+key.Key)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdin := must(cmd.StdinPipe())
	stdout := must(cmd.StdoutPipe())
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		out.Write(sc.Bytes())
		out.WriteByte('\n')
		if strings.HasPrefix(sc.Text(), `{"step":"hold"`) {
			benchFaces(t, sock, mcpClient, uid, holdID(out.Bytes()))
			io.WriteString(stdin, "go\n")
			stdin.Close()
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the e2b client: %v\n%s\n%s", err, out.String(), stderr.String())
	}
	steps := clientSteps(out.Bytes())
	type step struct {
		OK    bool            `json:"ok"`
		Value json.RawMessage `json:"value"`
		Error string          `json:"error"`
	}
	get := func(n string) step {
		t.Helper()
		var s step
		if err := json.Unmarshal(steps[n], &s); err != nil {
			t.Fatalf("step %s: %v (%s)\nall output:\n%s\n%s", n, err, steps[n], out.String(), stderr.String())
		}
		return s
	}
	type metric struct {
		Timestamp                   any
		CPUCount                    int     `json:"cpuCount"`
		CPUUsedPct                  float64 `json:"cpuUsedPct"`
		MemUsed, MemTotal, MemCache int64
		DiskUsed, DiskTotal         int64
	}
	samples := func(n string) []metric {
		t.Helper()
		s := get(n)
		var ms []metric
		if !s.OK || json.Unmarshal(s.Value, &ms) != nil {
			t.Errorf("%s: %+v (%s)", n, s, s.Value)
		}
		return ms
	}
	first := samples("first")
	if len(first) == 0 {
		t.Fatalf("no metrics of a running sandbox\n%s", out.String())
	}
	f := first[len(first)-1]
	if f.CPUCount < 1 || f.MemTotal <= 0 || f.MemUsed <= 0 || f.DiskTotal <= 0 || f.DiskUsed < 0 || f.DiskUsed > f.DiskTotal || f.MemUsed > f.MemTotal {
		t.Errorf("the first sample: %+v", f)
	}
	t.Logf("first: %+v", f)
	if s := get("work"); !s.OK || !strings.Contains(string(s.Value), "busy") {
		t.Errorf("work: %+v (%s)", s, s.Value)
	}
	moved := samples("moved")
	if len(moved) == 0 {
		t.Logf("the client's output:\n%s", out.String())
	}
	for _, m := range moved {
		t.Logf("after the work: cpu %.2f%% of %d, memory %d of %d (cache %d), disk %d of %d", m.CPUUsedPct, m.CPUCount, m.MemUsed, m.MemTotal, m.MemCache, m.DiskUsed, m.DiskTotal)
	}
	var rng struct {
		Start, End int64
		Samples    []int64
	}
	json.Unmarshal(get("range").Value, &rng)
	for _, ts := range rng.Samples {
		// The SDK rounds start and end to seconds.
		if ts < rng.Start-1000 || ts > rng.End+1000 {
			t.Errorf("a sample at %d is outside the range asked, %d to %d", ts, rng.Start, rng.End)
		}
	}
	if all := samples("all"); len(all) < len(moved) {
		t.Errorf("all the samples (%d) are fewer than those of a part (%d)", len(all), len(moved))
	}
	if s := get("before-it-existed"); !s.OK || string(s.Value) != "[]" {
		t.Errorf("a range before the sandbox existed: %+v (%s), want []", s, s.Value)
	}
	if s := get("ten-years"); !s.OK {
		t.Errorf("ten years: %+v", s)
	} else if n, _ := strconv.Atoi(string(s.Value)); n < 1 || n > 360 {
		t.Errorf("ten years: %d samples, want 1 to 360 (the history's bound)", n)
	}
	if s := get("backwards"); s.OK || !strings.Contains(s.Error, "start") || !strings.Contains(s.Error, "after end") {
		t.Errorf("a range backwards: %+v, want an error that says start is after end", s)
	}
	type resp struct {
		Status int
		Body   json.RawMessage
	}
	api := func(n string) resp {
		t.Helper()
		var r resp
		if s := get(n); !s.OK || json.Unmarshal(s.Value, &r) != nil {
			t.Errorf("%s: %+v", n, s)
		}
		return r
	}
	if r := api("not-a-number"); r.Status != 400 || !strings.Contains(string(r.Body), `parameter start: \"yesterday\"`) {
		t.Errorf("start=yesterday: %d %s", r.Status, r.Body)
	}
	if r := api("negative"); r.Status != 400 || !strings.Contains(string(r.Body), "parameter end") {
		t.Errorf("end=-5: %d %s", r.Status, r.Body)
	}
	if r := api("huge"); r.Status != 200 || !strings.HasPrefix(string(r.Body), "[{") {
		t.Errorf("an end in the year 3 million: %d %s", r.Status, r.Body)
	}
	id := holdID(out.Bytes())
	var many struct{ Sandboxes map[string]metric }
	if r := api("many"); r.Status != 200 || json.Unmarshal(r.Body, &many) != nil || len(many.Sandboxes) != 1 || many.Sandboxes[id].MemTotal <= 0 {
		t.Errorf("/sandboxes/metrics of the sandbox and one that is none: %d %s", r.Status, r.Body)
	}
	if r := api("too-many"); r.Status != 400 || !strings.Contains(string(r.Body), "maximum is 100") {
		t.Errorf("101 sandboxes: %d %s", r.Status, r.Body)
	}
	if r := api("none"); r.Status != 400 || !strings.Contains(string(r.Body), "sandbox_ids") {
		t.Errorf("no sandbox_ids: %d %s", r.Status, r.Body)
	}
	if s := get("unknown"); s.OK || !strings.Contains(s.Error, "not found") {
		t.Errorf("metrics of no sandbox: %+v", s)
	}
	if s := get("kill"); !s.OK {
		t.Errorf("kill: %+v", s)
	}
	if r := api("after-kill"); r.Status != 404 {
		t.Errorf("metrics of a killed sandbox: %d %s", r.Status, r.Body)
	}
	// Reading metrics is a read, as bench.ls is: a harness that polls them fills no audit log.
	if r := via(t, sock, 0, "", "--json", "audit", "--bench", id); r.code != 0 || strings.Contains(r.stdout, "bench.metrics") || !strings.Contains(r.stdout, "bench.create") {
		t.Errorf("the audit log of the sandbox's Bench (%d): %d entries of bench.metrics\n%s", r.code, strings.Count(r.stdout, "bench.metrics"), r.stderr)
	}
}

// benchFaces reads the running Bench id's figures as its owner (uid) through the CLI and MCP.
func benchFaces(t *testing.T, sock, mcpClient string, uid int, id string) {
	t.Helper()
	r := via(t, sock, uid, "", "--json", "bench", "ls")
	var benches []struct {
		Name    string
		Metrics *struct {
			CPUCount   int     `json:"cpu_count"`
			CPUUsedPct float64 `json:"cpu_used_pct"`
			MemUsed    int64   `json:"mem_used"`
			MemTotal   int64   `json:"mem_total"`
			DiskUsed   int64   `json:"disk_used"`
			DiskTotal  int64   `json:"disk_total"`
		}
	}
	if err := json.Unmarshal([]byte(r.stdout), &benches); err != nil {
		t.Fatalf("bench ls --json: %v %s %s", err, r.stdout, r.stderr)
	}
	found := false
	for _, b := range benches {
		if b.Name != id {
			continue
		}
		found = true
		if m := b.Metrics; m == nil || m.CPUCount < 1 || m.MemUsed < 48<<20 || m.DiskUsed < 64<<20 || m.DiskTotal < m.DiskUsed || m.MemTotal <= 0 {
			t.Errorf("bench ls --json: the metrics of %s: %+v", id, m)
		}
	}
	if !found {
		t.Errorf("bench ls --json does not list %s: %s", id, r.stdout)
	}
	plain := via(t, sock, uid, "", "bench", "ls")
	if !strings.Contains(plain.stdout, "CPU") || !strings.Contains(plain.stdout, "MEMORY") || !strings.Contains(plain.stdout, "%") || !strings.Contains(plain.stdout, "MiB") {
		t.Errorf("bench ls: no cpu and memory columns:\n%s", plain.stdout)
	}

	calls := [][]any{
		{"metrics", "bench_metrics", map[string]any{"bench": id}},
		{"backwards", "bench_metrics", map[string]any{"bench": id, "start": 10, "end": 5}},
		{"none", "bench_metrics", map[string]any{"bench": "no-such-bench"}},
		{"list", "bench_list", map[string]any{}},
	}
	cmd := exec.Command("node", mcpClient, shedBin, string(must(json.Marshal(calls))))
	cmd.Env = append(os.Environ(), "SHED_SOCKET="+sock, "SHED_ROOT=/nonexistent", "HOME=/")
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	outb, err := cmd.Output()
	if err != nil {
		t.Fatalf("the MCP client: %v\n%s\n%s", err, outb, stderr.String())
	}
	type result struct {
		Error bool           `json:"error"`
		Data  map[string]any `json:"data"`
		Text  string         `json:"text"`
	}
	steps := clientSteps(outb)
	step := func(n string) result {
		var r result
		if err := json.Unmarshal(steps[n], &r); err != nil {
			t.Fatalf("MCP step %s: %v (%s)", n, err, steps[n])
		}
		return r
	}
	if r := step("metrics"); r.Error || len(r.Data["samples"].([]any)) == 0 {
		t.Errorf("bench_metrics: %+v", r)
	}
	if r := step("backwards"); !r.Error || !strings.Contains(r.Text, "start (10) is after end (5)") || !strings.Contains(r.Text, "hint:") {
		t.Errorf("bench_metrics with start after end: %+v", r)
	}
	if r := step("none"); !r.Error || !strings.Contains(r.Text, "no bench no-such-bench of yours") {
		t.Errorf("bench_metrics of no Bench: %+v", r)
	}
	if r := step("list"); r.Error || !strings.Contains(fmt.Sprint(r.Data), "cpu_used_pct") {
		t.Errorf("bench_list has no metrics: %+v", r)
	}
}
