package sandbox

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// The command (and each Exec'd one) runs as root of a user namespace of its own, whose ids 0..65535
// are the sandbox's range of host ids, with a mount namespace of its own that is a copy of init's (so
// every mount is locked, see root_linux.go). Its root has every capability over what the namespace
// owns (its files: chown, setuid bits, users and groups for dpkg) and none over the host: the mount,
// pid, network, uts and ipc namespaces, the cgroups and the devices are the host user namespace's.

// commandAttr is how init forks a command: into its user and mount namespaces, as uid and gid there.
func commandAttr(cfg *initConfig, uid, gid uint32) *syscall.SysProcAttr {
	ids := []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(cfg.IDBase), Size: IDsPerSandbox}}
	return &syscall.SysProcAttr{
		Cloneflags:  unix.CLONE_NEWUSER | unix.CLONE_NEWNS,
		UidMappings: ids,
		GidMappings: ids,
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
// init itself needs none of what the filter refuses.
func confine() *SetupError {
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return &SetupError{Op: "prctl", Detail: "no_new_privs", Err: err}
	}
	// Keyrings belong to uids, not namespaces, and a process inherits its parent's session keyring:
	// the caller's (a login's, a service's) would be the sandbox's. A new, empty, anonymous one
	// instead (a named one could be joined by another process that knows the name).
	if _, _, e := unix.Syscall(unix.SYS_KEYCTL, unix.KEYCTL_JOIN_SESSION_KEYRING, 0, 0); e != 0 {
		return &SetupError{Op: "keyctl", Detail: "join a new session keyring", Err: e}
	}
	if err := loadSeccomp(); err != nil {
		return &SetupError{Op: "seccomp", Err: err}
	}
	return nil
}
