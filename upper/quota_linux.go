package upper

// Per-user disk bounds on the uppers: btrfs simple quotas (squota, Linux >= 6.7). squota charges an
// extent, for its whole life, to the subvolume that wrote it: no backref walks, so a snapshot or a
// fork costs what it costs without quotas, and a snapshot adds nothing to anyone's usage until its
// source writes over what it shares. Each upper's subvolume (qgroup 0/ID) is put in its user's
// level-1 qgroup 1/UID, whose limit the kernel enforces on every write: EDQUOT inside the Bench. The
// bytes a deleted subvolume wrote stay charged to its qgroup (and so to the user) while a snapshot
// still holds them, which is what a user's snapshots cost.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The quota ioctls, from linux/btrfs.h (ENABLE_SIMPLE_QUOTA is newer than the headers here: 6.7).
const (
	iocQuotaCtl     = 0xc0109428 // _IOWR(0x94, 40, struct btrfs_ioctl_quota_ctl_args)
	iocQgroupAssign = 0x40189429 // _IOW(0x94, 41, struct btrfs_ioctl_qgroup_assign_args)
	iocQgroupCreate = 0x4010942a // _IOW(0x94, 42, struct btrfs_ioctl_qgroup_create_args)
	iocQgroupLimit  = 0x8030942b // _IOR(0x94, 43, struct btrfs_ioctl_qgroup_limit_args)
	iocInoLookup    = 0xd0009412 // _IOWR(0x94, 18, struct btrfs_ioctl_ino_lookup_args)
	iocFsInfo       = 0x8400941f // _IOR(0x94, 31, struct btrfs_ioctl_fs_info_args)

	quotaCtlEnableSimple = 4 // BTRFS_QUOTA_CTL_ENABLE_SIMPLE_QUOTA

	limitMaxRfer = 1 << 0 // BTRFS_QGROUP_LIMIT_MAX_RFER
	limitMaxExcl = 1 << 1 // BTRFS_QGROUP_LIMIT_MAX_EXCL
	clearLimit   = ^uint64(0)

	// groupLevel is the level of the users' qgroups: 1/UID holds the subvolumes 0/ID of a user's uppers.
	groupLevel = 1
)

type quotaCtlArgs struct{ cmd, status uint64 }

type qgroupAssignArgs struct{ assign, src, dst uint64 }

type qgroupCreateArgs struct{ create, qgroupid uint64 }

type qgroupLimitArgs struct {
	qgroupid                                  uint64
	flags, maxRfer, maxExcl, rsvRfer, rsvExcl uint64
}

type inoLookupArgs struct {
	treeid, objectid uint64
	name             [4080]byte
}

// fsInfoArgs is struct btrfs_ioctl_fs_info_args (1024 bytes); only fsid is read.
type fsInfoArgs struct {
	maxID, numDevices uint64
	fsid              [16]byte
	rest              [1024 - 32]byte
}

// ErrNoQuotas is the error of the quota calls on uppers without quotas: copies (plain directories
// have no per-user accounting a kernel enforces), or a store root's own btrfs whose quotas are off
// (shed does not turn on quotas in a filesystem it did not make).
var ErrNoQuotas = errors.New("the uppers have no quotas")

func qgroupID(level uint64, id uint64) uint64 { return level<<48 | id }

// enableQuotas turns on simple quotas on the uppers' btrfs at dir; on ones already on (of either
// kind), nothing. It fails on kernels before 6.7.
func enableQuotas(dir string) error {
	d, err := openDir(dir)
	if err != nil {
		return err
	}
	defer unix.Close(d)
	a := quotaCtlArgs{cmd: quotaCtlEnableSimple}
	if err := ioctl(d, iocQuotaCtl, unsafe.Pointer(&a)); err != nil {
		return fmt.Errorf("enable simple quotas on %s: %w", dir, err)
	}
	return nil
}

// qgroupsDir is /sys/fs/btrfs/<fsid>/qgroups of the btrfs at dir: there only while quotas are on.
func qgroupsDir(dir string) (string, error) {
	d, err := openDir(dir)
	if err != nil {
		return "", err
	}
	defer unix.Close(d)
	var a fsInfoArgs
	if err := ioctl(d, iocFsInfo, unsafe.Pointer(&a)); err != nil {
		return "", fmt.Errorf("btrfs fs info of %s: %w", dir, err)
	}
	u := a.fsid
	fsid := fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
	return filepath.Join("/sys/fs/btrfs", fsid, "qgroups"), nil
}

// Quotas says whether the kernel bounds each group's bytes (SetGroupLimit, Charge): btrfs with
// quotas on.
func (f *FS) Quotas() bool { return f.qgroups != "" }

// subvolID is the id of the subvolume whose root is dir.
func subvolID(dir string) (uint64, error) {
	d, err := openDir(dir)
	if err != nil {
		return 0, err
	}
	defer unix.Close(d)
	a := inoLookupArgs{objectid: subvolIno}
	if err := ioctl(d, iocInoLookup, unsafe.Pointer(&a)); err != nil {
		return 0, fmt.Errorf("subvolume id of %s: %w", dir, err)
	}
	return a.treeid, nil
}

