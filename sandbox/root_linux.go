package sandbox

import (
	"encoding/hex"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The sandbox's file system, built by init (root of the host, in the sandbox's new mount namespace) for
// a command that runs in a user namespace of its own (see startCommand):
//
//   - Every layer of the root (the lowers, and a build's upper) is an idmapped mount: files that root
//     owns on disk appear owned by the sandbox's root, and what the sandbox writes lands on disk with
//     the ids it chose. Store paths keep Debian's owners, and a build's output needs no mapping back.
//   - The overlay itself is made here, in the host's user namespace, so that it keeps its markers in
//     trusted.overlay.* xattrs as every store path of root's has them, and only the host can set them.
//     Without root (see rootless) init is in shed's user namespace instead: the layers need no idmap
//     (their files are its ids already), and the overlay keeps its marks in user.overlay.* (userxattr),
//     as a store made without root has them; a mark set through it is escaped by the kernel.
//   - Everything is mounted before the command exists, in a mount namespace of the host's user
//     namespace, where the command (root of a user namespace of its own) has no capability: it can
//     change none of these mounts (see command_linux.go).

const noSuidDev = unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV

// mountRoot returns the root file system as a detached mount.
func mountRoot(r *Root, cfg *initConfig) (int, *SetupError) {
	switch {
	case r.Host:
		// The host's own tree, read-only: its files keep their host owners (root's appear as nobody).
		return cloneTree("/", unix.AT_RECURSIVE, unix.MOUNT_ATTR_RDONLY|noSuidDev, -1)
	case len(r.Lowers) == 1 && r.Upper == "" && !r.UpperTmpfs:
		// overlayfs refuses a single lower without an upper: a read-only bind is the same thing.
		return cloneTree(r.Lowers[0], 0, unix.MOUNT_ATTR_RDONLY|noSuidDev, cfg.idmap())
	}
	fs, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, &SetupError{Op: "mount overlay", Detail: "fsopen", Err: err}
	}
	defer unix.Close(fs)
	if err := unix.FsconfigSetString(fs, "source", "overlay"); err != nil {
		return -1, &SetupError{Op: "mount overlay", Detail: fsDetail(fs, "source"), Err: err}
	}
	if cfg.Rootless {
		// Made in a user namespace, the overlay keeps its marks in user.overlay.* xattrs, as the
		// layers of a store made without root have them (the kernel reads trusted.* only for the
		// host's root).
		if err := unix.FsconfigSetFlag(fs, "userxattr"); err != nil {
			return -1, &SetupError{Op: "mount overlay", Detail: fsDetail(fs, "userxattr"), Err: err}
		}
	}
	// One "lowerdir+" per layer, each an idmapped mount given by descriptor: no 4 KiB limit on the
	// options, no path looked up again. Overlay wants the top layer first. A detached mount lives as
	// long as a descriptor of it: they are retired once the overlay has its own clones (at create).
	var held []int
	defer func() { retire(held) }()
	for i := len(r.Lowers) - 1; i >= 0; i-- {
		l, e := cloneTree(r.Lowers[i], 0, unix.MOUNT_ATTR_RDONLY|noSuidDev, cfg.idmap())
		if e != nil {
			e.Op, e.Detail = "mount overlay", strings.TrimSpace(fmt.Sprintf("lowerdir+ root.lowers[%d]: %s", i, e.Detail))
			return -1, e
		}
		held = append(held, l)
		if err := unix.FsconfigSetFd(fs, "lowerdir+", l); err != nil {
			return -1, &SetupError{Op: "mount overlay", Path: r.Lowers[i],
				Detail: fsDetail(fs, fmt.Sprintf("lowerdir+ root.lowers[%d]", i)), Err: err}
		}
	}
	attr := uint64(noSuidDev)
	if r.Setuid {
		// The overlay's own mount decides: a setuid file's owner is one of the sandbox's ids.
		attr = unix.MOUNT_ATTR_NODEV
	}
	switch {
	case r.UpperTmpfs:
		tree, e := tmpfsUpper(fs, r.UpperSize, cfg.idmap())
		if e != nil {
			return -1, e
		}
		held = append(held, tree)
	case r.Upper != "":
		// Cloned by the parent (openUpper), in its mount namespace: this init's may be older.
		parent := commonDir(r.Upper, r.Work)
		rel := strings.TrimPrefix(strings.TrimPrefix(r.Upper, parent), "/")
		if e := setUpper(fs, cfg.UpperTree, parent, rel, strings.TrimPrefix(r.Work, parent)); e != nil {
			return -1, e
		}
		held = append(held, cfg.UpperTree) // the overlay has its own clone once created
	default:
		attr |= unix.MOUNT_ATTR_RDONLY
	}
	if e := createAs(fs, cfg.IDBase); e != nil {
		return -1, e
	}
	m, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, int(attr))
	if err != nil {
		return -1, &SetupError{Op: "mount overlay", Detail: "fsmount", Err: err}
	}
	return m, nil
}

