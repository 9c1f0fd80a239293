package sandbox

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
	"path"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Init mode is recognized by both argv[0] and an environment variable, so that neither a renamed binary
// nor an inherited variable alone turns a process into a sandbox init.
const (
	initArg0 = "shed-sandbox-init"
	initEnv  = "_SHED_SANDBOX_INIT"
)

var initComm = []byte("shed-sandbox\x00")

// Descriptors of init, as Prestart arranges them with ExtraFiles. The others (bind trees, cgroup
// files, the control and console sockets) come over the sync socket with the config.
const (
	fdExe  = 3 // the sealed copy of the binary, which init was executed from
	fdSync = 4 // socket to the parent: descriptors and config in; the listeners, then "started" or a SetupError, out
)

// initProto is the version of what shed and its init say on the sync socket (the config frame,
// message): shed-init is a binary of its own, so one from another build can meet this one. Bump it
// on any change of initConfig or message; init refuses a version it does not know.
const initProto = 6

// message is one JSON value from init on the sync socket (the config goes the other way as a frame
// of its own, encodeConfig).
type message struct {
	Started bool       `json:",omitempty"`
	Error   *wireError `json:",omitempty"`
}

// startedMsg is message{Started: true} as the encoder writes it: encoding it would first build an
// encoder for message by reflection, a cost every init would pay afresh.
var startedMsg = []byte("{\"Started\":true}\n")

// initConfig is the spec plus what the parent prepared for it, sent as encodeConfig writes it.
// Descriptors are sent as indices among those that came with the config (-1: none); init replaces
// them by its own numbers (resolve), after which 0 means none.
type initConfig struct {
	Spec  Spec
	Binds []initBind // in mount order: parents before children
	// cgroup.procs files of the sandbox's cgroups: the command's pid goes there before it runs.
	CgroupProcs []int
	// Freezer is the freezer.state (v1) or cgroup.freeze (v2) of a Pausable sandbox's freezer (0:
	// none), write-only, and Thaw what thaws it: init thaws the sandbox should its parent die (armThaw).
	Freezer int
	Thaw    string
	// UpperTree is Root.Upper's and Root.Work's common directory as a detached mount (0: no disk
	// upper), cloned in the parent with its idmap: init attaches nothing by path that the parent's
	// mount namespace has and a warm init's, started before it was mounted, would not.
	UpperTree int
	// Control is the listening socket of Spec.Control (0: none); only connections from ControlUID,
	// the effective uid of the sandbox's creator, are served.
	Control    int
	ControlUID uint32
	// Console is a socket over which init sends the master side of the command's terminal (0: no
	// terminal, the command gets init's stdio); Terminal is its initial size.
	Console  int
	Terminal *Winsize
	// IDBase is the first host id of the sandbox's range: its ids 0..IDsPerSandbox-1 are host ids
	// IDBase..IDBase+IDsPerSandbox-1. Userns is a user namespace with that mapping, for the idmapped
	// mounts of the root's layers.
	IDBase uint32
	Userns int
	// UIDMap and GIDMap are the maps of the command's user namespace.
	UIDMap, GIDMap []idMapping
	// Stdio, when set, is the command's stdin, stdout and stderr, sent with the config to an init
	// started without the caller's (Pending.SetStdio: a warm pool's); else it gets init's own.
	Stdio []int
	// Rootless: init runs in a user namespace of an ordinary user's (see rootless).
	Rootless bool
}

// idmap is the user namespace for idmapped layers, or -1: none (without root).
func (cfg *initConfig) idmap() int {
	if cfg.Userns > 0 {
		return cfg.Userns
	}
	return -1
}

type initBind struct {
	FD     int // a detached mount tree (open_tree), made in the parent
	Target string
	File   bool // the source is not a directory: the target is created as an empty file
}

// isInit reports whether this process is a sandbox's init.
func isInit() bool {
	return len(os.Args) > 0 && os.Args[0] == initArg0 && os.Getenv(initEnv) == "1"
}

