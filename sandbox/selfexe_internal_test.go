package sandbox

import (
	"bytes"
	"fmt"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// BenchmarkSealedCopy measures the CVE-2019-5736 guard: copying this binary into a sealed memfd,
// which Start does once per process.
func BenchmarkSealedCopy(b *testing.B) {
	st, err := os.Stat("/proc/self/exe")
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(st.Size())
	for b.Loop() {
		f, err := copySelf()
		if err != nil {
			b.Fatal(err)
		}
		f.Close()
	}
}

func TestSealedCopy(t *testing.T) {
	f, err := sealedSelf()
	if err != nil {
		t.Fatal(err)
	}
	if g, _ := sealedSelf(); g != f {
		t.Error("the sealed copy is made more than once")
	}
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