// createAs creates the overlay with its creator's file system ids set to the sandbox's root. overlayfs
// does its own work (the work directory, whiteouts, copying files up) with its creator's credentials,
// and through an idmapped upper those must be ids the mapping has: host root's are not (EOVERFLOW).
func createAs(fs int, base uint32) *SetupError {
	return asSandboxRoot(base, func() *SetupError {
		if err := unix.FsconfigCreate(fs); err != nil {
			return &SetupError{Op: "mount overlay", Detail: fsDetail(fs, "create"), Err: err}
		}
		return nil
	})
}

// asSandboxRoot runs fn on this thread with its file system ids set to the sandbox's root (host id
// base), and its capabilities: what it creates is the sandbox root's, on an idmapped layer too.
// Switching the fsuid from 0 clears the file system capabilities from the effective set: they are
// raised again from the permitted set, and switching back restores them on its own. Any change of
// the fsuid also clears the parent-death signal and resets dumpability: both are set again, the signal
// to the one in force before (SIGKILL, or armThaw's). (Should the parent die in between, init finds
// its sync socket closed when it waits for "go".)
func asSandboxRoot(base uint32, fn func() *SetupError) *SetupError {
	var deathSig int32
	// Syscall, not Prctl: the pointer must stay valid until the kernel writes through it.
	if _, _, e := unix.Syscall(unix.SYS_PRCTL, unix.PR_GET_PDEATHSIG, uintptr(unsafe.Pointer(&deathSig)), 0); e != 0 || deathSig == 0 {
		deathSig = int32(unix.SIGKILL)
	}
	_ = unix.Setfsuid(int(base))
	_ = unix.Setfsgid(int(base))
	// setfsuid says nothing of failure but returns the id in force: ask with an id that is never set.
	if uid, _ := unix.SetfsuidRetUid(-1); uid != int(base) {
		return &SetupError{Op: "setfsuid", Detail: fmt.Sprintf("the file system ids are %d, not the sandbox root's %d", uid, base), Err: unix.EPERM}
	}
	defer func() {
		_ = unix.Setfsuid(0)
		_ = unix.Setfsgid(0)
		_ = unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(deathSig), 0, 0, 0)
		_ = unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	}()
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return &SetupError{Op: "capget", Err: err}
	}
	data[0].Effective, data[1].Effective = data[0].Permitted, data[1].Permitted
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return &SetupError{Op: "capset", Err: err}
	}
	return fn()
}

// openUpper clones, for the overlay's upper and work directories on disk, one mount of the directory that
// holds both (overlayfs wants them on one mount), idmapped with userns unless it is -1: in the parent, so
// that it is the parent's mount namespace that has them (init's, a warm pool's, may be older than the
// mount they are on). Without the idmap, the upper's root is given to the sandbox's root (host id base),
// which the root of the sandbox's tree then is. init opens upper and work beneath it without following a
// symlink (setUpper).
func openUpper(upper, work string, userns int, base uint32) (int, *SetupError) {
	parent := commonDir(upper, work)
	// The clone below is of parent's mount alone: a mount on upper or work would not be in it, and the
	// directory it covers would be used instead.
	for _, d := range []string{upper, work} {
		if e := notMountPoint(d); e != nil {
			return -1, e
		}
	}
	tree, e := cloneTree(parent, 0, noSuidDev, userns)
	if e != nil {
		return -1, e
	}
	rel := strings.TrimPrefix(strings.TrimPrefix(upper, parent), "/")
	if userns < 0 {
		if err := unix.Fchownat(tree, rel, int(base), int(base), unix.AT_SYMLINK_NOFOLLOW); err != nil {
			unix.Close(tree)
			return -1, &SetupError{Op: "mount overlay", Path: upper, Detail: "give the upper to the sandbox's root", Err: err}
		}
	}
	return tree, nil
}