// A sandbox's init runs on the process's main thread, the one that was executed: the parent-death
// signal is a thread's own (the runtime's other threads start without one), and only that thread has
// the one Prestart set before execve, which armThaw and asSandboxRoot set again. Locked in an init
// function, the main goroutine stays on the main thread into main (runtime.LockOSThread).
func init() {
	if isInit() {
		runtime.LockOSThread()
	}
}

// Init must be the first statement of main() in every binary that uses this package. When the process
// is a sandbox's init (re-executed by Start), Init runs the sandbox and never returns; otherwise it
// returns at once.
func Init() {
	if !isInit() {
		return
	}
	// Some of init's work is per thread (no_new_privs, the keyring, the seccomp filter, the fsuid,
	// being the command's ptrace tracer): keep all of it, and the fork of the command, on this thread.
	runtime.LockOSThread()
	os.Exit(runInit())
}

func runInit() int {
	// Nothing in the sandbox may read this process's memory or open its executable through /proc/1
	// (runc CVE-2019-5736); the executable is also a sealed copy.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return initFatal("prctl(PR_SET_DUMPABLE): %v", err)
	}
	// Executed as /proc/self/fd/3, init would show as "3" in ps.
	_ = unix.Prctl(unix.PR_SET_NAME, uintptr(unsafe.Pointer(&initComm[0])), 0, 0, 0)
	unix.Umask(0) // modes below are meant exactly
	// Forward termination signals to the command. Notify starts the runtime's signal thread, which
	// takes a few hundred microseconds: do it beside the setup instead of after it. Until the command
	// exists, a signal waits in the channel.
	sigs := make(chan os.Signal, 8)
	sigReady := make(chan struct{})
	go func() {
		signal.Notify(sigs, unix.SIGTERM, unix.SIGINT, unix.SIGHUP)
		// Without root the command's uid is init's own, so it may signal init: these would make
		// the Go runtime print init's stacks to the caller's terminal and exit (sent by kill, the
		// synchronous ones too reach a channel). Caught, not ignored, so that the command does not
		// inherit them ignored.
		signal.Notify(make(chan os.Signal, 1), unix.SIGQUIT, unix.SIGABRT, unix.SIGSEGV, unix.SIGBUS,
			unix.SIGFPE, unix.SIGILL, unix.SIGTRAP, unix.SIGSYS, unix.SIGSTKFLT)
		close(sigReady)
	}()
	pre := prepare()
	// Started ahead of its spec, init waits here for the descriptors and the config.
	files, first, rerr := recvFiles(fdSync)
	if rerr != nil {
		return initFatal("read descriptors: %v", rerr)
	}
	conn := os.NewFile(fdSync, "sandbox-sync")
	enc := json.NewEncoder(conn)
	fail := func(e *SetupError) int {
		if err := enc.Encode(message{Error: toWire(e)}); err != nil {
			return initFatal("%v (and report it: %v)", e, err)
		}
		return 255
	}
	var cfg *initConfig
	var proto int
	var err error
	if first == configByte {
		cfg, proto, err = readConfig(byteReader{conn}, conn)
	} else {
		// A shed of another build, which sent its config as JSON (version 3 and before): its
		// version, for the error.
		var old struct{ Proto int }
		err = json.NewDecoder(io.MultiReader(bytes.NewReader([]byte{first}), conn)).Decode(&old)
		proto = old.Proto
	}
	if err != nil || cfg == nil {
		why := fmt.Sprintf("version %d", proto)
		if err != nil {
			why = err.Error()
		}
		return fail(&SetupError{Op: "start init", Detail: fmt.Sprintf(
			"this init speaks version %d of the sandbox protocol and shed does not (%s): install shed and %s from one build (make install)",
			initProto, why, InitName)})
	}
	if err := cfg.resolve(files); err != nil {
		return initFatal("read config: %v", err)
	}
	if pre.err != nil {
		return fail(pre.err)
	}
	if e := closeInherited(cfg, pre.fds); e != nil {
		return fail(e)
	}
	if e := setup(cfg, pre); e != nil {
		return fail(e)
	}
	// The Listen sockets, made here in the sandbox's network namespace and handed to the parent
	// before the command starts (so that they exist when it does). Made by init, not by the parent
	// entering the namespace: without root the parent could enter it but not come back.
	if len(cfg.Spec.Network.Listen) > 0 {
		fds, e := listenAll(cfg.Spec.Network.Listen)
		if e != nil {
			return fail(e)
		}
		err := sendFDs(fdSync, fds)
		for _, fd := range fds {
			unix.Close(fd)
		}
		if err != nil {
			return initFatal("send listeners: %v", err)
		}
	}
	<-sigReady
	if cfg.Freezer > 0 {
		if e := armThaw(cfg.Freezer, cfg.Thaw); e != nil {
			return fail(e)
		}
	}
	stdio, master := [3]uintptr{0, 1, 2}, -1
	if len(cfg.Stdio) == 3 {
		stdio = [3]uintptr{uintptr(cfg.Stdio[0]), uintptr(cfg.Stdio[1]), uintptr(cfg.Stdio[2])}
	}
	if cfg.Console > 0 {
		m, slave, e := openTerminal(cfg.Terminal, cfg.IDBase+cfg.Spec.UID)
		if e != nil {
			return fail(e)
		}
		master, stdio = m, [3]uintptr{uintptr(slave), uintptr(slave), uintptr(slave)}
	}
	pid, e := startCommand(cfg, pre.filter, stdio)
	if master >= 0 {
		unix.Close(int(stdio[0])) // the command has the slave side; the caller's reads end with it
		if e == nil {
			if err := sendFD(cfg.Console, master); err != nil {
				e = &SetupError{Op: "open terminal", Detail: "send the master side", Err: err}
			}
		}
		unix.Close(master)
		unix.Close(cfg.Console)
	}
	if e != nil {
		return fail(e)
	}
	go func() {
		for s := range sigs {
			_ = unix.Kill(pid, s.(syscall.Signal))
		}
	}()
	if _, err := conn.Write(startedMsg); err != nil {
		return initFatal("report start: %v", err)
	}
	var code int
	if cfg.Control > 0 {
		code, err = serveControl(cfg, pid)
	} else {
		code, err = reap(pid)
	}
	if err != nil {
		return fail(&SetupError{Op: "wait", Detail: "reap the command", Err: err})
	}
	// Returning kills every other process of the sandbox: pid 1 is gone, the pid namespace goes.
	return code
}

