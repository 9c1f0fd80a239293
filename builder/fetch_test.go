package builder

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"toolshed.dev/shed/store"
)

// testServer serves files on loopback and counts the requests it sees.
type testServer struct {
	*httptest.Server
	requests atomic.Int64
	mu       sync.Mutex
	handlers map[string]http.HandlerFunc
}

func newServer(t *testing.T) *testServer {
	t.Helper()
	ts := &testServer{handlers: map[string]http.HandlerFunc{}}
	ts.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ts.requests.Add(1)
		ts.mu.Lock()
		h := ts.handlers[r.URL.Path]
		ts.mu.Unlock()
		if h == nil {
			http.NotFound(w, r)
			return
		}
		h(w, r)
	}))
	t.Cleanup(ts.Close)
	if !strings.HasPrefix(ts.URL, "http://127.0.0.1:") {
		t.Fatalf("test server on %s, want loopback 127.0.0.1", ts.URL)
	}
	return ts
}

func (ts *testServer) handle(path string, h http.HandlerFunc) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	ts.handlers[path] = h
}

// serve makes path answer data.
func (ts *testServer) serve(path string, data []byte) string {
	ts.handle(path, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(data)))
		w.Write(data)
	})
	return ts.URL + path
}

func newTestStore(t *testing.T) *store.Store {
	t.Helper()
	s, err := store.Init(filepath.Join(t.TempDir(), "root"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func sha256Hex(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// fetchItem is the item for data stored under name, as a fetch derivation pins it.
func fetchItem(t *testing.T, s *store.Store, name string, data []byte, urls ...string) FetchItem {
	t.Helper()
	sum := sha256Hex(data)
	p, err := store.MakePath("fixed:sha256", sum, s.StoreDir(), name)
	if err != nil {
		t.Fatal(err)
	}
	return FetchItem{Path: p, URLs: urls, SHA256: sum, Size: int64(len(data)), Name: name + " (test)"}
}

func randomBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// checkFetched checks that p is valid, holds data, and is stored as a fetch.
func checkFetched(t *testing.T, s *store.Store, p store.Path, data []byte) {
	t.Helper()
	info, err := s.Info(p)
	if err != nil {
		t.Fatalf("%s not valid: %v", p, err)
	}
	if want := "fixed:sha256:" + sha256Hex(data); info.CA != want {
		t.Errorf("%s: CA %q, want %q", p, info.CA, want)
	}
	if len(info.References) != 0 {
		t.Errorf("%s: references %v, want none", p, info.References)
	}
	got, err := os.ReadFile(s.Location(p))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Errorf("%s: content differs (%d bytes, want %d)", p, len(got), len(data))
	}
	fi, err := os.Lstat(s.Location(p))
	if err != nil {
		t.Fatal(err)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o444 {
		t.Errorf("%s: mode %v, want a regular file 0444", p, fi.Mode())
	}
	if fi.ModTime().Unix() != 1 {
		t.Errorf("%s: mtime %v, want 1", p, fi.ModTime().Unix())
	}
}

// checkNothingStored checks that no bytes and no staging are left in the store.
func checkNothingStored(t *testing.T, s *store.Store, paths ...store.Path) {
	t.Helper()
	for _, p := range paths {
		if s.IsValid(p) {
			t.Errorf("%s is valid, want absent", p)
		}
	}
	for _, d := range []string{"store", "tmp"} {
		ents, err := os.ReadDir(filepath.Join(s.Root(), d))
		if err != nil {
			t.Fatal(err)
		}
		if len(ents) != 0 {
			var names []string
			for _, e := range ents {
				names = append(names, e.Name())
			}
			t.Errorf("%s/ holds %v, want nothing", d, names)
		}
	}
}

func TestFetchParallel(t *testing.T) {
	s := newTestStore(t)
	ts := newServer(t)
	var items []FetchItem
	contents := map[store.Path][]byte{}
	var total int64
	for i := range 20 {
		data := randomBytes(uint64(i), 1000+i*7919)
		name := fmt.Sprintf("file-%02d.deb", i)
		it := fetchItem(t, s, name, data, ts.serve("/pool/"+name, data))
		if i%2 == 1 {
			it.Size = 0 // unknown sizes are fetched and checked by hash alone
		}
		items = append(items, it)
		contents[it.Path] = data
		total += int64(len(data))
	}
	res, err := Fetch(t.Context(), s, items, FetchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Fetched) != 20 || len(res.Present) != 0 || res.Bytes != total {
		t.Fatalf("first fetch: %d fetched, %d present, %d bytes; want 20, 0, %d", len(res.Fetched), len(res.Present), res.Bytes, total)
	}
	for i, p := range res.Fetched {
		if p != items[i].Path {
			t.Errorf("Fetched[%d] = %s, want %s (item order)", i, p, items[i].Path)
		}
		checkFetched(t, s, p, contents[p])
	}
	if n := ts.requests.Load(); n != 20 {
		t.Errorf("server saw %d requests, want 20", n)
	}

	res, err = Fetch(t.Context(), s, items, FetchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Fetched) != 0 || len(res.Present) != 20 || res.Bytes != 0 {
		t.Errorf("second fetch: %d fetched, %d present, %d bytes; want 0, 20, 0", len(res.Fetched), len(res.Present), res.Bytes)
	}
	if n := ts.requests.Load(); n != 20 {
		t.Errorf("second fetch made %d requests, want 0", n-20)
	}
}

func TestFetchSameFileFromTwoMirrors(t *testing.T) {
	s := newTestStore(t)
	ts := newServer(t)
	data := randomBytes(1, 4096)
	a := fetchItem(t, s, "jq.deb", data, ts.serve("/mirror-a/jq.deb", data))
	b := fetchItem(t, s, "jq.deb", data, ts.serve("/mirror-b/jq.deb", data))
	b.Name = "jq.deb (another recipe)"
	if a.Path != b.Path {
		t.Fatalf("one file, two paths: %s, %s", a.Path, b.Path)
	}
	res, err := Fetch(t.Context(), s, []FetchItem{a, b}, FetchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Fetched) != 1 || res.Fetched[0] != a.Path || len(res.Present) != 0 {
		t.Errorf("fetched %v, present %v; want [%s] and none", res.Fetched, res.Present, a.Path)
	}
	if n := ts.requests.Load(); n != 1 {
		t.Errorf("server saw %d requests, want 1", n)
	}
	checkFetched(t, s, a.Path, data)
}

func TestFetchHashMismatch(t *testing.T) {
	s := newTestStore(t)
	ts := newServer(t)
	good := randomBytes(2, 10000)
	bad := bytes.Clone(good)
	bad[5000] ^= 1 // same size: only the hash tells
	var fixed atomic.Bool
	ts.handle("/jq.deb", func(w http.ResponseWriter, r *http.Request) {
		data := bad
		if fixed.Load() {
			data = good
		}
		w.Write(data)
	})
	it := fetchItem(t, s, "jq.deb", good, ts.URL+"/jq.deb")

	for _, size := range []int64{it.Size, 0} {
		it.Size = size
		_, err := Fetch(t.Context(), s, []FetchItem{it}, FetchOptions{})
		if !errors.Is(err, ErrHashMismatch) {
			t.Fatalf("size %d: error %v, want ErrHashMismatch", size, err)
		}
		msg := err.Error()
		for _, want := range []string{ts.URL + "/jq.deb", sha256Hex(good), sha256Hex(bad), it.Name} {
			if !strings.Contains(msg, want) {
				t.Errorf("size %d: error %q does not mention %q", size, msg, want)
			}
		}
		checkNothingStored(t, s, it.Path)
	}
	if n := ts.requests.Load(); n != 2 {
		t.Errorf("a mismatch was retried: %d requests, want 2", n)
	}

	// A size that is announced wrong is refused before the download.
	ts.handle("/short.deb", func(w http.ResponseWriter, r *http.Request) { w.Write(good[:100]) })
	short := fetchItem(t, s, "jq.deb", good, ts.URL+"/short.deb")
	if _, err := Fetch(t.Context(), s, []FetchItem{short}, FetchOptions{}); !errors.Is(err, ErrHashMismatch) {
		t.Errorf("wrong Content-Length: error %v, want ErrHashMismatch", err)
	}
	checkNothingStored(t, s, it.Path)

	fixed.Store(true)
	res, err := Fetch(t.Context(), s, []FetchItem{it}, FetchOptions{})
	if err != nil {
		t.Fatalf("after the fix: %v", err)
	}
	if len(res.Fetched) != 1 {
		t.Errorf("after the fix: fetched %v", res.Fetched)
	}
	checkFetched(t, s, it.Path, good)
}

func TestFetchRefusesWrongPath(t *testing.T) {
	s := newTestStore(t)
	ts := newServer(t)
	data := []byte("data")
	it := fetchItem(t, s, "a.deb", data, ts.serve("/a.deb", data))
	other := fetchItem(t, s, "a.deb", []byte("other"), ts.URL+"/a.deb")
	it.Path = other.Path // a caller bug: the path of another hash
	_, err := Fetch(t.Context(), s, []FetchItem{it}, FetchOptions{})
	if err == nil || !strings.Contains(err.Error(), "not the fixed output") {
		t.Errorf("error %v, want a refusal of the path", err)
	}
	if n := ts.requests.Load(); n != 0 {
		t.Errorf("server saw %d requests, want 0", n)
	}
}

func TestFetchFallsBackAndGone(t *testing.T) {
	s := newTestStore(t)
	ts := newServer(t)
	data := randomBytes(3, 3000)
	gone := ts.URL + "/old/jq.deb" // no handler: 404
	ts.handle("/removed/jq.deb", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusGone) })
	it := fetchItem(t, s, "jq.deb", data, gone, ts.serve("/new/jq.deb", data))
	res, err := Fetch(t.Context(), s, []FetchItem{it}, FetchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Fetched) != 1 {
		t.Errorf("fetched %v", res.Fetched)
	}
	checkFetched(t, s, it.Path, data)

	other := randomBytes(4, 100)
	it2 := fetchItem(t, s, "jq_1.6-2.1_amd64.deb", other, gone, ts.URL+"/removed/jq.deb")
	it2.Name = "jq_1.6-2.1_amd64.deb (jq 1.6-2.1)"
	_, err = Fetch(t.Context(), s, []FetchItem{it2}, FetchOptions{})
	if !errors.Is(err, ErrGone) {
		t.Fatalf("error %v, want ErrGone", err)
	}
	for _, want := range []string{it2.Name, "no longer served by " + gone, ts.URL + "/removed/jq.deb"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if s.IsValid(it2.Path) {
		t.Error("a gone file is valid")
	}

	// One URL gone and one failing otherwise is not "gone": the file may exist.
	ts.handle("/forbidden/jq.deb", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusForbidden) })
	it2.URLs = []string{gone, ts.URL + "/forbidden/jq.deb"}
	_, err = Fetch(t.Context(), s, []FetchItem{it2}, FetchOptions{})
	if err == nil || errors.Is(err, ErrGone) || !strings.Contains(err.Error(), "403") {
		t.Errorf("error %v, want a 403 that is not ErrGone", err)
	}
}

func TestFetchRetriesTransient(t *testing.T) {
	s := newTestStore(t)
	ts := newServer(t)
	data := randomBytes(5, 20000)
	var n atomic.Int64
	ts.handle("/flaky.deb", func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) <= 2 {
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		w.Write(data)
	})
	it := fetchItem(t, s, "flaky.deb", data, ts.URL+"/flaky.deb")
	if _, err := Fetch(t.Context(), s, []FetchItem{it}, FetchOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := n.Load(); got != 3 {
		t.Errorf("server saw %d requests, want 3", got)
	}
	checkFetched(t, s, it.Path, data)
}

// cutBody answers with the full Content-Length but closes the connection
// after half the body.
func cutBody(data []byte) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		conn, bw, err := w.(http.Hijacker).Hijack()
		if err != nil {
			panic(err)
		}
		defer conn.Close()
		fmt.Fprintf(bw, "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n", len(data))
		bw.Write(data[:len(data)/2])
		bw.Flush()
	}
}

