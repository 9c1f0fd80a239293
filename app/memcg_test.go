package app

import (
	"os"
	"path/filepath"
	"testing"

	"toolshed.dev/shed/bench"
)

// A Bench's memory cgroup is looked up once and kept, and looked up again once its directory is gone.
func TestMemoryCgroupKept(t *testing.T) {
	dir := t.TempDir()
	// This process has no Bench below it: a lookup finds nothing.
	rec := &bench.Record{ID: "0123456789abcdef", Pid: os.Getpid()}
	if got := memoryCgroup(rec); got != "" {
		t.Fatalf("memoryCgroup of a process with no Bench = %q, want none", got)
	}
	memcgs.Lock()
	memcgs.m = map[memcgKey]string{{rec.ID, rec.Pid}: dir}
	memcgs.Unlock()
	if got := memoryCgroup(rec); got != dir {
		t.Fatalf("memoryCgroup = %q, want the kept %q", got, dir)
	}
	if got := memoryCgroup(&bench.Record{ID: rec.ID, Pid: rec.Pid + 1}); got != "" {
		t.Fatalf("memoryCgroup of another init = %q, want a lookup (none)", got)
	}
	os.Remove(dir)
	if got := memoryCgroup(rec); got != "" {
		t.Fatalf("memoryCgroup once its directory is gone = %q, want a lookup (none)", got)
	}
	// Bounded: past maxMemcgs entries it starts again.
	memcgs.Lock()
	memcgs.m = map[memcgKey]string{}
	for i := range maxMemcgs {
		memcgs.m[memcgKey{"x", i}] = filepath.Join(dir, "gone")
	}
	memcgs.Unlock()
	keepMemcg(memcgKey{"y", 1}, t.TempDir())
	memcgs.Lock()
	n := len(memcgs.m)
	memcgs.Unlock()
	if n != 1 {
		t.Fatalf("memcgs holds %d entries past its bound, want 1", n)
	}
}
