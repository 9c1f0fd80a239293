package sandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// Process is a running sandbox.
type Process struct {
	Pid int // host pid of the sandbox's init
	// Listeners are the Network.Listen sockets, in that order, bound in the sandbox's network namespace
	// and served by the caller from the host side. Wait closes them.
	Listeners []net.Listener

	cmd      *exec.Cmd
	sync     *os.File
	dec      *json.Decoder
	cg       *cgroup
	control  *controlSocket
	ids      *idRange     // given back once every process of the sandbox is dead
	terminal func() error // waits for the terminal's output to be copied (Stdio.Terminal)
	copied   func() error // waits for the output given with SetStdio to be copied

	once sync.Once
	code int
	err  error
	oom  bool
}

// OOMKilled says, after Wait, whether the kernel's OOM killer killed a process of the command for
// reaching Limits.MemoryBytes: an exit of 137 that was the limit, not a kill -9.
func (p *Process) OOMKilled() bool { return p.oom }

// Start validates the spec and starts the sandbox. When it returns, the Listen sockets exist inside the
// sandbox's network namespace and the command is running. ctx cancellation kills the sandbox (SIGKILL to
// its init; the pid namespace takes everything with it). Setup failures are *SetupError, an invalid spec
// a *SpecError.
func Start(ctx context.Context, spec *Spec, stdio Stdio) (*Process, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	pd, err := Prestart(ctx, stdio)
	if err != nil {
		return nil, err
	}
	return pd.Start(spec)
}

// Pending is a sandbox's init started before its spec is known (Prestart). It waits in its new
// namespaces, with the caller's stdio, for Start.
type Pending struct {
	Pid int // host pid of the waiting init

	ctx     context.Context
	cmd     *exec.Cmd
	sync    *os.File
	console [2]*os.File // the parent's and init's ends of the console socket (Stdio.Terminal)
	stdio   Stdio
	ids     *idRange
	used    bool
	bare    bool // started with no stdio: SetStdio may give the command the caller's
	late    bool // SetStdio gave it: it goes to init with the spec
}

