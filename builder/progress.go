package builder

import (
	"fmt"
	"io"
	"math"
	"os"
	"sync"
	"time"

	"github.com/vbauerster/cupwriter" // mpb's console writer (termWriter)
	// mpb rather than schollz/progressbar: a bar per active download plus a
	// total is mpb's core use (a container of concurrently updated bars with
	// remove-on-complete and printing above the bars), while progressbar draws
	// one bar per writer and would need hand-made cursor moves for several.
	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"
	"golang.org/x/term"

	"toolshed.dev/shed/internal/nospace"
)

// ProgressReporter hears about the downloads of one Fetch. Fetch calls it only
// when there is something to download (never for present paths) and
// serializes its calls, so an implementation needs no locking for one Fetch.
type ProgressReporter interface {
	// Start comes before any download: total files, and their total size
	// (0 when any size is unknown).
	Start(total int, totalBytes int64)
	// FileStart: a download begins; size 0 is unknown.
	FileStart(name string, size int64)
	// FileProgress: cumulative bytes of that file (back to 0 on a retry).
	FileProgress(name string, done int64)
	// FileDone: the download ended, verified (err nil) or failed.
	FileDone(name string, err error)
	// Done comes after the last FileDone.
	Done()
}

// NewTerminalProgress reports on w (stderr). On a terminal it draws a bar per
// active file and one in total; otherwise it prints a summary ("fetched 19
// files, 4.4 MiB in 0.6s"), and with perFile also one plain line per finished
// file ("fetched jq_1.6-2.1_amd64.deb 63.2 KiB"), so that CI logs stay
// readable. It is also a Status (status.go). It is safe for concurrent use.
func NewTerminalProgress(w io.Writer, perFile bool) *TerminalProgress {
	return &TerminalProgress{w: w, tty: isTerminal(w), perFile: perFile, statusDelay: statusDelayOf(os.Getenv("SHED_PROGRESS_DELAY"))}
}

// statusDelayOf is how long a step runs before its status line shows: SHED_PROGRESS_DELAY (a Go
// duration, 0 for every step), else a second, so that quick steps do not flicker.
func statusDelayOf(env string) time.Duration {
	if d, err := time.ParseDuration(env); err == nil && d >= 0 {
		return d
	}
	return time.Second
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(interface{ Fd() uintptr })
	return ok && f.Fd() <= math.MaxInt && term.IsTerminal(int(f.Fd()))
}

// termWriter is mpb's console writer for w, which isTerminal found a terminal: mpb itself asks only
// an *os.File for its size, and w may wrap one (the supervisor's writer to its client's terminal).
// Each redraw asks the size, so lines fit a terminal resized meanwhile rather than wrap (a wrapped
// line breaks the cursor moves that redraw the lines in place).
type termWriter struct {
	*cupwriter.Writer
	fd int
}

func newTermWriter(w io.Writer) termWriter {
	// forceTTY: the cursor moves are written whatever w is; isTerminal decided.
	return termWriter{cupwriter.New(w, true), int(w.(interface{ Fd() uintptr }).Fd())}
}

func (w termWriter) IsTerminal() bool { return true }

func (w termWriter) GetTermSize() (width, height int, err error) {
	width, height, err = term.GetSize(w.fd)
	if err != nil || width <= 0 || height <= 0 {
		return 80, 24, nil // a terminal that does not say (a new pty is 0×0)
	}
	return width, height, nil
}

// TerminalProgress draws downloads (ProgressReporter) and the step that runs (Status) on a terminal,
// and prints plain lines elsewhere.
type TerminalProgress struct {
	mu      sync.Mutex
	w       io.Writer
	tty     bool
	perFile bool // a line per file when not on a terminal (--verbose)

	start      time.Time
	total      int
	totalBytes int64
	fetched    int
	failed     int
	bytes      int64
	done       map[string]int64 // bytes so far of each active file

	// terminal only
	p        *mpb.Progress
	totalBar *mpb.Bar
	bars     map[string]*mpb.Bar
	sum      int64 // bytes so far of all files, for the total bar

	// the Status (status.go)
	step        *stepLine     // the step that runs now; nil: none
	statusDelay time.Duration // how long a step runs before its line shows
}