// setUpper opens upper and work beneath the mount tree (whose root is parent) and gives them to the
// overlay context fs.
func setUpper(fs, tree int, parent, upper, work string) *SetupError {
	for _, d := range [][2]string{{"upperdir", upper}, {"workdir", work}} {
		rel := strings.TrimPrefix(d[1], "/")
		p := filepath.Join(parent, rel)
		fd, err := unix.Openat2(tree, rel, &unix.OpenHow{
			Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_XDEV | unix.RESOLVE_NO_MAGICLINKS,
		})
		if err != nil {
			return &SetupError{Op: "mount overlay", Path: p, Detail: "open " + d[0], Err: err}
		}
		err = unix.FsconfigSetFd(fs, d[0], fd)
		unix.Close(fd)
		if err != nil {
			return &SetupError{Op: "mount overlay", Path: p, Detail: fsDetail(fs, d[0]), Err: err}
		}
	}
	return nil
}

// notMountPoint refuses a directory that is a mount point (its mount differs from its parent's).
func notMountPoint(dir string) *SetupError {
	var a, b unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, dir, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_MNT_ID, &a); err != nil {
		return &SetupError{Op: "mount overlay", Path: dir, Detail: "statx", Err: err}
	}
	if err := unix.Statx(unix.AT_FDCWD, filepath.Dir(dir), unix.AT_SYMLINK_NOFOLLOW, unix.STATX_MNT_ID, &b); err != nil {
		return &SetupError{Op: "mount overlay", Path: filepath.Dir(dir), Detail: "statx", Err: err}
	}
	if a.Mnt_id != b.Mnt_id {
		return &SetupError{Op: "mount overlay", Path: dir, Detail: "upper and work must not be mount points", Err: unix.EINVAL}
	}
	return nil
}

// commonDir is the deepest directory that holds both clean absolute paths a and b.
func commonDir(a, b string) string {
	d := filepath.Dir(a)
	for !within(b, d) {
		d = filepath.Dir(d)
	}
	return d
}

// upperStaging is where init mounts the tmpfs of Root.UpperTmpfs, in its own mount namespace and before
// the pivot: the host's /proc, which every Linux host has, is not needed there any more, and the pivot
// detaches it with the rest of the host's tree.
const upperStaging = "/proc"

// tmpfsUpper mounts the tmpfs of Root.UpperTmpfs on upperStaging and gives directories in it, through an
// idmapped clone of it, to the overlay context fs as its upper and work directories. The overlay keeps
// its own private clone, so the tmpfs lives exactly as long as the overlay, until the sandbox's mount
// namespace goes; neither the host nor the command can reach it. It returns the clone, for the caller to
// close once the overlay is created.
func tmpfsUpper(fs int, size int64, userns int) (int, *SetupError) {
	data := "mode=0755"
	if size > 0 {
		data += ",size=" + strconv.FormatInt(size, 10)
	}
	if err := unix.Mount("tmpfs", upperStaging, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, data); err != nil {
		return -1, &SetupError{Op: "mount tmpfs upper", Path: upperStaging, Detail: data, Err: err}
	}
	staged = true
	for _, d := range []string{"upper", "work"} {
		p := upperStaging + "/" + d
		if err := unix.Mkdir(p, 0o755); err != nil {
			return -1, &SetupError{Op: "mount tmpfs upper", Path: p, Detail: "mkdir", Err: err}
		}
	}
	tree, e := cloneTree(upperStaging, 0, noSuidDev, userns)
	if e != nil {
		return -1, e
	}
	if e := setUpper(fs, tree, upperStaging, "upper", "work"); e != nil {
		unix.Close(tree)
		return -1, e
	}
	return tree, nil
}

// staged says that a tmpfs of this init's is mounted on upperStaging (stage's, or tmpfsUpper's on it).
var staged bool