// armThaw makes init's parent-death signal sigParentGone, handled by killing every process of the
// sandbox and thawing its freezer (the descriptor freezer, with thawed) before init exits: on cgroup
// v1 a frozen task ignores SIGKILL, so with the SIGKILL of other sandboxes a sandbox frozen when its
// creator died would stay, half dead, for ever (its tasks in D state, init a zombie, until thawed).
// It is armed once the handler is, before the command exists (nothing can be frozen before): until
// then the parent-death signal is Prestart's SIGKILL, so a parent that dies at any moment still
// takes the sandbox with it. kill(-1) first, so that nothing of the sandbox runs again after its
// parent is gone; the thaw then lets the killed tasks die.
func armThaw(freezer int, thawed string) *SetupError {
	if unix.Gettid() != unix.Getpid() {
		// Another thread's signal would leave the main thread's SIGKILL in force (see init).
		return &SetupError{Op: "prctl", Detail: "set the parent-death signal: init is not on its main thread", Err: unix.EINVAL}
	}
	gone := make(chan os.Signal, 1)
	signal.Notify(gone, sigParentGone)
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(sigParentGone), 0, 0, 0); err != nil {
		return &SetupError{Op: "prctl", Detail: "set the parent-death signal", Err: err}
	}
	go func() {
		<-gone
		_ = unix.Kill(-1, unix.SIGKILL)
		_, _ = unix.Write(freezer, []byte(thawed))
		os.Exit(128 + int(unix.SIGKILL))
	}()
	return nil
}

// initFatal is for failures with no parent to tell: the message goes to the command's stderr.
func initFatal(format string, args ...any) int {
	fmt.Fprintf(os.Stderr, "shed-sandbox-init: "+format+"\n", args...)
	return 255
}

