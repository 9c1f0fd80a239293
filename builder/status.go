package builder

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"
)

// Status shows the one long step that runs now (a build, a lock's resolution, a substitution) while
// it runs. The step's start and end lines are printed by others (Builder.Step, the notices of package
// app), so Begin comes before the start line and End before the end line, and when either returns
// nothing of the status is on the terminal. What Begin names shows only once the step has run a
// moment (TerminalProgress: a second): a step shorter than that shows nothing, and a start line that
// travels further (the supervisor sends its notices to its client, which prints them) is printed
// before the status draws.
type Status interface {
	// Begin: a step starts (what: "building jq (layer)"), and the one before, if any, has ended.
	Begin(what string)
	// Write takes the step's own output, whose latest line shows. It never fails.
	Write(p []byte) (int, error)
	// Bytes: a step that downloads has done bytes of total (0: not known yet).
	Bytes(done, total int64)
	// End: the step ended.
	End()
}

// spinner is the status line's first column, a frame per redraw.
var spinner = []string{"⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"}

// maxLine bounds the output kept of a line not ended yet.
const maxLine = 4096

// stepLine is the step that runs now, and its line on the terminal.
type stepLine struct {
	what  string
	start time.Time

	mu          sync.Mutex // the fields below: mpb's renderer reads them while the step writes
	latest      string     // the latest line of output, made fit for a terminal line
	partial     []byte     // output after the latest line's end
	bytes       bool       // Bytes was called: show them rather than the output
	done, total int64
	frame       int

	// drawing, under TerminalProgress.mu
	p     *mpb.Progress
	bar   *mpb.Bar
	timer *time.Timer
}

// Begin starts drawing what's line (on a terminal only: a log gets the step's lines only).
func (t *TerminalProgress) Begin(what string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.step.hide()
	t.step = nil
	if !t.tty {
		return
	}
	t.step = &stepLine{what: what, start: time.Now()}
	if t.p == nil { // while download bars are drawn, the line shows after them (Done)
		t.step.show(t)
	}
}

// End erases the step's line.
func (t *TerminalProgress) End() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.step.hide()
	t.step = nil
}

// Write keeps the latest line of p for the step's line.
func (t *TerminalProgress) Write(p []byte) (int, error) {
	t.mu.Lock()
	st := t.step
	t.mu.Unlock()
	if st != nil {
		st.write(p)
	}
	return len(p), nil
}

// Bytes shows done of total on the step's line.
func (t *TerminalProgress) Bytes(done, total int64) {
	t.mu.Lock()
	st := t.step
	t.mu.Unlock()
	if st != nil {
		st.mu.Lock()
		st.bytes, st.done, st.total = true, done, total
		st.mu.Unlock()
	}
}

// show draws st's line from a moment on, redrawn a few times a second.
func (st *stepLine) show(t *TerminalProgress) {
	if st == nil || st.p != nil {
		return
	}
	delay := make(chan any)
	st.timer = time.AfterFunc(t.statusDelay, func() { close(delay) })
	st.p = mpb.New(mpb.WithOutput(t.w), mpb.WithConsoleWriter(newTermWriter(t.w)), mpb.WithRenderDelay(delay),
		mpb.WithRefreshRate(200*time.Millisecond))
	// One bar with no filler and no total (it never completes): its only decorator is the whole
	// line, which mpb cuts to the terminal's width.
	st.bar = st.p.New(0, mpb.NopStyle(), mpb.BarFillerTrim(), mpb.PrependDecorators(decor.Any(func(decor.Statistics) string {
		return st.line(time.Now())
	})))
}

// hide erases st's line: when it returns, nothing of it is on the terminal.
func (st *stepLine) hide() {
	if st == nil || st.p == nil {
		return
	}
	st.timer.Stop()
	// The only bar, aborted and dropped: the container's last redraw erases its line, and Wait
	// returns after it.
	st.bar.Abort(true)
	st.p.Wait()
	st.p, st.bar, st.timer = nil, nil, nil
}

