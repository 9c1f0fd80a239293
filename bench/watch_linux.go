package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A directory of a running Bench is watched from the supervisor, with inotify, on the Bench's own view
// of its files: the directory is opened under the root of the Bench's init (/proc/PID/root) with
// openat2 RESOLVE_IN_ROOT, so that a symlink in the Bench resolves as it would inside and never leads
// to a host path, and each directory below by its name relative to its parent's descriptor, never
// following a symlink. Every watch of the process shares one inotify instance: the kernel allows root
// few (fs.inotify.max_user_instances, 128 by default), and its watches count against root's budget,
// which the host's own services share; so the number of directories watched is bounded too.

// WatchOptions say how to watch a directory.
type WatchOptions struct {
	Recursive bool // the directories below too, those made later included
	// Entry adds a description of the file to each event, when it still exists.
	Entry bool
	// NetworkMounts allows a directory on a network filesystem (NFS, SMB, FUSE), whose changes made
	// elsewhere inotify does not see.
	NetworkMounts bool
	// MaxDirs bounds the directories this watch may watch (0: MaxWatchDirs).
	MaxDirs int
}

// WatchEvent is one change in a watched directory.
type WatchEvent struct {
	Name  string     // the file's path relative to the watched directory
	Op    string     // "create", "write", "remove", "rename" or "chmod"
	Entry *WatchFile // with WatchOptions.Entry, the file as it is after the change (nil: gone)
}

// WatchFile describes a file of a Bench, as lstat inside would.
type WatchFile struct {
	Path     string // absolute, as the Bench sees it
	Type     string // "file", "dir", "symlink" or "other"
	Size     int64
	Mode     uint32 // permission bits (07777)
	Owner    string // the owner's name in the Bench (its number if it has none)
	Group    string
	Modified time.Time
	Target   string // a symlink's target
}

// Bounds on watches: directories one watch may cover, and all watches of the process together.
const (
	MaxWatchDirs  = 4096
	maxHubWatches = 32768
	// watchBacklog bounds the raw events one watch holds that its reader has not handled yet: as many
	// as the kernel's own queue of an inotify instance holds by default (max_queued_events), past
	// which a watch of its own would have overflowed. It grows only as the reader falls behind (a
	// shell making 6,000 files in a loop outruns a reader that stats each entry: 1,024 ended such a
	// watch as behind long before the E2B watcher's own bound of 4,096 events not taken).
	watchBacklog = 16384
)

// ErrWatchBehind ends a watch whose reader did not keep up: events were lost.
var ErrWatchBehind = errors.New("events came faster than they were read, and some were lost: watch again (a smaller tree, or read faster)")

// DirWatch is a watch of a Bench's directory.
type DirWatch struct {
	dir   string // as the Bench names it
	opts  WatchOptions
	root  int      // the Bench's root (O_PATH)
	init  *os.File // a pidfd of the Bench's init: its end ends the watch, whose descriptors would hold its mounts
	names *idNames

	mu     sync.Mutex
	dirs   map[int32]*watchedDir // by inotify wd
	closed bool
	failed chan error // one error ends it (buffered)

	// The raw events the hub delivered, for Run: the hub never waits for a watch's reader.
	qmu     sync.Mutex
	backlog []rawEvent
	ready   chan struct{} // a token when backlog is not empty (buffered, 1)
}

type rawEvent struct {
	ev   unix.InotifyEvent
	name string
}

type watchedDir struct {
	rel string // relative to the watched directory ("" for itself)
	fd  int    // O_PATH
}

// WatchError is a watch that could not start: Missing, NotDir or a bound.
type WatchError struct {
	Path            string
	Missing, NotDir bool
	Err             error
}

func (e *WatchError) Error() string { return e.Path + ": " + e.Err.Error() }
func (e *WatchError) Unwrap() error { return e.Err }