// Prestart starts a sandbox's init ahead of its spec: a new init is a Go program that takes a few
// milliseconds to start, which the caller can spend meanwhile (realizing the layers, say) instead of
// waiting for it after. Start gives it the spec; Close ends it if the caller never does. ctx is the
// sandbox's, as for Start.
func Prestart(ctx context.Context, stdio Stdio) (*Pending, error) {
	exe, err := sealedSelf()
	if err != nil {
		return nil, fmt.Errorf("start sandbox: %w", err)
	}
	ids, err := acquireIDs()
	if err != nil {
		return nil, fmt.Errorf("start sandbox: %w", err)
	}
	pd := &Pending{ctx: ctx, stdio: stdio, ids: ids,
		bare: stdio.Stdin == nil && stdio.Stdout == nil && stdio.Stderr == nil && stdio.Terminal == nil}
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		ids.release()
		return nil, fmt.Errorf("start sandbox: socketpair: %w", err)
	}
	parentEnd, childEnd := os.NewFile(uintptr(pair[0]), "sandbox-sync"), os.NewFile(uintptr(pair[1]), "sandbox-sync")
	defer childEnd.Close() // init has its copy once started
	if stdio.Terminal != nil {
		pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			parentEnd.Close()
			ids.release()
			return nil, fmt.Errorf("start sandbox: socketpair: %w", err)
		}
		pd.console = [2]*os.File{os.NewFile(uintptr(pair[0]), "sandbox-console"), os.NewFile(uintptr(pair[1]), "sandbox-console")}
	}

	// The child's fd 3 is the sealed copy (ExtraFiles[0]), so this path is resolved in the child,
	// between dup2 and execve.
	cmd := exec.CommandContext(ctx, fmt.Sprintf("/proc/self/fd/%d", fdExe))
	cmd.Args = []string{initArg0}
	// A fixed GOMAXPROCS skips the runtime's cgroup probing at start; 2 lets init's signal setup run
	// beside its mounts.
	cmd.Env = []string{initEnv + "=1", "GOMAXPROCS=2", "GODEBUG=containermaxprocs=0,updatemaxprocs=0"}
	own := stdio
	if rootless() {
		own = stdio.withoutFiles()
	}
	var stdinPipe *os.File // the command's end, closed here once init has it
	cmd.Stdout, cmd.Stderr = own.Stdout, own.Stderr
	switch r := own.Stdin.(type) {
	case nil, *os.File:
		cmd.Stdin = r
	default:
		if stdio.Terminal != nil {
			break // copied to the terminal instead (attachTerminal)
		}
		// Copied through a pipe that Wait does not wait for: the caller's reader (a terminal) may
		// block for ever after the command is gone. The copy ends with EPIPE once it is.
		pr, pw, err := os.Pipe()
		if err != nil {
			parentEnd.Close()
			pd.closeConsole()
			ids.release()
			return nil, fmt.Errorf("start sandbox: %w", err)
		}
		cmd.Stdin, stdinPipe = pr, pr
		go func() {
			_, _ = io.Copy(pw, r)
			pw.Close()
		}()
	}
	if stdio.Terminal != nil {
		// The command's stdio is the terminal; init's own is only for its last-resort messages.
		cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, nil, nil
		switch own.Stderr.(type) {
		case *os.File, writerOnly:
			cmd.Stderr = own.Stderr
		}
	}
	// Everything else init gets (bind trees, cgroup files, the control socket, the console socket)
	// comes with its config, over the sync socket (SCM_RIGHTS).
	cmd.ExtraFiles = []*os.File{exe, childEnd} // fdExe, fdSync
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC | unix.CLONE_NEWNET,
		// The sandbox dies with the thread that started it (Go threads live as long as the process,
		// unless a goroutine exits while locked to one).
		Pdeathsig: unix.SIGKILL,
		// A session of its own, without a controlling terminal: terminal signals (^C) go to the caller,
		// which decides (init forwards what it is sent); a terminal passed as stdio is not the
		// sandbox's controlling terminal, so without CAP_SYS_ADMIN the command cannot push input into
		// it with TIOCSTI (to be run by the caller's shell once the sandbox ends), and reading it does
		// not stop the command with SIGTTIN.
		Setsid: true,
	}
	err = cmd.Start()
	if stdinPipe != nil {
		stdinPipe.Close()
	}
	if err != nil {
		parentEnd.Close()
		pd.closeConsole()
		ids.release()
		return nil, fmt.Errorf("start sandbox: %w", err)
	}
	pd.cmd, pd.sync, pd.Pid = cmd, parentEnd, cmd.Process.Pid
	if err := ids.record(pd.Pid); err != nil {
		pd.abort()
		return nil, fmt.Errorf("start sandbox: %w", err)
	}
	return pd, nil
}

// withoutFiles is s with every *os.File behind a reader or writer that is not one, so that the
// executor copies through pipes of its own. Without root the sandbox's root is the user's uid, which
// owns the inodes of the caller's stdio: given one of them (a file stdout is redirected to, the user's
// terminal), the command could chmod it (setuid, world-writable) or chown it. A pipe of the executor's
// is nothing the user has. (With Stdio.Terminal the command gets a terminal of its own already.)
func (s Stdio) withoutFiles() Stdio {
	if f, ok := s.Stdin.(*os.File); ok {
		s.Stdin = readerOnly{f}
	}
	if f, ok := s.Stdout.(*os.File); ok {
		s.Stdout = writerOnly{f}
	}
	if f, ok := s.Stderr.(*os.File); ok {
		s.Stderr = writerOnly{f} // equal to Stdout's if the same file: one pipe for both
	}
	return s
}

type readerOnly struct{ f *os.File }

func (r readerOnly) Read(b []byte) (int, error) { return r.f.Read(b) }

