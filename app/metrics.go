package app

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"toolshed.dev/shed/bench"
	"toolshed.dev/shed/metrics"
	"toolshed.dev/shed/sandbox"
	"toolshed.dev/shed/upper"
)

func init() {
	op("bench.metrics", (*Service).BenchMetrics)
}

// MaxMetricsBenches is the most Benches one bench.metrics request names (E2B's /sandboxes/metrics
// takes 100 ids).
const MaxMetricsBenches = 100

// BenchMetricsRequest asks for what Benches use: each one's samples from Start to End, or only its
// newest (Latest).
type BenchMetricsRequest struct {
	Benches []string `json:"benches"`          // by name or id, 1 to 100, the caller's own (an operator's: any)
	Start   int64    `json:"start,omitempty"`  // unix seconds, from (0: the Bench's start)
	End     int64    `json:"end,omitempty"`    // unix seconds, to (0: now)
	Latest  bool     `json:"latest,omitempty"` // only each one's newest sample (Start and End unused)
}

// BenchMetricsResult is the samples of each Bench asked for, in the request's order.
type BenchMetricsResult struct {
	Benches []BenchMetrics `json:"benches"` // each Bench asked for: bench (its name), id, running, samples (oldest first; each time, cpu_count, cpu_used_pct, mem_used, mem_cache, mem_total, disk_used, disk_total: docs/agents.md#metrics)
}

// BenchMetrics is one Bench's samples, oldest first.
type BenchMetrics struct {
	Bench   string           `json:"bench"` // its name
	ID      string           `json:"id"`
	Running bool             `json:"running"` // a Bench that is not running has none
	Samples []metrics.Sample `json:"samples"`
}