func TestFetchRetriesCutBody(t *testing.T) {
	s := newTestStore(t)
	ts := newServer(t)
	data := randomBytes(6, 50000)
	var n atomic.Int64
	cut := cutBody(data)
	ts.handle("/cut-once.deb", func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			cut(w, r)
			return
		}
		w.Write(data)
	})
	it := fetchItem(t, s, "cut.deb", data, ts.URL+"/cut-once.deb")
	it.Size = 0 // the short body is told by Content-Length alone
	if _, err := Fetch(t.Context(), s, []FetchItem{it}, FetchOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := n.Load(); got != 2 {
		t.Errorf("server saw %d requests, want 2", got)
	}
	checkFetched(t, s, it.Path, data)

	s2 := newTestStore(t)
	before := ts.requests.Load()
	ts.handle("/cut-always.deb", cut)
	it = fetchItem(t, s2, "cut.deb", data, ts.URL+"/cut-always.deb")
	_, err := Fetch(t.Context(), s2, []FetchItem{it}, FetchOptions{Retries: 1})
	if err == nil || !strings.Contains(err.Error(), "/cut-always.deb") || !strings.Contains(err.Error(), "cut after") {
		t.Fatalf("error %v, want a cut body at /cut-always.deb", err)
	}
	if got := ts.requests.Load() - before; got != 2 {
		t.Errorf("server saw %d requests, want 2 (Retries: 1)", got)
	}
	checkNothingStored(t, s2, it.Path)
}

