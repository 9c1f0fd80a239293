package sandbox

import "testing"

// TestCgroupDirs: the accounting cgroups of a command, from its /proc/PID/cgroup: v1's memory and
// cpuacct hierarchies (cpuacct alone or beside cpu), or the unified one; cgroups not shed's are not.
func TestCgroupDirs(t *testing.T) {
	for _, c := range []struct {
		name, in string
		mem, cpu string
		v2       bool
	}{
		{"v1", "9:name=systemd:/\n8:pids:/toolshed/0123456789abcdef\n4:memory:/toolshed/0123456789abcdef\n2:cpuacct:/toolshed/0123456789abcdef\n1:cpu:/\n0::/\n",
			"/sys/fs/cgroup/memory/toolshed/0123456789abcdef", "/sys/fs/cgroup/cpuacct/toolshed/0123456789abcdef", false},
		{"v1 cpu,cpuacct", "4:memory:/toolshed/aa\n3:cpu,cpuacct:/toolshed/aa\n",
			"/sys/fs/cgroup/memory/toolshed/aa", "/sys/fs/cgroup/cpuacct/toolshed/aa", false},
		{"v2", "0::/toolshed/bb\n", "/sys/fs/cgroup/toolshed/bb", "/sys/fs/cgroup/toolshed/bb", true},
		{"not ours", "4:memory:/user.slice\n0::/user.slice/session-1.scope\n", "", "", false},
		{"no escape", "4:memory:/toolshed/../../etc\n", "", "", false},
		{"garbage", "not a cgroup file", "", "", false},
	} {
		mem, cpu, v2 := cgroupDirs(c.in)
		if mem != c.mem || cpu != c.cpu || v2 != c.v2 {
			t.Errorf("%s: got %q %q %v, want %q %q %v", c.name, mem, cpu, v2, c.mem, c.cpu, c.v2)
		}
	}
}

// TestParseFlat: a cgroup's flat-keyed file; lines that are not "key number" are skipped.
func TestParseFlat(t *testing.T) {
	m := parseFlat("cache 4096\ntotal_cache 8192\ntotal_inactive_file 100\nbad line\nx notanumber\nusage_usec 12\n")
	for k, want := range map[string]int64{"cache": 4096, "total_cache": 8192, "total_inactive_file": 100, "usage_usec": 12} {
		if m[k] != want {
			t.Errorf("%s = %d, want %d", k, m[k], want)
		}
	}
	if _, ok := m["x"]; ok {
		t.Error("a value that is no number was read")
	}
}