// closeInherited closes every descriptor that init did not ask for: anything the caller's process
// leaked without O_CLOEXEC, and the executable copy. Go's own descriptors are always close-on-exec, so
// one that is not was inherited. The ones init keeps are made close-on-exec for the command.
// recvFiles reads the descriptor frames the parent sends ahead of the config (filesByte, each with
// SCM_RIGHTS) and returns the descriptors, close-on-exec, and the first byte after them.
func recvFiles(sock int) (fds []int, next byte, err error) {
	oob := make([]byte, unix.CmsgSpace(maxFilesPerFrame*4))
	for {
		var b [1]byte
		n, oobn, flags, _, err := unix.Recvmsg(sock, b[:], oob, unix.MSG_CMSG_CLOEXEC)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fds, 0, err
		}
		if n == 0 {
			return fds, 0, io.EOF
		}
		if oobn > 0 {
			msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
			if err != nil {
				return fds, 0, err
			}
			for _, m := range msgs {
				if got, err := unix.ParseUnixRights(&m); err == nil {
					fds = append(fds, got...)
				}
			}
		}
		if flags&unix.MSG_CTRUNC != 0 {
			return fds, 0, errors.New("descriptors cut off (MSG_CTRUNC)")
		}
		if b[0] != filesByte {
			return fds, b[0], nil
		}
	}
}

// resolve replaces the descriptor indices of the config by the descriptors received.
func (cfg *initConfig) resolve(fds []int) error {
	fd := func(i int) (int, error) {
		if i < 0 || i >= len(fds) {
			return 0, fmt.Errorf("descriptor %d of %d", i, len(fds))
		}
		return fds[i], nil
	}
	var err error
	for i := range cfg.Binds {
		if cfg.Binds[i].FD, err = fd(cfg.Binds[i].FD); err != nil {
			return err
		}
	}
	for i := range cfg.CgroupProcs {
		if cfg.CgroupProcs[i], err = fd(cfg.CgroupProcs[i]); err != nil {
			return err
		}
	}
	if len(cfg.Stdio) != 0 && len(cfg.Stdio) != 3 {
		return fmt.Errorf("%d stdio descriptors", len(cfg.Stdio))
	}
	for i := range cfg.Stdio {
		if cfg.Stdio[i], err = fd(cfg.Stdio[i]); err != nil {
			return err
		}
	}
	for _, p := range []*int{&cfg.Control, &cfg.Console, &cfg.Userns, &cfg.Freezer, &cfg.UpperTree} {
		if *p < 0 {
			*p = 0
		} else if *p, err = fd(*p); err != nil {
			return err
		}
	}
	return nil
}

func closeInherited(cfg *initConfig, dir *os.File) *SetupError {
	keep := map[int]bool{fdSync: true}
	for _, b := range cfg.Binds {
		keep[b.FD] = true
	}
	for _, fd := range cfg.CgroupProcs {
		keep[fd] = true
	}
	if cfg.Control > 0 {
		keep[cfg.Control] = true
	}
	if cfg.Console > 0 {
		keep[cfg.Console] = true
	}
	if cfg.Userns > 0 {
		keep[cfg.Userns] = true
	}
	if cfg.Freezer > 0 {
		keep[cfg.Freezer] = true
	}
	for _, fd := range cfg.Stdio {
		keep[fd] = true
	}
	ents, err := dir.ReadDir(-1)
	if err != nil {
		return &SetupError{Op: "list descriptors", Path: "/proc/self/fd", Err: unwrapErrno(err)}
	}
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd < 3 {
			continue
		}
		flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
		switch {
		case err != nil: // closed since the listing
		case fd == int(dir.Fd()): // kept for nothing else, closed with the early setup
		case keep[fd]:
			_, _ = unix.FcntlInt(uintptr(fd), unix.F_SETFD, flags|unix.FD_CLOEXEC)
		case flags&unix.FD_CLOEXEC == 0:
			unix.Close(fd)
		}
	}
	return nil
}