// line is st's line as it is at now: "⠹ building jq (layer) 12 s: Unpacking jq (1.6-2.1) ...", or
// for a download "⠹ substituting jq (layer) from oci://… 3 s: 12.0 MiB / 20.1 MiB".
func (st *stepLine) line(now time.Time) string {
	st.mu.Lock()
	defer st.mu.Unlock()
	f := spinner[st.frame%len(spinner)]
	st.frame++
	l := fmt.Sprintf("%s %s %d s", f, st.what, int(now.Sub(st.start).Seconds()))
	switch {
	case st.bytes && st.total > 0:
		l += fmt.Sprintf(": %s / %s", FormatBytes(st.done), FormatBytes(st.total))
	case st.bytes:
		l += ": " + FormatBytes(st.done)
	default:
		if p := cleanLine(st.partial); shows(p) {
			l += ": " + p
		} else if st.latest != "" {
			l += ": " + st.latest
		}
	}
	return l
}

// write splits p into lines (at \n and at \r, which a progress meter redraws its line with) and
// keeps the latest that shows something.
func (st *stepLine) write(p []byte) {
	st.mu.Lock()
	defer st.mu.Unlock()
	for len(p) > 0 {
		i := bytes.IndexAny(p, "\r\n")
		if i < 0 {
			st.partial = append(st.partial, p[:min(len(p), maxLine-len(st.partial))]...)
			return
		}
		st.partial = append(st.partial, p[:min(i, maxLine-len(st.partial))]...)
		if l := cleanLine(st.partial); shows(l) {
			st.latest = l
		}
		st.partial, p = st.partial[:0], p[i+1:]
	}
}

// shows says whether a line of output is one for the status: not a blank one, and not the proxy's
// log of each connection, which shed writes beside the build's output (a seed's build would show
// little else).
func shows(l string) bool { return l != "" && !strings.HasPrefix(l, "shed: network: ") }

// cleanLine makes a line of a build's output safe and fit for one terminal line: escape sequences
// (colours, cursor moves, titles) and every other control or formatting character go, a tab is a
// space, and so is what is not UTF-8; spaces at either end are trimmed. A build runs code from
// packages: what it prints must not drive the terminal of whoever watches it.
func cleanLine(b []byte) string {
	var sb strings.Builder
	for i := 0; i < len(b); {
		if b[i] == 0x1b { // ESC
			i = skipEscape(b, i)
			continue
		}
		r, n := utf8.DecodeRune(b[i:])
		i += n
		switch {
		case r == utf8.RuneError && n == 1, r == '\t':
			sb.WriteByte(' ')
		case r == 0x9b: // CSI in one character: its parameters are skipped as ESC [ ones are
			for i < len(b) && (b[i] < 0x40 || b[i] > 0x7e) {
				i++
			}
			i++
		case unicode.IsControl(r), unicode.Is(unicode.Cf, r):
		default:
			sb.WriteRune(r)
		}
	}
	return strings.TrimSpace(sb.String())
}

// skipEscape returns the index after the escape sequence at b[i] (an ESC).
func skipEscape(b []byte, i int) int {
	i++
	if i >= len(b) {
		return i
	}
	switch c := b[i]; {
	case c == '[': // CSI: parameters and intermediates, then a final byte in @..~
		for i++; i < len(b) && (b[i] < 0x40 || b[i] > 0x7e); i++ {
		}
		return i + 1
	case c == ']', c == 'P', c == '_', c == '^', c == 'X': // OSC, DCS, …: to BEL or ESC \
		for i++; i < len(b); i++ {
			if b[i] == 0x07 {
				return i + 1
			}
			if b[i] == 0x1b && i+1 < len(b) && b[i+1] == '\\' {
				return i + 2
			}
		}
		return i
	case c >= 0x20 && c <= 0x2f: // intermediates, then a final byte
		for ; i < len(b) && b[i] >= 0x20 && b[i] <= 0x2f; i++ {
		}
		return i + 1
	default: // ESC and one byte
		return i + 1
	}
}
