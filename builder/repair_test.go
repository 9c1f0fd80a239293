package builder

import (
	"testing"

	"toolshed.dev/shed/store"
)

// Repairs run dependencies first: the seed, then the .debs, then the layer built over and from them;
// and a path over one whose repair failed is named, not rebuilt.
func TestRepairOrder(t *testing.T) {
	mk := func(name string) store.Path {
		p, err := store.MakePath("output", name, store.DefaultStoreDir, name)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	seed, deb, apt, pip := mk("debian-bookworm"), mk("jq.deb"), mk("apt-jq"), mk("pip-x")
	infos := map[store.Path]*store.PathInfo{
		seed: {Path: seed},
		deb:  {Path: deb},
		apt:  {Path: apt, References: []store.Path{seed}, BuildInputs: []store.Path{deb}},
		pip:  {Path: pip, References: []store.Path{apt}},
	}
	order := dependenciesFirst(infos, []store.Path{pip, apt, deb, seed})
	pos := map[store.Path]int{}
	for i, p := range order {
		pos[p] = i
	}
	if len(order) != 4 || pos[seed] > pos[apt] || pos[deb] > pos[apt] || pos[apt] > pos[pip] {
		t.Errorf("order %v: want the seed and the .deb before apt-jq, apt-jq before pip-x", order)
	}
	if got := failedBelow(infos[pip], map[store.Path]bool{apt: true}); got != apt {
		t.Errorf("failedBelow(pip) = %v, want %v", got, apt)
	}
	if got := failedBelow(infos[apt], map[store.Path]bool{deb: true}); got != deb {
		t.Errorf("failedBelow(apt) = %v, want the .deb it was built from", got)
	}
	if got := failedBelow(infos[apt], map[store.Path]bool{pip: true}); !got.IsZero() {
		t.Errorf("failedBelow(apt) = %v, want none (pip-x is above it)", got)
	}
}