// retire attaches detached mounts that are not needed any more (the overlay has its own clones of its
// layers and upper) beneath upperStaging, in the host's tree that the pivot then detaches, and closes
// them: they go with that tree, in one unmount. The last descriptor of a detached mount closed unmounts
// it on its own, and each such unmount waits for an expedited RCU grace period (IPIs to every CPU):
// three per launch (two layers and the upper) were on its path. One that cannot be attached is closed.
func retire(fds []int) {
	if len(fds) == 0 {
		return
	}
	ok := stage() == nil
	for i, fd := range fds {
		if ok {
			dir := upperStaging + "/.retired-" + strconv.Itoa(i)
			if err := unix.Mkdir(dir, 0o700); err == nil || err == unix.EEXIST {
				_ = unix.MoveMount(fd, "", unix.AT_FDCWD, dir, unix.MOVE_MOUNT_F_EMPTY_PATH)
			}
		}
		unix.Close(fd)
	}
}

// stage mounts a small tmpfs of init's on upperStaging, unless one is there. The host's
// /proc is not needed any more (newProc has made the sandbox's), and the pivot detaches the tmpfs with
// the rest of the host's tree: what is made in it is reached only through clones taken before.
func stage() *SetupError {
	if staged {
		return nil
	}
	if err := unix.Mount("tmpfs", upperStaging, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0700,size=4k"); err != nil {
		return &SetupError{Op: "mount staging tmpfs", Path: upperStaging, Err: err}
	}
	staged = true
	return nil
}

// bootIDFile is where the sandbox's boot id is made, on init's staging tmpfs (stage: not the upper's).
const bootIDFile = upperStaging + "/boot_id"

// BootIDPath is the kernel's boot id, which a sandbox has of its own: every start of a sandbox is a
// boot of it (a Bench launched again over its upper, after a cold pause, reads a new one), as a VM's
// guest sees across its boots; the host's would never change.
const BootIDPath = "/proc/sys/kernel/random/boot_id"

// bootID makes the sandbox's boot id (a random UUID, as the kernel's: version 4, one line, mode
// 0444) and returns a read-only clone of its file, for mountSystem to put over BootIDPath. Made before
// the root, it is on init's own staging tmpfs: a tmpfs upper is mounted over that one, and stays the
// overlay's alone.
func bootID() (int, *SetupError) {
	if e := stage(); e != nil {
		return -1, e
	}
	var b [16]byte
	if _, err := unix.Getrandom(b[:], 0); err != nil {
		return -1, &SetupError{Op: "boot id", Detail: "getrandom", Err: err}
	}
	b[6] = b[6]&0x0f | 0x40 // version 4
	b[8] = b[8]&0x3f | 0x80 // the RFC 4122 variant
	h := hex.EncodeToString(b[:])
	id := h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:] + "\n"
	fd, err := unix.Open(bootIDFile, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o444)
	if err != nil {
		return -1, &SetupError{Op: "boot id", Path: bootIDFile, Err: err}
	}
	_, err = unix.Write(fd, []byte(id))
	unix.Close(fd)
	if err != nil {
		return -1, &SetupError{Op: "boot id", Path: bootIDFile, Err: err}
	}
	return cloneTree(bootIDFile, 0, unix.MOUNT_ATTR_RDONLY|noSuidDev|unix.MOUNT_ATTR_NOEXEC, -1)
}

// fsDetail appends the kernel's own explanation, which fsopen file descriptors keep for reading.
func fsDetail(fs int, what string) string {
	var b [512]byte
	n, err := unix.Read(fs, b[:])
	if err != nil || n <= 0 {
		return what
	}
	return what + " (" + strings.TrimSpace(string(b[:n])) + ")"
}

// cloneTree returns a detached copy of the mount at path (with the mounts below it if flags has
// AT_RECURSIVE) with attr set on all of it, idmapped with the user namespace userns unless it is -1.
// A symlink as the last component of path is not followed.
func cloneTree(path string, flags int, attr uint64, userns int) (int, *SetupError) {
	fd, err := unix.OpenTree(unix.AT_FDCWD, path, uint(unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_SYMLINK_NOFOLLOW|flags))
	if err != nil {
		return -1, &SetupError{Op: "clone mount", Path: path, Detail: "open_tree", Err: err}
	}
	ma := unix.MountAttr{Attr_set: attr, Propagation: unix.MS_PRIVATE}
	if userns >= 0 {
		ma.Attr_set |= unix.MOUNT_ATTR_IDMAP
		ma.Userns_fd = uint64(userns)
	}
	if err := unix.MountSetattr(fd, "", uint(unix.AT_EMPTY_PATH|(flags&unix.AT_RECURSIVE)), &ma); err != nil {
		detail := "mount_setattr"
		if userns >= 0 {
			detail = "mount_setattr (idmap)"
			if err == unix.EINVAL {
				detail = "idmapped mount: " + idmapUnsupported(fd)
			}
		}
		unix.Close(fd)
		return -1, &SetupError{Op: "clone mount", Path: path, Detail: detail, Err: err}
	}
	return fd, nil
}

