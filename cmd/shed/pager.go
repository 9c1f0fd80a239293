package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strings"

	"golang.org/x/term"

	"toolshed.dev/shed/proposal"
)

// page writes text to w, through a pager when w is a terminal, as git does: $SHED_PAGER, else
// $PAGER, else less, with LESS=FRX when LESS is unset (quit when it fits one screen, keep colours,
// leave the text on the screen after). Empty or "cat" is no pager; a pager that cannot start is
// none either. A pipe or a file gets the text as it is: no pager ever waits on a script.
func page(w io.Writer, text string) error {
	f, ok := w.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		_, err := io.WriteString(w, text)
		return err
	}
	pager, set := os.LookupEnv("SHED_PAGER")
	if !set {
		if pager, set = os.LookupEnv("PAGER"); !set {
			pager = "less"
		}
	}
	if p := strings.TrimSpace(pager); p == "" || p == "cat" {
		_, err := io.WriteString(w, text)
		return err
	}
	cmd := exec.Command("/bin/sh", "-c", pager) // as git runs it: a command line, with its flags
	cmd.Stdin, cmd.Stdout, cmd.Stderr = strings.NewReader(text), f, os.Stderr
	cmd.Env = os.Environ()
	if _, set := os.LookupEnv("LESS"); !set {
		cmd.Env = append(cmd.Env, "LESS=FRX")
	}
	if err := cmd.Run(); err != nil {
		if _, ran := err.(*exec.ExitError); ran {
			return nil // the pager ran and showed the text: how it ended is the reader's business (q, ^C)
		}
		_, err := io.WriteString(w, text)
		return err
	}
	return nil
}

// promoteSummary is what a proposal changes, in one line for next to the confirmation prompt: the
// packages it adds by kind, what it widens, and each file's lines added and removed in the diff.
func promoteSummary(p *proposal.Proposal, diff string) string {
	var parts []string
	kinds := map[string]int{}
	for _, a := range p.Added {
		kind, _, _ := strings.Cut(a, " ")
		kinds[kind]++
	}
	var pkgs []string
	for _, k := range sortedKeys(kinds) {
		noun := k + " package"
		if kinds[k] != 1 {
			noun += "s"
		}
		pkgs = append(pkgs, fmt.Sprintf("+%d %s", kinds[k], noun))
	}
	if len(pkgs) == 0 {
		pkgs = []string{"no packages added"}
	}
	parts = append(parts, strings.Join(pkgs, ", "))
	if len(p.Widens) == 0 {
		parts = append(parts, "access: unchanged")
	} else {
		shown := p.Widens
		if len(shown) > 3 {
			shown = append(shown[:3:3], fmt.Sprintf("%d more", len(p.Widens)-3))
		}
		parts = append(parts, "WIDENS ACCESS: "+strings.Join(shown, ", "))
	}
	var files []string
	name, add, del := "", 0, 0
	flush := func() {
		if name != "" {
			files = append(files, fmt.Sprintf("%s +%d -%d", name, add, del))
		}
	}
	for _, l := range strings.Split(diff, "\n") {
		switch {
		case strings.HasPrefix(l, "+++ b/"):
			flush()
			name, add, del = strings.TrimPrefix(l, "+++ b/"), 0, 0
			name = strings.TrimSuffix(name, " (proposed)")
		case strings.HasPrefix(l, "--- a/"):
		case strings.HasPrefix(l, "+"):
			add++
		case strings.HasPrefix(l, "-"):
			del++
		}
	}
	flush()
	if len(files) > 0 {
		parts = append(parts, "lines: "+strings.Join(files, ", "))
	}
	return proposal.Visible(strings.Join(parts, "; "))
}

func sortedKeys(m map[string]int) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