type writerOnly struct{ f *os.File }

func (w writerOnly) Write(b []byte) (int, error) { return w.f.Write(b) }

func (pd *Pending) closeConsole() {
	for _, f := range pd.console {
		if f != nil {
			f.Close()
		}
	}
}

// SetStdio gives the command stdio, for an init started with none (a warm pool's): they go to init
// with the spec, so that a pool serves callers with stdio of their own. A terminal cannot be given
// this way (its console socket is made by Prestart).
func (pd *Pending) SetStdio(stdio Stdio) error {
	if pd.used || !pd.bare || pd.late || stdio.Terminal != nil {
		return errors.New("start sandbox: stdio can be given only once, without a terminal, to an init started with none")
	}
	pd.stdio, pd.late = stdio, true
	return nil
}

// Close ends a pending init that was not given a spec; after Start it does nothing.
func (pd *Pending) Close() {
	if pd == nil || pd.used {
		return
	}
	pd.used = true
	pd.abort()
}

func (pd *Pending) abort() {
	_ = pd.cmd.Process.Kill()
	_ = pd.cmd.Wait()
	pd.sync.Close()
	pd.closeConsole()
	pd.ids.release()
}

// Start validates the spec and gives it to the pending init, as Start does for a new one. A Pending
// starts one sandbox: on any error, its init is ended too.
func (pd *Pending) Start(spec *Spec) (*Process, error) {
	if pd.used {
		return nil, errors.New("start sandbox: this init was already used")
	}
	pd.used = true
	if err := spec.Validate(); err != nil {
		pd.abort()
		return nil, err
	}
	// Descriptors handed to init; the parent's copies are closed once init has them.
	var handed []*os.File
	defer func() {
		for _, f := range handed {
			f.Close()
		}
	}()
	// The sandbox's ids as a user namespace, for idmapped mounts (the layers, and binds that ask).
	// Without root there is none: the sandbox's ids are this namespace's own.
	var userns *os.File
	if !rootless() {
		var err error
		if userns, err = keptUserns(pd.ids.mapping(), pd.ids.mapping()); err != nil {
			pd.abort()
			return nil, &SetupError{Op: "user namespace", Err: err}
		}
		handed = append(handed, userns)
	} else if spec.Limits != (Limits{}) {
		pd.abort()
		return nil, &SetupError{Op: "enforce limits", Detail: "the host's cgroups are root's, and shed runs without root", Err: ErrNoLimits}
	}
	binds, trees, err := openBinds(spec.Binds, pd.ids, userns)
	handed = append(handed, trees...)
	if err != nil {
		pd.abort()
		return nil, err
	}
	var upperTree *os.File
	if spec.Root.Upper != "" {
		ns := -1
		if userns != nil && !spec.Root.UpperHostIDs {
			ns = int(userns.Fd())
		}
		tree, e := openUpper(spec.Root.Upper, spec.Root.Work, ns, pd.ids.base)
		if e != nil {
			pd.abort()
			return nil, e
		}
		upperTree = os.NewFile(uintptr(tree), "upper "+spec.Root.Upper)
		handed = append(handed, upperTree)
	}
	cg, err := newCgroup(spec.Limits, spec.Account && !rootless(), spec.Pausable && !rootless())
	if err != nil {
		pd.abort()
		return nil, err
	}
	var ctl *controlSocket
	if spec.Control != "" {
		if ctl, err = listenControl(spec.Control); err != nil {
			cg.remove()
			pd.abort()
			return nil, err
		}
		// init serves it from the start of the command on; the parent's copy is closed below, so
		// that the socket stops accepting when init dies.
		handed = append(handed, ctl.f)
	}

	// The config names descriptors by their index among those sent with it; -1 is none.
	cfg := &initConfig{Spec: *spec, Binds: binds, Control: -1, Console: -1, Userns: -1, Freezer: -1, UpperTree: -1,
		IDBase: pd.ids.base, UIDMap: pd.ids.uid, GIDMap: pd.ids.gid, Rootless: rootless()}
	var files []*os.File
	if userns != nil {
		cfg.Userns = len(files)
		files = append(files, userns)
	}
	for i := range cfg.Binds {
		cfg.Binds[i].FD = len(files)
		files = append(files, trees[i])
	}
	if upperTree != nil {
		cfg.UpperTree = len(files)
		files = append(files, upperTree)
	}
	if cg != nil {
		for _, f := range cg.procs {
			cfg.CgroupProcs = append(cfg.CgroupProcs, len(files))
			files = append(files, f)
		}
		if cg.freeze != nil {
			cfg.Freezer = len(files)
			_, cfg.Thaw = freezerFile(cg.v2, false)
			files = append(files, cg.freeze)
		}
	}
	if ctl != nil {
		cfg.Control, cfg.ControlUID = len(files), uint32(os.Geteuid())
		files = append(files, ctl.f)
	}
	console := pd.console[0]
	if console != nil {
		size := pd.stdio.Terminal.Size
		cfg.Console, cfg.Terminal = len(files), &size
		files = append(files, pd.console[1])
		handed = append(handed, pd.console[1])
	}
	// Stdio given after the start goes as Exec's does: the caller's files, or pipes copied here.
	var late *execStdio
	if pd.late {
		if late, err = newExecStdio(pd.stdio); err != nil {
			cg.remove()
			ctl.remove()
			pd.abort()
			return nil, &SetupError{Op: "stdio", Err: err}
		}
		for _, f := range late.send {
			cfg.Stdio = append(cfg.Stdio, len(files))
			files = append(files, f)
		}
	}
	p := &Process{Pid: pd.cmd.Process.Pid, cmd: pd.cmd, sync: pd.sync, cg: cg, control: ctl, ids: pd.ids}
	// A failed send means init is gone: the handshake's read tells how it ended.
	_ = sendFiles(pd.sync, files)
	if cg != nil {
		cg.closeFiles()
	}
	for _, f := range handed {
		f.Close()
	}
	handed = nil
	if late != nil {
		late.sent()
	}
	err = p.handshake(pd.ctx, cfg)
	if err == nil && console != nil {
		// init sent the terminal's master side before it said "started".
		_, master, rerr := recvFD(console)
		if master == nil {
			err = &SetupError{Op: "open terminal", Detail: "receive the master side from init", Err: errors.Join(rerr, unix.EPROTO)}
		} else {
			p.terminal = attachTerminal(master, pd.stdio)
		}
	}
	if console != nil {
		console.Close()
	}
	if late != nil {
		if err != nil {
			late.closeAll()
		} else {
			p.copied = late.wait
		}
	}
	if err != nil {
		p.abort()
		return nil, err
	}
	return p, nil
}

