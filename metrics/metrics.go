// Package metrics keeps what each running Bench uses over time: a reading of its cgroups and its
// upper layer's disk (sandbox.ReadUsage) every Interval, in a history of bounded size per Bench, so
// that a supervisor with many Benches holds at most Capacity samples of each, however long they run.
//
// When a Bench's history is full, its samples are merged two by two and the spacing doubles (5 s,
// 10 s, 20 s...): the history always covers the Bench's whole life, coarser as it grows, as E2B's API
// answers a longer range with a longer step. A merged sample has the mean cpu use and the highest
// memory and disk use of the two (a peak is what one looks for in a coarse history).
package metrics

import (
	"math"
	"sort"
	"sync"
	"time"

	"toolshed.dev/shed/sandbox"
)

// Interval is how often a Bench is read (E2B samples every 5 s).
const Interval = 5 * time.Second

// Capacity is the most samples kept of one Bench: 360 of 56 bytes, 20 KB a Bench. They cover 30
// minutes at Interval, then twice as long at twice the spacing each time the history fills.
const Capacity = 360

// Sample is one reading of a Bench's use.
type Sample struct {
	Time       time.Time `json:"time"`         // when it was read (to the second)
	CPUCount   int       `json:"cpu_count"`    // the cpus it may run on
	CPUUsedPct float64   `json:"cpu_used_pct"` // its cpu use since the previous sample, in % of CPUCount cpus
	MemUsed    int64     `json:"mem_used"`     // memory in use, bytes (the page cache it could drop at once left out)
	MemCache   int64     `json:"mem_cache"`    // page cache, bytes (its tmpfs upper's files are in it)
	MemTotal   int64     `json:"mem_total"`    // its memory limit, or the host's memory when less, bytes
	DiskUsed   int64     `json:"disk_used"`    // bytes written in its upper layer's filesystem
	DiskTotal  int64     `json:"disk_total"`   // that filesystem's size, bytes
}

// sample is a Sample as a history holds it: 56 bytes.
type sample struct {
	t                                     int64 // unix seconds
	pct                                   float32
	cpus                                  uint16
	n                                     uint16 // readings merged into it
	mem, cache, memTotal, disk, diskTotal int64
}

func (x sample) export() Sample {
	return Sample{
		Time: time.Unix(x.t, 0).UTC(), CPUCount: int(x.cpus), CPUUsedPct: math.Round(float64(x.pct)*100) / 100,
		MemUsed: x.mem, MemCache: x.cache, MemTotal: x.memTotal, DiskUsed: x.disk, DiskTotal: x.diskTotal,
	}
}

// merge is a and the later b as one sample at a's time.
func merge(a, b sample) sample {
	n := uint32(a.n) + uint32(b.n)
	m := a
	m.pct = (a.pct*float32(a.n) + b.pct*float32(b.n)) / float32(n)
	m.n = uint16(min(n, 1<<16-1))
	m.mem, m.cache, m.disk = max(a.mem, b.mem), max(a.cache, b.cache), max(a.disk, b.disk)
	m.cpus, m.memTotal, m.diskTotal = b.cpus, b.memTotal, b.diskTotal
	return m
}

// History is one Bench's samples, oldest first, at most cap of them.
type History struct {
	cap     int
	step    int64 // seconds between samples: Interval, doubled each time the history filled
	samples []sample
	latest  sample // the newest reading, unmerged
	// The previous reading's cpu time and when it was taken, for the next one's cpu use.
	prevCPU  int64
	prevTime time.Time
}

// NewHistory is an empty history of at most capacity samples (at least 2) spaced step or more.
func NewHistory(capacity int, step time.Duration) *History {
	return &History{cap: max(capacity, 2), step: max(int64(step/time.Second), 1)}
}

// Add records the reading u taken at now of a Bench that started at started.
func (h *History) Add(now, started time.Time, u sandbox.Usage) {
	// Its cpu use since the previous reading, or since it started for the first.
	since, base := started, int64(0)
	if !h.prevTime.IsZero() {
		since, base = h.prevTime, h.prevCPU
	}
	pct := 0.0
	if wall := now.Sub(since); wall > 0 && u.CPUCount > 0 && u.CPUNanos >= base {
		pct = float64(u.CPUNanos-base) / float64(wall) / float64(u.CPUCount) * 100
		pct = min(math.Round(pct*100)/100, 100) // two decimals, as envd's
	}
	h.prevCPU, h.prevTime = u.CPUNanos, now
	x := sample{t: now.Unix(), pct: float32(pct), cpus: uint16(min(u.CPUCount, 1<<16-1)), n: 1,
		mem: u.MemUsed, cache: u.MemCache, memTotal: u.MemTotal, disk: u.DiskUsed, diskTotal: u.DiskTotal}
	h.latest = x
	if n := len(h.samples); n > 0 && x.t-h.samples[n-1].t < h.step {
		h.samples[n-1] = merge(h.samples[n-1], x)
		return
	}
	if len(h.samples) == h.cap {
		h.halve()
	}
	h.samples = append(h.samples, x)
}

