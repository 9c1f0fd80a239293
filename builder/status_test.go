package builder

import (
	"bytes"
	"io"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"toolshed.dev/shed/internal/ptytest"
)

func TestCleanLine(t *testing.T) {
	for in, want := range map[string]string{
		"  Unpacking jq (1.6-2.1) ...  ": "Unpacking jq (1.6-2.1) ...",
		"\x1b[1;31mE:\x1b[0m failed":     "E: failed",
		"a\tb":                           "a b",
		"\x1b]0;evil title\x07after":     "after",
		"\x1b]8;;http://x\x1b\\link":     "link",
		"bell\x07 and nul\x00":           "bell and nul",
		"\x1b(Bcharset":                  "charset",
		"\x1b7saved\x1b8":                "saved",
		"\u009b2Jcsi in one":             "csi in one",
		"bidi \u202eesrever":             "bidi esrever",
		"bad \xff utf-8":                 "bad   utf-8",
		"Déjà vu ⠋":                      "Déjà vu ⠋",
		"\x1b[":                          "",
	} {
		if got := cleanLine([]byte(in)); got != want {
			t.Errorf("cleanLine(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestStepLine(t *testing.T) {
	start := time.Now()
	st := &stepLine{what: "building jq (layer)", start: start}
	at := start.Add(12*time.Second + 300*time.Millisecond)
	line := func() string { return strings.TrimLeft(st.line(at), strings.Join(spinner, "")) }
	if got := line(); got != " building jq (layer) 12 s" {
		t.Errorf("before any output: %q", got)
	}
	st.write([]byte("Get:1 http://deb.debian.org jq\nUnpacking "))
	if got := line(); got != " building jq (layer) 12 s: Unpacking" {
		t.Errorf("with a line begun: %q", got)
	}
	st.write([]byte("jq ...\n\n   \nshed: network: GET deb.debian.org:80 allowed\n"))
	if got := line(); got != " building jq (layer) 12 s: Unpacking jq ..." {
		t.Errorf("blank lines and the proxy's after: %q", got)
	}
	st.write([]byte("Progress: [ 10%]\rProgress: [ 60%]\r\x1b[2K"))
	if got := line(); got != " building jq (layer) 12 s: Progress: [ 60%]" {
		t.Errorf("a meter redrawn with CR: %q", got)
	}
	st.write(bytes.Repeat([]byte("x"), 3*maxLine))
	if len(st.partial) != maxLine {
		t.Errorf("a line never ended keeps %d bytes, want %d", len(st.partial), maxLine)
	}
	// The spinner turns a frame per redraw.
	if a, b := st.line(at), st.line(at); a[:len(spinner[0])] == b[:len(spinner[0])] {
		t.Errorf("two redraws %q and %q show the same frame", a, b)
	}

	st = &stepLine{what: "substituting jq (layer) from oci://c/r", start: start}
	st.write([]byte("ignored\n"))
	st.bytes, st.done, st.total = true, 3<<20, 20<<20
	if got := line(); got != " substituting jq (layer) from oci://c/r 12 s: 3.0 MiB / 20.0 MiB" {
		t.Errorf("a download: %q", got)
	}
	st.total = 0
	if got := line(); got != " substituting jq (layer) from oci://c/r 12 s: 3.0 MiB" {
		t.Errorf("a download of a size unknown: %q", got)
	}
}

// statusTerminal is a TerminalProgress on a pty cols wide, whose steps show after delay, and a
// function that closes the pty and returns what was written to it.
func statusTerminal(t *testing.T, cols uint16, delay time.Duration) (*TerminalProgress, *os.File, func() []byte) {
	master, slave := ptytest.Open(t, 24, cols)
	var out bytes.Buffer
	read := make(chan struct{})
	go func() {
		io.Copy(&out, master) // ends with EIO once the slave is closed
		close(read)
	}()
	tp := NewTerminalProgress(slave, false)
	tp.statusDelay = delay
	return tp, slave, func() []byte {
		slave.Close()
		<-read
		return out.Bytes()
	}
}

func TestStatusTerminal(t *testing.T) {
	tp, term, closed := statusTerminal(t, 40, 100*time.Millisecond)
	io.WriteString(term, "shed: building jq (layer)...\n")
	tp.Begin("building jq (layer)")
	io.WriteString(tp, "shed: building /store/abc-jq (layer, apt)\n")
	time.Sleep(500 * time.Millisecond)
	io.WriteString(tp, "\x1b[1;31mSetting up jq (1.6-2.1) and a line far wider than the terminal\r\n")
	time.Sleep(500 * time.Millisecond)
	tp.End()
	io.WriteString(term, "shed: built jq in 1.0 s\n")
	out := closed()

	raw := string(out)
	// Cut to the terminal's 40 columns.
	for _, want := range []string{" building jq (layer) 0 s: shed: buildi…\r\n", " building jq (layer) 0 s: Setting up j…\r\n"} {
		if !strings.Contains(raw, want) {
			t.Errorf("the terminal never showed %q:\n%q", want, raw)
		}
	}
	if !strings.ContainsAny(raw, strings.Join(spinner, "")) {
		t.Errorf("no spinner:\n%q", raw)
	}
	if strings.Contains(raw, "\x1b[1;31m") {
		t.Errorf("the build's own escape sequence reached the terminal:\n%q", raw)
	}
	// Every line the status drew fit in 40 columns (a wrapped one would leave a row behind), and
	// once the step ended its line is gone: the screen shows the step's two lines only.
	want := []string{"shed: building jq (layer)...", "shed: built jq in 1.0 s"}
	if got := ptytest.Screen(out, 40); !slices.Equal(got, want) {
		t.Errorf("the screen after the step:\n%q\nwant\n%q\n(raw %q)", got, want, raw)
	}
}

func TestStatusShortStep(t *testing.T) {
	tp, _, closed := statusTerminal(t, 80, time.Second)
	tp.Begin("building jq (layer)")
	io.WriteString(tp, "output\n")
	time.Sleep(300 * time.Millisecond)
	tp.End()
	if out := closed(); len(out) > 0 {
		t.Errorf("a step shorter than the delay drew %q", out)
	}
}

func TestStatusBytesAndBars(t *testing.T) {
	tp, term, closed := statusTerminal(t, 80, 100*time.Millisecond)
	tp.Begin("substituting jq (layer) from oci://c/r")
	tp.Bytes(1024, 4096)
	time.Sleep(500 * time.Millisecond)
	// Download bars take the terminal while they are drawn, and the step's line comes back after.
	tp.Start(1, 100)
	tp.FileStart("a.deb", 100)
	tp.FileProgress("a.deb", 100)
	tp.FileDone("a.deb", nil)
	tp.Done()
	tp.Bytes(2048, 4096)
	time.Sleep(500 * time.Millisecond)
	tp.End()
	io.WriteString(term, "shed: substituted jq\n")
	out := closed()
	raw := string(out)
	for _, want := range []string{"from oci://c/r 0 s: 1.0 KiB / 4.0 KiB", "from oci://c/r 0 s: 2.0 KiB / 4.0 KiB"} {
		if !strings.Contains(raw, want) {
			t.Errorf("the terminal never showed %q:\n%q", want, raw)
		}
	}
	screen := ptytest.Screen(out, 80)
	if len(screen) == 0 || screen[len(screen)-1] != "shed: substituted jq" || !slices.ContainsFunc(screen, func(l string) bool { return strings.HasPrefix(l, "fetched 1 file, 100 B in ") }) {
		t.Errorf("the screen after the step: %q, want the fetch's summary and the step's end line", screen)
	}
	for _, l := range screen {
		if strings.Contains(l, "substituting") {
			t.Errorf("the step's line is left on the screen: %q", screen)
		}
	}
}

func TestStatusNotTerminal(t *testing.T) {
	var buf bytes.Buffer
	tp := NewTerminalProgress(&buf, false)
	tp.statusDelay = 0
	tp.Begin("building jq (layer)")
	io.WriteString(tp, "output\n")
	tp.Bytes(1, 2)
	time.Sleep(300 * time.Millisecond)
	tp.End()
	if buf.Len() > 0 {
		t.Errorf("a log got %q of a step's status", buf.String())
	}
}

// TestStatusDelayOf: SHED_PROGRESS_DELAY sets how long a step runs before its line shows; anything
// that is not a duration of zero or more leaves the second.
func TestStatusDelayOf(t *testing.T) {
	for env, want := range map[string]time.Duration{"": time.Second, "0": 0, "250ms": 250 * time.Millisecond, "-1s": time.Second, "soon": time.Second} {
		if got := statusDelayOf(env); got != want {
			t.Errorf("SHED_PROGRESS_DELAY=%q: %v, want %v", env, got, want)
		}
	}
}
