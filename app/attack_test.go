package app_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	imeta "github.com/opencontainers/image-spec/specs-go"
	ispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/opencontainers/umoci/oci/cas/dir"
	"github.com/opencontainers/umoci/oci/casext"

	"toolshed.dev/shed/app"
	"toolshed.dev/shed/audit"
	"toolshed.dev/shed/bench"
	"toolshed.dev/shed/policy"
	"toolshed.dev/shed/sandbox"
	"toolshed.dev/shed/store"
	"toolshed.dev/shed/trust"
)

func TestMain(m *testing.M) {
	sandbox.Init() // a Bench's init is this test binary, re-executed
	os.Exit(m.Run())
}

// benchService is a real supervisor's Service (the policy table, a warm pool, Benches that outlive
// their request) on a new store with one record, "bb": a root of busybox-static's applets imported as
// an OCI image seed (no network), that alice may launch.
func benchService(t testing.TB) *app.Service {
	t.Helper()
	return benchServiceSized(t, 512<<20)
}

// benchServiceSized is benchService whose uppers' image is uppers bytes.
func benchServiceSized(t testing.TB, uppers int64) *app.Service {
	t.Helper()
	s, _ := benchServiceStop(t, uppers)
	return s
}

// benchServiceStop is benchServiceSized, and what stops it as a supervisor stops: its Benches'
// context ends, and it waits for them.
func benchServiceStop(t testing.TB, uppers int64) (*app.Service, func()) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: sandboxes, and the store is root-only (CI runs as root)")
	}
	bb, err := exec.LookPath("busybox")
	if err != nil {
		t.Skipf("busybox not found: apt-get install busybox-static (%v)", err)
	}
	root := filepath.Join(t.TempDir(), "root")
	st, err := store.Init(root)
	if err != nil {
		t.Fatal(err)
	}
	// A small uppers' image: its default is preallocated from the disk's free space.
	if err := st.UpdateConfig(func(c *store.Config) error { c.UppersSize = uppers; return nil }); err != nil {
		t.Fatal(err)
	}
	st.Close()
	if _, _, err := trust.OpenKeys(root).Ensure("test-1"); err != nil {
		t.Fatal(err)
	}
	layout := filepath.Join(t.TempDir(), "image")
	busyboxImage(t, bb, layout)
	file := filepath.Join(t.TempDir(), "workshop.toml")
	if err := os.WriteFile(file, fmt.Appendf(nil, "name = \"bb\"\nseed = \"oci:%s:v1\"\n", layout), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	d := &app.Detached{Ctx: ctx}
	s := &app.Service{Root: root, Version: "test", Policy: policy.Check, Detached: d, Pool: app.NewPool(ctx, 2, nil)}
	// The uppers' filesystem it mounted goes too (detached: a watcher of a test may hold an inode).
	t.Cleanup(func() { cancel(); d.Wait(); syscall.Unmount(filepath.Join(root, "uppers"), syscall.MNT_DETACH) })
	operator := &app.Call{Caller: &app.Caller{User: "root", Role: app.Operator, Dir: "/"}}
	if _, err := s.Do(ctx, operator, "workshop.add", &app.WorkshopAddRequest{File: file, Allow: []string{"nobody"}}); err != nil {
		t.Fatal(err)
	}
	// Realized once here: the launches below race on the limit, not on a first build.
	if _, err := s.Do(ctx, operator, "realize", &app.RealizeRequest{Workshop: "bb"}); err != nil {
		t.Fatal(err)
	}
	return s, func() { cancel(); d.Wait() }
}

