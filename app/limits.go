package app

import (
	"path/filepath"
	"sync"

	"toolshed.dev/shed/bench"
)

// A user's limits on Benches (the supervisor's --user-benches and --user-kept) count the Benches the
// user has, by their records. A launch has no record until its Workshop is realized and its sandbox
// started, long after the policy looked: counted then and let go, launches at once all see room for
// one more (20 creates at once with a limit of 8 made 20 Benches). So the policy does not count and
// let go: it reserves. ReserveBench counts the owner's records and the launches that hold a slot, and
// takes a slot, under one lock; the launch holds its slot until its Bench's record exists or it
// failed. A slot learns its Bench's id before the record is written (bench.Options.Reserved), so a
// Bench is counted once, by its slot or its record, never twice and never not at all.
//
// The count lives here, in the one long-lived Service the supervisor has, because every face (the
// socket, the E2B API, MCP) reaches Benches through it; the decision (who is bounded, by which
// limits, and what a refusal says) stays the policy's. Operators are not bounded, and the CLI on a
// store directly is an operator's: users launch only through the supervisor, through this count.

// BenchLimits are the most Benches one owner may have at once: running or kept, and kept (their
// uppers are on the store's filesystem). Zero: no bound.
type BenchLimits struct{ Benches, Kept int }

// BenchCount is what an owner has: Benches with a record, and launches holding a slot.
type BenchCount struct{ Benches, Kept int }

// Launch is a request that launches a Bench (bench.run's, bench.create's): the slot the policy
// reserved for it goes with it to the operation.
type Launch interface{ slotOf() **Slot }

func (r *BenchRunRequest) slotOf() **Slot    { return &r.slot }
func (r *BenchCreateRequest) slotOf() **Slot { return &r.slot }

// Slot is one launch's hold on one of its owner's Bench slots.
type Slot struct {
	s     *Service
	owner string
	keep  bool
	id    string // its Bench's, once reserved (under s.slots.mu)
}

// slots are the launches that hold a slot, and the snapshots being taken, by owner.
type slots struct {
	mu    sync.Mutex
	held  map[string]map[*Slot]bool
	snaps map[string]map[*SnapshotHold]bool
}

// bound tells the slot its Bench's id: from now its record, once written, is this slot's Bench.
func (sl *Slot) bound(id string) {
	if sl == nil {
		return
	}
	sl.s.slots.mu.Lock()
	defer sl.s.slots.mu.Unlock()
	sl.id = id
}

// release gives the slot back (again: nothing; nil holds nothing).
func (sl *Slot) release() {
	if sl == nil {
		return
	}
	t := &sl.s.slots
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.held[sl.owner], sl)
	if len(t.held[sl.owner]) == 0 {
		delete(t.held, sl.owner)
	}
}

// ReserveBench takes, for the launch req of owner (keep: a kept Bench), one of owner's slots within
// lim, or says that a limit is reached (ok false, with what owner has; nothing is held then). The
// operation that runs req gives the slot back once its Bench's record exists or it failed, so the
// policy reserves last, when nothing else may refuse the request.
func (s *Service) ReserveBench(req Launch, owner string, keep bool, lim BenchLimits) (have BenchCount, ok bool, err error) {
	sls, have, ok, err := s.reserve(owner, 1, keep, lim)
	if !ok {
		return have, ok, err
	}
	// A request is checked once and run once; one checked again (a caller reusing it) gives back
	// what its first check held, rather than hold it forever.
	if old := *req.slotOf(); old != nil {
		old.release()
	}
	*req.slotOf() = sls[0]
	return have, true, nil
}

// ReserveForks takes n of owner's slots for the children of the fork req, as ReserveBench does one.
func (s *Service) ReserveForks(req *BenchForkRequest, owner string, n int, lim BenchLimits) (have BenchCount, ok bool, err error) {
	sls, have, ok, err := s.reserve(owner, n, false, lim)
	if !ok {
		return have, ok, err
	}
	for _, old := range req.slots {
		old.release()
	}
	req.slots = sls
	return have, true, nil
}