func TestFetchOffline(t *testing.T) {
	s := newTestStore(t)
	ts := newServer(t)
	a, b := []byte("present"), []byte("missing")
	ia := fetchItem(t, s, "a.deb", a, ts.serve("/a.deb", a))
	ib := fetchItem(t, s, "b.deb", b, ts.serve("/b.deb", b))
	ic := fetchItem(t, s, "c.deb", []byte("also missing"), ts.URL+"/c.deb")
	if _, err := Fetch(t.Context(), s, []FetchItem{ia}, FetchOptions{}); err != nil {
		t.Fatal(err)
	}
	before := ts.requests.Load()

	res, err := Fetch(t.Context(), s, []FetchItem{ia, ib, ic}, FetchOptions{Offline: true})
	if !errors.Is(err, ErrOffline) {
		t.Fatalf("error %v, want ErrOffline", err)
	}
	for _, it := range []FetchItem{ib, ic} {
		if !strings.Contains(err.Error(), it.Path.String()) || !strings.Contains(err.Error(), it.Name) {
			t.Errorf("error %q does not list %s", err, it.Name)
		}
	}
	if strings.Contains(err.Error(), ia.Path.String()) {
		t.Errorf("error %q lists the present %s", err, ia.Path)
	}
	if len(res.Present) != 1 || len(res.Fetched) != 0 {
		t.Errorf("present %v, fetched %v", res.Present, res.Fetched)
	}
	if n := ts.requests.Load() - before; n != 0 {
		t.Errorf("offline fetch made %d requests", n)
	}

	res, err = Fetch(t.Context(), s, []FetchItem{ia}, FetchOptions{Offline: true})
	if err != nil || len(res.Present) != 1 {
		t.Errorf("offline with all present: %v, %+v", err, res)
	}
}

