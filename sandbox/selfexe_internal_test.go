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
		f    func(string) (*os.File, error)
	}{{"overlay", sealedOverlay}, {"memfd", sealedCopy}} {
		b.Run(c.name, func(b *testing.B) {
			exe, err := initProgram()
			if err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				f, err := c.f(exe)
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
	exe, _ := os.Readlink("/proc/self/exe")
	if os.Geteuid() == 0 {
		if _, err := sealedOverlay(exe); err != nil {
			t.Errorf("the overlay seal fails as root on this kernel: %v", err)
		}
	}
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
	exe, _ := os.Readlink("/proc/self/exe")
	f, err := sealedCopy(exe)
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

// TestCheckInit: an init program that another user could have written is refused before it runs as
// every sandbox's root.
func TestCheckInit(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		name  string
		mode  os.FileMode
		owner int
		ok    bool
	}{{"fine", 0o755, -1, true}, {"group-writable", 0o775, -1, false}, {"world-writable", 0o757, -1, false}, {"nobody's", 0o755, 65534, false}} {
		p := dir + "/" + c.name
		if err := os.WriteFile(p, []byte("#!/bin/true\n"), c.mode); err != nil {
			t.Fatal(err)
		}
		os.Chmod(p, c.mode)
		if c.owner >= 0 {
			if os.Geteuid() != 0 {
				continue
			}
			os.Chown(p, c.owner, c.owner)
		}
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		err = checkInit(int(f.Fd()), p)
		f.Close()
		if (err == nil) != c.ok {
			t.Errorf("%s: %v, want ok %v", c.name, err, c.ok)
		}
	}
}
