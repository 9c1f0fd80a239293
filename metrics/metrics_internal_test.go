package metrics

import (
	"testing"
	"time"
	"unsafe"

	"toolshed.dev/shed/sandbox"
)

var t0 = time.Unix(1_800_000_000, 0)

func usage(cpuNanos int64, mem int64) sandbox.Usage {
	return sandbox.Usage{CPUNanos: cpuNanos, CPUCount: 2, MemUsed: mem, MemTotal: 1 << 30, DiskUsed: mem / 2, DiskTotal: 1 << 30}
}

// TestCPUPercent: a sample's cpu use is the cpu time since the reading before over the wall time and
// the cpus, to two decimals; the first one's is since the Bench started.
func TestCPUPercent(t *testing.T) {
	h := NewHistory(10, Interval)
	started := t0.Add(-10 * time.Second)
	h.Add(t0, started, usage(int64(5*time.Second), 1))                     // 5 s of 2 cpus in 10 s: 25 %
	h.Add(t0.Add(5*time.Second), started, usage(int64(15*time.Second), 1)) // 10 s in 5 s of 2 cpus: 100 %
	h.Add(t0.Add(10*time.Second), started, usage(int64(15*time.Second)+int64(time.Second/3), 1))
	got := h.Range(0, 1<<62)
	want := []float64{25, 100, 3.33}
	if len(got) != len(want) {
		t.Fatalf("got %d samples, want %d", len(got), len(want))
	}
	for i, w := range want {
		if got[i].CPUUsedPct != w {
			t.Errorf("sample %d: cpu %v%%, want %v%%", i, got[i].CPUUsedPct, w)
		}
	}
	// A counter that went back (a new cgroup) is no negative use.
	h.Add(t0.Add(15*time.Second), started, usage(0, 1))
	if x, _ := h.Latest(); x.CPUUsedPct != 0 {
		t.Errorf("cpu after the counter went back: %v", x.CPUUsedPct)
	}
}

// TestHistoryBounded: however long a Bench runs, its history holds at most its capacity; when full,
// samples merge two by two (mean cpu, highest memory), the spacing doubles, and the whole life stays
// covered, oldest first.
func TestHistoryBounded(t *testing.T) {
	const capacity = 8
	h := NewHistory(capacity, 5*time.Second)
	cpu := int64(0)
	n := 1000 // 5000 s of readings every 5 s
	for i := range n {
		if i%2 == 1 {
			cpu += int64(5 * time.Second) // every other interval, both cpus busy... half of them: 50 %
		}
		h.Add(t0.Add(time.Duration(i)*5*time.Second), t0, usage(cpu, int64(i)))
		if len(h.samples) > capacity {
			t.Fatalf("after %d readings: %d samples, more than %d", i+1, len(h.samples), capacity)
		}
	}
	all := h.Range(0, 1<<62)
	if len(all) < capacity/2 || len(all) > capacity {
		t.Fatalf("%d samples kept of %d, want %d to %d", len(all), n, capacity/2, capacity)
	}
	if !all[0].Time.Equal(t0) {
		t.Errorf("the oldest sample is at %v, want the first reading's time %v", all[0].Time, t0)
	}
	for i := 1; i < len(all); i++ {
		if !all[i].Time.After(all[i-1].Time) {
			t.Fatalf("samples out of order: %v then %v", all[i-1].Time, all[i].Time)
		}
	}
	last := all[len(all)-1]
	if last.MemUsed != int64(n-1) {
		t.Errorf("the newest sample's memory %d, want the highest of its readings, %d", last.MemUsed, n-1)
	}
	for _, x := range all[1:] {
		if x.CPUUsedPct < 20 || x.CPUUsedPct > 30 {
			t.Errorf("merged sample at %v: cpu %v%%, want the mean, about 25%%", x.Time, x.CPUUsedPct)
		}
	}
	if x, _ := h.Latest(); !x.Time.Equal(t0.Add(time.Duration(n-1)*5*time.Second)) || x.MemUsed != int64(n-1) {
		t.Errorf("latest: %+v, want the newest reading", x)
	}
}

// TestRange: a range is inclusive, in unix seconds; one outside the history, backwards, or of ten
// years answers from what is there, never more than the history.
func TestRange(t *testing.T) {
	h := NewHistory(Capacity, Interval)
	for i := range 10 {
		h.Add(t0.Add(time.Duration(i)*Interval), t0, usage(0, 1))
	}
	s := t0.Unix()
	for _, c := range []struct {
		name       string
		start, end int64
		want       int
	}{
		{"all", 0, 1 << 62, 10},
		{"inclusive", s + 5, s + 15, 3},
		{"before", s - 3600, s - 1800, 0},
		{"after", s + 3600, s + 7200, 0},
		{"backwards", s + 15, s + 5, 0},
		{"ten years", s - 10*365*86400, s + 10*365*86400, 10},
	} {
		if got := h.Range(c.start, c.end); len(got) != c.want {
			t.Errorf("%s: %d samples, want %d", c.name, len(got), c.want)
		}
	}
	// Readings closer than the spacing merge into the sample before.
	h2 := NewHistory(Capacity, Interval)
	h2.Add(t0, t0, usage(0, 5))
	h2.Add(t0.Add(time.Second), t0, usage(0, 9))
	if got := h2.Range(0, 1<<62); len(got) != 1 || got[0].MemUsed != 9 {
		t.Errorf("two readings a second apart: %+v, want one sample with the higher memory", got)
	}
}

// TestSampler: Observe reads the running Benches, keeps nothing of one it cannot read, and forgets a
// Bench once it is no longer running, so the histories are those of the running Benches only.
func TestSampler(t *testing.T) {
	reads := 0
	s := &Sampler{Read: func(pid int) (sandbox.Usage, error) {
		reads++
		if pid == 2 {
			return sandbox.Usage{}, sandbox.ErrNoUsage
		}
		return usage(0, int64(pid)), nil
	}}
	running := map[string]Running{"a": {Pid: 1, Started: t0}, "b": {Pid: 2, Started: t0}, "c": {Pid: 0}}
	s.Observe(t0, running)
	if reads != 2 {
		t.Errorf("%d reads, want 2 (a Bench with no pid is not read)", reads)
	}
	if _, ok := s.Latest("a"); !ok {
		t.Error("no sample of a")
	}
	if _, ok := s.Latest("b"); ok {
		t.Error("a sample of b, which could not be read")
	}
	delete(running, "a")
	s.Observe(t0.Add(Interval), running)
	if len(s.Range("a", 0, 1<<62)) != 0 || len(s.benches) != 0 {
		t.Errorf("a stopped running, and %d histories are kept", len(s.benches))
	}
}

// TestSampleSize: a history's sample is the 56 bytes Capacity's memory bound counts.
func TestSampleSize(t *testing.T) {
	if n := unsafe.Sizeof(sample{}); n != 56 {
		t.Errorf("a sample is %d bytes, want 56 (docs/agents.md: 20 KB a Bench)", n)
	}
}
