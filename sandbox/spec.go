package sandbox

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path"
	"strconv"
	"strings"
	"syscall"
)

// MaxLowers is the kernel's limit on overlay lower layers (OVL_MAX_STACK).
const MaxLowers = 500

// IDsPerSandbox is the number of uids (and gids) a sandbox has, 0 (its root) to 65535: its user
// namespace maps them to a range of host ids that no other live sandbox has.
const IDsPerSandbox = 65536

// DefaultHostname is the sandbox's hostname when Spec.Hostname is empty.
const DefaultHostname = "shed"

// Spec is everything the executor needs to run one command in a sandbox. It is plain data: builders and
// Benches make one, Validate checks it without touching the system, Start applies it.
type Spec struct {
	Root    Root
	Binds   []Bind
	Network Network
	// Argv[0] is an absolute path inside the sandbox, or a name without a slash looked up in the PATH of Env.
	Argv []string
	// Env is exactly the environment of the command: nothing is inherited from the host.
	Env []string
	// Dir is the working directory inside the sandbox; "" means "/". MakeDir makes it (and its
	// parents, root's, 0755) in the upper if the layers lack it, as a Dockerfile's WORKDIR does.
	Dir     string
	MakeDir bool
	// Files are written into the root's own file system (the upper) before the command starts, as the
	// sandbox's root, replacing what a layer has there: small files of this launch alone, such as the
	// CA bundle that makes a Bench trust its proxy. Missing directories above them are made; no mount
	// is crossed and no magic link followed. Only with Lowers.
	Files []File
	// UID and GID are the credentials the command runs with, ids of the sandbox's own user namespace
	// (0 is its root, which has every capability over the sandbox's files and none over the host's);
	// below IDsPerSandbox. Supplementary groups are always cleared.
	UID, GID uint32
	// Hostname is the sandbox's hostname; "" means DefaultHostname.
	Hostname string
	Limits   Limits
	// Account puts the command in cgroups of its own even where Limits set none, so that its use of
	// cpu and memory can be read while it runs (ReadUsage): a Bench's metrics. Without root the host's
	// cgroups are not shed's, and there is nothing to read (ReadUsage says so).
	Account bool
	// Pausable puts the command in a freezer of its own (cgroup v1 `freezer`, or the unified
	// hierarchy's cgroup.freeze) so that Freeze can stop every process of it at once. Needs root
	// (rootless: ErrNoFreezer). Only these sandboxes pay the freezer's mkdir and rmdir.
	Pausable bool
	// Control, if set, is an absolute host path where Start creates a unix socket (mode 0600) through
	// which Exec runs more commands in the running sandbox. Only init holds it: the command never sees
	// it. Put it in a directory that only the caller can write and that the sandbox cannot see (not
	// under a lower, the upper or a bind source). Wait removes it. At most 107 bytes (sun_path).
	// Or "@NAME": an abstract socket of the caller's network namespace, which no sandbox can reach
	// whatever it is granted (each has a network namespace of its own), and which has no file; for
	// shed without root, where the uid that owns a path is every sandbox's too. Only the creator's
	// uid may connect to either (Exec).
	Control string
}

// File is a file Start writes into the sandbox's root (Spec.Files).
type File struct {
	Path string // absolute, clean, inside the sandbox
	Data []byte
	Mode uint32 // permission bits; 0 is 0644
}

// ExecRequest is a command to run in a running sandbox (Exec). The fields mean what the Spec's fields
// of the same names mean; the command gets the main command's restrictions (user namespace, no_new_privs,
// seccomp filter, cgroups, namespaces).
type ExecRequest struct {
	Argv, Env []string
	Dir       string
	UID, GID  uint32
}