// reserve counts what owner has and takes n slots if they fit within lim, under one lock.
func (s *Service) reserve(owner string, n int, keep bool, lim BenchLimits) ([]*Slot, BenchCount, bool, error) {
	var have BenchCount
	s.slots.mu.Lock()
	defer s.slots.mu.Unlock()
	recs, err := bench.ListIn(filepath.Join(s.Root, "benches"))
	if err != nil {
		return nil, have, false, err
	}
	counted := map[string]bool{}
	for _, r := range recs {
		if r.Owner == owner {
			counted[r.ID] = true
			have.Benches++
			if r.Keep {
				have.Kept++
			}
		}
	}
	for sl := range s.slots.held[owner] {
		if sl.id == "" || !counted[sl.id] {
			have.Benches++
			if sl.keep {
				have.Kept++
			}
		}
	}
	if (lim.Benches > 0 && have.Benches+n > lim.Benches) || (keep && lim.Kept > 0 && have.Kept+n > lim.Kept) {
		return nil, have, false, nil
	}
	if s.slots.held == nil {
		s.slots.held = map[string]map[*Slot]bool{}
	}
	if s.slots.held[owner] == nil {
		s.slots.held[owner] = map[*Slot]bool{}
	}
	sls := make([]*Slot, n)
	for i := range sls {
		sls[i] = &Slot{s: s, owner: owner, keep: keep}
		s.slots.held[owner][sls[i]] = true
	}
	return sls, have, true, nil
}

// heldSlot is the slot the policy reserved for req, if any: the operation binds and releases it.
func heldSlot(req Launch) *Slot { return *req.slotOf() }

// releaseHeld gives back what the policy reserved for req (Bench slots, a snapshot's hold) when its
// operation is not run after all; one that runs gives them back itself.
func releaseHeld(req any) {
	switch r := req.(type) {
	case Launch:
		heldSlot(r).release()
	case *BenchForkRequest:
		for _, sl := range r.slots {
			sl.release()
		}
	case *SnapshotCreateRequest:
		r.hold.release()
	}
}

// A user's snapshots (the supervisor's --user-snapshots) are reserved the same way: the policy counts
// the snapshots the owner has and those being taken, and holds one, under one lock, until its record
// exists or the taking failed; 20 snapshots asked at once with room for one make one.

// SnapshotHold is one snapshot.create's hold on one of its owner's snapshots.
type SnapshotHold struct {
	s     *Service
	owner string
	id    string // its snapshot's, once chosen (under s.slots.mu)
}

// bound tells the hold its snapshot's id: from now that snapshot's record, once written, is this hold's.
func (h *SnapshotHold) bound(id string) {
	if h == nil {
		return
	}
	h.s.slots.mu.Lock()
	defer h.s.slots.mu.Unlock()
	h.id = id
}

// release gives the hold back (again: nothing; nil holds nothing).
func (h *SnapshotHold) release() {
	if h == nil {
		return
	}
	t := &h.s.slots
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.snaps[h.owner], h)
	if len(t.snaps[h.owner]) == 0 {
		delete(t.snaps, h.owner)
	}
}

// ReserveSnapshot holds, for req of owner, one of at most limit snapshots owner may have, or says
// that owner has them all (ok false, with how many; nothing is held then). SnapshotCreate gives the
// hold back when its snapshot's record exists or it failed.
func (s *Service) ReserveSnapshot(req *SnapshotCreateRequest, owner string, limit int) (have int, ok bool, err error) {
	st, err := s.openStore()
	if err != nil {
		return 0, false, err
	}
	defer st.Close()
	s.slots.mu.Lock()
	defer s.slots.mu.Unlock()
	all, err := bench.Snapshots(st)
	if err != nil {
		return 0, false, err
	}
	counted := map[string]bool{}
	for _, snap := range all {
		if snap.Owner == owner {
			counted[snap.ID] = true
			have++
		}
	}
	for h := range s.slots.snaps[owner] {
		if h.id == "" || !counted[h.id] {
			have++
		}
	}
	if have >= limit {
		return have, false, nil
	}
	req.hold.release() // a request checked again gives back what its first check held
	if s.slots.snaps == nil {
		s.slots.snaps = map[string]map[*SnapshotHold]bool{}
	}
	if s.slots.snaps[owner] == nil {
		s.slots.snaps[owner] = map[*SnapshotHold]bool{}
	}
	req.hold = &SnapshotHold{s: s, owner: owner}
	s.slots.snaps[owner][req.hold] = true
	return have, true, nil
}
