package store_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"toolshed.dev/shed/store"
)

// TestMain lets the tests run this binary as a separate shed-like process
// (crash and concurrency tests need real processes: flock and SIGKILL are
// per process).
func TestMain(m *testing.M) {
	if h := os.Getenv("STORE_TEST_HELPER"); h != "" {
		os.Exit(runHelper(h))
	}
	os.Exit(m.Run())
}

func runHelper(name string) int {
	ctx := context.Background()
	s, err := store.Open(os.Getenv("STORE_TEST_ROOT"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer s.Close()
	// A stand-in for the signer: the provenance of every path is its content hash.
	s.SetAttestor(func(info *store.PathInfo, _ any) ([]byte, error) { return []byte(info.ContentHash.String()), nil })
	switch name {
	case "add":
		info, err := s.AddDir(ctx, os.Getenv("STORE_TEST_SRC"), "src", nil)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Println(info.Path)
	case "realize":
		// Build a derived path; record each build in a log so the test can
		// count how many processes built it.
		p, _ := store.MakePath("output", "test", s.StoreDir(), "out")
		info, built, err := s.Realize(ctx, p, store.AddOptions{}, func(ctx context.Context, out string) error {
			f, err := os.OpenFile(os.Getenv("STORE_TEST_LOG"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
			if err != nil {
				return err
			}
			fmt.Fprintf(f, "built by %d\n", os.Getpid())
			f.Close()
			time.Sleep(200 * time.Millisecond) // long enough for the others to queue
			if err := os.Mkdir(out, 0o755); err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(out, "data"), []byte("payload"), 0o644)
		})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Println(info.Path, built)
	case "hold":
		// Hold a temporary root on a path until stdin closes.
		p, err := store.ParsePath(os.Getenv("STORE_TEST_PATH"))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if err := s.AddTempRoot(ctx, p); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Println("holding")
		buf := make([]byte, 1)
		os.Stdin.Read(buf)
	case "repair":
		// Put back the bytes of STORE_TEST_PATH from a copy of STORE_TEST_SRC.
		p, err := store.ParsePath(os.Getenv("STORE_TEST_PATH"))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		err = s.Repair(ctx, p, 0, func(ctx context.Context, out string) error {
			return store.CopyTree(ctx, os.Getenv("STORE_TEST_SRC"), out)
		})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	case "gc":
		if _, err := s.GC(ctx, store.GCOptions{}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	default:
		return 2
	}
	return 0
}

func helper(t *testing.T, root, name string, env ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "STORE_TEST_HELPER="+name, "STORE_TEST_ROOT="+root)
	cmd.Env = append(cmd.Env, env...)
	return cmd
}

func newStore(t *testing.T) *store.Store {
	t.Helper()
	s, err := store.Init(filepath.Join(t.TempDir(), "root"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func writeTree(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// realizeFile builds a derived path holding one file, referencing refs.
func realizeFile(t *testing.T, s *store.Store, name, content string, refs ...store.Path) store.Path {
	t.Helper()
	p, err := store.MakePath("output", name+content, s.StoreDir(), name)
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = s.Realize(context.Background(), p, store.AddOptions{References: refs}, func(ctx context.Context, out string) error {
		return os.WriteFile(out, []byte(content), 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestInitIsPrivateAndIdempotent(t *testing.T) {
	root := filepath.Join(t.TempDir(), "root")
	for i := 0; i < 2; i++ {
		s, err := store.Init(root)
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
	}
	for _, d := range []string{".", "store", "db", "roots", "temproots", "locks", "tmp", "trash", "logs"} {
		fi, err := os.Stat(filepath.Join(root, d))
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode().Perm(); got != 0o700 {
			t.Errorf("%s: got mode %04o, want 0700", d, got)
		}
	}
}

func TestOpenRefusesUnsafeStore(t *testing.T) {
	s := newStore(t)
	if err := os.Chmod(filepath.Join(s.Root(), "store"), 0o777); err != nil {
		t.Fatal(err)
	}
	_, err := store.Open(s.Root())
	if !errors.Is(err, store.ErrUnsafe) {
		t.Fatalf("open of a world-writable store: got %v, want ErrUnsafe", err)
	}
	if _, err := store.Open(filepath.Join(t.TempDir(), "none")); !errors.Is(err, store.ErrNotInitialized) {
		t.Fatalf("open of a missing store: got %v, want ErrNotInitialized", err)
	}
}

func TestAddDirIsContentAddressed(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	src := t.TempDir()
	writeTree(t, src, map[string]string{"a": "1", "d/b": "2"})
	first, err := s.AddDir(ctx, src, "src", nil)
	if err != nil {
		t.Fatal(err)
	}
	second, err := s.AddDir(ctx, src, "src", nil)
	if err != nil {
		t.Fatal(err)
	}
	if first.Path != second.Path || !first.Registered.Equal(second.Registered) {
		t.Errorf("adding the same content twice: got %s then %s, want the same registered path", first.Path, second.Path)
	}
	writeTree(t, src, map[string]string{"a": "changed"})
	third, err := s.AddDir(ctx, src, "src", nil)
	if err != nil {
		t.Fatal(err)
	}
	if third.Path == first.Path {
		t.Errorf("changed content got the same path %s", third.Path)
	}
	b, err := os.ReadFile(filepath.Join(s.Location(first.Path), "d/b"))
	if err != nil || string(b) != "2" {
		t.Errorf("stored file: got %q, %v", b, err)
	}
	fi, err := os.Lstat(filepath.Join(s.Location(first.Path), "a"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.ModTime().Unix() != store.DefaultEpoch {
		t.Errorf("mtime: got %d, want clamped to %d", fi.ModTime().Unix(), store.DefaultEpoch)
	}
}

func TestRealizeFailureStoresNothing(t *testing.T) {
	s := newStore(t)
	p, _ := store.MakePath("output", "x", s.StoreDir(), "broken")
	_, _, err := s.Realize(context.Background(), p, store.AddOptions{}, func(ctx context.Context, out string) error {
		os.WriteFile(out, []byte("half"), 0o644)
		return errors.New("builder failed")
	})
	if err == nil || !strings.Contains(err.Error(), "builder failed") {
		t.Fatalf("got %v, want the builder's error", err)
	}
	if s.IsValid(p) {
		t.Fatal("a failed build is valid")
	}
	if _, err := os.Lstat(s.Location(p)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a failed build left bytes in the store: %v", err)
	}
	ents, _ := os.ReadDir(filepath.Join(s.Root(), "tmp"))
	if len(ents) != 0 {
		t.Errorf("a failed build left %d staging entries", len(ents))
	}
}

// TestRealizeWithManifest: a build that checked its output against a manifest as it wrote it
// (cache.ReadLayer) registers it with that manifest, not a scan of its own; an output whose root
// is not of the manifest's type is refused.
func TestRealizeWithManifest(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	src := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(src, []byte("bytes"), 0o444); err != nil {
		t.Fatal(err)
	}
	if err := store.ClampTimes(src, store.DefaultEpoch); err != nil {
		t.Fatal(err)
	}
	m, err := store.ScanTree(ctx, src)
	if err != nil {
		t.Fatal(err)
	}
	p, _ := store.MakePath("output", "m", s.StoreDir(), "m")
	bad, _ := store.MakePath("output", "n", s.StoreDir(), "n")
	_, _, err = s.Realize(ctx, bad, store.AddOptions{Manifest: m}, func(ctx context.Context, out string) error {
		return os.Mkdir(out, 0o755)
	})
	if err == nil || !strings.Contains(err.Error(), "is not the file its manifest says") || s.IsValid(bad) {
		t.Fatalf("a directory registered with a file's manifest: %v", err)
	}
	info, built, err := s.Realize(ctx, p, store.AddOptions{Manifest: m}, func(ctx context.Context, out string) error {
		b, err := os.ReadFile(src)
		if err != nil {
			return err
		}
		if err := os.WriteFile(out, b, 0o444); err != nil {
			return err
		}
		return store.ClampTimes(out, store.DefaultEpoch)
	})
	if err != nil || !built {
		t.Fatalf("realize: %v, built %v", err, built)
	}
	if info.ContentHash != m.Hash() || info.Size != m.Size() {
		t.Errorf("registered %s (%d bytes), want the manifest's %s (%d)", info.ContentHash, info.Size, m.Hash(), m.Size())
	}
	got, err := s.Manifest(p)
	if err != nil || got.Hash() != m.Hash() {
		t.Errorf("stored manifest %v, %v", got, err)
	}
}

func TestRegisterRefusesInvalidReference(t *testing.T) {
	s := newStore(t)
	missing, _ := store.MakePath("output", "nope", s.StoreDir(), "missing")
	p, _ := store.MakePath("output", "y", s.StoreDir(), "y")
	_, _, err := s.Realize(context.Background(), p, store.AddOptions{References: []store.Path{missing}}, func(ctx context.Context, out string) error {
		return os.WriteFile(out, nil, 0o644)
	})
	if !errors.Is(err, store.ErrNotExist) {
		t.Fatalf("got %v, want ErrNotExist for a reference that is not valid", err)
	}
}

func TestGCKeepsRootedClosureAndDeletesTheRest(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	dep := realizeFile(t, s, "dep", "d")
	top := realizeFile(t, s, "top", "t", dep)
	dead := realizeFile(t, s, "dead", "x")
	deadTop := realizeFile(t, s, "deadtop", "y", dead)
	if err := s.AddRoot(ctx, "mine", top); err != nil {
		t.Fatal(err)
	}
	s.Close() // drop this process's temporary roots on what it built

	dry, err := s.GC(ctx, store.GCOptions{DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := fmt.Sprint(dry.Deleted), fmt.Sprint([]store.Path{deadTop, dead}); got != want {
		t.Errorf("dry run: got %s, want %s (referrers first)", got, want)
	}
	if !s.IsValid(dead) {
		t.Fatal("dry run deleted a path")
	}
	for _, suffix := range []string{"", ".check", ".repair"} {
		os.WriteFile(s.LogFile(dead)+suffix, []byte("log"), 0o600)
	}
	res, err := s.GC(ctx, store.GCOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, suffix := range []string{"", ".check", ".repair"} {
		if _, err := os.Lstat(s.LogFile(dead) + suffix); err == nil {
			t.Errorf("gc left the log %s", s.LogFile(dead)+suffix)
		}
	}
	if len(res.Deleted) != 2 || res.Freed != 2 {
		t.Errorf("gc: got deleted %v freed %d, want 2 paths, 2 bytes", res.Deleted, res.Freed)
	}
	for _, p := range []store.Path{top, dep} {
		if !s.IsValid(p) {
			t.Errorf("%s was rooted and is gone", p)
		}
	}
	for _, p := range []store.Path{dead, deadTop} {
		if _, err := os.Lstat(s.Location(p)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s survived gc", p)
		}
	}
	if err := s.RemoveRoot("mine"); err != nil {
		t.Fatal(err)
	}
	res, err = s.GC(ctx, store.GCOptions{MaxFreed: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Deleted) != 1 || res.Deleted[0] != top || !s.IsValid(dep) {
		t.Errorf("max-freed 1: got %v, want only the referrer %s deleted", res.Deleted, top)
	}
	assertVerifies(t, s)
}

func assertVerifies(t *testing.T, s *store.Store) {
	t.Helper()
	res, err := s.Verify(context.Background(), store.VerifyOptions{CheckContents: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Problems) > 0 {
		t.Fatalf("verify: %v", res.Problems)
	}
}

func TestVerifyNamesCorruptFile(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	src := t.TempDir()
	writeTree(t, src, map[string]string{"usr/bin/tool": "good", "etc/conf": "c"})
	info, err := s.AddDir(ctx, src, "src", nil)
	if err != nil {
		t.Fatal(err)
	}
	other := realizeFile(t, s, "other", "o")
	assertVerifies(t, s)
	loc := s.Location(info.Path)
	if err := os.WriteFile(filepath.Join(loc, "usr/bin/tool"), []byte("evil"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chtimes(filepath.Join(loc, "usr/bin/tool"), time.Unix(1, 0), time.Unix(1, 0))
	os.Remove(filepath.Join(loc, "etc/conf"))
	// Plain verify checks presence and records only.
	res, err := s.Verify(ctx, store.VerifyOptions{})
	if err != nil || len(res.Problems) != 0 {
		t.Fatalf("plain verify: got %v, %v; want no problems (contents not checked)", res.Problems, err)
	}
	res, err = s.Verify(ctx, store.VerifyOptions{CheckContents: true})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, p := range res.Problems {
		if p.Path != info.Path {
			t.Errorf("problem on the wrong path: %v", p)
		}
		got[p.File] = true
	}
	// etc's mtime changed too, when etc/conf was removed: also worth naming.
	if !got["usr/bin/tool"] || !got["etc/conf"] || got["usr"] || got["usr/bin"] {
		t.Errorf("got problems %v, want usr/bin/tool and etc/conf named, and nothing about usr", res.Problems)
	}
	// A path that vanished is reported by plain verify.
	os.RemoveAll(s.Location(other))
	res, _ = s.Verify(ctx, store.VerifyOptions{Paths: []store.Path{other}})
	if len(res.Problems) != 1 || !strings.Contains(res.Problems[0].What, "missing") {
		t.Errorf("got %v, want %s reported missing", res.Problems, other)
	}
}

// TestCrashAtEveryStep kills an add with SIGKILL at each step and checks that
// the store verifies and the next add completes.
func TestCrashAtEveryStep(t *testing.T) {
	for _, fp := range store.Failpoints {
		if !strings.HasPrefix(fp, "add-") {
			continue
		}
		t.Run(fp, func(t *testing.T) {
			s := newStore(t)
			src := t.TempDir()
			writeTree(t, src, map[string]string{"bin/x": "x", "lib/y": strings.Repeat("y", 100000)})
			cmd := helper(t, s.Root(), "add", "STORE_TEST_SRC="+src, store.FailpointEnv+"="+fp)
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ProcessState.String() != "signal: killed" {
				t.Fatalf("helper was not killed at %s: %v %s", fp, err, out)
			}
			assertVerifies(t, s)
			out, err = helper(t, s.Root(), "add", "STORE_TEST_SRC="+src).Output()
			if err != nil {
				t.Fatalf("rerun after crash: %v", err)
			}
			p, err := store.ParsePath(strings.TrimSpace(string(out)))
			if err != nil {
				t.Fatal(err)
			}
			if !s.IsValid(p) {
				t.Fatalf("rerun did not leave %s valid", p)
			}
			info, _ := s.Info(p)
			if prov, err := s.Provenance(p); err != nil || string(prov) != info.ContentHash.String() {
				t.Errorf("provenance after the rerun: %q, %v", prov, err)
			}
			assertVerifies(t, s)
			res, err := s.GC(context.Background(), store.GCOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if ents, _ := os.ReadDir(filepath.Join(s.Root(), "store")); len(ents) != 0 {
				t.Errorf("after gc, store/ still holds %d entries (gc result %+v)", len(ents), res)
			}
			if files := recordFiles(t, s); len(files) != 0 {
				t.Errorf("after gc, db/ still holds %v", files)
			}
			if ents, _ := os.ReadDir(filepath.Join(s.Root(), "locks")); len(ents) != 1 {
				t.Errorf("after gc, locks/ holds %d entries, want gc.lock alone", len(ents))
			}
			if left := linkEntries(t, s); len(left) != 0 {
				t.Errorf("after gc, links/ holds %v", left)
			}
		})
	}
}

// recordFiles lists the files of db/'s shards: the manifests and provenance of paths.
func recordFiles(t *testing.T, s *store.Store) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(s.Root(), "db", "*", "*"))
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func TestCrashDuringGC(t *testing.T) {
	for _, fp := range []string{"gc-unregistered", "gc-trashed"} {
		t.Run(fp, func(t *testing.T) {
			s := newStore(t)
			for i := range 5 {
				realizeFile(t, s, "p"+strconv.Itoa(i), "x")
			}
			s.Close()
			cmd := helper(t, s.Root(), "gc", store.FailpointEnv+"="+fp)
			if err := cmd.Run(); err == nil {
				t.Fatal("gc was not killed")
			}
			assertVerifies(t, s)
			if err := helper(t, s.Root(), "gc").Run(); err != nil {
				t.Fatal(err)
			}
			assertVerifies(t, s)
			if ents, _ := os.ReadDir(filepath.Join(s.Root(), "store")); len(ents) != 0 {
				t.Errorf("store/ holds %d entries after a full gc", len(ents))
			}
			if files := recordFiles(t, s); len(files) != 0 {
				t.Errorf("db/ holds %v after a full gc", files)
			}
		})
	}
}

// TestConcurrentRealizeBuildsOnce: 16 processes realize the same path; one
// builds it, the others wait and reuse it.
func TestConcurrentRealizeBuildsOnce(t *testing.T) {
	s := newStore(t)
	log := filepath.Join(t.TempDir(), "builds.log")
	const n = 16
	outs := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := helper(t, s.Root(), "realize", "STORE_TEST_LOG="+log).Output()
			outs[i], errs[i] = string(out), err
		}()
	}
	wg.Wait()
	builders := 0
	var path string
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("process %d: %v", i, errs[i])
		}
		f := strings.Fields(outs[i])
		if path == "" {
			path = f[0]
		}
		if f[0] != path {
			t.Errorf("process %d got %s, want %s", i, f[0], path)
		}
		if f[1] == "true" {
			builders++
		}
	}
	b, _ := os.ReadFile(log)
	if builds := strings.Count(string(b), "built by"); builds != 1 || builders != 1 {
		t.Errorf("got %d builds (%d processes say they built), want 1:\n%s", builds, builders, b)
	}
	assertVerifies(t, s)
}

// TestTempRootSurvivesConcurrentGC: a path held by a live process's temporary
// root survives gc; once the process exits, gc deletes it.
func TestTempRootSurvivesConcurrentGC(t *testing.T) {
	s := newStore(t)
	p := realizeFile(t, s, "held", "h")
	s.Close()
	cmd := helper(t, s.Root(), "hold", "STORE_TEST_PATH="+p.String())
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 8)
	if _, err := stdout.Read(buf); err != nil {
		t.Fatal(err)
	}
	// Run gc from several processes at once while the root is held.
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if out, err := helper(t, s.Root(), "gc").CombinedOutput(); err != nil {
				t.Errorf("gc: %v %s", err, out)
			}
		}()
	}
	wg.Wait()
	if !s.IsValid(p) {
		t.Fatal("gc deleted a path held by a live process")
	}
	stdin.Close()
	cmd.Wait()
	res, err := s.GC(context.Background(), store.GCOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Deleted) != 1 || s.IsValid(p) {
		t.Errorf("after the holder exited: got %v deleted, want %s", res.Deleted, p)
	}
}

func TestRoots(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	p := realizeFile(t, s, "r", "r")
	missing, _ := store.MakePath("output", "m", s.StoreDir(), "m")
	if err := s.AddRoot(ctx, "../evil", p); err == nil {
		t.Error("a root name with a slash was accepted")
	}
	if err := s.AddRoot(ctx, "gone", missing); !errors.Is(err, store.ErrNotExist) {
		t.Errorf("root on an invalid path: got %v, want ErrNotExist", err)
	}
	if err := s.AddRoot(ctx, "a", p); err != nil {
		t.Fatal(err)
	}
	roots, err := s.Roots()
	if err != nil || len(roots) != 1 || roots[0].Name != "a" || roots[0].Path != p {
		t.Fatalf("roots: got %v, %v", roots, err)
	}
	if err := s.RemoveRoot("nope"); !errors.Is(err, store.ErrRootNotExist) {
		t.Errorf("remove of an unknown root: got %v", err)
	}
}

// TestTwoHandlesKeepTheirRoots: two Stores open in one process each keep
// their own temporary roots (a second handle must not truncate the first's).
func TestTwoHandlesKeepTheirRoots(t *testing.T) {
	s := newStore(t)
	p := realizeFile(t, s, "first", "1")
	other, err := store.Open(s.Root())
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	q := realizeFile(t, other, "second", "2")
	third, err := store.Open(s.Root())
	if err != nil {
		t.Fatal(err)
	}
	defer third.Close()
	if _, err := third.GC(context.Background(), store.GCOptions{}); err != nil {
		t.Fatal(err)
	}
	if !s.IsValid(p) || !s.IsValid(q) {
		t.Fatalf("gc deleted a path held by another handle of this process: %v %v", s.IsValid(p), s.IsValid(q))
	}
}

// A layer's build inputs (its .debs) are freed by gc unless the store keeps
// them; what it references (the layer below) is always kept, and a freed build
// input is no problem for verify.
func TestGCFreesBuildInputsUnlessKept(t *testing.T) {
	for _, keep := range []bool{false, true} {
		t.Run(fmt.Sprintf("keep=%v", keep), func(t *testing.T) {
			s := newStore(t)
			ctx := context.Background()
			if keep {
				if err := s.UpdateConfig(func(c *store.Config) error { c.KeepBuildInputs = true; return nil }); err != nil {
					t.Fatal(err)
				}
			}
			below := realizeFile(t, s, "below", "b")
			deb2 := realizeFile(t, s, "two.deb", "2")
			deb1 := realizeFile(t, s, "one.deb", "1")
			top, err := store.MakePath("output", "top", s.StoreDir(), "top")
			if err != nil {
				t.Fatal(err)
			}
			opts := store.AddOptions{References: []store.Path{below}, BuildInputs: []store.Path{deb2, deb1, deb2}}
			info, _, err := s.Realize(ctx, top, opts, func(ctx context.Context, out string) error {
				return os.WriteFile(out, []byte("t"), 0o644)
			})
			if err != nil {
				t.Fatal(err)
			}
			want := []store.Path{deb1, deb2}
			if deb2.String() < deb1.String() {
				want = []store.Path{deb2, deb1}
			}
			if fmt.Sprint(info.BuildInputs) != fmt.Sprint(want) || fmt.Sprint(info.References) != fmt.Sprint([]store.Path{below}) {
				t.Fatalf("registered build inputs %v, references %v; want %v and [%s]", info.BuildInputs, info.References, want, below)
			}
			if err := s.AddRoot(ctx, "top", top); err != nil {
				t.Fatal(err)
			}
			s.Close()
			res, err := s.GC(ctx, store.GCOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range []store.Path{top, below} {
				if !s.IsValid(p) {
					t.Errorf("gc deleted %s, which the root needs at run time", p)
				}
			}
			for _, p := range []store.Path{deb1, deb2} {
				if s.IsValid(p) != keep {
					t.Errorf("keep_build_inputs=%v: %s valid=%v after gc (deleted %v)", keep, p, s.IsValid(p), res.Deleted)
				}
			}
			assertVerifies(t, s)
		})
	}
}

// TestValidPaths: ValidPaths answers as IsValid for each path (a record and its bytes), in one
// opening of the database.
func TestValidPaths(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	var ps []store.Path
	for _, c := range []string{"1", "2"} {
		src := t.TempDir()
		writeTree(t, src, map[string]string{"a": c})
		info, err := s.AddDir(ctx, src, "src", nil)
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, info.Path)
	}
	never, err := store.MakePath("source", strings.Repeat("0", 64), s.StoreDir(), "never")
	if err != nil {
		t.Fatal(err)
	}
	ps = append(ps, never)
	// The second's bytes gone, its record kept.
	if err := os.RemoveAll(s.Location(ps[1])); err != nil {
		t.Fatal(err)
	}
	before := s.DBOpens()
	valid, err := s.ValidPaths(ctx, ps)
	if err != nil {
		t.Fatal(err)
	}
	if n := s.DBOpens() - before; n != 1 {
		t.Errorf("ValidPaths opened the database %d times, want 1", n)
	}
	for i, p := range ps {
		if valid[i] != s.IsValid(p) {
			t.Errorf("%s: ValidPaths says %v, IsValid %v", p, valid[i], s.IsValid(p))
		}
	}
	if !valid[0] || valid[1] || valid[2] {
		t.Errorf("valid %v, want [true false false]", valid)
	}
}