// OpenWatch starts watching dir (absolute, as the Bench names it) of the running Bench rec. Close
// ends it; Next returns its events.
func OpenWatch(rec *Record, dir string, opts WatchOptions) (*DirWatch, error) {
	if !rec.Running || rec.Pid <= 0 {
		return nil, fmt.Errorf("bench %s is not running", rec.Name)
	}
	if opts.MaxDirs <= 0 || opts.MaxDirs > MaxWatchDirs {
		opts.MaxDirs = MaxWatchDirs
	}
	dir = path.Clean("/" + dir)
	pfd, err := unix.PidfdOpen(rec.Pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("bench %s is not running: %w", rec.Name, err)
	}
	pidf := os.NewFile(uintptr(pfd), "pidfd")
	root, err := unix.Open(fmt.Sprintf("/proc/%d/root", rec.Pid), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		pidf.Close()
		return nil, fmt.Errorf("bench %s: its root: %w", rec.Name, err)
	}
	w := &DirWatch{dir: dir, opts: opts, root: root, init: pidf, dirs: map[int32]*watchedDir{},
		ready: make(chan struct{}, 1), failed: make(chan error, 1)}
	fd, err := unix.Openat2(root, inRoot(dir), &unix.OpenHow{
		Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS})
	if err != nil {
		unix.Close(root)
		pidf.Close()
		return nil, &WatchError{Path: dir, Missing: errors.Is(err, unix.ENOENT), NotDir: errors.Is(err, unix.ENOTDIR), Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		unix.Close(fd)
		unix.Close(root)
		pidf.Close()
		return nil, &WatchError{Path: dir, NotDir: true, Err: errors.New("not a directory: watch a directory")}
	}
	if !opts.NetworkMounts {
		var sfs unix.Statfs_t
		if unix.Fstatfs(fd, &sfs) == nil && networkFS(sfs.Type) {
			unix.Close(fd)
			unix.Close(root)
			pidf.Close()
			return nil, &WatchError{Path: dir, Err: errors.New("on a network filesystem, whose changes made elsewhere are not seen: allow network mounts to watch it anyway")}
		}
	}
	if opts.Entry {
		w.names = readIDNames(root, rec.Pid)
	}
	if err := w.add(fd, ""); err != nil {
		w.Close()
		return nil, err
	}
	go w.awaitEnd()
	return w, nil
}

// networkFS says whether a statfs type is a network filesystem's (or FUSE's, which may be one).
func networkFS(t int64) bool {
	switch uint32(t) {
	case unix.NFS_SUPER_MAGIC, unix.SMB_SUPER_MAGIC, unix.SMB2_SUPER_MAGIC, unix.CIFS_SUPER_MAGIC, unix.FUSE_SUPER_MAGIC,
		unix.AFS_SUPER_MAGIC, unix.CODA_SUPER_MAGIC, unix.NCP_SUPER_MAGIC, unix.V9FS_MAGIC:
		return true
	}
	return false
}

// pseudoFS says whether a directory's filesystem is the kernel's (proc, sysfs...): a recursive
// watch does not descend into one, which is not files and would cost a watch per process.
func pseudoFS(fd int) bool {
	var sfs unix.Statfs_t
	if unix.Fstatfs(fd, &sfs) != nil {
		return true
	}
	switch uint32(sfs.Type) {
	case unix.PROC_SUPER_MAGIC, unix.SYSFS_MAGIC, unix.CGROUP_SUPER_MAGIC, unix.CGROUP2_SUPER_MAGIC, unix.DEVPTS_SUPER_MAGIC,
		unix.DEBUGFS_MAGIC, unix.TRACEFS_MAGIC, unix.SECURITYFS_MAGIC, unix.BPF_FS_MAGIC:
		return true
	}
	return false
}

// add watches the directory fd (O_PATH, taken over) at rel, and, for a recursive watch, those below.
func (w *DirWatch) add(fd int, rel string) error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		unix.Close(fd)
		return nil
	}
	if len(w.dirs) >= w.opts.MaxDirs {
		w.mu.Unlock()
		unix.Close(fd)
		return &WatchError{Path: w.dir, Err: fmt.Errorf("more than %d directories to watch under it: watch a smaller tree (or not recursively)", w.opts.MaxDirs)}
	}
	wd, err := theHub.watch(w, fd)
	if err != nil {
		w.mu.Unlock()
		unix.Close(fd)
		return &WatchError{Path: path.Join(w.dir, rel), Err: err}
	}
	if old := w.dirs[wd]; old != nil { // the same directory again (a bind mount, or moved)
		unix.Close(old.fd)
		theHub.release(w, wd)
	}
	w.dirs[wd] = &watchedDir{rel: rel, fd: fd}
	w.mu.Unlock()
	if !w.opts.Recursive {
		return nil
	}
	// The directories below, by name from this one's descriptor: a name is one component, and a
	// symlink is not followed.
	dfd, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil // gone, or not readable: its events still come
	}
	d := os.NewFile(uintptr(dfd), rel)
	defer d.Close()
	for {
		ents, err := d.ReadDir(256)
		for _, e := range ents {
			if !e.IsDir() {
				continue
			}
			sub, err := unix.Openat(fd, e.Name(), unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				continue
			}
			if pseudoFS(sub) {
				unix.Close(sub)
				continue
			}
			if err := w.add(sub, path.Join(rel, e.Name())); err != nil {
				return err
			}
		}
		if err != nil {
			return nil
		}
	}
}