// early is the part of init's setup that no spec changes, made as soon as init starts (prepare): a
// warm init (Prestart) has it done while it waits for its spec, so a launch does not wait for it.
// Its failure is reported once the spec has come, as setup's.
type early struct {
	rootless bool // the process's, which the spec's must be
	// /proc and the boot id's file, detached, and the host's device nodes without root (mountSystem).
	proc, boot int
	devs       []int
	filter     []unix.SockFilter // the seccomp filter, assembled (confine loads it)
	// fds is /proc/self/fd, for closeInherited: the staging tmpfs (bootID) is over the host's /proc.
	fds *os.File
	err *SetupError
}

// prepare makes init's early setup. It runs on init's locked main thread, as the rest of setup.
func prepare() *early {
	pre := &early{rootless: rootless(), proc: -1, boot: -1}
	pre.err = pre.make()
	return pre
}

func (pre *early) make() *SetupError {
	// Nothing mounted from now on may propagate back to the host.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return &SetupError{Op: "make mounts private", Path: "/", Err: err}
	}
	fds, err := os.Open("/proc/self/fd")
	if err != nil {
		return &SetupError{Op: "list descriptors", Path: "/proc/self/fd", Err: unwrapErrno(err)}
	}
	pre.fds = fds
	// /proc is made here, while the host's own is in this mount namespace: without root the kernel
	// mounts a new proc only where one is fully visible already (mount_too_revealing), and after the
	// pivot none is. The same for /dev's nodes, which only the host's can be without root.
	var e *SetupError
	if pre.proc, e = newProc(); e != nil {
		return e
	}
	if pre.rootless {
		if pre.devs, e = cloneDevices(); e != nil {
			return e
		}
	}
	if pre.boot, e = bootID(); e != nil {
		return e
	}
	// The sandbox's network namespace is init's from its start, whatever the spec's network.
	if err := loopbackUp(); err != nil {
		return &SetupError{Op: "bring lo up", Err: err}
	}
	filter, err := seccompProgram(pre.rootless)
	if err != nil {
		return &SetupError{Op: "seccomp", Err: err}
	}
	pre.filter = filter
	return nil
}

func (pre *early) close() {
	if pre.fds != nil {
		pre.fds.Close()
		pre.fds = nil
	}
	for _, fd := range append([]int{pre.proc, pre.boot}, pre.devs...) {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
	pre.proc, pre.boot, pre.devs = -1, -1, nil
}

// setup builds the sandbox's file system, hostname and network, all before the command exists.
func setup(cfg *initConfig, pre *early) *SetupError {
	s := &cfg.Spec
	defer pre.close() // attached by the end: closing them unmounts nothing
	if pre.rootless != cfg.Rootless {
		return &SetupError{Op: "start init", Detail: fmt.Sprintf("init found rootless %v and shed says %v: install shed and %s from one build (make install)", pre.rootless, cfg.Rootless, InitName)}
	}
	proc, boot, devs := pre.proc, pre.boot, pre.devs
	root, e := mountRoot(&s.Root, cfg)
	// The layers are idmapped: the user namespace that gave them their ids is not needed any more.
	if cfg.Userns > 0 {
		unix.Close(cfg.Userns)
		cfg.Userns = 0
	}
	if e != nil {
		return e
	}
	// Pivot into the new root first and set up the rest from inside: every path below then resolves
	// within the sandbox, so a symlink planted in a layer (say /run -> /host/etc) cannot make a mount
	// or a mkdir land on the host.
	e = pivot(root)
	unix.Close(root)
	if e != nil {
		return e
	}
	if e := mountSystem(cfg.IDBase, proc, boot, devs); e != nil {
		return e
	}
	for _, h := range s.Root.Hide {
		if e := hide(h); e != nil {
			return e
		}
	}
	for _, b := range cfg.Binds {
		if e := mountBind(b, cfg.IDBase); e != nil {
			return e
		}
	}
	host := s.Hostname
	if host == "" {
		host = DefaultHostname
	}
	if err := unix.Sethostname([]byte(host)); err != nil {
		return &SetupError{Op: "sethostname", Path: host, Err: err}
	}
	dir := s.Dir
	if dir == "" {
		dir = "/"
	}
	for _, f := range s.Files {
		if e := asSandboxRoot(cfg.IDBase, func() *SetupError { return writeFileIn(f) }); e != nil {
			return e
		}
	}
	if s.MakeDir {
		// As the sandbox's root, in its root's own file system only (no mount crossed: a grant's host
		// directory is never written with the capabilities this takes), so what it makes is the
		// sandbox root's, in the upper: task state.
		if e := asSandboxRoot(cfg.IDBase, func() *SetupError { return makeDirIn(dir) }); e != nil {
			return e
		}
	}
	// Never through a magic link (/proc/self/fd/N of a descriptor this process still holds, which
	// an image's symlink could name): a plain symlink resolves within the pivoted root.
	fd, err := unix.Openat2(unix.AT_FDCWD, dir, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_NO_MAGICLINKS})
	if err != nil {
		return &SetupError{Op: "chdir", Path: dir, Err: err}
	}
	defer unix.Close(fd)
	if err := unix.Fchdir(fd); err != nil {
		return &SetupError{Op: "chdir", Path: dir, Err: err}
	}
	return nil
}