// Root is the sandbox's root filesystem.
type Root struct {
	// Exactly one of Host and Lowers.
	// Host bind-mounts the host's / read-only (recursively) as the root: for tools that run from the
	// host, such as mmdebstrap building a seed into a writable Bind.
	Host bool
	// Hide are directories of the host that a Host root shows empty (an empty read-only tmpfs on
	// each; one that does not exist is skipped): users' homes, the store. Without root the sandbox's
	// root is the user's uid, which owns the user's files: hidden, they are not the sandbox's to read.
	Hide []string
	// Lowers are overlayfs lower directories, bottom first (the seed first, then each layer above it).
	Lowers []string
	// Upper and Work make the overlay writable; Upper receives every change (the build's output).
	// Both "" gives a read-only root (with a single lower: a read-only bind of it, since overlayfs
	// refuses one lower without an upper), unless UpperTmpfs.
	Upper, Work string
	// UpperTmpfs makes the overlay writable with its upper and work directories on a tmpfs of init's
	// own, mounted in the sandbox's mount namespace before the pivot and gone from it after (neither the
	// command nor the host can reach it): the sandbox's writes live in memory and vanish with it, and
	// teardown syncs no disk. It needs Lowers and excludes Upper and Work.
	UpperTmpfs bool
	// UpperHostIDs keeps host ids in an Upper on disk: what the sandbox writes is owned there by its
	// range of host ids, not by the ids it chose, so no file of it is root's (or setuid root) on the
	// host. For an upper that is only read afterwards, as a Bench's kept with --keep; a build's upper
	// (the default, idmapped) holds the owners a store path keeps. Only with Upper.
	UpperHostIDs bool
	// UpperSize caps the tmpfs upper in bytes (a write beyond fails with ENOSPC); 0 is tmpfs's default,
	// half of RAM. Only with UpperTmpfs. The pages count against Limits.MemoryBytes of the writer.
	UpperSize int64
	// Setuid honours the setuid and setgid bits and file capabilities of the root filesystem (the
	// overlay is mounted without nosuid) and leaves no_new_privs unset for the commands: for a Bench
	// whose Workshop declares an account with sudo. What a setuid program gains is the sandbox's
	// root (the file's owner is one of the sandbox's ids), which any command may be anyway (UID 0);
	// the host's ids stay out of reach, and the seccomp filter applies all the same. Only with Lowers,
	// and not with Host (the host's setuid programs stay inert).
	Setuid bool
}

// Bind mounts a host path into the sandbox, always nosuid and nodev.
type Bind struct {
	// Source is a host path, absolute. The executor opens it in the parent without following a symlink
	// as the final component and mounts from that descriptor, so a path swapped after the check cannot
	// redirect it. Exactly one of Source and SourceFD.
	Source string
	// SourceFD is a descriptor of the source that the caller already opened and checked, for example
	// with openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS) inside an allowed directory; O_PATH is enough.
	// Start clones the mount tree from it (open_tree with AT_EMPTY_PATH): nothing is looked up by path
	// again. Start does not close it. It is not part of the JSON form of a Spec.
	SourceFD *os.File `json:"-"`
	// Target is an absolute path inside the sandbox, created if missing (a directory, or an empty file
	// if Source is a file). Put it under /run or /tmp, which are tmpfs: creating it elsewhere writes
	// into Upper.
	Target string
	// Writable makes the bind read-write; the default is read-only (and locked so: no remount inside
	// makes it writable).
	Writable bool
	// IDs says how the owners of the source's files appear inside (an idmapped mount).
	IDs BindIDs
}

// BindIDs is how a bind's files' host owners appear inside the sandbox.
type BindIDs int

const (
	// IDsHost (the default): as the host's ids, which the sandbox does not have: root's files appear
	// owned by nobody (65534), and the sandbox reaches them by their "other" permission bits only.
	// Read-only only (what a sandbox wrote with its range's host ids would be the next sandbox's). For
	// inputs: fetched files, configuration.
	IDsHost BindIDs = iota
	// IDsSandbox: host ids 0..IDsPerSandbox-1 on the source are the sandbox's own 0..IDsPerSandbox-1,
	// so root's files are the sandbox root's, and what it writes lands with the ids it chose. For a
	// build's output in a private directory (a seed): the sandbox can make root-owned setuid files
	// there, so never for a directory anyone else can reach.
	IDsSandbox
	// IDsOwner: the owner (uid and gid) of the source itself is the sandbox's root; other ids appear as
	// nobody. For grants: the sandbox acts as that owner and group in the directory (the caller checks
	// that the group is one of the owner's). A writable bind whose source host root owns, or group
	// root, is refused (the sandbox could make setuid- or setgid-root files on the host).
	IDsOwner
)

// Network: the sandbox always gets a new network namespace with only lo, up. There is no way to share
// the host's network. It reaches the outside only through Listen sockets, which are created inside the
// sandbox's namespace before the command starts and handed to the caller, who serves them from the host
// side.
type Network struct {
	// Listen are TCP addresses on a loopback IP, such as "127.0.0.1:3128". Port 0 picks a free port.
	Listen []string
}