// ErrBenchEnded ends the watches of a Bench that ended.
var ErrBenchEnded = errors.New("the Bench ended")

// awaitEnd fails the watch when the Bench's init exits (its pidfd becomes readable), or returns when
// the watch is closed.
func (w *DirWatch) awaitEnd() {
	rc, err := w.init.SyscallConn()
	if err != nil {
		return
	}
	polled := false
	if rc.Read(func(uintptr) bool {
		done := polled // the first call only asks the poller to wait
		polled = true
		return done
	}) == nil {
		w.fail(ErrBenchEnded)
	}
}

// Close ends the watch.
func (w *DirWatch) Close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return
	}
	w.closed = true
	for wd, d := range w.dirs {
		theHub.release(w, wd)
		unix.Close(d.fd)
	}
	w.dirs = nil
	unix.Close(w.root)
	w.init.Close()
}

// deliver queues a raw event for the watch; one that does not keep up is ended.
func (w *DirWatch) deliver(ev unix.InotifyEvent, name string) {
	w.qmu.Lock()
	full := len(w.backlog) >= watchBacklog
	if !full {
		w.backlog = append(w.backlog, rawEvent{ev, name})
	}
	w.qmu.Unlock()
	if full {
		w.fail(ErrWatchBehind)
		return
	}
	select {
	case w.ready <- struct{}{}:
	default: // a token is there already
	}
}

// take returns the backlog and empties it.
func (w *DirWatch) take() []rawEvent {
	w.qmu.Lock()
	defer w.qmu.Unlock()
	b := w.backlog
	w.backlog = nil
	return b
}

func (w *DirWatch) fail(err error) {
	select {
	case w.failed <- err:
	default:
	}
}

// Run calls emit for each event until ctx ends (nil) or the watch fails (the error: the watched
// directory removed, events lost).
func (w *DirWatch) Run(ctx context.Context, emit func(WatchEvent)) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-w.failed:
			return err
		case <-w.ready:
			for _, r := range w.take() {
				if err := w.handle(r.ev, r.name, emit); err != nil {
					return err
				}
			}
		}
	}
}

