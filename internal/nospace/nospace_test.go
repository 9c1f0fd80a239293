package nospace

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestScanner: the messages are heard when a write splits them, and only they.
func TestScanner(t *testing.T) {
	for _, c := range []struct {
		writes      []string
		seen, quota bool
	}{
		{[]string{"tar: ./usr/bin/x: Cannot write: No space ", "left on device\n"}, true, false},
		{[]string{"dpkg: error: Disk quota", " exceeded\n"}, true, true},
		{[]string{"E: Unable to locate package nosuch\n", "No space\n", "left on device\n"}, false, false},
		{[]string{strings.Repeat("x", 100000), "No space left on device"}, true, false},
	} {
		var s Scanner
		for _, w := range c.writes {
			if n, err := s.Write([]byte(w)); n != len(w) || err != nil {
				t.Fatalf("Write: %d, %v", n, err)
			}
		}
		if seen, quota := s.Seen(); seen != c.seen || quota != c.quota {
			t.Errorf("%q: seen %v quota %v, want %v %v", c.writes, seen, quota, c.seen, c.quota)
		}
	}
}

// TestCheck: only ENOSPC and EDQUOT, however wrapped, become an Error, which keeps the errno and
// names the directory's filesystem; an Error is not wrapped twice.
func TestCheck(t *testing.T) {
	dir := t.TempDir()
	if err := Check(dir, os.ErrPermission); err != os.ErrPermission {
		t.Errorf("EPERM became %v", err)
	}
	if Check(dir, nil) != nil {
		t.Error("nil became an error")
	}
	full := fmt.Errorf("add x: %w", &os.PathError{Op: "write", Path: dir + "/x", Err: unix.ENOSPC})
	err := Check(dir, full)
	var e *Error
	if !errors.As(err, &e) || !errors.Is(err, unix.ENOSPC) || e.Quota || e.Mount == "" || e.FSType == "" || e.Size == 0 {
		t.Fatalf("ENOSPC: %#v", err)
	}
	if !strings.HasPrefix(err.Error(), "no space left on the filesystem of "+dir+" ("+e.FSType+" of ") || !strings.Contains(err.Error(), "free): add x: ") {
		t.Errorf("message %q", err)
	}
	if again := Check("/elsewhere", err); again != err {
		t.Errorf("an Error wrapped again: %v", again)
	}
	q := Check(dir+"/gone/since", fmt.Errorf("x: %w", unix.EDQUOT))
	if !errors.As(q, &e) || !e.Quota || !strings.HasPrefix(q.Error(), "disk quota exceeded on the filesystem of "+dir+"/gone/since") {
		t.Errorf("EDQUOT: %v", q)
	}
}

func TestUnescape(t *testing.T) {
	if got := unescape(`/mnt/a\040b\134c`); got != `/mnt/a b\c` {
		t.Errorf("unescape: %q", got)
	}
}
