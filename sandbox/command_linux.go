package sandbox

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// The command (and each Exec'd one) runs as root of a user namespace of its own, whose ids 0..65535
// are the sandbox's range of host ids. Its root has every capability over what that namespace owns
// (its files: chown, setuid bits, users and groups for dpkg) and none over the host: the mount, pid,
// network, uts and ipc namespaces, the cgroups and the devices belong to the host's user namespace.
// So it can neither mount nor unmount nor remount anything of the sandbox's tree (init's mount
// namespace); a mount namespace it makes itself (unshare -m) is a copy in which the kernel locks
// every mount (MNT_LOCKED and the MNT_LOCK_* flags): it cannot unmount one to see what it covers,
// or make a read-only one writable. (A mount namespace of the command's own, made at its fork, would
// give it the same, and cost a copy and a teardown of the tree per command.)

// commandAttr is how init forks a command: into its user namespace, as uid and gid there.
func commandAttr(cfg *initConfig, uid, gid uint32) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{
		Cloneflags:  unix.CLONE_NEWUSER,
		UidMappings: sysMaps(cfg.UIDMap),
		GidMappings: sysMaps(cfg.GIDMap),
		// adduser, su, apt's drop to _apt: the sandbox's root sets groups of its own ids.
		GidMappingsEnableSetgroups: true,
		Credential:                 &syscall.Credential{Uid: uid, Gid: gid, Groups: []uint32{}},
		// With limits, the command stops right after execve, before its first instruction, so that
		// it can be put into its cgroups first (see enterCgroups).
		Ptrace: len(cfg.CgroupProcs) > 0,
	}
}

// confine sets what init's locked thread hands to every command it forks: no_new_privs, a session
// keyring of its own, and the seccomp filter. Called once, just before the main command is forked;
// init itself needs none of what the filter refuses. With setuid (Root.Setuid), no no_new_privs: sudo
// then works in the sandbox; init installs the filter with its own capability (CAP_SYS_ADMIN in its
// user namespace), and the commands inherit it all the same.
func confine(filter []unix.SockFilter, setuid bool) *SetupError {
	if !setuid {
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			return &SetupError{Op: "prctl", Detail: "no_new_privs", Err: err}
		}
	}
	// Keyrings belong to uids, not namespaces, and a process inherits its parent's session keyring:
	// the caller's (a login's, a service's) would be the sandbox's. A new, empty, anonymous one
	// instead (a named one could be joined by another process that knows the name).
	if _, _, e := unix.Syscall(unix.SYS_KEYCTL, unix.KEYCTL_JOIN_SESSION_KEYRING, 0, 0); e != 0 {
		return &SetupError{Op: "keyctl", Detail: "join a new session keyring", Err: e}
	}
	listener, err := loadSeccomp(filter)
	if err != nil {
		return &SetupError{Op: "seccomp", Err: err}
	}
	// This thread's own clones into a new user namespace (the commands) go through init's answer.
	go notifyNamespaces(listener, unix.Gettid())
	return nil
}
