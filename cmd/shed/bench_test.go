package main

import (
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"toolshed.dev/shed/bench"
)

// BenchmarkInstantiateWarm is `shed instantiate` of a three-layer recipe whose
// .drv files are already in the store (the common case), run in process.
func BenchmarkInstantiateWarm(b *testing.B) {
	dir := b.TempDir()
	root := filepath.Join(dir, "root")
	file := filepath.Join(dir, "workshop.toml")
	os.WriteFile(file, []byte(`name = "tools"
seed = "debian/bookworm"
[apt]
packages = ["jq", "curl", "python3-pip"]
[pip]
packages = ["attrs==23.1.0", "requests"]
`), 0o644)
	if code := run([]string{"shed", "--root", root, "init"}, io.Discard, os.Stderr); code != 0 {
		b.Fatal("init failed")
	}
	args := []string{"shed", "--root", root, "instantiate", file}
	if code := run(args, io.Discard, os.Stderr); code != 0 {
		b.Fatal("instantiate failed")
	}
	for b.Loop() {
		if code := run(args, io.Discard, os.Stderr); code != 0 {
			b.Fatal("instantiate failed")
		}
	}
}

// TestFitColumns: on a narrow terminal the flexible columns are cut with an ellipsis so that every
// row fits; the other columns, and a pipe's rows (width 0), stay whole.
func TestFitColumns(t *testing.T) {
	mk := func() [][]string {
		return [][]string{
			{"NAME", "STATE", "STARTED", "COMMAND", "WORKSHOP"},
			{"jq-tools-1a2b3c", "running", "2026-12-01 20:00:00", "sh -c " + strings.Repeat("x", 120), "/home/someone/projects/" + strings.Repeat("y", 60) + "/workshop.toml"},
		}
	}
	rows := mk()
	fitColumns(rows, 0, 3, 4)
	if !slices.Equal(rows[1], mk()[1]) {
		t.Error("width 0 changed the rows")
	}
	rows = mk()
	fitColumns(rows, 100, 3, 4)
	for _, row := range rows {
		n := 0
		for i, cell := range row {
			n += utf8.RuneCountInString(cell)
			if i > 0 {
				n += 2
			}
		}
		if n >= 100 {
			t.Errorf("a row of %d columns at width 100: %q", n, row)
		}
	}
	if rows[1][0] != "jq-tools-1a2b3c" || !strings.HasSuffix(rows[1][3], "…") {
		t.Errorf("name cut, or command not: %q", rows[1])
	}
	if got := workshopLabel(&bench.Record{Workshop: "/var/lib/toolshed/workshops/jq-tools/3/workshop.toml", Record: "jq-tools", Version: 3}); got != "jq-tools v3" {
		t.Errorf("workshopLabel of a record: %q", got)
	}
}

// TestFitColumnsNarrowFlexible: a flexible column narrower than its share keeps its width, and the
// rows still fit.
func TestFitColumnsNarrowFlexible(t *testing.T) {
	rows := [][]string{
		{"NAME", "STATE", "STARTED", "COMMAND", "WORKSHOP"},
		{"b", "running", "2026-12-01 20:00:00", "sleep 1", strings.Repeat("w", 200)},
	}
	fitColumns(rows, 60, 3, 4)
	if rows[1][3] != "sleep 1" {
		t.Errorf("a short command was cut: %q", rows[1][3])
	}
	widest := make([]int, 5)
	for _, row := range rows {
		for i, c := range row {
			widest[i] = max(widest[i], utf8.RuneCountInString(c))
		}
	}
	n := 2 * 4
	for _, w := range widest {
		n += w
	}
	if n >= 60 {
		t.Errorf("the table is %d wide at width 60: %q", n, rows)
	}
}
