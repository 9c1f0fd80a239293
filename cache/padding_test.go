package cache

import (
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/klauspost/pgzip"

	"toolshed.dev/shed/store"
)

// paddedTree is the tree the real tars below hold, under LayerRoot, and its manifest.
func paddedTree(t *testing.T) (dir string, m *store.Manifest) {
	t.Helper()
	dir = t.TempDir()
	root := filepath.Join(dir, LayerRoot)
	must(t, os.MkdirAll(filepath.Join(root, "sub"), 0o755))
	must(t, os.WriteFile(filepath.Join(root, "f"), []byte(hello), 0o644))
	must(t, os.WriteFile(filepath.Join(root, "sub", "g"), []byte("another file"), 0o644))
	for _, p := range []string{"", "sub", "f", "sub/g"} {
		mode := os.FileMode(0o644)
		if p == "" || p == "sub" {
			mode = 0o755
		}
		must(t, os.Chmod(filepath.Join(root, p), mode)) // whatever the umask
	}
	must(t, store.ClampTimes(root, epoch))
	return dir, manifest(fileEntry("f", hello), dirEntry("sub"), fileEntry("sub/g", "another file"))
}

// realTars are layers of the tree in dir gzip'd by GNU tar and by Python's tarfile, which pad the
// archive to a 10,240-byte record after the end-of-archive marker (Go's writer does not).
func realTars(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	for _, tool := range []string{"tar", "python3"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s: %v", tool, err)
		}
	}
	run := func(name string, args ...string) []byte {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir = dir
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%s: %v\n%s", name, err, stderr.Bytes())
		}
		return out
	}
	py := `import sys, tarfile
def clean(ti):
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    return ti
with tarfile.open(fileobj=sys.stdout.buffer, mode="w|gz") as tf:
    tf.add("` + LayerRoot + `", filter=clean)
`
	return map[string][]byte{
		"GNU tar": run("tar", "--sort=name", "--numeric-owner", "--owner=0", "--group=0", "-czf", "-", LayerRoot),
		"Python":  run("python3", "-c", py),
	}
}

// gunzip inflates b, failing the test on an error.
func gunzip(t *testing.T, b []byte) []byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(b))
	must(t, err)
	out, err := io.ReadAll(zr)
	must(t, err)
	return out
}

// padding is the number of zero bytes after the end-of-archive marker of the tar stream b.
func padding(b []byte) int {
	end := len(b)
	for end >= blockSize && !slices.ContainsFunc(b[end-blockSize:end], func(c byte) bool { return c != 0 }) {
		end -= blockSize
	}
	return len(b) - end - 2*blockSize
}

// TestReadLayerRealTars: layers written by GNU tar and Python's tarfile, gzip'd, padded with zeros
// to the 10,240-byte record after the end-of-archive marker, extract as their manifest's tree, read
// through pgzip as extractTree reads a blob, to its end.
func TestReadLayerRealTars(t *testing.T) {
	needRoot(t)
	dir, m := paddedTree(t)
	for name, gz := range realTars(t, dir) {
		t.Run(name, func(t *testing.T) {
			plain := gunzip(t, gz)
			if len(plain)%10240 != 0 || padding(plain) == 0 {
				t.Fatalf("%d bytes, %d of padding after the marker: not padded to a record", len(plain), padding(plain))
			}
			br := bytes.NewReader(gz)
			zr, err := pgzip.NewReader(br)
			must(t, err)
			defer zr.Close()
			dst := filepath.Join(t.TempDir(), "dst")
			if err := ReadLayer(context.Background(), zr, dst, m); err != nil {
				t.Fatalf("refused: %v", err)
			}
			checkExactly(t, dst, m)
			if n, err := io.Copy(io.Discard, struct{ io.Reader }{zr}); n != 0 || err != nil || br.Len() != 0 {
				t.Fatalf("after ReadLayer: %d bytes more, %v, %d of the blob unread", n, err, br.Len())
			}
		})
	}
}

// TestAttackPadding: after the end-of-archive marker, zeros up to the record and nothing else. Each
// real tar with more zeros than that, or a non-zero byte in its padding, is refused, dst absent and
// nothing beside it changed; a valid layer with an endless zero tail is refused having read at most
// its bound.
func TestAttackPadding(t *testing.T) {
	needRoot(t)
	dir, m := paddedTree(t)
	var attacks []attack
	for name, gz := range realTars(t, dir) {
		plain := gunzip(t, gz)
		pad := padding(plain)
		marker := len(plain) - pad
		with := func(f func(b []byte) []byte) func(string) []byte {
			return func(string) []byte { return f(slices.Clone(plain)) }
		}
		attacks = append(attacks,
			attack{name + ", as written", with(func(b []byte) []byte { return b }), func(string) *store.Manifest { return m }, ""},
			attack{name + ", padding cut to a block", with(func(b []byte) []byte { return b[:marker+blockSize] }), func(string) *store.Manifest { return m }, ""},
			attack{name + ", padding up to the bound", with(func(b []byte) []byte { return append(b[:marker], make([]byte, maxPadding)...) }), func(string) *store.Manifest { return m }, ""},
			attack{name + ", a zero past the bound", with(func(b []byte) []byte { return append(b[:marker], make([]byte, maxPadding+1)...) }), func(string) *store.Manifest { return m }, "zero bytes after the end-of-archive marker"},
			attack{name + ", another record of zeros", with(func(b []byte) []byte { return append(b, make([]byte, 10240)...) }), func(string) *store.Manifest { return m }, "zero bytes after the end-of-archive marker"},
			attack{name + ", a non-zero last byte", with(func(b []byte) []byte { b[len(b)-1] = 1; return b }), func(string) *store.Manifest { return m }, "data after the end-of-archive marker"},
			attack{name + ", a non-zero first byte", with(func(b []byte) []byte { b[marker] = 'x'; return b }), func(string) *store.Manifest { return m }, "data after the end-of-archive marker"},
			attack{name + ", a second archive in the padding", with(func(b []byte) []byte {
				second := tarOf(dirHdr("content/"), fileHdr("content/pwned", hello))("")
				return append(b[:marker], second...)
			}), func(string) *store.Manifest { return m }, "data after the end-of-archive marker"},
		)

		t.Run(name+", an endless zero tail", func(t *testing.T) {
			cr := &countingReader{r: io.MultiReader(bytes.NewReader(plain), io.LimitReader(zeroReader{}, 1<<40))}
			dst := filepath.Join(t.TempDir(), "dst")
			err := ReadLayer(context.Background(), cr, dst, m)
			checkRefused(t, err, "zero bytes after the end-of-archive marker", dst)
			if cr.n > maxBytes(m)+64<<10 {
				t.Fatalf("read %d bytes, bound %d", cr.n, maxBytes(m))
			}
		})
	}
	runAttacks(t, attacks)
}