// Limits are resource limits of the command and everything it starts (cgroups). 0 means unlimited.
type Limits struct {
	MemoryBytes int64
	Pids        int64
}

// Stdio is the command's standard input and output. An *os.File is passed to the command as it is;
// any other reader or writer goes through a pipe that the executor copies.
type Stdio struct {
	Stdin          io.Reader // nil = /dev/null
	Stdout, Stderr io.Writer // nil = discard
	// Terminal, if set, gives the command a pseudo-terminal of the sandbox's own /dev/pts as its
	// stdin, stdout, stderr and controlling terminal, so that tty(1) names it and job control works
	// inside. Stdin is copied to the terminal and everything the command prints to Stdout; Stderr is
	// then only for init's own last-resort messages (an *os.File, or unused).
	Terminal *Terminal
	// Signal, for Exec, delivers signals for the command (its process, not its group, as kill(2) with
	// its pid); the executor stops reading it when the command ends.
	Signal <-chan syscall.Signal
}

// Terminal is the window size of a Stdio's pseudo-terminal.
type Terminal struct {
	Size Winsize // 0 rows and columns: unset
	// Resize delivers later sizes (the caller forwards its SIGWINCH); nil if the size never changes.
	// The executor stops reading it when the command ends.
	Resize <-chan Winsize
}

// Winsize is a terminal's size in characters.
type Winsize struct{ Rows, Cols uint16 }

// SpecError is an invalid Spec: Field names the field as in "binds[1].target".
type SpecError struct {
	Field, Problem string
}

func (e *SpecError) Error() string { return e.Field + ": " + e.Problem }

func specErr(field, format string, args ...any) error {
	return &SpecError{Field: field, Problem: fmt.Sprintf(format, args...)}
}

// Validate checks the spec without any system call. It returns the first problem as a *SpecError.
func (s *Spec) Validate() error {
	if err := s.Root.validate(); err != nil {
		return err
	}
	seen := make(map[string]int, len(s.Binds))
	for i, b := range s.Binds {
		f := fmt.Sprintf("binds[%d]", i)
		switch {
		case b.SourceFD != nil && b.Source != "":
			return specErr(f+".sourceFD", "excludes source")
		case b.SourceFD == nil && b.Source == "":
			return specErr(f+".source", "one of source and sourceFD is required")
		case b.SourceFD == nil:
			if err := checkPath(f+".source", b.Source); err != nil {
				return err
			}
		}
		if err := checkPath(f+".target", b.Target); err != nil {
			return err
		}
		if b.Target == "/" {
			return specErr(f+".target", "must not be /")
		}
		// The executor owns these: a bind there would hide or replace the sandbox's /proc and /dev.
		for _, p := range []string{"/proc", "/sys", "/dev"} {
			if within(b.Target, p) {
				return specErr(f+".target", "must not be under %s", p)
			}
		}
		if b.IDs < IDsHost || b.IDs > IDsOwner {
			return specErr(f+".ids", "unknown value %d", b.IDs)
		}
		if b.Writable && b.IDs == IDsHost {
			// Files written there would be owned by the range's host ids, which the next sandbox of
			// that range has.
			return specErr(f+".ids", "a writable bind needs IDsSandbox or IDsOwner: files the sandbox wrote with host ids would be the next sandbox's")
		}
		if j, ok := seen[b.Target]; ok {
			return specErr(f+".target", "duplicate of binds[%d].target", j)
		}
		seen[b.Target] = i
	}
	for i, f := range s.Files {
		field := fmt.Sprintf("files[%d].path", i)
		if err := checkPath(field, f.Path); err != nil {
			return err
		}
		if len(s.Root.Lowers) == 0 || (s.Root.Upper == "" && !s.Root.UpperTmpfs) {
			return specErr(field, "files need a writable root of layers (lowers and an upper)")
		}
		for _, p := range []string{"/proc", "/sys", "/dev"} {
			if within(f.Path, p) || f.Path == "/" {
				return specErr(field, "must not be / or under %s", p)
			}
		}
		if f.Mode&^0o777 != 0 {
			return specErr(fmt.Sprintf("files[%d].mode", i), "permission bits only")
		}
	}
	for i, a := range s.Network.Listen {
		if err := checkListen(a); err != nil {
			return specErr(fmt.Sprintf("network.listen[%d]", i), "%s", err)
		}
	}
	if err := checkCommand(s.Argv, s.Env, s.Dir); err != nil {
		return err
	}
	if s.Hostname != "" {
		if err := checkHostname(s.Hostname); err != nil {
			return specErr("hostname", "%s", err)
		}
	}
	if err := checkIDs(s.UID, s.GID); err != nil {
		return err
	}
	if s.Limits.MemoryBytes < 0 {
		return specErr("limits.memoryBytes", "must not be negative")
	}
	if s.Limits.Pids < 0 {
		return specErr("limits.pids", "must not be negative")
	}
	if s.Control != "" {
		return s.checkControl()
	}
	return nil
}

