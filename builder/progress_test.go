package builder

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"toolshed.dev/shed/internal/ptytest"
)

// recorder is a ProgressReporter that writes down what it hears.
type recorder struct {
	mu     sync.Mutex
	events []string
	last   map[string]int64 // last FileProgress of each file
}

func (r *recorder) add(format string, a ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, fmt.Sprintf(format, a...))
}

func (r *recorder) Start(total int, totalBytes int64) { r.add("start %d %d", total, totalBytes) }
func (r *recorder) FileStart(name string, size int64) { r.add("file-start %s %d", name, size) }
func (r *recorder) FileDone(name string, err error)   { r.add("file-done %s %v", name, err) }
func (r *recorder) Done()                             { r.add("done") }
func (r *recorder) FileProgress(name string, done int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.last == nil {
		r.last = map[string]int64{}
	}
	r.last[name] = done
}

func TestFetchProgress(t *testing.T) {
	s := newTestStore(t)
	ts := newServer(t)
	present := []byte("already here")
	a, b := randomBytes(11, 5000), randomBytes(12, 7000)
	ip := fetchItem(t, s, "present.deb", present, ts.serve("/present.deb", present))
	if _, err := Fetch(t.Context(), s, []FetchItem{ip}, FetchOptions{}); err != nil {
		t.Fatal(err)
	}
	ia := fetchItem(t, s, "a.deb", a, ts.serve("/a.deb", a))
	ib := fetchItem(t, s, "b.deb", b, ts.serve("/b.deb", b))

	rec := &recorder{}
	if _, err := Fetch(t.Context(), s, []FetchItem{ip, ia, ib}, FetchOptions{Progress: rec}); err != nil {
		t.Fatal(err)
	}
	ev := rec.events
	if len(ev) != 6 || ev[0] != "start 2 12000" || ev[5] != "done" {
		t.Fatalf("events %q, want start 2 12000, a start/done pair per fetched file, done", ev)
	}
	for _, it := range []FetchItem{ia, ib} {
		si := slices.Index(ev, fmt.Sprintf("file-start %s %d", it.Name, it.Size))
		di := slices.Index(ev, fmt.Sprintf("file-done %s <nil>", it.Name))
		if si < 0 || di < si {
			t.Errorf("events %q lack start then done of %s", ev, it.Name)
		}
		if got := rec.last[it.Name]; got != it.Size {
			t.Errorf("last progress of %s: %d, want %d", it.Name, got, it.Size)
		}
	}
	for _, e := range ev {
		if strings.Contains(e, ip.Name) {
			t.Errorf("event %q for a present file", e)
		}
	}

	// Nothing to fetch: the reporter hears nothing.
	rec = &recorder{}
	if _, err := Fetch(t.Context(), s, []FetchItem{ip, ia}, FetchOptions{Progress: rec}); err != nil {
		t.Fatal(err)
	}
	if len(rec.events) != 0 {
		t.Errorf("events %q with nothing to fetch", rec.events)
	}

	// A failed file is reported done with its error.
	rec = &recorder{}
	ic := fetchItem(t, s, "c.deb", []byte("c"), ts.URL+"/nowhere.deb")
	if _, err := Fetch(t.Context(), s, []FetchItem{ic}, FetchOptions{Progress: rec}); !errors.Is(err, ErrGone) {
		t.Fatalf("error %v, want ErrGone", err)
	}
	if len(rec.events) != 4 || !strings.HasPrefix(rec.events[2], "file-done "+ic.Name+" fetch ") {
		t.Errorf("events %q, want the failure in file-done", rec.events)
	}
}