// halve merges the samples two by two and doubles the spacing.
func (h *History) halve() {
	out := h.samples[:0]
	for i := 0; i < len(h.samples); i += 2 {
		if i+1 < len(h.samples) {
			out = append(out, merge(h.samples[i], h.samples[i+1]))
		} else {
			out = append(out, h.samples[i])
		}
	}
	h.samples = out
	h.step *= 2
}

// Range is the samples taken from start to end (unix seconds, both included), oldest first.
func (h *History) Range(start, end int64) []Sample {
	i := sort.Search(len(h.samples), func(i int) bool { return h.samples[i].t >= start })
	out := []Sample{}
	for ; i < len(h.samples) && h.samples[i].t <= end; i++ {
		out = append(out, h.samples[i].export())
	}
	return out
}

// Latest is the newest reading, if there is one.
func (h *History) Latest() (Sample, bool) {
	if h.latest.n == 0 {
		return Sample{}, false
	}
	return h.latest.export(), true
}

// Running is a Bench to read: its init's host pid and when it started.
type Running struct {
	Pid     int
	Started time.Time
	// Disk, if set, is the Bench's own disk use and bound, in place of its root filesystem's (whose
	// figures are those of every Bench on it when uppers share one: a created Bench's); ok false
	// keeps the filesystem's.
	Disk func() (used, total int64, ok bool)
}

// disk puts r's own disk figures, if it has them, in u.
func (r Running) disk(u *sandbox.Usage) {
	if r.Disk == nil {
		return
	}
	if used, total, ok := r.Disk(); ok {
		u.DiskUsed, u.DiskTotal = used, total
	}
}

// Sampler keeps the histories of the running Benches, by id.
type Sampler struct {
	// Read reads a Bench's use by its init's pid (nil: a sandbox.UsageReader of each Bench, which
	// finds its cgroups once).
	Read func(pid int) (sandbox.Usage, error)

	mu      sync.Mutex
	benches map[string]*tracked
}

// tracked is one running Bench's history and how to read it.
type tracked struct {
	h      *History
	pid    int
	reader *sandbox.UsageReader
}

// Observe reads each Bench of running (by id) now, and forgets the histories of Benches no longer
// in it. A Bench that cannot be read (no cgroup: shed without root) gets no sample.
func (s *Sampler) Observe(now time.Time, running map[string]Running) {
	// The readers are taken under the lock and used outside it: a query never waits for the reads.
	s.mu.Lock()
	if s.benches == nil {
		s.benches = map[string]*tracked{}
	}
	for id, t := range s.benches {
		if r, ok := running[id]; !ok || r.Pid != t.pid {
			delete(s.benches, id)
		}
	}
	readers := map[string]*sandbox.UsageReader{}
	for id, t := range s.benches {
		readers[id] = t.reader
	}
	s.mu.Unlock()
	got := map[string]sandbox.Usage{}
	for id, r := range running {
		if r.Pid <= 0 {
			continue
		}
		var u sandbox.Usage
		var err error
		switch rd := readers[id]; {
		case s.Read != nil:
			u, err = s.Read(r.Pid)
		case rd != nil:
			u, err = rd.Read()
		default:
			if rd, err = sandbox.NewUsageReader(r.Pid); err == nil {
				readers[id] = rd
				u, err = rd.Read()
			}
		}
		if err == nil {
			r.disk(&u)
			got[id] = u
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, u := range got {
		t := s.benches[id]
		if t == nil {
			t = &tracked{h: NewHistory(Capacity, Interval), pid: running[id].Pid, reader: readers[id]}
			s.benches[id] = t
		}
		t.h.Add(now, running[id].Started, u)
	}
}

// Range is the samples of the Bench id from start to end (unix seconds), oldest first: none for a
// Bench the sampler has not read.
func (s *Sampler) Range(id string, start, end int64) []Sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t := s.benches[id]; t != nil {
		return t.h.Range(start, end)
	}
	return []Sample{}
}

// Latest is the newest sample of the Bench id, if it has one.
func (s *Sampler) Latest(id string) (Sample, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t := s.benches[id]; t != nil {
		return t.h.Latest()
	}
	return Sample{}, false
}

// Now is one reading of a Bench, for a process that keeps no history (the CLI on a store of its
// own): its cpu use is its mean since it started.
func Now(now time.Time, r Running) (Sample, error) {
	u, err := sandbox.ReadUsage(r.Pid)
	if err != nil {
		return Sample{}, err
	}
	r.disk(&u)
	h := NewHistory(2, Interval)
	h.Add(now, r.Started, u)
	x, _ := h.Latest()
	return x, nil
}
