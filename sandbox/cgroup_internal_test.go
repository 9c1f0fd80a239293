package sandbox

import (
	"os"
	"testing"
)

// TestSweepKeepsHeldCgroup: between its creation and its command's start a sandbox's cgroup is empty;
// Sweep must keep it because its creator holds it.
func TestSweepKeepsHeldCgroup(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (cgroups)")
	}
	c, err := newCgroup(Limits{Pids: 5, MemoryBytes: 64 << 20}, false, true)
	if err != nil {
		t.Fatal(err)
	}
	defer c.remove()
	if _, err := Sweep(); err != nil {
		t.Fatal(err)
	}
	for _, d := range c.dirs {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("Sweep removed a held, empty cgroup: %v", err)
		}
	}
	dirs := append([]string(nil), c.dirs...)
	if err := c.remove(); err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("%s after remove: %v", d, err)
		}
	}
}