// idmapUnsupported names the file system under fd, for an idmapped mount it refused.
func idmapUnsupported(fd int) string {
	var sfs unix.Statfs_t
	if unix.Fstatfs(fd, &sfs) != nil {
		return "its file system may not support them"
	}
	names := map[int64]string{unix.NFS_SUPER_MAGIC: "nfs", unix.OVERLAYFS_SUPER_MAGIC: "overlay",
		unix.FUSE_SUPER_MAGIC: "fuse", 0xff534d42: "cifs", 0xfe534d42: "smb2", 0x2fc12fc1: "zfs", unix.V9FS_MAGIC: "9p"}
	name, ok := names[int64(sfs.Type)]
	if !ok {
		name = fmt.Sprintf("type %#x", sfs.Type)
	}
	return fmt.Sprintf("the file system (%s) does not support them; ext4, xfs, btrfs and tmpfs do (put the store and grants there)", name)
}

// A fresh /proc, a small /dev, and tmpfs on /tmp and /run (scratch that must not land in the upper).
// /sys is not mounted: builds do not need it, and a read-only sysfs would still show host hardware.
// The tmpfs are the sandbox root's (uid= and gid= are host ids: its range's first). /proc belongs to
// the host's user namespace: the sandbox cannot write a host-wide sysctl, which root owns.
func mountSystem(base uint32, proc, boot int, devs []int) *SetupError {
	owner := fmt.Sprintf(",uid=%d,gid=%d", base, base)
	for _, m := range []struct {
		target, fstype, data string
		flags                uintptr
	}{
		{"/proc", "proc", "", 0}, // mounted before the pivot (newProc)
		{"/dev", "tmpfs", "mode=0755,size=64k" + owner, unix.MS_NOSUID | unix.MS_NOEXEC},
		{"/tmp", "tmpfs", "mode=1777" + owner, unix.MS_NOSUID | unix.MS_NODEV},
		{"/run", "tmpfs", "mode=0755" + owner, unix.MS_NOSUID | unix.MS_NODEV},
	} {
		op := "mount " + m.fstype
		// Creating a missing mount point would write it into the upper, which is the build's output.
		var st unix.Stat_t
		if err := unix.Lstat(m.target, &st); err != nil {
			return &SetupError{Op: op, Path: m.target, Detail: "missing from the root (not created: it would land in the upper)", Err: err}
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return &SetupError{Op: op, Path: m.target, Detail: "not a directory in the root", Err: unix.ENOTDIR}
		}
		if m.fstype == "proc" {
			if err := unix.MoveMount(proc, "", unix.AT_FDCWD, m.target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
				return &SetupError{Op: op, Path: m.target, Err: err}
			}
			if err := unix.MoveMount(boot, "", unix.AT_FDCWD, BootIDPath, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
				return &SetupError{Op: "boot id", Path: BootIDPath, Err: err}
			}
			if devs != nil {
				for i, p := range procMasked {
					if err := unix.MoveMount(devs[len(devices)+i], "", unix.AT_FDCWD, p, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
						return &SetupError{Op: "mask", Path: p, Err: err}
					}
				}
			}
			continue
		}
		if err := unix.Mount(m.fstype, m.target, m.fstype, m.flags, m.data); err != nil {
			return &SetupError{Op: op, Path: m.target, Err: err}
		}
		if m.target == "/dev" {
			if e := populateDev(base, devs); e != nil {
				return e
			}
		}
	}
	return nil
}

// devices are the standard device nodes a sandbox has.
var devices = []struct {
	name         string
	major, minor uint32
}{{"null", 1, 3}, {"zero", 1, 5}, {"full", 1, 7}, {"random", 1, 8}, {"urandom", 1, 9}, {"tty", 5, 0}}