// filesByte starts a frame that carries descriptors (SCM_RIGHTS) on the sync socket, ahead of the
// config; a JSON message never starts with it.
const filesByte = 'F'

// maxFilesPerFrame stays below the kernel's limit of descriptors per message (SCM_MAX_FD, 253).
const maxFilesPerFrame = 200

// sendFiles sends files over sock, in frames of at most maxFilesPerFrame.
func sendFiles(sock *os.File, files []*os.File) error {
	fds := make([]int, len(files))
	for i, f := range files {
		fds[i] = int(f.Fd())
	}
	err := sendFDs(int(sock.Fd()), fds)
	runtime.KeepAlive(files)
	runtime.KeepAlive(sock)
	return err
}

// sendFDs sends descriptors over the socket sock, in frames of at most maxFilesPerFrame, for
// recvFiles at the other end.
func sendFDs(sock int, fds []int) error {
	for len(fds) > 0 {
		n := min(len(fds), maxFilesPerFrame)
		if err := unix.Sendmsg(sock, []byte{filesByte}, unix.UnixRights(fds[:n]...), nil, unix.MSG_NOSIGNAL); err != nil {
			return err
		}
		fds = fds[n:]
	}
	return nil
}

// handshake sends the config and waits for init to report that the command started, or why not;
// before that, init sends the Listen sockets it made.
func (p *Process) handshake(ctx context.Context, cfg *initConfig) error {
	// A failed write means init is gone: the read below tells how it ended.
	_, _ = p.sync.Write(encodeConfig(cfg))
	fds, first, err := recvFiles(int(p.sync.Fd()))
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "listener")
		l, lerr := net.FileListener(f)
		f.Close()
		if lerr != nil || i >= len(cfg.Spec.Network.Listen) {
			err = errors.Join(err, &SetupError{Op: "listen", Detail: "a listener from init", Err: errors.Join(lerr, unix.EPROTO)})
			continue
		}
		p.Listeners = append(p.Listeners, l)
	}
	if err == nil {
		// The byte after the descriptors starts init's first message.
		p.dec = json.NewDecoder(io.MultiReader(bytes.NewReader([]byte{first}), p.sync))
		var m message
		err = p.dec.Decode(&m)
		switch {
		case err == nil && m.Error != nil:
			return m.Error.setupError()
		case err == nil && m.Started && len(p.Listeners) != len(cfg.Spec.Network.Listen):
			return &SetupError{Op: "listen", Detail: fmt.Sprintf("init sent %d listeners for %d addresses", len(p.Listeners), len(cfg.Spec.Network.Listen)), Err: unix.EPROTO}
		case err == nil && m.Started:
			return nil
		case err == nil:
			return &SetupError{Op: "init", Detail: "unexpected message from init"}
		}
	}
	// init died without a word: killed (ctx), or it could not even read its config.
	_ = p.cmd.Wait()
	if ctx.Err() != nil {
		return fmt.Errorf("start sandbox: %w", ctx.Err())
	}
	return &SetupError{Op: "init", Detail: fmt.Sprintf("exited before the command started (%v)", p.cmd.ProcessState), Err: err}
}

