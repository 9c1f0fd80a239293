package tests

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"toolshed.dev/shed/internal/ptytest"
)

// TestRealizeOnTerminal: with stderr a terminal, a realize that locks and builds shows the step that
// runs on a line of its own, redrawn in place (a spinner, the step, its seconds, the latest line of
// its output, cut to the terminal's width), and erases it before the step's end line: what the user
// is left looking at is the lines a log gets, in order, with no status line and no escape sequence
// from the builds. (Directly and, with SHED_TEST_VIA=daemon, through the supervisor, which draws on
// its client's terminal while the client prints the lines.)
func TestRealizeOnTerminal(t *testing.T) {
	requireRoot(t)
	root := sharedRoot(t)
	// Packages no other test installs together (a layer another test built would be a cache hit), and
	// no lock yet: the realize resolves, then builds. A step's line shows after SHED_PROGRESS_DELAY
	// (100ms here, TestMain); python3's postinst, which byte-compiles for seconds, keeps the build
	// long enough for several of its lines on any machine.
	name := fmt.Sprintf("tty-%d", os.Getpid())
	file := writeFile(t, filepath.Join(t.TempDir(), "workshop.toml"), fmt.Sprintf("name = %q\nseed = \"debian/bookworm\"\n[apt]\npackages = [\"perl\", \"python3\"]\n", name))
	const cols = 160
	stdout, raw, screen := onTerminal(t, cols, shedCmd(t, root, "realize", file))
	if n := len(strings.Fields(stdout)); n != 2 {
		t.Errorf("stdout %q, want the two layers", stdout)
	}

	// The status of the lock's resolution and of the layer's build, each with an output line.
	for _, re := range []string{
		frames + ` resolving the apt packages of ` + name + ` \d+ s: \S`,
		frames + ` building apt-perl-python3 \(layer\) \d+ s: \S`,
	} {
		if !regexp.MustCompile(re).MatchString(raw) {
			t.Errorf("the terminal never showed a status line like %q:\n%q", re, raw)
		}
	}
	checkDrawn(t, raw, cols)

	// What is left on the screen: the lines, in order, and nothing of any status.
	want := []string{
		`^shed: locking: .*; resolving ` + regexp.QuoteMeta(file) + `\.\.\.$`,
		`^shed: resolving the apt packages of ` + name + ` against http://deb\.debian\.org/debian bookworm \(apt-get update, install --print-uris\)\.\.\.$`,
		`^shed: resolved ` + regexp.QuoteMeta(file) + ` in `,
		`^shed: wrote `,
		`^fetched \d+ files?, `,
		`^shed: building apt-perl-python3 \(layer\)\.\.\.$`,
		`^shed: built apt-perl-python3 in `,
		`^shed: realized ` + name + ` in .*: built `,
	}
	// Besides those: the seed's build lines (unless another test built it) and the download bars'
	// last frame, which stays above their summary.
	checkScreen(t, screen, want, `^shed: buil(ding|t) debian-|^fetching \d+ files? `)
}

