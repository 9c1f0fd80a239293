package sandbox_test

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"toolshed.dev/shed/sandbox"
)

// ttyScript reports what the command sees of its terminal: its name (tty(1) finds it in the
// sandbox's own /dev/pts), that stdin is a character device of the pts major (136), the window size
// and whether it has a controlling terminal; then it echoes a line read from the terminal.
const ttyScript = `tty; stat -L -c '%t' /proc/self/fd/0; stty size; [ -e /dev/tty ] && : </dev/tty && echo ctty; read line; echo "got $line"; exit 3`

func checkTTY(t *testing.T, out string, rows, cols string) {
	t.Helper()
	out = strings.ReplaceAll(out, "\r", "")
	want := []string{"/dev/pts/0", "88", rows + " " + cols, "ctty", "got hello"}
	for _, w := range want {
		if !strings.Contains(out, w+"\n") {
			t.Errorf("terminal output lacks %q:\n%s", w, out)
		}
	}
}

func TestTerminal(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out bytes.Buffer
	spec := readOnlySpec(t, "sh", "-c", ttyScript)
	stdio := sandbox.Stdio{Stdin: strings.NewReader("hello\n"), Stdout: &out, Terminal: &sandbox.Terminal{Size: sandbox.Winsize{Rows: 31, Cols: 91}}}
	code, err := sandbox.Run(ctx, spec, stdio)
	if err != nil || code != 3 {
		t.Fatalf("exit %d, %v\n%s", code, err, out.String())
	}
	checkTTY(t, out.String(), "31", "91")
}

// TestTerminalResize: a size sent on Resize reaches the command's terminal, with its SIGWINCH.
func TestTerminalResize(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	outR, outW := io.Pipe()
	resize := make(chan sandbox.Winsize, 1)
	spec := readOnlySpec(t, "sh", "-c", `trap 'stty size; exit 0' WINCH; echo ready; while :; do sleep 0.05; done`)
	p, err := sandbox.Start(ctx, spec, sandbox.Stdio{Stdout: outW, Terminal: &sandbox.Terminal{Resize: resize}})
	if err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(outR)
	var got []string
	for lines.Scan() {
		line := strings.TrimRight(lines.Text(), "\r")
		got = append(got, line)
		if line == "ready" { // the trap is set
			resize <- sandbox.Winsize{Rows: 50, Cols: 120}
		}
		if line == "50 120" {
			break
		}
	}
	go io.Copy(io.Discard, outR)
	code, err := p.Wait()
	outW.Close()
	if err != nil || code != 0 || len(got) == 0 || got[len(got)-1] != "50 120" {
		t.Fatalf("exit %d, %v, output %q; want the new size after SIGWINCH", code, err, got)
	}
}

func TestExecTerminal(t *testing.T) {
	requireRoot(t)
	c := startControlled(t, readOnlySpec(t, "sh", "-c", "echo ready; read x"))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out bytes.Buffer
	code, err := sandbox.Exec(ctx, c.control, sh(ttyScript), sandbox.Stdio{Stdin: strings.NewReader("hello\n"), Stdout: &out,
		Terminal: &sandbox.Terminal{Size: sandbox.Winsize{Rows: 24, Cols: 80}}})
	if err != nil || code != 3 {
		t.Fatalf("exit %d, %v\n%s", code, err, out.String())
	}
	checkTTY(t, out.String(), "24", "80")
	// A command that cannot start reports why, terminal or not.
	_, err = sandbox.Exec(ctx, c.control, sandbox.ExecRequest{Argv: []string{"/no/such"}}, sandbox.Stdio{Terminal: &sandbox.Terminal{}})
	if err == nil || !strings.Contains(err.Error(), "/no/such") {
		t.Errorf("exec of a missing command with a terminal: %v", err)
	}
}
