package sandbox

import (
	"bytes"
	"fmt"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// BenchmarkSealedSelf measures the two CVE-2019-5736 guards, which Start uses once per process: the
// read-only overlay mount, and the copy into a sealed memfd that is its fallback.
func BenchmarkSealedSelf(b *testing.B) {
	for _, c := range []struct {
		name string
		f    func() (*os.File, error)
	}{{"overlay", sealedOverlay}, {"memfd", sealedCopy}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				f, err := c.f()
				if err != nil {
					b.Fatal(err)
				}
				f.Close()
			}
		})
	}
}

func TestSealedSelf(t *testing.T) {
	f, err := sealedSelf()
	if err != nil {
		t.Fatal(err)
	}
	if g, _ := sealedSelf(); g != f {
		t.Error("the sealed handle is made more than once")
	}
	if os.Geteuid() == 0 {
		if _, err := sealedOverlay(); err != nil {
			t.Errorf("the overlay seal fails as root on this kernel: %v", err)
		}
	}
	exe, _ := os.Readlink("/proc/self/exe")
	if _, err := os.OpenFile(fmt.Sprintf("/proc/self/fd/%d", f.Fd()), os.O_WRONLY, 0); err == nil {
		t.Error("reopened the sealed handle for writing")
	}
	if _, err := f.WriteAt([]byte{0}, 0); err == nil {
		t.Error("wrote to the sealed handle")
	}
	a, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	c, err := os.ReadFile(fmt.Sprintf("/proc/self/fd/%d", f.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, c) {
		t.Errorf("the sealed handle differs from the executable (%d bytes vs %d)", len(c), len(a))
	}
}

func TestSealedCopy(t *testing.T) {
	f, err := sealedCopy()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	seals, err := unix.FcntlInt(f.Fd(), unix.F_GET_SEALS, 0)
	want := unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE
	if err != nil || seals&want != want {
		t.Errorf("seals %#x, %v; want %#x", seals, err, want)
	}
	if _, err := f.WriteAt([]byte{0}, 0); err == nil {
		t.Error("wrote to the sealed copy")
	}
	a, err := os.ReadFile("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	c, err := os.ReadFile(fmt.Sprintf("/proc/self/fd/%d", f.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, c) {
		t.Errorf("copy differs from the executable (%d bytes vs %d)", len(c), len(a))
	}
}