// writeFileIn writes f in the root's own file system: its directory is made as a workdir is, and the
// file replaces what is there by a rename, so a symlink planted at its path is replaced, not followed.
func writeFileIn(f File) *SetupError {
	dir, name := path.Split(f.Path)
	if e := makeDirIn(dir); e != nil {
		return e
	}
	d, err := unix.Openat2(unix.AT_FDCWD, dir, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV})
	if err != nil {
		return &SetupError{Op: "write file", Path: f.Path, Detail: "files are written in the sandbox's own files only, not under a mount", Err: err}
	}
	defer unix.Close(d)
	mode := f.Mode
	if mode == 0 {
		mode = 0o644
	}
	tmp := "." + name + ".shed-new"
	fd, err := unix.Openat(d, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
	if errors.Is(err, unix.EEXIST) {
		unix.Unlinkat(d, tmp, 0)
		fd, err = unix.Openat(d, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
	}
	if err != nil {
		return &SetupError{Op: "write file", Path: f.Path, Err: err}
	}
	for b := f.Data; len(b) > 0 && err == nil; {
		var n int
		n, err = unix.Write(fd, b)
		b = b[n:]
	}
	if err == nil {
		err = unix.Fchmod(fd, mode) // not the umask's
	}
	unix.Close(fd)
	if err == nil {
		err = unix.Renameat(d, tmp, d, name)
	}
	if err != nil {
		unix.Unlinkat(d, tmp, 0)
		return &SetupError{Op: "write file", Path: f.Path, Err: err}
	}
	return nil
}

// makeDirIn makes the absolute directory dir and those above it that are missing, 0755, one
// component at a time from the root, crossing no mount and following no magic link.
func makeDirIn(dir string) *SetupError {
	how := &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_NO_MAGICLINKS}
	if fd, err := unix.Openat2(unix.AT_FDCWD, dir, how); err == nil {
		unix.Close(fd) // there already, wherever it is (a grant's directory too): nothing to make
		return nil
	}
	how.Resolve |= unix.RESOLVE_NO_XDEV
	cur, err := unix.Openat2(unix.AT_FDCWD, "/", how)
	if err != nil {
		return &SetupError{Op: "mkdir", Path: "/", Err: err}
	}
	for _, name := range strings.Split(strings.Trim(dir, "/"), "/") {
		if name == "" {
			continue
		}
		next, err := unix.Openat2(cur, name, how)
		if errors.Is(err, unix.ENOENT) {
			if err = unix.Mkdirat(cur, name, 0o755); err == nil || errors.Is(err, unix.EEXIST) {
				next, err = unix.Openat2(cur, name, how)
			}
		}
		unix.Close(cur)
		if err != nil {
			return &SetupError{Op: "mkdir", Path: dir, Detail: "the workdir is made in the Bench's own files only, not under a mount", Err: err}
		}
		cur = next
	}
	unix.Close(cur)
	return nil
}