// Validate checks the request without any system call, as Spec.Validate checks the same fields.
func (r *ExecRequest) Validate() error {
	if err := checkIDs(r.UID, r.GID); err != nil {
		return err
	}
	return checkCommand(r.Argv, r.Env, r.Dir)
}

// checkIDs checks UID and GID of a Spec or an ExecRequest: the sandbox has ids below IDsPerSandbox.
func checkIDs(uid, gid uint32) error {
	if uid >= IDsPerSandbox {
		return specErr("uid", "%d: the sandbox's ids are 0 to %d", uid, IDsPerSandbox-1)
	}
	if gid >= IDsPerSandbox {
		return specErr("gid", "%d: the sandbox's ids are 0 to %d", gid, IDsPerSandbox-1)
	}
	return nil
}

// checkCommand checks Argv, Env and Dir of a Spec or an ExecRequest.
func checkCommand(argv, env []string, dir string) error {
	if len(argv) == 0 {
		return specErr("argv", "must not be empty")
	}
	for i, a := range argv {
		if strings.IndexByte(a, 0) >= 0 {
			return specErr(fmt.Sprintf("argv[%d]", i), "must not contain NUL")
		}
	}
	switch a0 := argv[0]; {
	case a0 == "":
		return specErr("argv[0]", "must not be empty")
	case strings.HasPrefix(a0, "/"):
		if err := checkPath("argv[0]", a0); err != nil {
			return err
		}
	case strings.Contains(a0, "/"):
		return specErr("argv[0]", "must be an absolute path or a name without a slash")
	}
	keys := make(map[string]int, len(env))
	for i, e := range env {
		f := fmt.Sprintf("env[%d]", i)
		k, _, ok := strings.Cut(e, "=")
		if !ok || k == "" {
			return specErr(f, "must be KEY=VALUE")
		}
		if strings.IndexByte(e, 0) >= 0 {
			return specErr(f, "must not contain NUL")
		}
		if j, dup := keys[k]; dup {
			return specErr(f, "duplicate of env[%d] (%s)", j, k)
		}
		keys[k] = i
	}
	if dir != "" {
		return checkPath("dir", dir)
	}
	return nil
}

// maxSocketPath is the longest path a unix socket address holds (sun_path, NUL-terminated).
const maxSocketPath = 107

// checkControl refuses a control socket path that the sandbox could see: from there the command could
// unlink it and put its own socket in its place, to receive the stdio of whoever calls Exec.
func (s *Spec) checkControl() error {
	if name, ok := strings.CutPrefix(s.Control, "@"); ok {
		switch {
		case name == "":
			return specErr("control", "an abstract socket needs a name after @")
		case strings.IndexByte(name, 0) >= 0:
			return specErr("control", "must not contain NUL")
		case len(s.Control) > maxSocketPath:
			return specErr("control", "%d bytes, a unix socket address holds at most %d", len(s.Control), maxSocketPath)
		}
		return nil
	}
	if err := checkPath("control", s.Control); err != nil {
		return err
	}
	if len(s.Control) > maxSocketPath {
		return specErr("control", "%d bytes, a unix socket path holds at most %d", len(s.Control), maxSocketPath)
	}
	for i, l := range s.Root.Lowers {
		if within(s.Control, l) {
			return specErr("control", "inside root.lowers[%d]: the sandbox would see it", i)
		}
	}
	for _, d := range []struct{ field, dir string }{{"root.upper", s.Root.Upper}, {"root.work", s.Root.Work}} {
		if d.dir != "" && within(s.Control, d.dir) {
			return specErr("control", "inside %s: the sandbox would see it", d.field)
		}
	}
	for i, b := range s.Binds {
		if b.Source != "" && within(s.Control, b.Source) {
			return specErr("control", "inside binds[%d].source: the sandbox would see it", i)
		}
	}
	return nil
}

