package app

import (
	"encoding/binary"
	"sync"

	"toolshed.dev/shed/recipe"
	"toolshed.dev/shed/store"
)

// planMemo keeps, in a long-lived process (the supervisor), what launches make of the recipe and
// lock they read: the parsed recipe, and the lock and plan compiled from both. Every launch still
// reads both files, since a changed file must be seen; the work after reading is keyed by the bytes
// read (and whatever else Parse and Compile read), never by time, so new content under the same
// mtime is a new key. Entries are shared by concurrent launches, which only read them.
type planMemo struct {
	mu      sync.Mutex
	recipes map[store.Hash]*recipe.Recipe
	keys    map[*recipe.Recipe]store.Hash // the key each memoized recipe was parsed under
	plans   map[store.Hash]memoPlan
}

type memoPlan struct {
	lock *recipe.Lock
	plan *recipe.Plan
}

// maxMemo bounds each map: a supervisor serves a few Workshops, and a recipe edited for hours adds an
// entry per version; past the bound the memo starts again.
const maxMemo = 64

// memoKey hashes parts, each length-prefixed so that no two lists of parts share a key.
func memoKey(parts ...[]byte) store.Hash {
	var b []byte
	for _, p := range parts {
		b = binary.AppendUvarint(b, uint64(len(p)))
		b = append(b, p...)
	}
	return store.Sum(b)
}

// recipe parses the bytes read from file, or returns what parsing the same bytes gave before.
func (m *planMemo) recipe(file string, data []byte, opts recipe.Options) (*recipe.Recipe, error) {
	parts := [][]byte{[]byte(file), data}
	for _, p := range opts.ForbiddenPaths {
		parts = append(parts, []byte(p))
	}
	k := memoKey(parts...)
	m.mu.Lock()
	r := m.recipes[k]
	m.mu.Unlock()
	if r != nil {
		return r, nil
	}
	r, err := recipe.Parse(file, data, opts)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.recipes == nil || len(m.recipes) >= maxMemo {
		m.recipes, m.keys = map[store.Hash]*recipe.Recipe{}, map[*recipe.Recipe]store.Hash{}
	}
	m.recipes[k], m.keys[r] = r, k
	return r, nil
}

// planKey is the key of r's plan with the lock bytes lock in a store bound to storeDir; false if r
// was not parsed by the memo (its bytes are not known).
func (m *planMemo) planKey(r *recipe.Recipe, lock []byte, storeDir string) (store.Hash, bool) {
	m.mu.Lock()
	rk, ok := m.keys[r]
	m.mu.Unlock()
	if !ok {
		return store.Hash{}, false
	}
	return memoKey(rk[:], lock, []byte(storeDir)), true
}

func (m *planMemo) plan(k store.Hash) (memoPlan, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p, ok := m.plans[k]
	return p, ok
}

func (m *planMemo) putPlan(k store.Hash, p memoPlan) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.plans == nil || len(m.plans) >= maxMemo {
		m.plans = map[store.Hash]memoPlan{}
	}
	m.plans[k] = p
}
