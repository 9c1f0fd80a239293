package builder

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"toolshed.dev/shed/recipe"
	"toolshed.dev/shed/store"
)

// eventLog is a Status and a Step that write down, in order, what they hear.
type eventLog struct{ events []string }

func (l *eventLog) step(format string, args ...any) {
	l.events = append(l.events, "line "+fmt.Sprintf(format, args...))
}
func (l *eventLog) Begin(what string)           { l.events = append(l.events, "begin "+what) }
func (l *eventLog) Write(p []byte) (int, error) { return len(p), nil }
func (l *eventLog) End()                        { l.events = append(l.events, "end") }
func (l *eventLog) Bytes(done, total int64) {
	l.events = append(l.events, fmt.Sprintf("bytes %d/%d", done, total))
}

// fakeCache has the closure of every path asked for: a Pull registers every missing output of plan
// (the seed, the .debs, the layer), 1000 bytes each, as a cache's pull of a layer's closure does.
type fakeCache struct {
	s    *store.Store
	plan *recipe.Plan
}

func (f *fakeCache) Pull(ctx context.Context, p store.Path, found func(string), progress func(done, expected int64)) (bool, error) {
	found("fake://cache")
	progress(0, 2000)
	progress(2000, 2000)
	for _, d := range f.plan.Derivations {
		_, _, err := f.s.Realize(ctx, d.Output, store.AddOptions{}, func(ctx context.Context, out string) error {
			if err := os.MkdirAll(out, 0o755); err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(out, "data"), []byte(strings.Repeat("x", 1000)), 0o644)
		})
		if err != nil {
			return false, err
		}
	}
	return true, nil
}

// TestRealizeSubstitutes: a substitution says when it starts (the cache that has the path) and
// ends (the paths it brought, their size, the time, the bytes downloaded), with its status between
// the two lines; the result counts every path substituted.
func TestRealizeSubstitutes(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: store paths keep owners (CI runs as root)")
	}
	s := newTestStore(t)
	r, err := recipe.Parse("workshop.toml", []byte("name = \"t\"\nseed = \"debian/bookworm\"\n[apt]\npackages = [\"jq\"]\n"), recipe.Options{})
	if err != nil {
		t.Fatal(err)
	}
	lock := &recipe.Lock{Seed: recipe.LockedSeed{Spec: "debian/bookworm", Mirror: recipe.DefaultMirror, Epoch: 1700000000}}
	for _, n := range []string{"jq", "libjq1"} {
		lock.Apt = append(lock.Apt, recipe.LockedDeb{Name: n, Version: "1", Arch: "amd64", URL: "http://deb.example/" + n + ".deb",
			SHA256: strings.Repeat("a", 63) + fmt.Sprint(len(n)), Size: 1000, Declared: n == "jq"})
	}
	plan, err := recipe.Compile(r, lock, s.StoreDir())
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Derivations) != 4 {
		t.Fatalf("%d derivations, want the seed, two .debs and the layer", len(plan.Derivations))
	}
	log := &eventLog{}
	top := plan.Derivations[3].Output
	b := &Builder{Store: s, Substituter: &fakeCache{s, plan}, Step: log.step, Status: log}
	res, err := b.Realize(t.Context(), plan)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Substituted) != 4 || len(res.Built) != 0 || len(res.Fetched) != 0 {
		t.Errorf("substituted %v, built %v, fetched %v: want the 4 paths substituted", res.Substituted, res.Built, res.Fetched)
	}
	ev := log.events
	want := []string{
		"begin substituting " + top.Name() + " (layer) from fake://cache",
		"line substituting " + top.Name() + " (layer) from fake://cache...",
		"bytes 0/2000", "bytes 2000/2000", "end",
	}
	if len(ev) != len(want)+1 || !slices.Equal(ev[:len(want)], want) {
		t.Fatalf("events:\n%s\nwant\n%s\nand the end line", strings.Join(ev, "\n"), strings.Join(want, "\n"))
	}
	end := regexp.MustCompile(`^line substituted ` + regexp.QuoteMeta(top.Name()) + ` \(layer\) from fake://cache: 4 paths, (\S+ \S+) in \d+ ms \(2\.0 KiB downloaded\)$`)
	m := end.FindStringSubmatch(ev[len(want)])
	if m == nil {
		t.Fatalf("end line %q", ev[len(want)])
	}
	var size int64
	for _, p := range res.Substituted {
		info, _ := s.Info(p)
		size += info.Size
	}
	if m[1] != FormatBytes(size) {
		t.Errorf("end line says %s, want the paths' %s", m[1], FormatBytes(size))
	}
}

// TestRealizeCacheHitOneRead: a cache-hit realize reads the database once, whatever the size of
// the plan; and a path whose bytes are gone is no hit, though its record is there.
func TestRealizeCacheHitOneRead(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: store paths keep owners (CI runs as root)")
	}
	s := newTestStore(t)
	r, err := recipe.Parse("workshop.toml", []byte("name = \"t\"\nseed = \"debian/bookworm\"\n[apt]\npackages = [\"jq\"]\n"), recipe.Options{})
	if err != nil {
		t.Fatal(err)
	}
	lock := &recipe.Lock{Seed: recipe.LockedSeed{Spec: "debian/bookworm", Mirror: recipe.DefaultMirror, Epoch: 1700000000}}
	for _, n := range []string{"jq", "libjq1", "libonig5"} {
		lock.Apt = append(lock.Apt, recipe.LockedDeb{Name: n, Version: "1", Arch: "amd64", URL: "http://deb.example/" + n + ".deb",
			SHA256: strings.Repeat("a", 63) + fmt.Sprint(len(n)), Size: 1000, Declared: n == "jq"})
	}
	plan, err := recipe.Compile(r, lock, s.StoreDir())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := (&Builder{Store: s, Substituter: &fakeCache{s, plan}}).Realize(t.Context(), plan); err != nil {
		t.Fatal(err)
	}
	before := s.DBOpens()
	res, err := (&Builder{Store: s, Offline: true}).Realize(t.Context(), plan)
	if err != nil {
		t.Fatal(err)
	}
	if n := s.DBOpens() - before; n != 1 {
		t.Errorf("a cache-hit realize of %d derivations opened the database %d times, want 1", len(plan.Derivations), n)
	}
	if len(res.Built)+len(res.Fetched)+len(res.Substituted) != 0 || !slices.Equal(res.Layers, plan.Layers) {
		t.Errorf("cache hit: built %v, fetched %v, substituted %v, layers %v", res.Built, res.Fetched, res.Substituted, res.Layers)
	}
	// The layer's bytes gone (its record kept): not a hit, the layer is built again (here it cannot
	// be: its fake .debs are not real files).
	top := plan.Layers[len(plan.Layers)-1]
	if err := os.RemoveAll(s.Location(top)); err != nil {
		t.Fatal(err)
	}
	if _, err := (&Builder{Store: s, Offline: true}).Realize(t.Context(), plan); err == nil || !strings.Contains(err.Error(), "build "+top.String()) {
		t.Errorf("realize with the layer's bytes gone: %v, want its build tried", err)
	}
}
