package app

import (
	"errors"
	"fmt"

	"toolshed.dev/shed/bench"
	"toolshed.dev/shed/proposal"
	"toolshed.dev/shed/store"
)

// taskState is the refusal of an operation that makes something lasting or shared (copy, export,
// a proposal, a promotion) when the argument it could not resolve names task state of the caller's:
// a snapshot, or a Bench (a paused one's files too). Such a thing is never promoted, exported or
// shared; what lasts is a recipe, derived by a proposal. nil when name names neither. Only the
// caller's own are named (an operator's: anyone's), so nothing tells one user of another's.
func (s *Service) taskState(c *Call, st *store.Store, name, never string) error {
	if name == "" {
		return nil
	}
	const how = "what lasts is a recipe: `shed bench propose BENCH` derives one from a Bench (of a snapshot: `shed bench create --snapshot ID` first), and an operator promotes it"
	if snap, err := s.ownSnapshot(c, st, name); err == nil {
		return fail(CodeUsage, fmt.Errorf("%s is snapshot %s: %w", name, snap.ID, bench.ErrPromoteSnapshot), how)
	}
	if rec, err := ownBench(c, st, name); err == nil {
		what := "a Bench"
		if rec.Paused != nil {
			what = "a paused Bench"
		}
		return fail(CodeUsage, fmt.Errorf("%s is %s: its files are task state, never %s", name, what, never), how)
	}
	return nil
}

// noProposal is the refusal of a proposal id that names a snapshot (err: the store's not-found),
// else err.
func (s *Service) noProposal(c *Call, st *store.Store, id string, err error) error {
	if !errors.Is(err, proposal.ErrNoProposal) {
		return err
	}
	if _, serr := s.ownSnapshot(c, st, id); serr == nil {
		return s.taskState(c, st, id, "promoted")
	}
	return err
}

// SnapshotRefusal is the task-state refusal when name is a snapshot of caller's and not what the
// operation takes (the policy's, for an operation it refuses first: a user's bench.propose of a
// snapshot is otherwise "no bench of yours"); nil when it is none.
func (s *Service) SnapshotRefusal(caller *Caller, name, never string) error {
	st, err := s.openStore()
	if err != nil {
		return nil
	}
	defer st.Close()
	c := &Call{Caller: caller}
	if _, err := s.ownSnapshot(c, st, name); err != nil {
		return nil
	}
	return s.taskState(c, st, name, never)
}