// abort kills a sandbox whose start failed and releases what it holds.
func (p *Process) abort() {
	if p.cmd.ProcessState == nil {
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Wait()
	}
	p.release()
}

func (p *Process) release() error {
	p.sync.Close()
	for _, l := range p.Listeners {
		l.Close()
	}
	p.control.remove()
	err := p.cg.remove()
	p.ids.release() // every process of the sandbox is dead: its ids are free
	return err
}

// Wait waits until every process of the sandbox is dead (the pid namespace is torn down) and returns the
// command's exit code (128+signal if a signal killed it, also when ctx cancellation killed the sandbox).
// err is non-nil only if the sandbox itself failed, as a *SetupError. Wait closes Listeners and removes
// the sandbox's cgroups and its control socket. It may be called more than once.
func (p *Process) Wait() (exitCode int, err error) {
	p.once.Do(func() {
		werr := p.cmd.Wait()
		if p.copied != nil {
			if err := p.copied(); err != nil && werr == nil {
				werr = err
			}
		}
		if p.terminal != nil {
			if err := p.terminal(); err != nil && werr == nil {
				werr = err
			}
		}
		st := p.cmd.ProcessState
		if st == nil {
			p.code, p.err = -1, &SetupError{Op: "wait", Err: werr}
			p.release()
			return
		}
		ws := st.Sys().(syscall.WaitStatus)
		if ws.Signaled() {
			p.code = 128 + int(ws.Signal())
		} else {
			p.code = ws.ExitStatus()
		}
		// init reports a failure after the start (its reaper's) on the sync socket; otherwise the
		// socket just ends.
		var m message
		if p.dec.Decode(&m) == nil && m.Error != nil {
			p.err = m.Error.setupError()
		}
		var exitErr *exec.ExitError
		if p.err == nil && werr != nil && !errors.As(werr, &exitErr) && !isCtxErr(werr) {
			// Copying the command's output to the caller's writer failed: the output is incomplete.
			p.err = &SetupError{Op: "copy stdio", Err: werr}
		}
		p.oom = p.cg.oomKills() > 0 // read before release removes the cgroup
		if err := p.release(); err != nil && p.err == nil {
			p.err = &SetupError{Op: "remove cgroup", Err: err}
		}
	})
	return p.code, p.err
}

func isCtxErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// Run is Start then Wait.
func Run(ctx context.Context, spec *Spec, stdio Stdio) (int, error) {
	p, err := Start(ctx, spec, stdio)
	if err != nil {
		return -1, err
	}
	return p.Wait()
}

// openBinds opens each bind source here, in the parent, without following a symlink as its last
// component, and clones the mount tree under it (open_tree) with its final attributes: init only
// attaches it. A path swapped after this cannot redirect the bind. The result is in mount order
// (parents first), so a bind inside another bind's target lands on top of it.
func openBinds(binds []Bind, ids *idRange, userns *os.File) ([]initBind, []*os.File, error) {
	order := make([]int, len(binds))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool {
		return strings.Count(binds[order[a]].Target, "/") < strings.Count(binds[order[b]].Target, "/")
	})
	var out []initBind
	var trees []*os.File
	for _, i := range order {
		b := binds[i]
		tree, file, err := openBind(b, ids, userns)
		if err != nil {
			return nil, trees, err
		}
		trees = append(trees, os.NewFile(uintptr(tree), "bind "+b.Source))
		out = append(out, initBind{Target: b.Target, File: file})
	}
	return out, trees, nil
}

func openBind(b Bind, ids *idRange, sandboxNS *os.File) (tree int, file bool, err error) {
	fd, name, err := openSource(b)
	if err != nil {
		return -1, false, &SetupError{Op: "open bind source", Path: name, Err: err}
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return -1, false, &SetupError{Op: "open bind source", Path: name, Err: err}
	}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		return -1, false, &SetupError{Op: "open bind source", Path: name, Detail: "is a symlink", Err: unix.ELOOP}
	}
	tree, err = unix.OpenTree(fd, "", unix.OPEN_TREE_CLONE|unix.AT_RECURSIVE|unix.AT_EMPTY_PATH|unix.O_CLOEXEC)
	if err != nil {
		return -1, false, &SetupError{Op: "bind", Path: name, Detail: "open_tree", Err: err}
	}
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV, Propagation: unix.MS_PRIVATE}
	if !b.Writable {
		attr.Attr_set |= unix.MOUNT_ATTR_RDONLY
	}
	var ns *os.File
	switch {
	case rootless() && b.IDs == IDsOwner && st.Uid != 0:
		// The kernel idmaps no mount of a host file system for a user: only the user's own files
		// (uid 0 here) can appear as the sandbox root's.
		unix.Close(tree)
		return -1, false, &SetupError{Op: "bind", Path: name,
			Detail: "not the user's own: without root only the user's files can be the sandbox root's (an idmapped mount needs root)",
			Err:    unix.EPERM}
	case rootless():
		// The sandbox's ids are this namespace's: IDsSandbox and IDsOwner (of the user's files)
		// need no idmap, and IDsHost shows the ids as they are here.
	case b.IDs == IDsSandbox:
		ns = sandboxNS
	case b.IDs == IDsOwner:
		if b.Writable && (st.Uid == 0 || st.Gid == 0) {
			unix.Close(tree)
			return -1, false, &SetupError{Op: "bind", Path: name,
				Detail: "writable, and owned by host root or group root: the sandbox would act as them in it and could make setuid- or setgid-root files on the host; chown it to the user the sandbox works for and a group of theirs",
				Err:    unix.EPERM}
		}
		base := ids.mapping().Outside
		if ns, err = keptUserns(idMapping{st.Uid, base, 1}, idMapping{st.Gid, base, 1}); err != nil {
			unix.Close(tree)
			return -1, false, &SetupError{Op: "bind", Path: name, Detail: "user namespace for the owner's ids", Err: err}
		}
		defer ns.Close()
	}
	if ns != nil {
		attr.Attr_set |= unix.MOUNT_ATTR_IDMAP
		attr.Userns_fd = uint64(ns.Fd())
	}
	err = unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &attr)
	runtime.KeepAlive(ns)
	if err != nil {
		unix.Close(tree)
		return -1, false, &SetupError{Op: "bind", Path: name, Detail: "mount_setattr", Err: err}
	}
	return tree, st.Mode&unix.S_IFMT != unix.S_IFDIR, nil
}