// handle turns one inotify event into the watch's events, as fsnotify names them.
func (w *DirWatch) handle(ev unix.InotifyEvent, name string, emit func(WatchEvent)) error {
	if ev.Mask&unix.IN_Q_OVERFLOW != 0 {
		return ErrWatchBehind
	}
	w.mu.Lock()
	d := w.dirs[ev.Wd]
	w.mu.Unlock()
	if d == nil {
		return nil
	}
	if ev.Mask&unix.IN_IGNORED != 0 || ev.Mask&(unix.IN_DELETE_SELF|unix.IN_MOVE_SELF) != 0 {
		// A directory below is reported by its parent's event; the watched one itself ends the watch.
		if d.rel == "" {
			return fmt.Errorf("%s: the watched directory was removed or moved", w.dir)
		}
		if ev.Mask&unix.IN_IGNORED != 0 {
			w.mu.Lock()
			if w.dirs[ev.Wd] == d {
				delete(w.dirs, ev.Wd)
				theHub.release(w, ev.Wd)
				unix.Close(d.fd)
			}
			w.mu.Unlock()
		}
		return nil
	}
	rel := path.Join(d.rel, name)
	if w.opts.Recursive && ev.Mask&unix.IN_ISDIR != 0 && ev.Mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0 {
		if sub, err := unix.Openat(d.fd, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0); err == nil {
			if err := w.add(sub, rel); err != nil {
				return err
			}
		}
	}
	ops := []struct {
		mask uint32
		op   string
	}{
		{unix.IN_CREATE | unix.IN_MOVED_TO, "create"},
		{unix.IN_MOVED_FROM, "rename"},
		{unix.IN_ATTRIB, "chmod"},
		{unix.IN_MODIFY, "write"},
		{unix.IN_DELETE, "remove"},
	}
	for _, o := range ops {
		if ev.Mask&o.mask == 0 {
			continue
		}
		e := WatchEvent{Name: rel, Op: o.op}
		if w.opts.Entry {
			e.Entry = w.describe(d.fd, name, path.Join(w.dir, rel))
		}
		emit(e)
	}
	return nil
}

// describe is the file name of the directory dfd, or nil if it is gone.
func (w *DirWatch) describe(dfd int, name, full string) *WatchFile {
	var st unix.Stat_t
	if unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) != nil {
		return nil
	}
	f := &WatchFile{Path: full, Size: st.Size, Mode: st.Mode & 0o7777, Modified: time.Unix(st.Mtim.Unix()).UTC()}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		f.Type = "file"
	case unix.S_IFDIR:
		f.Type = "dir"
	case unix.S_IFLNK:
		f.Type = "symlink"
		buf := make([]byte, 4096)
		if n, err := unix.Readlinkat(dfd, name, buf); err == nil {
			f.Target = string(buf[:n])
		}
	default:
		f.Type = "other"
	}
	f.Owner, f.Group = w.names.user(st.Uid), w.names.group(st.Gid)
	return f
}

// idNames names a Bench's users and groups as its /etc/passwd and /etc/group do, from the host's ids
// of its files (through its user namespace's maps).
type idNames struct {
	uidMap, gidMap [][3]uint32 // inside, outside, count
	users, groups  map[uint32]string
}

func readIDNames(root, pid int) *idNames {
	n := &idNames{users: map[uint32]string{}, groups: map[uint32]string{}}
	n.uidMap = readIDMap(fmt.Sprintf("/proc/%d/uid_map", pid))
	n.gidMap = readIDMap(fmt.Sprintf("/proc/%d/gid_map", pid))
	readNames(root, "etc/passwd", n.users)
	readNames(root, "etc/group", n.groups)
	return n
}

func readIDMap(file string) [][3]uint32 {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil
	}
	var m [][3]uint32
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 {
			continue
		}
		var r [3]uint32
		for i := range f {
			v, _ := strconv.ParseUint(f[i], 10, 32)
			r[i] = uint32(v)
		}
		m = append(m, r)
	}
	return m
}

// readNames reads name:x:id lines of a Bench's file (at most 1 MiB of it), through its root.
func readNames(root int, file string, into map[uint32]string) {
	fd, err := unix.Openat2(root, file, &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NONBLOCK,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS})
	if err != nil {
		return
	}
	f := os.NewFile(uintptr(fd), file)
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return
	}
	sc := bufio.NewScanner(io.LimitReader(f, 1<<20))
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 4)
		if len(parts) < 3 {
			continue
		}
		if id, err := strconv.ParseUint(parts[2], 10, 32); err == nil {
			if _, dup := into[uint32(id)]; !dup {
				into[uint32(id)] = parts[0]
			}
		}
	}
}