// newProc makes a proc file system of init's pid namespace as a detached mount, for mountSystem.
func newProc() (int, *SetupError) {
	fs, err := unix.Fsopen("proc", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, &SetupError{Op: "mount proc", Detail: "fsopen", Err: err}
	}
	defer unix.Close(fs)
	if err := unix.FsconfigCreate(fs); err != nil {
		return -1, &SetupError{Op: "mount proc", Detail: fsDetail(fs, "create"), Err: err}
	}
	m, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC)
	if err != nil {
		return -1, &SetupError{Op: "mount proc", Detail: fsDetail(fs, "fsmount"), Err: err}
	}
	return m, nil
}

// procMasked are files of /proc that a sandbox without root gets /dev/null in place of (as Docker
// masks them): they list the keys that the sandbox's uid, the user's own, may view, which are the
// user's (see keyringSyscalls).
var procMasked = []string{"/proc/keys", "/proc/key-users"}

// cloneDevices clones the host's nodes of devices, in that order, then one /dev/null per procMasked, for a sandbox without root, which
// cannot make device nodes (mknod needs CAP_MKNOD in the host's user namespace).
func cloneDevices() ([]int, *SetupError) {
	var fds []int
	names := make([]string, 0, len(devices)+len(procMasked))
	for _, d := range devices {
		names = append(names, "/dev/"+d.name)
	}
	for range procMasked {
		names = append(names, "/dev/null")
	}
	for _, name := range names {
		fd, e := cloneTree(name, 0, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NOEXEC, -1)
		if e != nil {
			for _, f := range fds {
				unix.Close(f)
			}
			e.Op = "bind device"
			return nil, e
		}
		fds = append(fds, fd)
	}
	return fds, nil
}

// populateDev makes the standard device nodes, owned by the sandbox's root: the only ones it has, since
// it cannot make any (mknod needs CAP_MKNOD in the host's user namespace).
func populateDev(base uint32, binds []int) *SetupError {
	for i, d := range devices {
		p := "/dev/" + d.name
		if binds != nil {
			// Without root: the host's node, bound onto an empty file (owned by the host's root, it
			// appears as nobody's, mode 0666 as on every Linux).
			if err := unix.Mknod(p, unix.S_IFREG|0o666, 0); err != nil {
				return &SetupError{Op: "bind device", Path: p, Detail: "create the mount point", Err: err}
			}
			if err := unix.MoveMount(binds[i], "", unix.AT_FDCWD, p, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
				return &SetupError{Op: "bind device", Path: p, Err: err}
			}
			continue
		}
		if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(d.major, d.minor))); err != nil {
			return &SetupError{Op: "mknod", Path: p, Err: err}
		}
		if err := unix.Lchown(p, int(base), int(base)); err != nil {
			return &SetupError{Op: "chown", Path: p, Err: err}
		}
	}
	for _, l := range [][2]string{
		{"/proc/self/fd", "/dev/fd"}, {"/proc/self/fd/0", "/dev/stdin"}, {"/proc/self/fd/1", "/dev/stdout"},
		{"/proc/self/fd/2", "/dev/stderr"}, {"pts/ptmx", "/dev/ptmx"},
	} {
		if err := unix.Symlink(l[0], l[1]); err != nil {
			return &SetupError{Op: "symlink", Path: l[1], Err: err}
		}
		if err := unix.Lchown(l[1], int(base), int(base)); err != nil {
			return &SetupError{Op: "chown", Path: l[1], Err: err}
		}
	}
	// The terminals' group is tty (5) of the sandbox.
	for _, d := range []struct {
		path, fstype, data string
		mode               uint32
		flags              uintptr
	}{
		{"/dev/pts", "devpts", fmt.Sprintf("newinstance,ptmxmode=0666,mode=0620,gid=%d", base+5), 0o755, unix.MS_NOSUID | unix.MS_NOEXEC},
		{"/dev/shm", "tmpfs", fmt.Sprintf("mode=1777,uid=%d,gid=%d", base, base), 0o1777, unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC},
	} {
		if err := unix.Mkdir(d.path, d.mode); err != nil {
			return &SetupError{Op: "mkdir", Path: d.path, Err: err}
		}
		if err := unix.Mount(d.fstype, d.path, d.fstype, d.flags, d.data); err != nil {
			return &SetupError{Op: "mount " + d.fstype, Path: d.path, Err: err}
		}
	}
	return nil
}
