package sandbox

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Usage is what a running sandbox uses: its commands' cpu time and memory, read from the cgroups
// Spec.Account (or a limit) put them in, and its root's filesystem (an overlay, whose figures are its
// upper's: for a tmpfs upper, the bytes the sandbox wrote and the tmpfs's size).
type Usage struct {
	CPUNanos int64 // cpu time of its commands since they started, in nanoseconds
	CPUCount int   // the cpus it may run on
	MemUsed  int64 // memory in use, in bytes: the cgroup's, less the page cache it could drop at once
	MemCache int64 // of it, page cache (the tmpfs upper's files too) in bytes
	MemTotal int64 // its memory limit, or the host's memory when that is less
	// DiskUsed and DiskTotal are the root filesystem's used bytes and size.
	DiskUsed, DiskTotal int64
}

// ErrNoUsage is returned by ReadUsage for a sandbox whose commands are in no cgroup of shed's: one
// started without root (the host's cgroups are not shed's) or without Spec.Account and limits, or
// one with no command running.
var ErrNoUsage = errors.New("no cgroup to read the sandbox's use from")

// ReadUsage reads what the sandbox of init's host pid initPid uses now (UsageReader, once).
func ReadUsage(initPid int) (Usage, error) {
	r, err := NewUsageReader(initPid)
	if err != nil {
		return Usage{}, err
	}
	return r.Read()
}

// UsageReader reads one running sandbox's use: its cgroups are found once (from a command init runs,
// as MemoryCgroup finds them), then each Read is a few small files and one statfs.
type UsageReader struct {
	pid      int
	mem, cpu string // the memory and cpu accounting cgroups' directories (v2: the same one)
	v2       bool
}

// NewUsageReader finds the cgroups of the sandbox of init's host pid initPid: ErrNoUsage when its
// commands are in none of shed's.
func NewUsageReader(initPid int) (*UsageReader, error) {
	cg := commandCgroup(initPid)
	if cg == "" {
		return nil, ErrNoUsage
	}
	r := &UsageReader{pid: initPid}
	r.mem, r.cpu, r.v2 = cgroupDirs(cg)
	if r.mem == "" || r.cpu == "" {
		return nil, ErrNoUsage
	}
	return r, nil
}

// Read reads what the sandbox uses now.
func (r *UsageReader) Read() (Usage, error) {
	var u Usage
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(r.pid, &set); err != nil {
		return u, fmt.Errorf("read the sandbox's cpus: %w", err)
	}
	u.CPUCount = set.Count()
	var st unix.Statfs_t
	if err := unix.Statfs("/proc/"+strconv.Itoa(r.pid)+"/root", &st); err != nil {
		return u, fmt.Errorf("read the sandbox's disk: %w", err)
	}
	u.DiskTotal = int64(st.Blocks) * st.Bsize
	u.DiskUsed = int64(st.Blocks-st.Bfree) * st.Bsize
	host := hostMemory()
	u.MemTotal = host
	var err error
	if r.v2 {
		err = readUsage2(&u, r.mem)
	} else {
		err = readUsage1(&u, r.mem, r.cpu)
	}
	if u.MemTotal <= 0 || host > 0 && u.MemTotal > host {
		u.MemTotal = host
	}
	return u, err
}

// readUsage1 reads cgroup v1's memory and cpuacct controllers.
func readUsage1(u *Usage, mem, cpu string) error {
	n, err := readInt(filepath.Join(cpu, "cpuacct.usage"))
	if err != nil {
		return err
	}
	u.CPUNanos = n
	usage, err := readInt(filepath.Join(mem, "memory.usage_in_bytes"))
	if err != nil {
		return err
	}
	if limit, err := readInt(filepath.Join(mem, "memory.limit_in_bytes")); err == nil {
		u.MemTotal = limit
	}
	b, err := os.ReadFile(filepath.Join(mem, "memory.stat"))
	if err != nil {
		return err
	}
	stat := parseFlat(string(b))
	u.MemCache = stat["total_cache"]
	u.MemUsed = max(usage-stat["total_inactive_file"], 0)
	return nil
}

// readUsage2 reads the unified hierarchy's cpu.stat (always there) and memory controller.
func readUsage2(u *Usage, dir string) error {
	b, err := os.ReadFile(filepath.Join(dir, "cpu.stat"))
	if err != nil {
		return err
	}
	u.CPUNanos = parseFlat(string(b))["usage_usec"] * 1000
	usage, err := readInt(filepath.Join(dir, "memory.current"))
	if err != nil {
		return err
	}
	if limit, err := readInt(filepath.Join(dir, "memory.max")); err == nil { // "max": no limit
		u.MemTotal = limit
	}
	if b, err = os.ReadFile(filepath.Join(dir, "memory.stat")); err != nil {
		return err
	}
	stat := parseFlat(string(b))
	u.MemCache = stat["file"]
	u.MemUsed = max(usage-stat["inactive_file"], 0)
	return nil
}

// commandCgroup is /proc/PID/cgroup of a command init runs ("" when none runs or none is in a
// cgroup of shed's).
func commandCgroup(initPid int) string {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", initPid))
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		for _, child := range strings.Fields(string(b)) {
			cg, err := os.ReadFile("/proc/" + child + "/cgroup")
			if err == nil && strings.Contains(string(cg), ":/"+cgroupParent+"/") {
				return string(cg)
			}
		}
	}
	return ""
}

// cgroupDirs finds, in a /proc/PID/cgroup text, the directories of shed's memory and cpu accounting
// cgroups: v1's memory and cpuacct hierarchies, or the unified one (v2, then mem is the one directory).
func cgroupDirs(procCgroup string) (mem, cpu string, v2 bool) {
	var unified string
	for _, line := range strings.Split(procCgroup, "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 || !strings.HasPrefix(parts[2], "/"+cgroupParent+"/") || strings.Contains(parts[2], "..") {
			continue
		}
		ctls := strings.Split(parts[1], ",")
		switch {
		case slices.Contains(ctls, "memory"):
			mem = filepath.Join(cgroupRoot, "memory", parts[2])
		case slices.Contains(ctls, "cpuacct"):
			// "cpuacct" is the hierarchy's mount point, or a link to "cpu,cpuacct" where they share one.
			cpu = filepath.Join(cgroupRoot, "cpuacct", parts[2])
		case parts[0] == "0" && parts[1] == "":
			unified = filepath.Join(cgroupRoot, parts[2])
		}
	}
	if mem == "" && cpu == "" && unified != "" {
		return unified, unified, true
	}
	return mem, cpu, false
}

// parseFlat reads a cgroup's flat-keyed file ("key value" lines); a line that is not one is skipped.
func parseFlat(s string) map[string]int64 {
	m := map[string]int64{}
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		if n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
			m[k] = n
		}
	}
	return m
}

// readInt reads a file of one decimal number.
func readInt(p string) (int64, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", p, err)
	}
	return n, nil
}

// hostMemory is the host's memory in bytes (MemTotal of /proc/meminfo), 0 if unknown: read once.
var hostMemory = sync.OnceValue(func() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
})