// pivot makes the detached mount root the root of this mount namespace and drops the host's tree. The
// root is first stacked on the host's /, which always exists, so no host directory is needed as a
// mount point.
func pivot(root int) *SetupError {
	if err := unix.MoveMount(root, "", unix.AT_FDCWD, "/", unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return &SetupError{Op: "pivot_root", Detail: "attach root", Err: err}
	}
	if err := unix.Fchdir(root); err != nil {
		return &SetupError{Op: "pivot_root", Detail: "enter root", Err: err}
	}
	// pivot_root(".", ".") stacks the old root on the new one; detaching "." then removes it
	// (runc's trick: no directory for the old root needed inside the new one).
	if err := unix.PivotRoot(".", "."); err != nil {
		return &SetupError{Op: "pivot_root", Err: err}
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return &SetupError{Op: "pivot_root", Detail: "detach old root", Err: err}
	}
	if err := unix.Chdir("/"); err != nil {
		return &SetupError{Op: "pivot_root", Detail: "chdir /", Err: err}
	}
	return nil
}

// mountBind attaches a bind tree that the parent opened and cloned, creating its target if missing as
// the sandbox's root would (on an idmapped upper, host root could not).
func mountBind(b initBind, base uint32) *SetupError {
	if _, err := os.Lstat(b.Target); errors.Is(err, os.ErrNotExist) {
		if e := asSandboxRoot(base, func() *SetupError {
			if err := os.MkdirAll(filepath.Dir(b.Target), 0o755); err != nil {
				return &SetupError{Op: "bind", Path: b.Target, Detail: "create parent of target", Err: unwrapErrno(err)}
			}
			if b.File {
				err = unix.Mknod(b.Target, unix.S_IFREG|0o644, 0)
			} else {
				err = unix.Mkdir(b.Target, 0o755)
			}
			if err != nil {
				return &SetupError{Op: "bind", Path: b.Target, Detail: "create target", Err: err}
			}
			return nil
		}); e != nil {
			return e
		}
	}
	if err := unix.MoveMount(b.FD, "", unix.AT_FDCWD, b.Target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return &SetupError{Op: "bind", Path: b.Target, Err: err}
	}
	unix.Close(b.FD)
	return nil
}

// loopbackUp sets IFF_UP on lo of the calling thread's network namespace.
func loopbackUp() error {
	s, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(s)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(s, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	return unix.IoctlIfreq(s, unix.SIOCSIFFLAGS, ifr)
}

// startCommand forks and executes the command from this locked thread, whose no_new_privs, session
// keyring and seccomp filter the child inherits (and which must be its ptrace tracer).
func startCommand(cfg *initConfig, filter []unix.SockFilter, stdio [3]uintptr) (int, *SetupError) {
	s := &cfg.Spec
	path, e := lookPath(s.Argv[0], s.Env)
	if e != nil {
		return 0, e
	}
	if e := confine(filter, s.Root.Setuid); e != nil {
		return 0, e
	}
	// Belt and braces after closeInherited: nothing but 0, 1 and 2 reaches the command.
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		return 0, &SetupError{Op: "close_range", Err: err}
	}
	unix.Umask(0o022)
	sys := commandAttr(cfg, s.UID, s.GID)
	// With a terminal, the command leads a session of its own with it as controlling terminal
	// (init's session has none): job control and ^C work inside.
	sys.Setsid, sys.Setctty, sys.Ctty = cfg.Console > 0, cfg.Console > 0, 0
	pid, err := syscall.ForkExec(path, s.Argv, &syscall.ProcAttr{Env: s.Env, Files: stdio[:], Sys: sys})
	if err != nil {
		return 0, &SetupError{Op: "exec", Path: path, Err: err}
	}
	if sys.Ptrace {
		if e := enterCgroups(pid, cfg.CgroupProcs); e != nil {
			unix.Kill(pid, unix.SIGKILL)
			return 0, e
		}
		if cfg.Control == 0 { // else each Exec'd command joins them too
			for _, fd := range cfg.CgroupProcs {
				unix.Close(fd)
			}
		}
	}
	return pid, nil
}