func (n *idNames) name(id uint32, m [][3]uint32, names map[uint32]string) string {
	for _, r := range m {
		if id >= r[1] && id-r[1] < r[2] {
			inside := r[0] + (id - r[1])
			if s, ok := names[inside]; ok {
				return s
			}
			return strconv.FormatUint(uint64(inside), 10)
		}
	}
	return "nobody" // not mapped into the Bench: it sees the overflow id
}

func (n *idNames) user(id uint32) string {
	if n == nil {
		return strconv.FormatUint(uint64(id), 10)
	}
	return n.name(id, n.uidMap, n.users)
}

func (n *idNames) group(id uint32) string {
	if n == nil {
		return strconv.FormatUint(uint64(id), 10)
	}
	return n.name(id, n.gidMap, n.groups)
}

// hub is the process's one inotify instance, shared by every watch: a directory that two watches
// watch has one wd, released when neither does.
type hub struct {
	once  sync.Once
	fd    int
	err   error
	mu    sync.Mutex
	subs  map[int32]map[*DirWatch]int // wd -> watches -> how many times each holds it
	total int
}

var theHub = &hub{}

const watchMask = unix.IN_CREATE | unix.IN_MOVED_TO | unix.IN_MOVED_FROM | unix.IN_ATTRIB | unix.IN_MODIFY |
	unix.IN_DELETE | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR

func (h *hub) start() error {
	h.once.Do(func() {
		h.fd, h.err = unix.InotifyInit1(unix.IN_CLOEXEC)
		if h.err != nil {
			h.err = fmt.Errorf("inotify: %w", h.err)
			return
		}
		h.subs = map[int32]map[*DirWatch]int{}
		go h.read()
	})
	return h.err
}

// watch adds the directory fd (O_PATH) to the instance for w.
func (h *hub) watch(w *DirWatch, fd int) (int32, error) {
	if err := h.start(); err != nil {
		return 0, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.total >= maxHubWatches {
		return 0, fmt.Errorf("the supervisor watches %d directories already, its bound: watch fewer, or end other watches", maxHubWatches)
	}
	// The directory by its descriptor's magic link, which names exactly it.
	wd, err := unix.InotifyAddWatch(h.fd, "/proc/self/fd/"+strconv.Itoa(fd), watchMask)
	if err != nil {
		if errors.Is(err, unix.ENOSPC) {
			return 0, errors.New("the kernel's bound on inotify watches is reached (fs.inotify.max_user_watches): watch fewer directories")
		}
		return 0, fmt.Errorf("inotify: %w", err)
	}
	id := int32(wd)
	if h.subs[id] == nil {
		h.subs[id] = map[*DirWatch]int{}
	}
	h.subs[id][w]++
	h.total++
	return id, nil
}

// release drops one of w's holds on wd; the last hold removes the kernel's watch.
func (h *hub) release(w *DirWatch, wd int32) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.subs[wd]
	if s == nil || s[w] == 0 {
		return
	}
	h.total--
	if s[w]--; s[w] == 0 {
		delete(s, w)
	}
	if len(s) == 0 {
		delete(h.subs, wd)
		_, _ = unix.InotifyRmWatch(h.fd, uint32(wd))
	}
}

// read hands each event to the watches of its wd, for ever (the instance lives as long as the
// process).
func (h *hub) read() {
	buf := make([]byte, 64<<10)
	for {
		n, err := unix.Read(h.fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil || n <= 0 {
			return
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := *(*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			nameBytes := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
			name := strings.TrimRight(string(nameBytes), "\x00")
			off += unix.SizeofInotifyEvent + int(ev.Len)
			h.mu.Lock()
			if ev.Mask&unix.IN_Q_OVERFLOW != 0 {
				for _, s := range h.subs {
					for w := range s {
						w.fail(ErrWatchBehind)
					}
				}
			}
			for w := range h.subs[ev.Wd] {
				w.deliver(ev, name)
			}
			if ev.Mask&unix.IN_IGNORED != 0 {
				// The kernel dropped the watch (its directory is gone): so do the holds on it.
				if s := h.subs[ev.Wd]; s != nil {
					for _, k := range s {
						h.total -= k
					}
					delete(h.subs, ev.Wd)
				}
			}
			h.mu.Unlock()
		}
	}
}
