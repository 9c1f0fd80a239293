package app

import (
	"fmt"
	"os/user"
	"strconv"

	"toolshed.dev/shed/upper"
)

// The per-user disk bound on task state (the supervisor's --user-disk): every upper a user's
// created Bench runs on (created, forked, of a snapshot, reset) is charged to the user's quota group
// on the uppers' btrfs (upper.FS.Charge, their uid), whose limit the kernel enforces on each write:
// a Bench past it gets EDQUOT, the host's disk never fills. A snapshot is charged nothing of its own:
// it writes nothing, and the bytes it shares stay charged to the upper that wrote them, removed or
// not, for as long as the snapshot holds them. Without quotas (copies, a kernel before 6.7) no
// group is kept and the bound is not enforced (the supervisor logs so, once, at the first launch).

// diskGroup is the quota group the uppers of owner's Benches are charged to (nil: the uppers have no
// quotas): the uid of owner, the Bench's owner, who is c's caller unless an operator resumes another
// user's Bench. The caller's own group gets the bound now in force (a user's is UserDisk, an
// operator's none); another owner's keeps the one their own launches set.
func (s *Service) diskGroup(fs *upper.FS, c *Call, owner string) (*uint32, error) {
	if !fs.Quotas() {
		if s.UserDisk > 0 {
			s.noQuotas.Do(func() {
				s.log().Warn("the uppers have no quotas (copies, a kernel before 6.7, or a store root's btrfs with quotas off): --user-disk is not enforced; the uppers' size bounds all users together")
			})
		}
		return nil, nil
	}
	if owner != "" && owner != c.Caller.User {
		uid, err := uidOf(owner)
		if err != nil {
			return nil, fail(CodeFailed, fmt.Errorf("the owner of the Bench, %q: %w", owner, err), "an operator removes the Bench (`shed bench rm`)")
		}
		return &uid, nil
	}
	uid := c.Caller.UID
	limit := s.UserDisk
	if c.Caller.Role == Operator {
		limit = 0
	}
	if err := fs.SetGroupLimit(uid, limit); err != nil {
		return nil, err
	}
	return &uid, nil
}

// DiskUsage is the bytes the uppers of uid's Benches and snapshots hold, and whether the uppers
// count them at all: as of the uppers' last commit (at most 30 s behind), or of now if flush (a
// commit: what a snapshot or fork costs anyway, bench.Branch).
func (s *Service) DiskUsage(uid uint32, flush bool) (int64, bool, error) {
	// The uppers as they are, without the store (this is on bench.create's path): none mounted
	// (none made yet, or not since a restart) hold nothing of anyone's that counts now.
	fs, err := upper.OpenMounted(s.Root)
	if err != nil {
		return 0, false, err
	}
	if fs == nil {
		return 0, true, nil
	}
	if !fs.Quotas() {
		return 0, false, nil
	}
	if flush {
		if err := fs.Flush(); err != nil {
			return 0, false, err
		}
	}
	n, err := fs.GroupUsage(uid)
	if err != nil {
		return 0, false, fmt.Errorf("disk usage of uid %d: %w", uid, err)
	}
	return n, true, nil
}

// uidOf is the uid of user (a name, or a uid in decimal: a Caller's User).
func uidOf(name string) (uint32, error) {
	if n, err := strconv.ParseUint(name, 10, 32); err == nil {
		return uint32(n), nil
	}
	u, err := user.Lookup(name)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseUint(u.Uid, 10, 32)
	return uint32(n), err
}