func (t *TerminalProgress) Start(total int, totalBytes int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.start = time.Now()
	t.total, t.totalBytes = total, totalBytes
	t.fetched, t.failed, t.bytes, t.sum = 0, 0, 0, 0
	t.done = map[string]int64{}
	if !t.tty {
		return
	}
	t.bars = map[string]*mpb.Bar{}
	t.step.hide() // a step's line and the bars do not share the terminal; Done shows it again
	t.p = mpb.New(mpb.WithOutput(t.w), mpb.WithConsoleWriter(newTermWriter(t.w)), mpb.WithWidth(100))
	counters := decor.CountersNoUnit("%d / %d files", decor.WCSyncWidth)
	barTotal := int64(total)
	if totalBytes > 0 {
		counters = decor.CountersKibiByte("% .1f / % .1f", decor.WCSyncWidth)
		barTotal = totalBytes
	}
	t.totalBar = t.p.AddBar(barTotal,
		mpb.BarPriority(math.MaxInt32), // stays below the file bars
		mpb.PrependDecorators(decor.Name(fmt.Sprintf("fetching %d %s", total, plural(total, "file", "files")), decor.WCSyncSpaceR), counters),
		mpb.AppendDecorators(decor.Percentage(decor.WCSyncWidth)),
	)
}

func (t *TerminalProgress) FileStart(name string, size int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.done[name] = 0
	if t.p == nil {
		return
	}
	counters := decor.CurrentKibiByte("% .1f", decor.WCSyncWidth)
	if size > 0 {
		counters = decor.CountersKibiByte("% .1f / % .1f", decor.WCSyncWidth)
	}
	t.bars[name] = t.p.AddBar(size,
		mpb.BarRemoveOnComplete(),
		mpb.PrependDecorators(decor.Name(name, decor.WCSyncSpaceR), counters),
		mpb.AppendDecorators(decor.Percentage(decor.WCSyncWidth)),
	)
}

func (t *TerminalProgress) FileProgress(name string, done int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done == nil {
		return
	}
	t.sum += done - t.done[name]
	t.done[name] = done
	if b := t.bars[name]; b != nil {
		b.SetCurrent(done)
		if t.totalBytes > 0 {
			t.totalBar.SetCurrent(t.sum)
		}
	}
}

func (t *TerminalProgress) FileDone(name string, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done == nil {
		return
	}
	n := t.done[name]
	delete(t.done, name)
	if err != nil {
		t.failed++
	} else {
		t.fetched++
		t.bytes += n
	}
	if t.p == nil {
		if err != nil {
			fmt.Fprintf(t.w, "failed %s\n", name) // the error itself is the caller's to print
		} else if t.perFile {
			fmt.Fprintf(t.w, "fetched %s %s\n", name, FormatBytes(n))
		}
		return
	}
	if b := t.bars[name]; b != nil {
		delete(t.bars, name)
		if err != nil {
			b.Abort(true)
			fmt.Fprintf(t.p, "failed %s\n", name) // printed above the bars
		} else {
			b.SetTotal(-1, true)
		}
	}
	if t.totalBytes <= 0 {
		t.totalBar.SetCurrent(int64(t.fetched + t.failed))
	}
}

func (t *TerminalProgress) Done() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done == nil {
		return
	}
	if t.p != nil {
		// Wait returns only when every bar is complete or aborted.
		for _, b := range t.bars {
			b.Abort(true)
		}
		t.totalBar.SetTotal(-1, true)
		t.p.Wait()
		t.p, t.totalBar, t.bars = nil, nil, nil
	}
	line := fmt.Sprintf("fetched %d %s, %s in %s", t.fetched, plural(t.fetched, "file", "files"),
		FormatBytes(t.bytes), time.Since(t.start).Round(100*time.Millisecond))
	if t.failed > 0 {
		line += fmt.Sprintf("; %d failed", t.failed)
	}
	fmt.Fprintln(t.w, line)
	t.done = nil
	t.step.show(t)
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// FormatBytes renders n in binary units with one decimal: "63.2 KiB" (nospace's rendering, the one shed uses).
func FormatBytes(n int64) string {
	if n < 0 {
		return fmt.Sprintf("%d B", n)
	}
	return nospace.FormatBytes(uint64(n))
}
