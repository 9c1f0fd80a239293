package sandbox

import (
	"errors"
	"strings"
	"syscall"
)

// SetupError is a failed setup step of a sandbox, structured as runc's mountError. Op is the step
// ("mount overlay", "pivot_root", "bind", "mknod", "exec", ...), Path what it applied to, Detail
// anything else worth saying, and Err the cause (a syscall.Errno when a system call failed, so
// errors.Is(err, syscall.EROFS) works).
type SetupError struct {
	Op, Path, Detail string
	Err              error
}

func (e *SetupError) Error() string {
	var b strings.Builder
	b.WriteString("sandbox: ")
	b.WriteString(e.Op)
	if e.Path != "" {
		b.WriteString(" ")
		b.WriteString(e.Path)
	}
	if e.Detail != "" {
		b.WriteString(": ")
		b.WriteString(e.Detail)
	}
	if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(e.Err.Error())
	}
	return b.String()
}

func (e *SetupError) Unwrap() error { return e.Err }

// wireError is a SetupError as init sends it to the parent: the errno survives as a number.
type wireError struct {
	Op, Path, Detail string
	Errno            uintptr `json:",omitempty"`
	Msg              string  `json:",omitempty"`
}

func toWire(e *SetupError) *wireError {
	w := &wireError{Op: e.Op, Path: e.Path, Detail: e.Detail}
	var errno syscall.Errno
	if errors.As(e.Err, &errno) {
		w.Errno = uintptr(errno)
	} else if e.Err != nil {
		w.Msg = e.Err.Error()
	}
	return w
}

func (w *wireError) setupError() *SetupError {
	e := &SetupError{Op: w.Op, Path: w.Path, Detail: w.Detail}
	switch {
	case w.Errno != 0:
		e.Err = syscall.Errno(w.Errno)
	case w.Msg != "":
		e.Err = errors.New(w.Msg)
	}
	return e
}

// ErrNotRunning is the cause of an Exec into a sandbox that is not running: nothing listens on the
// control socket (the sandbox ended, or never existed), or the sandbox ended before the command did.
var ErrNotRunning = errors.New("sandbox is not running")

// ErrNoLimits is returned for a spec with Limits when shed runs without root: the host's cgroups are
// root's, and a limit that is not enforced must not look as if it were.
var ErrNoLimits = errors.New("resource limits need root")

// ErrNoFreezer is returned by Freeze, Thaw and Frozen for a sandbox whose commands are in no freezer
// of shed's: one started without Spec.Pausable, or without root (the host's cgroups are not shed's),
// or one with no command running.
var ErrNoFreezer = errors.New("the sandbox has no freezer: start it with Pausable, as root")