func TestTerminalProgressPlain(t *testing.T) {
	var buf bytes.Buffer
	p := NewTerminalProgress(&buf, true)
	p.Start(3, 0)
	p.FileStart("jq_1.6-2.1_amd64.deb", 64717)
	p.FileStart("libjq1_1.6-2.1_amd64.deb", 0)
	p.FileStart("gone.deb", 10)
	p.FileProgress("jq_1.6-2.1_amd64.deb", 30000)
	p.FileProgress("libjq1_1.6-2.1_amd64.deb", 500)
	p.FileProgress("jq_1.6-2.1_amd64.deb", 64717)
	p.FileDone("jq_1.6-2.1_amd64.deb", nil)
	p.FileDone("gone.deb", ErrGone)
	p.FileDone("libjq1_1.6-2.1_amd64.deb", nil)
	p.Done()
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	want := []string{
		"fetched jq_1.6-2.1_amd64.deb 63.2 KiB",
		"failed gone.deb",
		"fetched libjq1_1.6-2.1_amd64.deb 500 B",
	}
	if len(lines) != 4 || !slices.Equal(lines[:3], want) {
		t.Fatalf("output:\n%s\nwant the lines %q and a summary", buf.String(), want)
	}
	if !regexp.MustCompile(`^fetched 2 files, 63\.7 KiB in \S+; 1 failed$`).MatchString(lines[3]) {
		t.Errorf("summary %q", lines[3])
	}
	if strings.Contains(buf.String(), "\x1b") {
		t.Error("escape codes in plain output")
	}
	// Without perFile (no --verbose), a log gets the failures and the summary only.
	buf.Reset()
	p = NewTerminalProgress(&buf, false)
	p.Start(2, 0)
	p.FileStart("a.deb", 10)
	p.FileStart("b.deb", 10)
	p.FileProgress("a.deb", 10)
	p.FileDone("a.deb", nil)
	p.FileDone("b.deb", ErrGone)
	p.Done()
	if out := buf.String(); strings.Contains(out, "fetched a.deb") || !strings.Contains(out, "failed b.deb\n") || !strings.Contains(out, "fetched 1 file") {
		t.Errorf("without perFile: %q, want the failure and the summary only", out)
	}
}

func TestFetchTerminalProgressPlain(t *testing.T) {
	s := newTestStore(t)
	ts := newServer(t)
	var items []FetchItem
	for i := range 3 {
		data := randomBytes(uint64(20+i), 2048)
		name := fmt.Sprintf("f%d.deb", i)
		items = append(items, fetchItem(t, s, name, data, ts.serve("/"+name, data)))
	}
	var buf bytes.Buffer
	if _, err := Fetch(t.Context(), s, items, FetchOptions{Progress: NewTerminalProgress(&buf, true)}); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, it := range items {
		if !strings.Contains(out, "fetched "+it.Name+" 2.0 KiB\n") {
			t.Errorf("output %q lacks a line for %s", out, it.Name)
		}
	}
	if !strings.Contains(out, "fetched 3 files, 6.0 KiB in ") || strings.Count(out, "\n") != 4 {
		t.Errorf("output %q, want 3 lines and a summary", out)
	}
}

func TestTerminalProgressBars(t *testing.T) {
	master, slave := ptytest.Open(t, 24, 100)
	defer master.Close()
	var out bytes.Buffer
	read := make(chan struct{})
	go func() {
		io.Copy(&out, master) // ends with EIO once the slave is closed
		close(read)
	}()

	p := NewTerminalProgress(slave, false)
	if !p.tty {
		t.Fatal("a pty is not taken for a terminal")
	}
	p.Start(2, 3000)
	p.FileStart("a.deb", 1000)
	p.FileStart("b.deb", 2000)
	p.FileProgress("a.deb", 500)
	time.Sleep(400 * time.Millisecond) // mpb draws every 150 ms
	p.FileProgress("a.deb", 1000)
	p.FileDone("a.deb", nil)
	p.FileProgress("b.deb", 100)
	time.Sleep(400 * time.Millisecond)
	p.FileDone("b.deb", errors.New("boom"))
	p.Done() // must not hang on the aborted bar
	slave.Close()
	<-read

	got := out.String()
	for _, want := range []string{"fetching 2 files", "a.deb", "b.deb", "failed b.deb", "fetched 1 file, 1000 B in "} {
		if !strings.Contains(got, want) {
			t.Errorf("terminal output %q lacks %q", got, want)
		}
	}
}

func TestFormatBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 64717: "63.2 KiB", 5 << 20: "5.0 MiB", 3 << 30: "3.0 GiB"} {
		if got := FormatBytes(n); got != want {
			t.Errorf("FormatBytes(%d) = %q, want %q", n, got, want)
		}
	}
}
