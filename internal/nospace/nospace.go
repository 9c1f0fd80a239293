// Package nospace names a full filesystem: a write that failed with ENOSPC (or EDQUOT, a quota
// spent) becomes an error that says which filesystem, of what type and size, mounted where, with how
// much left, instead of whatever the tool that hit it said about it (`mmdebstrap exited 25`).
package nospace

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Error is a write that found the filesystem of Dir full (or the writer's quota on it spent).
type Error struct {
	Dir    string // the directory the caller knows (a store's root), on the full filesystem
	Mount  string // the filesystem's mount point ("" if not found)
	FSType string // its type, as mountinfo says: tmpfs, ext4...
	Size   uint64 // its size in bytes
	Free   uint64 // the bytes an unprivileged writer may still use, when the error was made
	Quota  bool   // EDQUOT: the writer's quota, not the filesystem, is spent
	Err    error  // what failed
}

func (e *Error) Error() string {
	what := "no space left on the filesystem of "
	if e.Quota {
		what = "disk quota exceeded on the filesystem of "
	}
	var fs []string
	if e.FSType != "" {
		fs = append(fs, e.FSType)
	}
	if e.Size > 0 {
		fs = append(fs, "of "+FormatBytes(e.Size))
	}
	if e.Mount != "" && e.Mount != e.Dir {
		fs = append(fs, "at "+e.Mount)
	}
	desc := strings.Join(fs, " ")
	if desc != "" {
		desc += ", "
	}
	return fmt.Sprintf("%s%s (%s%s free): %v", what, e.Dir, desc, FormatBytes(e.Free), e.Err)
}

// Unwrap is what failed: errors.Is(err, unix.ENOSPC) stays true of an Error made from one.
func (e *Error) Unwrap() error { return e.Err }

// Is reports whether err says a filesystem is full (ENOSPC) or a quota spent (EDQUOT).
func Is(err error) bool { return errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) }

// Check returns err as an *Error about dir's filesystem when it is a full filesystem's (and not
// already an *Error); any other err, or nil, as it is.
func Check(dir string, err error) error {
	if err == nil || !Is(err) {
		return err
	}
	var e *Error
	if errors.As(err, &e) {
		return err
	}
	return Of(dir, errors.Is(err, unix.EDQUOT) && !errors.Is(err, unix.ENOSPC), err)
}

// Of is an *Error about dir's filesystem as it is now, wrapping err.
func Of(dir string, quota bool, err error) *Error {
	e := &Error{Dir: dir, Quota: quota, Err: err}
	// dir may be gone (a stage removed): its nearest ancestor is on the same filesystem, or close.
	p := filepath.Clean(dir)
	for {
		if _, serr := os.Stat(p); serr == nil || p == "/" || p == "." {
			break
		}
		p = filepath.Dir(p)
	}
	var st unix.Statfs_t
	if unix.Statfs(p, &st) == nil {
		e.Size, e.Free = st.Blocks*uint64(st.Bsize), st.Bavail*uint64(st.Bsize)
	}
	e.Mount, e.FSType = mountOf(p)
	return e
}

// Full says whether dir's filesystem has less than least bytes left for an unprivileged writer.
func Full(dir string, least uint64) bool {
	var st unix.Statfs_t
	return unix.Statfs(dir, &st) == nil && st.Bavail*uint64(st.Bsize) < least
}

// mountOf finds the mount point and type of the filesystem p is on, from /proc/self/mountinfo: the
// longest mount point above p among the mounts of p's device.
func mountOf(p string) (mount, fstype string) {
	if r, err := filepath.EvalSymlinks(p); err == nil {
		p = r
	}
	var st unix.Stat_t
	if unix.Stat(p, &st) != nil {
		return "", ""
	}
	dev := fmt.Sprintf("%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTIONS
		fields := strings.Fields(sc.Text())
		if len(fields) < 7 || fields[2] != dev {
			continue
		}
		mp := unescape(fields[4])
		if !(p == mp || mp == "/" || strings.HasPrefix(p, mp+"/")) || len(mp) < len(mount) {
			continue
		}
		for i, f := range fields[6:] {
			if f == "-" && 6+i+1 < len(fields) {
				mount, fstype = mp, fields[6+i+1]
				break
			}
		}
	}
	return mount, fstype
}

// unescape undoes mountinfo's octal escapes of space, tab, newline and backslash.
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var c byte
			if _, err := fmt.Sscanf(s[i+1:i+4], "%03o", &c); err == nil {
				b.WriteByte(c)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Messages are what tools print when a write finds the filesystem full or the quota spent
// (strerror of ENOSPC and EDQUOT, as dpkg, tar, cp, apt and pip all say them).
var messages = [][]byte{[]byte("No space left on device"), []byte("Disk quota exceeded")}

// Scanner is a writer that watches a tool's output for those messages (across writes) and remembers
// which it saw; it writes nowhere.
type Scanner struct {
	tail  []byte
	seen  bool
	quota bool
}

func (s *Scanner) Write(p []byte) (int, error) {
	if s.seen {
		return len(p), nil
	}
	keep := 32 // longer than the longest message
	buf := append(s.tail, p...)
	for i, m := range messages {
		if bytes.Contains(buf, m) {
			s.seen, s.quota = true, i == 1
			break
		}
	}
	if len(buf) > keep {
		buf = buf[len(buf)-keep:]
	}
	s.tail = append(s.tail[:0], buf...)
	return len(p), nil
}

// Seen says whether the output said a filesystem was full, and whether it was a quota.
func (s *Scanner) Seen() (seen, quota bool) { return s.seen, s.quota }

// FormatBytes renders n as "0 B", "812 B", "40.0 MiB".
func FormatBytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