func (r *Root) validate() error {
	switch {
	case r.Host && len(r.Lowers) > 0:
		return specErr("root", "host and lowers are exclusive")
	case !r.Host && len(r.Lowers) == 0:
		return specErr("root", "one of host or lowers is required")
	case r.Host && (r.Upper != "" || r.Work != ""):
		return specErr("root", "upper and work go only with lowers")
	case len(r.Hide) > 0 && !r.Host:
		return specErr("root.hide", "goes only with root.host")
	case r.Host && r.UpperTmpfs:
		return specErr("root.upperTmpfs", "goes only with lowers")
	case r.UpperTmpfs && (r.Upper != "" || r.Work != ""):
		return specErr("root.upperTmpfs", "excludes upper and work")
	case r.UpperSize < 0:
		return specErr("root.upperSize", "must not be negative")
	case r.UpperSize > 0 && !r.UpperTmpfs:
		return specErr("root.upperSize", "goes only with root.upperTmpfs")
	case r.Setuid && r.Host:
		return specErr("root.setuid", "goes only with lowers: the host's setuid programs stay inert")
	case r.UpperHostIDs && r.Upper == "":
		return specErr("root.upperHostIDs", "goes only with root.upper")
	case len(r.Lowers) > MaxLowers:
		return specErr("root.lowers", "%d lowers, the kernel allows at most %d", len(r.Lowers), MaxLowers)
	}
	for i, l := range r.Lowers {
		if err := checkPath(fmt.Sprintf("root.lowers[%d]", i), l); err != nil {
			return err
		}
	}
	for i, h := range r.Hide {
		if err := checkPath(fmt.Sprintf("root.hide[%d]", i), h); err != nil {
			return err
		}
		if h == "/" {
			return specErr(fmt.Sprintf("root.hide[%d]", i), "must not be /")
		}
	}
	if (r.Upper == "") != (r.Work == "") {
		if r.Upper == "" {
			return specErr("root.upper", "required with root.work")
		}
		return specErr("root.work", "required with root.upper")
	}
	if r.Upper == "" {
		return nil
	}
	if err := checkPath("root.upper", r.Upper); err != nil {
		return err
	}
	if err := checkPath("root.work", r.Work); err != nil {
		return err
	}
	// overlayfs refuses nested upper and work directories, and a lower that contains the upper would
	// let the build's output show through its own input.
	if within(r.Work, r.Upper) || within(r.Upper, r.Work) {
		return specErr("root.work", "must not overlap root.upper")
	}
	for i, l := range r.Lowers {
		if within(r.Upper, l) || within(l, r.Upper) {
			return specErr("root.upper", "overlaps root.lowers[%d]", i)
		}
		if within(r.Work, l) || within(l, r.Work) {
			return specErr("root.work", "overlaps root.lowers[%d]", i)
		}
	}
	return nil
}

// checkPath requires an absolute, clean path (so no "..", no "//", no trailing slash) without NUL.
func checkPath(field, p string) error {
	switch {
	case p == "":
		return specErr(field, "must not be empty")
	case strings.IndexByte(p, 0) >= 0:
		return specErr(field, "must not contain NUL")
	case !strings.HasPrefix(p, "/"):
		return specErr(field, "must be absolute")
	case path.Clean(p) != p:
		return specErr(field, "must be clean (no .., ., // or trailing /): %q", p)
	}
	return nil
}

// within reports whether clean absolute path p is dir or below it.
func within(p, dir string) bool {
	return p == dir || dir == "/" || strings.HasPrefix(p, dir+"/")
}

func checkListen(a string) error {
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		return fmt.Errorf("must be IP:port: %w", err)
	}
	ip, err := netip.ParseAddr(host)
	if err != nil || ip.Zone() != "" {
		return fmt.Errorf("host %q must be a literal IP", host)
	}
	if !ip.IsLoopback() {
		return fmt.Errorf("host %s must be a loopback IP", host)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("port %q must be a number from 0 to 65535", port)
	}
	return nil
}

// checkHostname accepts what RFC 1123 allows, up to the kernel's 64 bytes.
func checkHostname(h string) error {
	if len(h) > 64 {
		return fmt.Errorf("longer than 64 bytes")
	}
	for _, c := range []byte(h) {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.'
		if !ok {
			return fmt.Errorf("%q: only letters, digits, - and . are allowed", h)
		}
	}
	return nil
}