func TestFetchCancel(t *testing.T) {
	s := newTestStore(t)
	ts := newServer(t)
	data := randomBytes(7, 1<<20)
	started := make(chan struct{})
	ts.handle("/slow.deb", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(data)))
		w.Write(data[:len(data)/2])
		w.(http.Flusher).Flush()
		close(started)
		select { // hold the rest until the client gives up
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
	})
	it := fetchItem(t, s, "slow.deb", data, ts.URL+"/slow.deb")
	ctx, cancel := context.WithCancel(t.Context())
	go func() {
		<-started
		time.Sleep(50 * time.Millisecond) // let the first half land in staging
		cancel()
	}()
	start := time.Now()
	_, err := Fetch(ctx, s, []FetchItem{it}, FetchOptions{})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("error %v, want context.Canceled", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("cancel took %v", d)
	}
	checkNothingStored(t, s, it.Path)
}

// TestFetchConcurrentStoresFetchOnce has 16 goroutines, each with its own
// Store on one root. (Today the store serializes Stores of one process on
// their shared temproots/<pid> file, so they hardly overlap; the shared-Store
// and multi-process tests below are the ones that race on the path lock.)
func TestFetchConcurrentStoresFetchOnce(t *testing.T) {
	root := filepath.Join(t.TempDir(), "root")
	s0, err := store.Init(root)
	if err != nil {
		t.Fatal(err)
	}
	s0.Close()
	ts := newServer(t)
	data := randomBytes(8, 200000)
	ts.handle("/one.deb", func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(100 * time.Millisecond) // long enough for the others to wait on its lock
		w.Write(data)
	})
	it := fetchItem(t, s0, "one.deb", data, ts.URL+"/one.deb")

	var wg sync.WaitGroup
	errs := make([]error, 16)
	fetched := atomic.Int64{}
	for i := range 16 {
		wg.Go(func() {
			s, err := store.Open(root)
			if err != nil {
				errs[i] = err
				return
			}
			defer s.Close()
			res, err := Fetch(t.Context(), s, []FetchItem{it}, FetchOptions{})
			if err == nil {
				fetched.Add(int64(len(res.Fetched)))
				if len(res.Fetched)+len(res.Present) != 1 {
					err = fmt.Errorf("result %+v", res)
				}
			}
			errs[i] = err
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if n := ts.requests.Load(); n != 1 {
		t.Errorf("server saw %d requests, want 1", n)
	}
	if n := fetched.Load(); n != 1 {
		t.Errorf("%d calls report a download, want 1", n)
	}
	s, err := store.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	checkFetched(t, s, it.Path, data)
}

// TestFetchSharedStoreFetchOnce has 16 goroutines fetch through one Store, so
// that they really overlap on the path's lock.
func TestFetchSharedStoreFetchOnce(t *testing.T) {
	s := newTestStore(t)
	ts := newServer(t)
	data := randomBytes(9, 100000)
	ts.handle("/one.deb", func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(100 * time.Millisecond)
		w.Write(data)
	})
	it := fetchItem(t, s, "one.deb", data, ts.URL+"/one.deb")
	var wg sync.WaitGroup
	errs := make([]error, 16)
	for i := range 16 {
		wg.Go(func() { _, errs[i] = Fetch(t.Context(), s, []FetchItem{it}, FetchOptions{}) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if n := ts.requests.Load(); n != 1 {
		t.Errorf("server saw %d requests, want 1", n)
	}
	checkFetched(t, s, it.Path, data)
}

// TestFetchProcessesFetchOnce runs the fetch in 8 processes at once (this
// test binary, re-executed): the per-path lock is what keeps them to one download.
func TestFetchProcessesFetchOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	s := newTestStore(t)
	ts := newServer(t)
	data := randomBytes(10, 300000)
	ts.handle("/one.deb", func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(200 * time.Millisecond)
		w.Write(data)
	})
	it := fetchItem(t, s, "one.deb", data, ts.URL+"/one.deb")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var cmds []*exec.Cmd
	var outs []*bytes.Buffer
	for range 8 {
		cmd := exec.CommandContext(t.Context(), exe, "-test.run=^TestFetchHelperProcess$", "-test.v")
		cmd.Env = append(os.Environ(),
			"SHED_FETCH_HELPER=1",
			"SHED_FETCH_ROOT="+s.Root(),
			"SHED_FETCH_NAME=one.deb",
			"SHED_FETCH_SHA256="+it.SHA256,
			"SHED_FETCH_URL="+it.URLs[0],
		)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds, outs = append(cmds, cmd), append(outs, &out)
	}
	downloads := 0
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Errorf("helper %d: %v\n%s", i, err, outs[i])
		}
		downloads += strings.Count(outs[i].String(), "HELPER fetched 1")
	}
	if n := ts.requests.Load(); n != 1 {
		t.Errorf("server saw %d requests, want 1", n)
	}
	if downloads != 1 {
		t.Errorf("%d processes report a download, want 1", downloads)
	}
	checkFetched(t, s, it.Path, data)
}

// TestFetchHelperProcess is the body of TestFetchProcessesFetchOnce's processes.
func TestFetchHelperProcess(t *testing.T) {
	if os.Getenv("SHED_FETCH_HELPER") != "1" {
		t.Skip("helper process for TestFetchProcessesFetchOnce")
	}
	s, err := store.Open(os.Getenv("SHED_FETCH_ROOT"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	sum := os.Getenv("SHED_FETCH_SHA256")
	p, err := store.MakePath("fixed:sha256", sum, s.StoreDir(), os.Getenv("SHED_FETCH_NAME"))
	if err != nil {
		t.Fatal(err)
	}
	res, err := Fetch(t.Context(), s, []FetchItem{{Path: p, URLs: []string{os.Getenv("SHED_FETCH_URL")}, SHA256: sum}}, FetchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("HELPER fetched %d present %d\n", len(res.Fetched), len(res.Present))
}