// StartMetrics reads every running Bench's use each metrics.Interval into s.Metrics (which it
// makes), until ctx ends: the supervisor's, before it serves. A Bench's history goes when it stops
// running.
func (s *Service) StartMetrics(ctx context.Context) {
	s.Metrics = &metrics.Sampler{}
	go func() {
		t := time.NewTicker(metrics.Interval)
		defer t.Stop()
		for {
			s.observe(time.Now())
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
}

// observe reads the running Benches once.
func (s *Service) observe(now time.Time) {
	recs, err := bench.ListIn(benchesDir(s.Root))
	if err != nil {
		s.log().Warn("metrics: list Benches", "err", err)
		return
	}
	fs, _ := upper.OpenMounted(s.Root)
	running := map[string]metrics.Running{}
	disk := false
	for _, r := range recs {
		if r.Running && r.Pid > 0 {
			running[r.ID] = metrics.Running{Pid: r.Pid, Started: r.Started, Disk: s.benchDisk(fs, r)}
			disk = disk || running[r.ID].Disk != nil
		}
	}
	// A created Bench's disk figure is its upper's quota group, which moves when what it wrote is
	// on disk and committed (every 30 s by itself): once a reading, so that it is at most this
	// reading's interval behind.
	if disk {
		if err := fs.Flush(); err != nil {
			s.log().Warn("metrics: flush the uppers", "err", err)
		}
	}
	s.Metrics.Observe(now, running)
}

// BenchMetrics answers what the Benches asked for use: from the supervisor's history, or, in a
// process that keeps none (the CLI on a store of its own), one reading taken now.
func (s *Service) BenchMetrics(ctx context.Context, c *Call, req *BenchMetricsRequest) (*BenchMetricsResult, error) {
	if err := checkMetricsRequest(req); err != nil {
		return nil, err
	}
	st, err := s.openStore()
	if err != nil {
		return nil, err
	}
	defer st.Close()
	now := time.Now()
	start, end := req.Start, req.End
	if end == 0 {
		end = now.Unix()
	}
	res := &BenchMetricsResult{Benches: []BenchMetrics{}}
	for _, name := range req.Benches {
		rec, err := ownBench(c, st, name)
		if err != nil {
			return nil, err
		}
		m := BenchMetrics{Bench: rec.Name, ID: rec.ID, Running: rec.Running, Samples: []metrics.Sample{}}
		if rec.Running {
			switch {
			case req.Latest:
				if x, ok := s.latestSample(now, rec); ok {
					m.Samples = append(m.Samples, x)
				}
			case s.Metrics != nil:
				m.Samples = s.Metrics.Range(rec.ID, start, end)
			default:
				if x, ok := s.latestSample(now, rec); ok && x.Time.Unix() >= start && x.Time.Unix() <= end {
					m.Samples = append(m.Samples, x)
				}
			}
		}
		res.Benches = append(res.Benches, m)
	}
	return res, nil
}

// checkMetricsRequest refuses what no answer fits: no Bench, too many, a range backwards or before
// 1970. A long range is no error: the answer is what the history holds in it, at most
// metrics.Capacity samples a Bench.
func checkMetricsRequest(req *BenchMetricsRequest) error {
	switch {
	case len(req.Benches) == 0:
		return usage("name a Bench (`shed bench ls` lists yours)", "no Bench to give the metrics of")
	case len(req.Benches) > MaxMetricsBenches:
		return usage(fmt.Sprintf("ask for at most %d at a time", MaxMetricsBenches), "metrics of %d Benches asked at once", len(req.Benches))
	case req.Start < 0 || req.End < 0:
		return usage("start and end are unix times in seconds, 0 or more", "a time before 1970 (start %d, end %d)", req.Start, req.End)
	case req.End != 0 && req.Start > req.End:
		return usage("give a start before the end", "start (%d) is after end (%d)", req.Start, req.End)
	}
	return nil
}

// latestSample is the Bench's newest sample: the supervisor's, or one reading now where it has none
// yet (a Bench started less than metrics.Interval ago) or keeps none.
func (s *Service) latestSample(now time.Time, rec *bench.Record) (metrics.Sample, bool) {
	if s.Metrics != nil {
		if x, ok := s.Metrics.Latest(rec.ID); ok {
			return x, true
		}
	}
	if rec.Pid <= 0 {
		return metrics.Sample{}, false
	}
	fs, _ := upper.OpenMounted(s.Root)
	x, err := metrics.Now(now, metrics.Running{Pid: rec.Pid, Started: rec.Started, Disk: s.benchDisk(fs, rec)})
	if err != nil {
		if !errors.Is(err, sandbox.ErrNoUsage) {
			s.log().Debug("metrics: read a Bench", "bench", rec.Name, "err", err)
		}
		return metrics.Sample{}, false
	}
	return x, true
}

// withMetrics puts each running Bench's newest sample in its record (bench.ls).
func (s *Service) withMetrics(recs []*bench.Record) {
	now := time.Now()
	for _, r := range recs {
		if !r.Running {
			continue
		}
		if x, ok := s.latestSample(now, r); ok {
			r.Metrics = &x
		}
	}
}

// benchesDir is bench.Dir of the store at root, without opening it (as FindBench).
func benchesDir(root string) string { return filepath.Join(root, "benches") }

// benchDisk is how a created Bench's own disk figures are read (nil for another): its upper's usage
// on the uppers filesystem they all share (whose own figures are everyone's), within the smaller of
// that filesystem's size and its owner's bound (--user-disk, as the kernel holds it). Without quotas
// on the uppers, the filesystem's figures stand.
func (s *Service) benchDisk(fs *upper.FS, rec *bench.Record) func() (int64, int64, bool) {
	if fs == nil || !rec.Disk {
		return nil
	}
	return func() (int64, int64, bool) {
		name := bench.UpperName(rec.ID)
		used, ok, err := fs.UpperUsage(name)
		if err != nil || !ok {
			return 0, 0, false
		}
		var st unix.Statfs_t
		if err := unix.Statfs(fs.Dir(name), &st); err != nil {
			return 0, 0, false
		}
		total := int64(st.Blocks) * st.Bsize
		if rec.DiskGroup != nil {
			if limit, err := fs.GroupLimit(*rec.DiskGroup); err == nil && limit > 0 && limit < total {
				total = limit
			}
		}
		return used, total, true
	}
}