// enterCgroups moves the command, stopped by ptrace after execve, into its cgroups and lets it run.
func enterCgroups(pid int, procs []int) *SetupError {
	ws, err := waitPid(pid)
	if err != nil {
		return &SetupError{Op: "join cgroup", Detail: "wait for the command to stop", Err: err}
	}
	if !ws.Stopped() {
		return &SetupError{Op: "join cgroup", Detail: fmt.Sprintf("command did not stop after exec (status %#x)", ws)}
	}
	for _, fd := range procs {
		if _, err := unix.Write(fd, []byte(strconv.Itoa(pid))); err != nil {
			return &SetupError{Op: "join cgroup", Err: err}
		}
	}
	// Detaching with signal 0 discards the SIGTRAP of the exec.
	if err := unix.PtraceDetach(pid); err != nil {
		return &SetupError{Op: "join cgroup", Detail: "resume the command", Err: err}
	}
	return nil
}

// waitPid waits for a change of the child pid (its exit, or a ptrace stop), past EINTR.
func waitPid(pid int) (unix.WaitStatus, error) {
	var ws unix.WaitStatus
	for {
		_, err := unix.Wait4(pid, &ws, 0, nil)
		if err != unix.EINTR {
			return ws, err
		}
	}
}

// lookPath resolves a name without a slash in the PATH of the command's environment, inside the sandbox.
func lookPath(name string, env []string) (string, *SetupError) {
	if strings.HasPrefix(name, "/") {
		return name, nil
	}
	pathVar, found := "", false
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, "PATH="); ok {
			pathVar, found = v, true
		}
	}
	if !found {
		return "", &SetupError{Op: "exec", Path: name, Detail: "not an absolute path, and env has no PATH", Err: unix.ENOENT}
	}
	for _, dir := range filepath.SplitList(pathVar) {
		if !strings.HasPrefix(dir, "/") {
			continue // a relative PATH entry would depend on Dir: ignored, as a safe default
		}
		p := filepath.Join(dir, name)
		var st unix.Stat_t
		if unix.Stat(p, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFREG && st.Mode&0o111 != 0 {
			return p, nil
		}
	}
	return "", &SetupError{Op: "exec", Path: name, Detail: "not found in PATH " + pathVar, Err: unix.ENOENT}
}

// reap waits as pid 1 must: it collects every zombie the sandbox's orphans leave, and returns once the
// command itself exits, with its status (128+signal if a signal killed it).
func reap(pid int) (int, error) {
	for {
		var ws unix.WaitStatus
		wpid, err := unix.Wait4(-1, &ws, 0, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, err
		}
		if wpid == pid {
			return exitCode(ws), nil
		}
	}
}

// exitCode is the status of an exited process as a shell reports it: 128+signal if a signal killed it.
func exitCode(ws unix.WaitStatus) int {
	if ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ws.ExitStatus()
}

// listenAll creates the Listen sockets (checked by Validate: loopback IP and port) in this process's
// network namespace, whose lo setup has brought up.
func listenAll(addrs []string) ([]int, *SetupError) {
	var fds []int
	fail := func(e *SetupError) ([]int, *SetupError) {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, e
	}
	for _, a := range addrs {
		ap, err := netip.ParseAddrPort(a)
		if err != nil {
			return fail(&SetupError{Op: "listen", Path: a, Err: unix.EINVAL})
		}
		family, sa := unix.AF_INET6, unix.Sockaddr(&unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()})
		if ap.Addr().Is4() {
			family, sa = unix.AF_INET, &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}
		}
		fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fail(&SetupError{Op: "listen", Path: a, Detail: "socket", Err: err})
		}
		fds = append(fds, fd)
		if err := unix.Bind(fd, sa); err != nil {
			return fail(&SetupError{Op: "listen", Path: a, Detail: "bind", Err: err})
		}
		if err := unix.Listen(fd, unix.SOMAXCONN); err != nil {
			return fail(&SetupError{Op: "listen", Path: a, Detail: "listen", Err: err})
		}
	}
	return fds, nil
}

// hide covers a directory of a Host root with an empty read-only tmpfs (Root.Hide). It runs after the
// pivot, so a symlink in the path resolves within the root, and a path that is not there (or not a
// directory) has nothing to hide.
func hide(dir string) *SetupError {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return nil
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0755,size=4k"); err != nil {
		return &SetupError{Op: "hide", Path: dir, Err: err}
	}
	return nil
}