// TestSubstituteOnTerminal: with stderr a terminal, a substitution shows its bytes while it
// downloads (so many of the bytes its descriptors announce), and leaves its two lines and the
// summary only.
func TestSubstituteOnTerminal(t *testing.T) {
	requireRoot(t)
	a := sharedRoot(t)
	file, _ := benchWorkshop(t)
	reg := startRegistry(t, "")
	mustShed(t, a, "copy", "--to", reg.url("tty"), file)
	b := newRoot(t)
	mustShed(t, b, "key", "trust", strings.TrimSpace(mustShed(t, a, "key", "export").stdout))
	const cols = 120
	_, raw, screen := onTerminal(t, cols, shedCmd(t, b, "realize", "--substituter", reg.url("tty"), file))
	cache := regexp.QuoteMeta(reg.url("tty"))
	status := regexp.MustCompile(frames + ` substituting apt-jq \(layer\) from ` + cache + ` \d+ s: (\d+\.\d) MiB / (\d+\.\d) MiB`)
	drawn := status.FindAllStringSubmatch(raw, -1)
	if len(drawn) == 0 {
		t.Fatalf("the terminal never showed the substitution's bytes:\n%q", raw)
	}
	// The bytes only grow, never past the total expected, nor past what the end line says was
	// downloaded (the total grows as the pull reads its references' descriptors, so the last one
	// drawn may be short of it).
	end := regexp.MustCompile(`^shed: substituted apt-jq \(layer\) from ` + cache + `: \d+ paths, \S+ \S+ in \S+ m?s \((\S+) MiB downloaded\)$`)
	var downloaded float64
	for _, l := range screen {
		if m := end.FindStringSubmatch(l); m != nil {
			downloaded, _ = strconv.ParseFloat(m[1], 64)
		}
	}
	var last float64
	for _, d := range drawn {
		done, _ := strconv.ParseFloat(d[1], 64)
		total, _ := strconv.ParseFloat(d[2], 64)
		if done < last || done > total || total > downloaded {
			t.Errorf("the status showed %s MiB of %s MiB after %.1f MiB, of %.1f MiB downloaded in all", d[1], d[2], last, downloaded)
		}
		last = done
	}
	checkDrawn(t, raw, cols)
	checkScreen(t, screen, []string{
		`^shed: substituting apt-jq \(layer\) from ` + cache + `\.\.\.$`,
		end.String(),
		`^shed: realized bench-jq in .*: substituted \d+ paths `,
	}, `^$`)
}

// frames matches a frame of the status line's spinner.
const frames = "[⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏]"

// onTerminal runs cmd with its stderr a terminal cols wide, and returns its stdout, what it wrote
// to the terminal, and the screen it left.
func onTerminal(t *testing.T, cols uint16, cmd *exec.Cmd) (stdout, raw string, screen []string) {
	t.Helper()
	master, slave := ptytest.Open(t, 24, cols)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, slave
	read := make(chan []byte)
	go func() {
		b, _ := io.ReadAll(master) // ends with EIO once every copy of the slave is closed
		read <- b
	}()
	err := cmd.Run()
	slave.Close()
	drawn := <-read
	screen = ptytest.Screen(drawn, int(cols))
	if err != nil {
		t.Fatalf("%s on a terminal: %v\nscreen:\n%s\nraw: %q", strings.Join(cmd.Args, " "), err, strings.Join(screen, "\n"), drawn)
	}
	return out.String(), string(drawn), screen
}

// checkDrawn checks what went to a terminal cols wide: every status line fits (mpb cuts it), so no
// redraw wraps, and the only escape sequences are the redraws' own (up a line, erase below).
func checkDrawn(t *testing.T, raw string, cols int) {
	t.Helper()
	for _, l := range regexp.MustCompile(frames+` [^\r\n]*`).FindAllString(raw, -1) {
		if n := len([]rune(l)); n > cols {
			t.Errorf("a status line of %d columns on a terminal of %d: %q", n, cols, l)
		}
	}
	if left := regexp.MustCompile(`\x1b\[\d*A|\x1b\[J`).ReplaceAllString(raw, ""); strings.Contains(left, "\x1b") {
		t.Errorf("an escape sequence other than the redraws' reached the terminal:\n%q", left)
	}
}

// checkScreen checks the screen a command left: no status line, the lines want matches in order,
// and besides them only lines that also match.
func checkScreen(t *testing.T, screen, want []string, also string) {
	t.Helper()
	i := 0
	for _, l := range screen {
		if regexp.MustCompile(frames).MatchString(l) {
			t.Errorf("a status line is left on the screen: %q", l)
		}
		if i < len(want) && regexp.MustCompile(want[i]).MatchString(l) {
			i++
			continue
		}
		if !regexp.MustCompile(also).MatchString(l) {
			t.Errorf("an unexpected line on the screen: %q", l)
		}
	}
	if i < len(want) {
		t.Errorf("the screen lacks a line like %q", want[i])
	}
	if t.Failed() {
		t.Logf("screen:\n%s", strings.Join(screen, "\n"))
	}
}
