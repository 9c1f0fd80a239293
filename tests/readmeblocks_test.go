package tests

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"toolshed.dev/shed/store"
)

// TestReadmeBlocks runs the ```console blocks of README.md and docs/*.md as a reader would type
// them on a fresh machine. A line that begins with "# " is a command; the lines after it are the
// output shown for it. The commands of a file run in order in one bash (-o pipefail), as in the
// reader's terminal: a variable or a background job of one command is there for the next. They run
// in a fresh copy of the repository's files (as a fresh clone has them: no lock of an earlier run),
// with this test's shed first on PATH and SHED_ROOT a new store root of the file's own. A command
// that fails fails the test, unless the output shown for it is an error, and then it must fail; each
// line of output shown must match a line it printed, loosely and in order (see shownPattern).
//
// A block that cannot run unattended is marked by the line before its fence, `<!-- not run: WHY,
// see TestX -->`, naming the test that covers what it shows; keep such markers rare. The commands
// that want a person at a terminal get one (script(1)) and what atTerminal types.
func TestReadmeBlocks(t *testing.T) {
	parallel(t) // see parallelTests in main_test.go
	requireRoot(t)
	for _, tool := range []string{"bash", "git", "script"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is needed to run the README's blocks: %v", tool, err)
		}
	}
	clone := cloneRepo(t)
	tests := definedTests(t, clone)
	docs, err := filepath.Glob(filepath.Join(clone, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files := []string{"README.md"}
	for _, d := range docs {
		files = append(files, must(filepath.Rel(clone, d)))
	}
	undoHostChanges(t)
	for _, file := range files {
		blocks, err := consoleBlocks(string(must(os.ReadFile(filepath.Join(clone, file)))))
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if len(blocks) == 0 {
			continue
		}
		t.Run(file, func(t *testing.T) {
			for _, b := range blocks {
				if b.skip == "" {
					continue
				}
				name := regexp.MustCompile(`\bTest[A-Z]\w*`).FindString(b.skip)
				if name == "" || !tests[name] {
					t.Errorf("%s:%d: a block not run must name the test that covers it, a test of this repository: %q", file, b.line, b.skip)
				}
				t.Logf("%s:%d: not run: %s", file, b.line, b.skip)
			}
			root := filepath.Join(t.TempDir(), "root")
			sh := startShell(t, clone, []string{
				"PATH=" + filepath.Dir(shedBin) + ":" + os.Getenv("PATH"),
				"SHED_ROOT=" + root,
				// On a fresh machine no supervisor listens; one of this machine's must not answer.
				"SHED_SOCKET=none",
				// The reader pages a long diff and quits the pager; what the test types is the answer.
				"SHED_PAGER=cat",
			})
			for _, b := range blocks {
				if b.skip != "" {
					continue
				}
				for _, c := range b.cmds {
					runShown(t, sh, file, root, c)
				}
			}
		})
	}
}

// atTerminal is what the test types for the commands that want a person at a terminal, as the
// reader would; the output must then show want.
var atTerminal = []struct{ prefix, typed, want string }{
	// An interactive shell in a Bench: a line it runs, then exit.
	{"shed bench shell", "echo in-the-bench-$((6*7)); exit\n", "in-the-bench-42"},
	// The human who read the diff confirms it.
	{"shed workshop promote", "yes\n", ""},
}

// runShown runs one command of a block and checks it against what the block shows for it.
func runShown(t *testing.T, sh *shell, file, root string, c shownCommand) {
	t.Helper()
	where := fmt.Sprintf("%s:%d: # %s", file, c.line, c.text)
	if out, err := exec.Command("bash", "-n", "-c", c.text).CombinedOutput(); err != nil {
		t.Fatalf("%s: not a complete bash command: %v\n%s", where, err, out)
	}
	typed, want := "", ""
	terminal := false
	for _, a := range atTerminal {
		if strings.HasPrefix(c.text, a.prefix) {
			terminal, typed, want = true, a.typed, a.want
		}
	}
	start := time.Now()
	out, code := sh.run(t, c.text, terminal, typed)
	t.Logf("%s: exit %d in %.1f s", where, code, time.Since(start).Seconds())
	wantFail := false
	for _, l := range c.shown {
		wantFail = wantFail || strings.HasPrefix(l.text, "shed: error:")
	}
	switch {
	case wantFail && code == 0:
		t.Fatalf("%s: exit 0, but the block shows an error\noutput:\n%s", where, out)
	case !wantFail && code != 0:
		t.Fatalf("%s: exit %d\noutput:\n%s", where, code, out)
	}
	if want != "" && !strings.Contains(out, want) {
		t.Errorf("%s: typed %q, the output lacks %q:\n%s", where, typed, want, out)
	}
	lines := strings.Split(lsDate.ReplaceAllString(out, "DATE"), "\n")
	next, after := 0, ""
	for _, l := range c.shown {
		re := shownPattern(l.text, root)
		if re == nil {
			continue
		}
		i := next
		for i < len(lines) && !re.MatchString(lines[i]) {
			i++
		}
		if i == len(lines) {
			t.Errorf("%s: no line of the output%s matches line %d, %q (as %s)\noutput:\n%s", where, after, l.line, l.text, re, out)
			continue
		}
		next, after = i+1, fmt.Sprintf(" after the one that matched line %d", l.line)
	}
}

// A consoleBlock is a ```console block of a Markdown file.
type consoleBlock struct {
	line int    // of its opening fence
	skip string // why it is not run, from the marker before it
	cmds []shownCommand
}

// A shownCommand is a command of a block and the output the block shows for it.
type shownCommand struct {
	line  int
	text  string
	shown []shownLine
}

type shownLine struct {
	line int
	text string
}

var notRun = regexp.MustCompile(`^<!-- not run: (.+) -->$`)

// consoleBlocks returns the ```console blocks of a Markdown text.
func consoleBlocks(text string) ([]consoleBlock, error) {
	var blocks []consoleBlock
	var cur *consoleBlock
	skip, skipLine := "", 0
	for i, l := range strings.Split(text, "\n") {
		n := i + 1
		if cur != nil {
			switch {
			case l == "```":
				blocks = append(blocks, *cur)
				cur = nil
			case strings.HasPrefix(l, "# "):
				cur.cmds = append(cur.cmds, shownCommand{line: n, text: strings.TrimPrefix(l, "# ")})
			case len(cur.cmds) == 0:
				if cur.skip == "" {
					return nil, fmt.Errorf("line %d: a console block's first line is a command, \"# CMD\" (or mark the block <!-- not run: WHY, see TestX -->)", n)
				}
			default:
				c := &cur.cmds[len(cur.cmds)-1]
				c.shown = append(c.shown, shownLine{n, l})
			}
			continue
		}
		if m := notRun.FindStringSubmatch(l); m != nil {
			skip, skipLine = m[1], n
			continue
		}
		if l == "```console" {
			cur = &consoleBlock{line: n, skip: skip}
			skip = ""
			continue
		}
		if strings.TrimSpace(l) != "" && skip != "" {
			return nil, fmt.Errorf("line %d: a not-run marker must be right before a ```console block", skipLine)
		}
	}
	if cur != nil {
		return nil, fmt.Errorf("line %d: the console block is not closed", cur.line)
	}
	if skip != "" {
		return nil, fmt.Errorf("line %d: a not-run marker must be right before a ```console block", skipLine)
	}
	return blocks, nil
}

var (
	// lsDate is the time of `ls -l`, in the output shown and in the output printed.
	lsDate = regexp.MustCompile(`\b(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) +\d{1,2} +(\d{1,2}:\d\d|\d{4})\b`)
	// varying are the parts of a shown word that stand for something else in a real run: the default
	// store root (the test's own instead); a value abbreviated with "..." (an id, a key, a hash: what
	// precedes the dots in the word is its start); a store hash.
	varying = regexp.MustCompile(regexp.QuoteMeta(store.DefaultRoot) + `|[0-9A-Za-z+]*\.\.\.|[0-9a-z]{32}`)
)

// shownPattern is what a line of output shown in a block asks of a line the command printed, or nil
// for nothing. A line of one word is that word, the whole line; a line of several words is its words in
// order, except the ones that vary from run to run: those that begin with a digit (times, sizes,
// counts, versions) and a lone "..." (lines left out). In either, a word's varying parts match what
// they stand for.
func shownPattern(line, root string) *regexp.Regexp {
	fields := strings.Fields(lsDate.ReplaceAllString(line, "DATE"))
	var words []string
	for _, f := range fields {
		if f == "..." || len(fields) > 1 && startsWithDigit(f) {
			continue
		}
		var b strings.Builder
		last := 0
		for _, m := range varying.FindAllStringIndex(f, -1) {
			b.WriteString(regexp.QuoteMeta(f[last:m[0]]))
			switch v := f[m[0]:m[1]]; {
			case v == store.DefaultRoot:
				b.WriteString(regexp.QuoteMeta(root))
			case strings.HasSuffix(v, "..."):
				b.WriteString(`.*`)
			default:
				b.WriteString(`[0-9a-z]{32}`)
			}
			last = m[1]
		}
		b.WriteString(regexp.QuoteMeta(f[last:]))
		words = append(words, b.String())
	}
	switch {
	case len(words) == 0:
		return nil
	case len(fields) == 1:
		return regexp.MustCompile(`^\s*` + words[0] + `\s*$`)
	}
	return regexp.MustCompile(strings.Join(words, `.*`))
}

func startsWithDigit(word string) bool {
	w := strings.TrimLeft(word, `(["'`)
	return w != "" && w[0] >= '0' && w[0] <= '9'
}

// shell is one bash that runs a file's commands one after another, as the reader's terminal does.
type shell struct {
	cmd     *exec.Cmd
	script  *os.File    // bash reads its commands from this pipe
	status  chan string // "EXIT N" after each command
	exited  chan error
	out     *os.File // what bash and its commands print, stdout and stderr in order
	scratch string
	n       int
}

func startShell(t *testing.T, dir string, env []string) *shell {
	t.Helper()
	scratch := t.TempDir()
	out := must(os.Create(filepath.Join(scratch, "output")))
	t.Cleanup(func() { out.Close() })
	scriptR, scriptW := must2(os.Pipe())
	statusR, statusW := must2(os.Pipe())
	// The commands come on fd 3, and each one's exit status goes out on fd 4; the commands' stdin is
	// /dev/null, so that none reads the commands after it. Output goes to a file, not a pipe: a
	// background job that keeps it open (a server a block starts) does not hold up the test.
	cmd := exec.Command("bash", "-o", "pipefail", "/dev/fd/3")
	cmd.ExtraFiles = []*os.File{scriptR, statusW}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	// Its own process group, with every job it starts: all are killed when the test ends.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	scriptR.Close()
	statusW.Close()
	s := &shell{cmd: cmd, script: scriptW, status: make(chan string), exited: make(chan error, 1), out: out, scratch: scratch}
	go func() {
		lines := bufio.NewScanner(statusR)
		for lines.Scan() {
			s.status <- lines.Text()
		}
		statusR.Close()
	}()
	go func() { s.exited <- cmd.Wait() }()
	t.Cleanup(func() {
		scriptW.Close()
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-s.exited
	})
	// Every variable is exported, so that a command run at a terminal (in a shell of script(1)'s)
	// sees the variables of the ones before it.
	s.write(t, "set -a\n")
	return s
}

func (s *shell) write(t *testing.T, text string) {
	t.Helper()
	if _, err := io.WriteString(s.script, text); err != nil {
		t.Fatalf("write to the shell: %v", err)
	}
}

// commandTimeout is longer than any command of the docs takes (the README's first realize builds a
// seed: a minute), and catches one waiting forever.
const commandTimeout = 5 * time.Minute

// run runs command line in the shell and returns what it printed and its exit code. At a terminal,
// the command runs in a bash under script(1), with typed as what is typed at it.
func (s *shell) run(t *testing.T, line string, terminal bool, typed string) (string, int) {
	t.Helper()
	s.n++
	start := must(s.out.Seek(0, io.SeekEnd))
	if terminal {
		file := filepath.Join(s.scratch, fmt.Sprintf("command-%d", s.n))
		writeFile(t, file, line+"\n")
		writeFile(t, file+".typed", typed)
		line = fmt.Sprintf("script -qec 'bash -o pipefail %s' /dev/null < %s", file, file+".typed")
	}
	// The command, in a group that does not pass on the shell's own descriptors 3 and 4.
	s.write(t, fmt.Sprintf("{ %s\n} 3<&- 4>&-\necho \"EXIT $?\" >&4\n", line))
	var status string
	select {
	case status = <-s.status:
	case err := <-s.exited:
		s.exited <- err
		t.Fatalf("the shell exited: %v\n%s", err, s.since(start))
	case <-time.After(commandTimeout):
		t.Fatalf("the command did not end within %v\n%s", commandTimeout, s.since(start))
	}
	code, err := strconv.Atoi(strings.TrimPrefix(status, "EXIT "))
	if err != nil {
		t.Fatalf("the shell's status line: %q", status)
	}
	return s.since(start), code
}

// terminalCodes are what a terminal's output carries besides text: escape sequences (bash's prompt,
// bracketed paste) and carriage returns.
var terminalCodes = regexp.MustCompile(`\x1b\][^\x07]*\x07|\x1b\[[0-9;?]*[A-Za-z]|\r`)

// since returns the shell's output from offset on.
func (s *shell) since(offset int64) string {
	b, _ := io.ReadAll(io.NewSectionReader(s.out, offset, 1<<40))
	return terminalCodes.ReplaceAllString(string(b), "")
}

// cloneRepo copies the repository's files, as they are in the working tree (committed or not, but
// not ignored), into a new directory: what a fresh clone holds.
func cloneRepo(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("git", "-C", "..", "ls-files", "-z", "--cached", "--others", "--exclude-standard").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	dst := filepath.Join(t.TempDir(), "toolshed")
	for _, name := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		src, to := filepath.Join("..", name), filepath.Join(dst, name)
		fi, err := os.Lstat(src)
		if errors.Is(err, fs.ErrNotExist) {
			continue // deleted in the working tree
		} else if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
			t.Fatal(err)
		}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			err = os.Symlink(must(os.Readlink(src)), to)
		case fi.Mode().IsRegular():
			err = os.WriteFile(to, must(os.ReadFile(src)), fi.Mode().Perm())
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

// definedTests returns the names of the tests defined in the repository at dir.
func definedTests(t *testing.T, dir string) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	decl := regexp.MustCompile(`(?m)^func (Test\w+)\(`)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !strings.HasSuffix(p, "_test.go") {
			return err
		}
		for _, m := range decl.FindAllStringSubmatch(string(must(os.ReadFile(p))), -1) {
			names[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// undoHostChanges removes, when the test ends, what the blocks make on the host outside the copy
// of the repository and the store roots, if the host did not have it before: a machine is left as it
// was. (A block that makes something else on the host adds it here.)
func undoHostChanges(t *testing.T) {
	for _, p := range []string{"/srv/project", "/srv/wheels", "/tmp/keystore"} {
		if _, err := os.Lstat(p); errors.Is(err, fs.ErrNotExist) {
			t.Cleanup(func() { os.RemoveAll(p) })
		}
	}
	for _, u := range []string{"dev"} {
		if _, err := user.Lookup(u); err != nil {
			t.Cleanup(func() {
				if _, err := user.Lookup(u); err == nil {
					if out, err := exec.Command("userdel", "--remove", u).CombinedOutput(); err != nil {
						t.Errorf("userdel %s: %v %s", u, err, out)
					}
				}
			})
		}
	}
}

func must2[A, B any](a A, b B, err error) (A, B) {
	if err != nil {
		panic(err)
	}
	return a, b
}

// TestShownPattern: what a shown line asks of a printed one, failing cases first.
func TestShownPattern(t *testing.T) {
	const root = "/tmp/t/root"
	for _, c := range []struct {
		shown, printed string
		match          bool
	}{
		{"2", "12", false},
		{"2", "2 2", false},
		{"git version 2.39.5", "error: git not found", false},
		{"-rw-r--r-- 1 dev dev 3 Dec  1 14:26 /srv/project/note", "-rw-r--r-- 1 root root 3 Jan 15  2025 /srv/project/note", false},
		{"/var/lib/toolshed/store/cvmxlx6v3k5iv5vf85k5m8prqz143bn6-debian-bookworm", "/var/lib/toolshed/store/cvmxlx6v3k5iv5vf85k5m8prqz143bn6-debian-bookworm", false},
		{"/var/lib/toolshed/store/cvmxlx6v3k5iv5vf85k5m8prqz143bn6-debian-bookworm", root + "/store/jj5xv3b74fnv3pih1f6kw2plyadwvi4z-apt-curl-jq", false},
		{"shed: realized jq-tools in 3 ms: its 2 layers were in the store", "shed: realized jq-tools in 4.1 s: built 2 paths", false},
		{"2", " 2", true},
		{"git version 2.39.5", "git version 2.39.6", true},
		{"-rw-r--r-- 1 dev dev 3 Dec  1 14:26 /srv/project/note", "-rw-r--r-- 1 dev dev 3 Jan 15  2025 /srv/project/note", true},
		{"/var/lib/toolshed/store/cvmxlx6v3k5iv5vf85k5m8prqz143bn6-debian-bookworm", root + "/store/0123456789abcdefghijklmnopqrstuv-debian-bookworm", true},
		{"shed: check: /var/lib/toolshed/store/jj5x...-apt-curl-jq: rebuilt, same content", "shed: check: " + root + "/store/jj5xv3b74fnv3pih1f6kw2plyadwvi4z-apt-curl-jq: rebuilt, same content", true},
		{"shed: realized jq-tools in 3 ms: its 2 layers were in the store", "shed: realized jq-tools in 12 ms: its 3 layers were in the store", true},
		{"ci-example-org-1:3q6d...=", "ci-example-org-1:NR2hTAbI0trdWAbCPj5Rxa2Ew3liT7VjOrVu0CJEXkg=", true},
		{"adds: apt git=...", "adds: apt git=1:2.39.5-0+deb12u3", true},
	} {
		re := shownPattern(c.shown, root)
		if got := re.MatchString(lsDate.ReplaceAllString(c.printed, "DATE")); got != c.match {
			t.Errorf("shown %q, printed %q: match %v, want %v (pattern %s)", c.shown, c.printed, got, c.match, re)
		}
	}
	for _, shown := range []string{"", "   ", "..."} {
		if re := shownPattern(shown, root); re != nil {
			t.Errorf("shown %q asks for %s, want nothing", shown, re)
		}
	}
}

// TestConsoleBlocks: the blocks of a Markdown text, their commands and shown output, and the markers
// of the ones not run; a block that does not begin with a command, or a marker astray, is an error.
func TestConsoleBlocks(t *testing.T) {
	for _, text := range []string{
		"```console\nbuilder# shed copy\n```\n",
		"```console\n# true\n",
		"<!-- not run: see TestX -->\n\n```sh\n# true\n```\n",
		"<!-- not run: see TestX -->\n",
	} {
		if _, err := consoleBlocks(text); err == nil {
			t.Errorf("no error for %q", text)
		}
	}
	blocks, err := consoleBlocks("text\n```console\n# echo a\na\n# true\n```\n```sh\n# not a command\n```\n" +
		"<!-- not run: needs a registry, see TestCachePrewarm -->\n```console\nlaptop# shed realize\n```\n")
	if err != nil {
		t.Fatal(err)
	}
	want := []consoleBlock{
		{line: 2, cmds: []shownCommand{{line: 3, text: "echo a", shown: []shownLine{{4, "a"}}}, {line: 5, text: "true"}}},
		{line: 11, skip: "needs a registry, see TestCachePrewarm"},
	}
	if diff := cmp.Diff(want, blocks, cmp.AllowUnexported(consoleBlock{}, shownCommand{}, shownLine{})); diff != "" {
		t.Errorf("blocks (-want +got):\n%s", diff)
	}
}