// openSource returns a descriptor of the bind's source, to close, and a name for errors: Source opened
// without following a final symlink, or a duplicate of SourceFD (the caller keeps the original).
func openSource(b Bind) (int, string, error) {
	if b.SourceFD == nil {
		fd, err := unix.Open(b.Source, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		return fd, b.Source, err
	}
	fd, err := unix.FcntlInt(b.SourceFD.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	runtime.KeepAlive(b.SourceFD)
	return fd, b.SourceFD.Name(), err
}

// controlSocket is the listening socket of Spec.Control and the identity of its file, so that Wait
// removes that file and not one put in its place.
type controlSocket struct {
	path     string
	f        *os.File
	dev, ino uint64
	abstract bool // "@NAME": nothing to remove
}

// listenControl creates the control socket at path, mode 0600 from the first instant: the mode of a
// unix socket's file is that of the socket's own inode (less the umask) when it is bound, so it is set
// with fchmod before bind. bind refuses an existing path: nothing is replaced.
func listenControl(path string) (*controlSocket, error) {
	fail := func(detail string, err error) (*controlSocket, error) {
		return nil, &SetupError{Op: "create control socket", Path: path, Detail: detail, Err: err}
	}
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fail("socket", err)
	}
	f := os.NewFile(uintptr(fd), "control "+path)
	if strings.HasPrefix(path, "@") {
		// Abstract: no file, no mode; bind refuses a name in use.
		if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
			f.Close()
			return fail("bind", err)
		}
		if err := unix.Listen(fd, 64); err != nil {
			f.Close()
			return fail("listen", err)
		}
		return &controlSocket{path: path, f: f, abstract: true}, nil
	}
	if err := unix.Fchmod(fd, 0o600); err != nil {
		f.Close()
		return fail("fchmod", err)
	}
	if err := bindNeutral(fd, path); err != nil {
		f.Close()
		return fail("bind", err)
	}
	c := &controlSocket{path: path, f: f}
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		f.Close()
		return fail("stat", err)
	}
	c.dev, c.ino = st.Dev, st.Ino
	if err := unix.Listen(fd, 64); err != nil {
		c.remove()
		return fail("listen", err)
	}
	return c, nil
}

// bindNeutral binds the unix socket fd at path through a descriptor of path's directory, at the
// address "/proc/self/fd/N/NAME" when that fits in one. The kernel keeps the address as given and
// shows it in /proc/net/unix, which every user reads, and path names the sandbox's state (a Bench's
// directory is its id).
func bindNeutral(fd int, path string) error {
	dir, err := unix.Open(filepath.Dir(path), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(dir) // after the bind: until then N names this directory
	addr := fmt.Sprintf("/proc/self/fd/%d/%s", dir, filepath.Base(path))
	if len(addr) >= len(unix.RawSockaddrUnix{}.Path) {
		addr = path
	}
	return unix.Bind(fd, &unix.SockaddrUnix{Name: addr})
}

// remove closes the socket if still open and deletes its file, if the path still names it.
func (c *controlSocket) remove() {
	if c == nil {
		return
	}
	c.f.Close()
	if c.abstract {
		return
	}
	var st unix.Stat_t
	if unix.Lstat(c.path, &st) == nil && st.Dev == c.dev && st.Ino == c.ino {
		_ = unix.Unlink(c.path)
	}
}