// Charge puts upper name in group's account: what it writes from now on counts in group's usage and
// is bounded by group's limit. Charging an upper already in group does nothing; an upper is in one
// group at most (its user's). A branch is not charged to its source's group: charge it too.
func (f *FS) Charge(name string, group uint32) error {
	if !f.Quotas() {
		return ErrNoQuotas
	}
	dir, err := f.path(name)
	if err != nil {
		return err
	}
	id, err := subvolID(dir)
	if err != nil {
		return fmt.Errorf("charge upper %s to group %d: %w", name, group, err)
	}
	if err := f.createGroup(group); err != nil {
		return err
	}
	d, err := openDir(f.dir)
	if err != nil {
		return err
	}
	defer unix.Close(d)
	a := qgroupAssignArgs{assign: 1, src: qgroupID(0, id), dst: qgroupID(groupLevel, uint64(group))}
	// A positive return asks for a rescan; with simple quotas the kernel moves the usage itself.
	if err := ioctl(d, iocQgroupAssign, unsafe.Pointer(&a)); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("charge upper %s (subvolume %d) to group %d: %w", name, id, group, err)
	}
	return nil
}

// createGroup makes qgroup 1/group unless it is there.
func (f *FS) createGroup(group uint32) error {
	if _, err := os.Stat(filepath.Join(f.qgroups, fmt.Sprintf("%d_%d", groupLevel, group))); err == nil {
		return nil
	}
	d, err := openDir(f.dir)
	if err != nil {
		return err
	}
	defer unix.Close(d)
	a := qgroupCreateArgs{create: 1, qgroupid: qgroupID(groupLevel, uint64(group))}
	if err := ioctl(d, iocQgroupCreate, unsafe.Pointer(&a)); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("create the uppers' quota group %d: %w", group, err)
	}
	return nil
}

// SetGroupLimit bounds the bytes group's uppers may hold together (counted as the kernel does: data
// and metadata extents each upper wrote, snapshots' shares included). bytes <= 0 lifts the bound.
func (f *FS) SetGroupLimit(group uint32, bytes int64) error {
	if !f.Quotas() {
		return ErrNoQuotas
	}
	if err := f.createGroup(group); err != nil {
		return err
	}
	d, err := openDir(f.dir)
	if err != nil {
		return err
	}
	defer unix.Close(d)
	a := qgroupLimitArgs{qgroupid: qgroupID(groupLevel, uint64(group)), flags: limitMaxRfer | limitMaxExcl, maxRfer: clearLimit, maxExcl: clearLimit}
	if bytes > 0 {
		a.maxRfer, a.maxExcl = uint64(bytes), uint64(bytes)
	}
	if err := ioctl(d, iocQgroupLimit, unsafe.Pointer(&a)); err != nil {
		return fmt.Errorf("limit the uppers' quota group %d to %d bytes: %w", group, bytes, err)
	}
	return nil
}

// UpperUsage is the bytes upper name's own writes hold (its subvolume's quota group: a branch's
// extents shared with its source are the source's), as of the filesystem's last commit; ok false
// without quotas (Usage walks the files instead).
func (f *FS) UpperUsage(name string) (n int64, ok bool, err error) {
	if !f.Quotas() {
		return 0, false, nil
	}
	dir, err := f.path(name)
	if err != nil {
		return 0, false, err
	}
	id, err := subvolID(dir)
	if err != nil {
		return 0, false, fmt.Errorf("usage of upper %s: %w", name, err)
	}
	b, err := os.ReadFile(filepath.Join(f.qgroups, fmt.Sprintf("0_%d", id), "referenced"))
	if err != nil {
		return 0, false, fmt.Errorf("usage of upper %s: %w", name, err)
	}
	n, err = strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("usage of upper %s: %w", name, err)
	}
	return n, true, nil
}

// GroupLimit is the bound SetGroupLimit put on group's bytes: 0 for none (or no such group).
func (f *FS) GroupLimit(group uint32) (int64, error) {
	if !f.Quotas() {
		return 0, ErrNoQuotas
	}
	b, err := os.ReadFile(filepath.Join(f.qgroups, fmt.Sprintf("%d_%d", groupLevel, group), "max_referenced"))
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	} else if err != nil {
		return 0, fmt.Errorf("bound of the uppers' quota group %d: %w", group, err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("bound of the uppers' quota group %d: %w", group, err)
	}
	return n, nil
}

// GroupUsage is the bytes group's uppers hold, as of the filesystem's last commit (30 s at most
// behind; Flush commits): 0 for a group never charged.
func (f *FS) GroupUsage(group uint32) (int64, error) {
	if !f.Quotas() {
		return 0, ErrNoQuotas
	}
	b, err := os.ReadFile(filepath.Join(f.qgroups, fmt.Sprintf("%d_%d", groupLevel, group), "referenced"))
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	} else if err != nil {
		return 0, fmt.Errorf("usage of the uppers' quota group %d: %w", group, err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("usage of the uppers' quota group %d: %w", group, err)
	}
	return n, nil
}