// busyboxImage writes an OCI image layout at layout, tagged v1: one layer, a root with busybox and a
// link in /bin for each of its applets.
func busyboxImage(t testing.TB, busybox, layout string) {
	t.Helper()
	bin, err := os.ReadFile(busybox)
	if err != nil {
		t.Fatal(err)
	}
	list, err := exec.Command(busybox, "--list").Output()
	if err != nil {
		t.Fatal(err)
	}
	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	mtime := time.Unix(1700000000, 0)
	for _, d := range []string{"bin", "dev", "etc", "proc", "root", "run", "sys", "tmp"} {
		mode := int64(0o755)
		if d == "tmp" {
			mode = 0o1777
		}
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: mode, ModTime: mtime})
	}
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "bin/busybox", Mode: 0o755, Size: int64(len(bin)), ModTime: mtime})
	tw.Write(bin)
	for _, applet := range strings.Fields(string(list)) {
		if applet != "busybox" {
			tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + applet, Linkname: "busybox", Mode: 0o777, ModTime: mtime})
		}
	}
	passwd := "root:x:0:0:root:/root:/bin/sh\n"
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "etc/passwd", Mode: 0o644, Size: int64(len(passwd)), ModTime: mtime})
	tw.Write([]byte(passwd))
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(raw.Bytes())
	zw.Close()

	ctx := context.Background()
	if err := dir.Create(layout); err != nil {
		t.Fatal(err)
	}
	engine, err := dir.Open(layout)
	if err != nil {
		t.Fatal(err)
	}
	defer engine.Close()
	ext := casext.NewEngine(engine)
	ld, lsize, err := ext.PutBlob(ctx, bytes.NewReader(gz.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	config := ispec.Image{
		Platform: ispec.Platform{OS: "linux", Architecture: runtime.GOARCH},
		RootFS:   ispec.RootFS{Type: "layers", DiffIDs: []digest.Digest{digest.FromBytes(raw.Bytes())}},
	}
	cd, csize, err := ext.PutBlobJSON(ctx, config)
	if err != nil {
		t.Fatal(err)
	}
	md, msize, err := ext.PutBlobJSON(ctx, ispec.Manifest{
		Versioned: imeta.Versioned{SchemaVersion: 2},
		MediaType: ispec.MediaTypeImageManifest,
		Config:    ispec.Descriptor{MediaType: ispec.MediaTypeImageConfig, Digest: cd, Size: csize},
		Layers:    []ispec.Descriptor{{MediaType: ispec.MediaTypeImageLayerGzip, Digest: ld, Size: lsize}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := ext.UpdateReference(ctx, "v1", ispec.Descriptor{MediaType: ispec.MediaTypeImageManifest, Digest: md, Size: msize}); err != nil {
		t.Fatal(err)
	}
}

// owned counts the Benches of the store at root that user has: the ones with a record saying so, and
// the ones still starting (no record, no owner yet: only user launches here).
func owned(t *testing.T, root, user string) (all, kept int) {
	t.Helper()
	recs, err := bench.ListIn(filepath.Join(root, "benches"))
	if err != nil {
		t.Error(err)
	}
	for _, r := range recs {
		if r.Owner == user || r.Owner == "" {
			all++
			if r.Keep {
				kept++
			}
		}
	}
	return all, kept
}

// TestLaunchLimitsUnderRace: a user who launches many Benches at once gets no more than the
// supervisor's limits. 20 bench.create at once (some on the warm pool's inits) with --user-benches 8
// leave at most 8 Benches, at every moment of the race and after; 10 kept bench.run at once with
// --user-kept 2 leave at most 2 kept. Each refusal says which limit; operators are not bounded.
func TestLaunchLimitsUnderRace(t *testing.T) {
	s := benchService(t)
	s.UserBenches, s.UserKept = 8, 2
	ctx := context.Background()
	alice := &app.Call{Caller: &app.Caller{UID: 1001, User: "nobody", Role: app.User, Dir: "/"}}

	// A watcher counts alice's Benches all along: the most she ever has.
	var most atomic.Int64
	stop := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for {
			if n, _ := owned(t, s.Root, "nobody"); int64(n) > most.Load() {
				most.Store(int64(n))
			}
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	race := func(n int, op string, req func() any) (ok int, refusals []error) {
		var wg sync.WaitGroup
		var mu sync.Mutex
		start := make(chan struct{})
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				_, err := s.Do(ctx, alice, op, req())
				mu.Lock()
				defer mu.Unlock()
				if err == nil {
					ok++
				} else {
					refusals = append(refusals, err)
				}
			}()
		}
		close(start)
		wg.Wait()
		return ok, refusals
	}

	created, refused := race(20, "bench.create", func() any { return &app.BenchCreateRequest{Workshop: "bb"} })
	n, _ := owned(t, s.Root, "nobody")
	if created > 8 || n > 8 {
		t.Errorf("20 creates at once with --user-benches 8: %d created, alice has %d Benches", created, n)
	}
	if created != 8 {
		t.Errorf("%d of 20 creates succeeded, want 8: %v", created, refused)
	}
	for _, err := range refused {
		if e := app.Classify(err); e.Code != app.CodeDenied || !strings.Contains(e.Error(), "you have 8 Benches, the most a user may") || e.Hint == "" {
			t.Errorf("a create over the limit: %v (hint %q)", err, e.Hint)
		}
	}
	// Room again: remove all of alice's, then the kept limit under the same race.
	ls, err := s.Do(ctx, alice, "bench.ls", &app.BenchListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range ls.(*app.BenchListResult).Benches {
		names = append(names, r.Name)
	}
	if len(names) > 0 {
		if _, err := s.Do(ctx, alice, "bench.rm", &app.BenchRemoveRequest{Benches: names}); err != nil {
			t.Fatal(err)
		}
	}
	ran, refused := race(10, "bench.run", func() any {
		return &app.BenchRunRequest{Workshop: "bb", Keep: true, Argv: []string{"sleep", "1"}}
	})
	close(stop)
	<-watched
	if _, kept := owned(t, s.Root, "nobody"); ran > 2 || kept > 2 {
		t.Errorf("10 kept runs at once with --user-kept 2: %d ran, alice keeps %d", ran, kept)
	}
	for _, err := range refused {
		if e := app.Classify(err); e.Code != app.CodeDenied || !strings.Contains(e.Error(), "you keep 2 Benches, the most a user may") {
			t.Errorf("a kept run over the limit: %v", err)
		}
	}
	if m := most.Load(); m > 8 {
		t.Errorf("alice had %d Benches at one moment, with --user-benches 8", m)
	}
	// An operator is not bounded by the users' limits, nor counted in a user's (the launches below).
	operator := &app.Call{Caller: &app.Caller{User: "root", Role: app.Operator, Dir: "/"}}
	if _, err := s.Do(ctx, operator, "bench.create", &app.BenchCreateRequest{Workshop: "bb", Name: "ops-1"}); err != nil {
		t.Errorf("an operator's create: %v", err)
	}
	// Every slot came back: with room for one more Bench, launches one after another (failing: an
	// unknown command) all get it.
	_, kept := owned(t, s.Root, "nobody")
	s.UserBenches = kept + 1
	for range 3 {
		if _, err := s.Do(ctx, alice, "bench.run", &app.BenchRunRequest{Workshop: "bb", Argv: []string{"/no/such/command"}}); app.Classify(err).Code == app.CodeDenied {
			t.Errorf("a launch after failed ones was refused: %v", err)
		}
	}
}

// TestWriteFilesOneCommand: an upload of 2,000 one-byte files is one bench.write_files: one command
// in the Bench and one audit entry (not 2,000 of each), and every file is there with its bytes, a long
// path and a mode too. A request over the bounds (files, bytes) is refused and writes nothing; a
// path cannot leave the Bench through a symlink in it; another user's Bench is refused.
func TestWriteFilesOneCommand(t *testing.T) {
	s := benchService(t)
	s.Audit = audit.Open(s.Root)
	ctx := context.Background()
	alice := &app.Call{Caller: &app.Caller{UID: 1001, User: "nobody", Role: app.User, Dir: "/"}}
	res, err := s.Do(ctx, alice, "bench.create", &app.BenchCreateRequest{Workshop: "bb", Name: "up"})
	if err != nil {
		t.Fatal(err)
	}
	name := res.(*app.BenchCreateResult).Bench
	sh := func(script string) string {
		t.Helper()
		res, err := s.Do(ctx, alice, "bench.exec", &app.BenchExecRequest{Bench: name, Shell: script, Capture: true})
		if err != nil {
			t.Fatal(err)
		}
		return res.(*app.ExecResult).Stdout
	}
	entries := func(event string) int {
		t.Helper()
		res, err := s.Do(ctx, &app.Call{Caller: &app.Caller{User: "root", Role: app.Operator}}, "audit.ls", &app.AuditRequest{Bench: name})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, e := range res.(*app.AuditResult).Entries {
			if e.Event == event {
				n++
			}
		}
		return n
	}

	var files []app.FileWrite
	want := map[string]string{}
	for i := range 2000 {
		f := app.FileWrite{Path: fmt.Sprintf("/root/up/d%02d/f%04d", i%20, i), Content: string(rune('a' + i%26))}
		files = append(files, f)
		want[f.Path] = f.Content
	}
	long := "/root/up/" + strings.Repeat("long-name-", 20) + "/x.sh"
	files = append(files, app.FileWrite{Path: long, Content: "#!/bin/sh\necho ran\n", Mode: "0755"})
	res, err = s.Do(ctx, alice, "bench.write_files", &app.WriteFilesRequest{Bench: name, Files: files})
	if err != nil {
		t.Fatal(err)
	}
	if got := res.(*app.WriteFilesResult).Paths; len(got) != len(files) || got[0] != files[0].Path || got[len(got)-1] != long {
		t.Errorf("paths written: %d, first %q", len(got), got[:min(1, len(got))])
	}
	if n, m := entries("bench.write_files"), entries("bench.write_file"); n != 1 || m != 0 {
		t.Errorf("2,001 files written: %d bench.write_files and %d bench.write_file audit entries, want one and none", n, m)
	}
	var paths []string
	for p := range want {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	var all strings.Builder
	for _, p := range paths {
		all.WriteString(want[p])
	}
	out := sh(`find /root/up -type f -name 'f*' | sort > /tmp/l; wc -l < /tmp/l; xargs cat < /tmp/l; echo; ` + long)
	if wantOut := "2000\n" + all.String() + "\nran\n"; strings.TrimLeft(out, " ") != wantOut {
		t.Errorf("the files in the Bench:\n%.200q\nwant\n%.200q", out, wantOut)
	}

	// Over the bounds: refused whole, nothing written.
	many := make([]app.FileWrite, app.MaxWriteFiles+1)
	for i := range many {
		many[i] = app.FileWrite{Path: fmt.Sprintf("/root/over/f%d", i), Content: "x"}
	}
	big := []app.FileWrite{{Path: "/root/over/a", Content: strings.Repeat("x", app.MaxWriteBytes/2)}, {Path: "/root/over/b", Content: strings.Repeat("x", app.MaxWriteBytes/2+1)}}
	for what, fs := range map[string][]app.FileWrite{"too many files": many, "too many bytes": big} {
		_, err := s.Do(ctx, alice, "bench.write_files", &app.WriteFilesRequest{Bench: name, Files: fs})
		if e := app.Classify(err); e.Code != app.CodeUsage || e.Hint == "" {
			t.Errorf("%s: %v, want a usage error with a hint", what, err)
		}
	}
	if got := sh("[ -e /root/over ] && echo written || echo nothing"); got != "nothing\n" {
		t.Errorf("requests over the bounds: %s", got)
	}

	// A symlink in the Bench to a host directory resolves in the Bench: the host's stays empty.
	host := t.TempDir()
	sh("ln -s " + host + " /root/esc")
	s.Do(ctx, alice, "bench.write_files", &app.WriteFilesRequest{Bench: name, Files: []app.FileWrite{{Path: "/root/esc/pwned", Content: "x"}, {Path: "/root/../../.." + host + "/pwned2", Content: "x"}}})
	if ents, _ := os.ReadDir(host); len(ents) != 0 {
		t.Errorf("a write in the Bench reached the host: %v", ents)
	}

	// Another user's Bench is refused, and nothing is written.
	bob := &app.Call{Caller: &app.Caller{UID: 1002, User: "bob", Role: app.User, Dir: "/"}}
	_, err = s.Do(ctx, bob, "bench.write_files", &app.WriteFilesRequest{Bench: name, Files: []app.FileWrite{{Path: "/root/bob", Content: "x"}}})
	if app.Classify(err).Code != app.CodeDenied {
		t.Errorf("bob's write in alice's Bench: %v", err)
	}
	if got := sh("[ -e /root/bob ] && echo written || echo nothing"); got != "nothing\n" {
		t.Errorf("bob's refused write: %s", got)
	}
}
