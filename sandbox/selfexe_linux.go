package sandbox

import (
	"fmt"
	"io"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// The sandbox's init is this binary, executed from a sealed in-memory copy rather than from its file
// (the runc CVE-2019-5736 guard): a process inside that reaches /proc/1/exe finds the copy, which no one
// can write, never the host binary. The copy is made once per process and reused.
var selfExe struct {
	once sync.Once
	f    *os.File
	err  error
}

func sealedSelf() (*os.File, error) {
	selfExe.once.Do(func() { selfExe.f, selfExe.err = copySelf() })
	return selfExe.f, selfExe.err
}

func copySelf() (*os.File, error) {
	src, err := os.Open("/proc/self/exe")
	if err != nil {
		return nil, fmt.Errorf("open own executable: %w", err)
	}
	defer src.Close()
	fd, err := unix.MemfdCreate("shed-sandbox-init", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), "shed-sandbox-init")
	if st, err := src.Stat(); err == nil {
		// One allocation up front instead of growing page by page.
		_ = unix.Fallocate(fd, 0, 0, st.Size())
	}
	if _, err := io.Copy(f, src); err != nil {
		f.Close()
		return nil, fmt.Errorf("copy own executable: %w", err)
	}
	seals := unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
		f.Close()
		return nil, fmt.Errorf("seal copy of own executable: %w", err)
	}
	return f, nil
}
