package audit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/zeebo/blake3"
)

func fill(t testing.TB, n int) *Log {
	t.Helper()
	l := Open(t.TempDir())
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := l.Append(Entry{User: "alice", Role: "user", Event: "bench.run", Bench: fmt.Sprintf("b%d", i%3)}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	return l
}

// TestChain: concurrent appends make one chain that verifies; filters select.
func TestChain(t *testing.T) {
	l := fill(t, 20)
	n, problems, err := l.Verify()
	if err != nil || n != 20 || len(problems) != 0 {
		t.Fatalf("verify: %d entries, %v, %v", n, problems, err)
	}
	if es, _ := l.Entries(Filter{Bench: "b1"}); len(es) != 7 {
		t.Errorf("entries of b1: %d, want 7", len(es))
	}
	if es, _ := l.Entries(Filter{User: "bob"}); len(es) != 0 {
		t.Errorf("entries of bob: %d", len(es))
	}
}

// TestTamper: a changed, removed or reordered entry, or a cut tail, is found.
func TestTamper(t *testing.T) {
	for _, c := range []struct {
		name string
		edit func([]string) []string
		want string
	}{
		{"changed", func(ls []string) []string {
			ls[3] = strings.Replace(ls[3], `"user":"alice"`, `"user":"mallory"`, 1)
			return ls
		}, "was changed"},
		{"removed", func(ls []string) []string { return append(ls[:4], ls[5:]...) }, "removed or moved"},
		{"reordered", func(ls []string) []string { ls[2], ls[6] = ls[6], ls[2]; return ls }, "removed or moved"},
		{"cut", func(ls []string) []string { return ls[:len(ls)-2] }, "cut from the end"},
		{"rehashed", func(ls []string) []string {
			// Changed with its own hash recomputed: the next entry's prev gives it away.
			var e Entry
			json.Unmarshal([]byte(ls[3]), &e)
			e.User = "mallory"
			e.Hash = hashOf(e)
			b, _ := json.Marshal(e)
			ls[3] = string(b)
			return ls
		}, "its prev is not the hash of the entry before it"},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := fill(t, 10)
			b, _ := os.ReadFile(l.file())
			lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
			os.WriteFile(l.file(), []byte(strings.Join(c.edit(lines), "\n")+"\n"), 0o600)
			_, problems, err := l.Verify()
			if err != nil || !strings.Contains(fmt.Sprint(problems), c.want) {
				t.Errorf("verify: %v %v, want a problem saying %q", problems, err, c.want)
			}
		})
	}
}

// TestNote: entries noted without an fsync chain on like the others; the head lags behind them until
// the next Append, and the log verifies throughout.
func TestNote(t *testing.T) {
	l := fill(t, 3)
	for range 4 {
		if err := l.Note(Entry{Event: "net.allowed", Bench: "b", Dest: "deb.debian.org:80"}); err != nil {
			t.Fatal(err)
		}
	}
	if n, problems, err := l.Verify(); err != nil || n != 7 || len(problems) != 0 {
		t.Errorf("after notes: %d %v %v", n, problems, err)
	}
	if h, _ := l.readHead(); h.seq != 3 {
		t.Errorf("the head is at %d after notes, want 3", h.seq)
	}
	if _, err := l.Append(Entry{Event: "bench.rm", Bench: "b"}); err != nil {
		t.Fatal(err)
	}
	if h, _ := l.readHead(); h.seq != 8 {
		t.Errorf("the head is at %d after an append, want 8", h.seq)
	}
	if n, problems, err := l.Verify(); err != nil || n != 8 || len(problems) != 0 {
		t.Errorf("after the append: %d %v %v", n, problems, err)
	}
}

// add appends e to l and fails the test if it cannot.
func add(t *testing.T, l *Log, e Entry) {
	t.Helper()
	if _, err := l.Append(e); err != nil {
		t.Fatalf("append %s: %v", e.Event, err)
	}
}

// verifyClean fails the test unless l verifies with want entries and no problem.
func verifyClean(t *testing.T, l *Log, want int) {
	t.Helper()
	n, problems, err := l.Verify()
	if err != nil || n != want || len(problems) != 0 {
		t.Fatalf("verify: %d entries (want %d), problems %v, err %v", n, want, problems, err)
	}
}

// verifyFinds fails the test unless verifying l finds a problem at line that says want, and the
// chain is otherwise whole (the only problems are at lines).
func verifyFinds(t *testing.T, l *Log, line int, want string) {
	t.Helper()
	_, problems, err := l.Verify()
	if err != nil {
		t.Fatalf("verify: %v (want a problem at line %d, not an error)", err, line)
	}
	for _, p := range problems {
		if p.Line == line && strings.Contains(p.What, want) {
			return
		}
	}
	t.Fatalf("verify: %v, want a problem at line %d saying %q", problems, line, want)
}

// TestHugeFields: a field of any size is written bounded, its cut marked with its length and hash,
// and the log goes on: every later append works and verifies.
func TestHugeFields(t *testing.T) {
	l := Open(t.TempDir())
	huge := strings.Repeat("é", 50_000)   // 100,000 bytes, 2-byte runes
	ctl := strings.Repeat("<\x01", 6_000) // 6 bytes each once escaped
	add(t, l, Entry{User: huge, Via: huge, Event: "realize", Bench: huge, Workshop: huge, Dest: ctl, Error: huge, Detail: ctl, Role: huge, DiffSHA256: huge})
	add(t, l, Entry{User: "root", Role: "operator", Event: "key.trust", Detail: "k:AAAA"})
	add(t, l, Entry{User: "nobody", Role: "user", Event: "key.trust", Error: "denied"})
	verifyClean(t, l, 3)
	b, _ := os.ReadFile(l.file())
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	if len(lines[0]) > MaxLine {
		t.Errorf("the entry's line is %d bytes, above MaxLine %d", len(lines[0]), MaxLine)
	}
	es, err := l.Entries(Filter{})
	if err != nil || len(es) != 3 {
		t.Fatalf("entries: %d %v", len(es), err)
	}
	sum := blake3.Sum256([]byte(huge))
	want := fmt.Sprintf("…[truncated, 100000 bytes, blake3:%x]", sum)
	for name, v := range map[string]string{"user": es[0].User, "workshop": es[0].Workshop, "error": es[0].Error} {
		if !strings.HasSuffix(v, want) || !strings.HasPrefix(v, "éé") || !utf8.ValidString(v) {
			t.Errorf("%s: %.40q...%q, want a prefix of whole runes then %q", name, v, v[max(0, len(v)-120):], want)
		}
	}
	if es[1].Event != "key.trust" || es[2].Error != "denied" {
		t.Errorf("the entries after the huge one: %+v", es[1:])
	}
}

// TestNotUTF8: a field with bytes that are not UTF-8 (an upload's path from an E2B URL, %ff) is
// written as its JSON shows it, with U+FFFD: its line is an entry, listed and verified, and the log
// chains on from it, in this process and in another.
func TestNotUTF8(t *testing.T) {
	l := Open(t.TempDir())
	bad := []string{"/tmp/evil\xff\xfe", "\xed\xa0\x80", "\xc0\x80", "a\xe2\x80", strings.Repeat("\xff", 5000), strings.Repeat("é", 120) + "\xff" + strings.Repeat("<", 100)}
	for _, s := range bad {
		add(t, l, Entry{User: "nobody", Role: "user", Event: "bench.write_files", Bench: s, Dest: s, Detail: "1 file, first " + s})
	}
	add(t, Open(filepath.Dir(l.dir)), Entry{User: "root", Role: "operator", Event: "key.trust"}) // another writer: the tail by structure
	verifyClean(t, l, len(bad)+1)
	es, err := l.Entries(Filter{User: "nobody"})
	if err != nil || len(es) != len(bad) {
		t.Fatalf("entries of nobody: %d %v, want %d", len(es), err, len(bad))
	}
	if es[0].Detail != "1 file, first /tmp/evil\ufffd\ufffd" {
		t.Errorf("detail %q", es[0].Detail)
	}
}

// TestBoundWorstCase: an entry whose every field is at its bound, of the characters that cost the
// most once escaped, with the largest numbers, still fits in MaxLine.
func TestBoundWorstCase(t *testing.T) {
	l := Open(t.TempDir())
	worst := strings.Repeat("\u2028", 10_000)
	add(t, l, Entry{Time: time.Date(9999, 12, 31, 23, 59, 59, 999_999_999, time.FixedZone("", -(23*3600+59*60))), User: worst, Role: worst, Via: worst, Event: worst, Bench: worst,
		Workshop: worst, Version: math.MinInt, DiffSHA256: worst, Dest: worst, Error: worst, Detail: worst})
	b, _ := os.ReadFile(l.file())
	if len(b) > MaxLine {
		t.Errorf("the worst entry's line is %d bytes, above MaxLine %d", len(b), MaxLine)
	}
	verifyClean(t, l, 1)
}

// TestHugeLastEntry: a log whose last entry is larger than any window (as one written before
// fields were bounded, with its head) takes the next append and verifies.
func TestHugeLastEntry(t *testing.T) {
	l := fill(t, 3)
	legacy(t, l, Entry{User: "nobody", Role: "user", Event: "realize", Workshop: strings.Repeat("w", 200_000), Error: "denied"})
	add(t, l, Entry{User: "root", Role: "operator", Event: "workshop.allow"})
	verifyClean(t, l, 5)
}

// legacy appends e as the log's code did before fields were bounded and the head held an offset:
// e unbounded, the head "SEQ HASH".
func legacy(t *testing.T, l *Log, e Entry) {
	t.Helper()
	b, err := os.ReadFile(l.file())
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	var last Entry
	if len(b) > 0 {
		if err := json.Unmarshal([]byte(lines[len(lines)-1]), &last); err != nil {
			t.Fatal(err)
		}
	}
	e.Seq, e.Prev, e.Time = last.Seq+1, last.Hash, time.Now().UTC()
	e.Hash = hashOf(e)
	line, _ := json.Marshal(e)
	os.MkdirAll(l.dir, 0o700)
	f, err := os.OpenFile(l.file(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	f.Write(append(line, '\n'))
	f.Close()
	os.WriteFile(l.head(), []byte(fmt.Sprintf("%d %s\n", e.Seq, e.Hash)), 0o600)
}

// TestOldHead: a log and head written by the code before heads held an offset verify, take appends
// (found by reading the log once from its start), and then verify with the new head.
func TestOldHead(t *testing.T) {
	l := Open(t.TempDir())
	for i := range 5 {
		legacy(t, l, Entry{User: "alice", Event: "bench.run", Bench: fmt.Sprint("b", i)})
	}
	verifyClean(t, l, 5)
	add(t, l, Entry{User: "root", Event: "gc"})
	verifyClean(t, l, 6)
	l2 := Open(filepath.Dir(l.dir)) // another process: no tail in memory
	add(t, l2, Entry{User: "root", Event: "gc"})
	verifyClean(t, l2, 7)
	es, _ := l2.Entries(Filter{})
	if len(es) != 7 || es[6].Seq != 7 || es[6].Prev != es[5].Hash {
		t.Errorf("entries after the appends: %+v", es)
	}
}

// TestTornLastLine: a crash in the middle of writing an entry leaves part of a line at the end. The
// next append chains on from the last whole entry; verify reports the torn line, and nothing else.
func TestTornLastLine(t *testing.T) {
	l := fill(t, 4)
	b, _ := os.ReadFile(l.file())
	torn := b[:len(b)-40] // the last entry without its end
	os.WriteFile(l.file(), torn, 0o600)
	os.WriteFile(l.head(), nil, 0o600) // the head of 3 entries: as if the crash came before the head's write
	l = Open(filepath.Dir(l.dir))
	writeHead(t, l, 3)
	for range 2 {
		add(t, l, Entry{User: "root", Event: "gc"})
	}
	verifyFinds(t, l, 4, "does not parse")
	n, problems, _ := l.Verify()
	if n != 5 || len(problems) != 1 {
		t.Errorf("verify: %d entries, %v; want 5 entries and the torn line's problem only", n, problems)
	}
	es, _ := l.Entries(Filter{})
	if len(es) != 5 || es[3].Seq != 4 || es[3].Prev != es[2].Hash {
		t.Errorf("entries: %+v", es)
	}
}

// TestTornWholeEntry: a crash after an entry's bytes but before its newline: the entry is whole,
// and the next append ends its line and chains on from it.
func TestTornWholeEntry(t *testing.T) {
	l := fill(t, 3)
	b, _ := os.ReadFile(l.file())
	os.WriteFile(l.file(), b[:len(b)-1], 0o600)
	l = Open(filepath.Dir(l.dir))
	add(t, l, Entry{User: "root", Event: "gc"})
	verifyClean(t, l, 4)
}

// writeHead sets l's head to its entry seq, as Append would have.
func writeHead(t *testing.T, l *Log, seq int64) {
	t.Helper()
	b, _ := os.ReadFile(l.file())
	off := 0
	for _, line := range strings.SplitAfter(string(b), "\n") {
		off += len(line)
		var e Entry
		if json.Unmarshal([]byte(line), &e) == nil && e.Seq == seq {
			os.WriteFile(l.head(), []byte(fmt.Sprintf("%d %s %d\n", seq, e.Hash, off)), 0o600)
			return
		}
	}
	t.Fatalf("no entry %d", seq)
}

// TestGarbageLine: a line that is not an entry, in the middle, is a problem at that line; the
// entries after it are still checked, and appends go on.
func TestGarbageLine(t *testing.T) {
	for _, garbage := range []string{"garbage", "{}", `{"seq":3,"event":`, "\x00\x00\x00", `{"seq":3,"unknown":1}`, ""} {
		t.Run(fmt.Sprintf("%q", garbage), func(t *testing.T) {
			l := fill(t, 6)
			b, _ := os.ReadFile(l.file())
			lines := strings.SplitAfter(string(b), "\n")
			edited := strings.Join(lines[:3], "") + garbage + "\n" + strings.Join(lines[3:], "")
			os.WriteFile(l.file(), []byte(edited), 0o600)
			l = Open(filepath.Dir(l.dir))
			add(t, l, Entry{User: "root", Event: "gc"})
			verifyFinds(t, l, 4, "not an entry")
			n, problems, _ := l.Verify()
			if n != 7 || len(problems) != 1 {
				t.Errorf("verify: %d entries, %v; want 7 and the garbage line's problem only", n, problems)
			}
			// A changed entry after the garbage is still found.
			b, _ = os.ReadFile(l.file())
			os.WriteFile(l.file(), []byte(strings.Replace(string(b), `"bench":"b2"`, `"bench":"bX"`, 1)), 0o600)
			if _, problems, _ := l.Verify(); !strings.Contains(fmt.Sprint(problems), "was changed") {
				t.Errorf("verify after a change past the garbage: %v", problems)
			}
		})
	}
}

// TestTrailingText: anything after an entry on its line, or an entry not in its own encoding, is a
// problem: a line is exactly one entry's canonical JSON.
func TestTrailingText(t *testing.T) {
	for _, c := range []struct{ name, edit, want string }{
		{"text", ` and more`, "not an entry (text after the entry)"},
		{"second entry", ``, "not an entry (text after the entry)"}, // the next line appended to this one
		{"spaces", `   `, "not an entry (not in its canonical encoding"},
		{"reformatted", "indent", "not an entry (not in its canonical encoding"},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := fill(t, 5)
			b, _ := os.ReadFile(l.file())
			lines := strings.SplitAfter(strings.TrimSuffix(string(b), "\n"), "\n")
			switch c.edit {
			case "":
				lines[1] = strings.TrimSuffix(lines[1], "\n") + lines[2]
				lines[2] = ""
			case "indent":
				var e Entry
				json.Unmarshal([]byte(lines[1]), &e)
				out, _ := json.MarshalIndent(e, "", " ")
				lines[1] = strings.ReplaceAll(string(out), "\n", "") + "\n"
			default:
				lines[1] = strings.TrimSuffix(lines[1], "\n") + c.edit + "\n"
			}
			os.WriteFile(l.file(), []byte(strings.Join(lines, "")+"\n"), 0o600)
			verifyFinds(t, l, 2, c.want)
		})
	}
}

// TestLaggingHead: a durable entry after the head's entry is a problem (the head was put back, or
// the supervisor stopped between the entry and the head); noted entries after it are not.
func TestLaggingHead(t *testing.T) {
	l := fill(t, 3)
	old, _ := os.ReadFile(l.head())
	add(t, l, Entry{User: "root", Event: "key.trust"})
	if err := l.Note(Entry{Event: "net.allowed", Bench: "b", Dest: "deb.debian.org:80"}); err != nil {
		t.Fatal(err)
	}
	verifyClean(t, l, 5)
	os.WriteFile(l.head(), old, 0o600)
	verifyFinds(t, l, 4, "the head lags")
	// Appends go on from the lagging head, and move it.
	l = Open(filepath.Dir(l.dir))
	add(t, l, Entry{User: "root", Event: "gc"})
	es, _ := l.Entries(Filter{})
	if len(es) != 6 || es[5].Seq != 6 || es[5].Prev != es[4].Hash || !es[4].Noted || es[3].Noted {
		t.Errorf("entries: %+v", es)
	}
	verifyClean(t, l, 6)
	// A noted entry's mark is in its hash: removing it shows.
	b, _ := os.ReadFile(l.file())
	os.WriteFile(l.file(), []byte(strings.Replace(string(b), `"noted":true,`, ``, 1)), 0o600)
	verifyFinds(t, l, 5, "was changed")
}

// TestEveryFieldBounded: every string field of Entry (found by reflection, so a new one is not
// forgotten) is cut to its bound.
func TestEveryFieldBounded(t *testing.T) {
	l := Open(t.TempDir())
	var e Entry
	v := reflect.ValueOf(&e).Elem()
	for i := range v.NumField() {
		if v.Field(i).Kind() == reflect.String {
			v.Field(i).SetString(strings.Repeat("&", 20_000))
		}
	}
	w, err := l.Append(e)
	if err != nil {
		t.Fatal(err)
	}
	v = reflect.ValueOf(w)
	for i := range v.NumField() {
		f := v.Type().Field(i)
		if f.Type.Kind() != reflect.String || f.Name == "Prev" || f.Name == "Hash" {
			continue
		}
		b, _ := json.Marshal(v.Field(i).String())
		limit := MaxField
		if f.Name == "Detail" {
			limit = MaxDetail
		}
		if len(b)-2 > limit || !strings.Contains(string(b), "truncated, 20000 bytes") {
			t.Errorf("%s: %d bytes of JSON, want a marked cut within %d", f.Name, len(b)-2, limit)
		}
	}
	verifyClean(t, l, 1)
}

// TestLongLine: a line longer than any entry can be is not read whole: it is a problem, and the
// rest of the log verifies and takes appends.
func TestLongLine(t *testing.T) {
	l := fill(t, 2)
	f, _ := os.OpenFile(l.file(), os.O_WRONLY|os.O_APPEND, 0)
	f.Write(append(bytes.Repeat([]byte("x"), maxRead+10), '\n'))
	f.Close()
	l = Open(filepath.Dir(l.dir))
	add(t, l, Entry{User: "root", Event: "gc"})
	verifyFinds(t, l, 3, "longer than")
	if n, problems, _ := l.Verify(); n != 3 || len(problems) != 1 {
		t.Errorf("verify: %d entries, %v", n, problems)
	}
}

// TestTwoWriters: two processes' logs (each with its own memory of the tail) appending and noting in
// turn make one chain.
func TestTwoWriters(t *testing.T) {
	root := t.TempDir()
	a, b := Open(root), Open(root)
	for i := range 6 {
		w := a
		if i%2 == 1 {
			w = b
		}
		add(t, w, Entry{Event: "gc"})
		if err := w.Note(Entry{Event: "net.allowed"}); err != nil {
			t.Fatal(err)
		}
	}
	verifyClean(t, a, 12)
}

// TestWrongHead: a head whose offset does not end its entry is not followed (the log is read from its
// start): appends chain on, and verify reports the head.
func TestWrongHead(t *testing.T) {
	l := fill(t, 3)
	h, _ := l.readHead()
	os.WriteFile(l.head(), []byte(fmt.Sprintf("%d %s %d\n", h.seq, h.hash, h.end-5)), 0o600)
	l = Open(filepath.Dir(l.dir))
	if err := l.Note(Entry{Event: "net.allowed"}); err != nil {
		t.Fatal(err)
	}
	verifyFinds(t, l, 3, "the head says this entry ends at byte")
	add(t, l, Entry{Event: "gc"})
	verifyClean(t, l, 5)
	os.WriteFile(l.head(), []byte("what\n"), 0o600)
	verifyFinds(t, l, 0, "not SEQ HASH END")
}

// FuzzParse: a line is an entry only if it is exactly that entry's canonical JSON.
func FuzzParse(f *testing.F) {
	l := fill(f, 2)
	b, _ := os.ReadFile(l.file())
	for _, line := range strings.Split(string(b), "\n") {
		f.Add([]byte(line))
		f.Add([]byte(line + " x"))
	}
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		e, err := parse(line)
		if err != nil {
			return
		}
		if b, _ := json.Marshal(e); !bytes.Equal(b, line) || e.Seq < 1 {
			t.Errorf("parse(%q) = an entry that encodes as %q", line, b)
		}
	})
}

// FuzzBound: a bounded value's JSON fits its bound, and a value that fits is left as it is.
func FuzzBound(f *testing.F) {
	for _, s := range []string{"", "alice", strings.Repeat("é", 200), strings.Repeat("<\x01\u2028\xff", 100)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := bound(s, MaxField)
		b, _ := json.Marshal(got)
		if len(b)-2 > MaxField {
			t.Errorf("bound(%q): %d bytes of JSON", s, len(b)-2)
		}
		if !utf8.ValidString(got) {
			t.Errorf("bound(%q) = %q: not UTF-8 (its JSON would not read back as itself)", s, got)
		}
		v := validUTF8(s)
		if b, _ := json.Marshal(s); len(b)-2 <= MaxField && got != v {
			t.Errorf("bound(%q) = %q: it fit", s, got)
		}
		if got != v && !strings.HasPrefix(v, got[:strings.LastIndex(got, "…[truncated")]) {
			t.Errorf("bound(%q) = %q: not a prefix", s, got)
		}
	})
}

// TestTailFromTheEnd: the tail found from the log's end is the one the forward read from the head
// finds, whatever the end holds: entries noted after the head, a torn line (whole entry or not),
// garbage lines, a line longer than the window, or nothing but garbage after the head.
func TestTailFromTheEnd(t *testing.T) {
	entry := func(l *Log) string {
		b, _ := os.ReadFile(l.file())
		ls := strings.SplitAfter(string(b), "\n")
		return ls[len(ls)-2]
	}
	for _, c := range []struct {
		name string
		end  func(l *Log) string // what to add at the log's end, after its entries
	}{
		{"noted", func(*Log) string { return "" }},
		{"torn", func(l *Log) string { return entry(l)[:50] }},
		{"torn whole", func(l *Log) string { return strings.TrimSuffix(entry(l), "\n") }},
		{"garbage", func(*Log) string { return "garbage\n{}\n" }},
		{"garbage torn", func(*Log) string { return "garbage\n{\"seq\":" }},
		{"long line", func(*Log) string { return strings.Repeat("x", 3*tailWindow) + "\n" }},
		{"long torn", func(*Log) string { return strings.Repeat("x", 3*tailWindow) }},
		{"garbage lines", func(*Log) string { return strings.Repeat("garbage\n", tailWindow/4) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := Open(t.TempDir())
			add(t, l, Entry{User: "root", Event: "gc"}) // the head's entry
			for i := range 200 {
				if err := l.Note(Entry{User: "alice", Event: "bench.exec", Bench: fmt.Sprint("b", i)}); err != nil {
					t.Fatal(err)
				}
			}
			f, err := os.OpenFile(l.file(), os.O_RDWR|os.O_APPEND, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := f.WriteString(c.end(l)); err != nil {
				t.Fatal(err)
			}
			fresh := Open(filepath.Dir(l.dir)) // another process: no tail in memory
			got, err := fresh.tail(f)
			if err != nil {
				t.Fatal(err)
			}
			h, _ := fresh.readHead()
			want, err := scanTail(f, h.end, tail{dev: got.dev, ino: got.ino, size: got.size, seq: h.seq, hash: h.hash})
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Errorf("the tail from the end is %+v, the forward read's %+v", got, want)
			}
			if want.seq < 2 {
				t.Errorf("the tail is entry %d: the noted entries were not read", want.seq)
			}
			add(t, fresh, Entry{User: "root", Event: "gc"})
			es, _ := fresh.Entries(Filter{})
			if n := len(es); es[n-1].Prev != es[n-2].Hash || es[n-1].Seq != es[n-2].Seq+1 {
				t.Errorf("the append after it does not chain: %+v then %+v", es[n-2], es[n-1])
			}
		})
	}
}

// TestVerifyLiveAppend: a verify that reads a live log between an Append's write and its head (the
// fsync runs outside the file's lock; CI's TestSupervisorLoop met this) waits for the head rather than
// reporting a lag; the same entry left without its head is still a problem (TestLaggingHead).
func TestVerifyLiveAppend(t *testing.T) {
	l := fill(t, 3)
	f, w, err := l.write(Entry{User: "root", Event: "key.trust"}, true)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	done := make(chan error, 1)
	go func() {
		time.Sleep(300 * time.Millisecond)
		done <- l.commit(f, w.at)
	}()
	n, problems, err := l.Verify()
	if err != nil || n != 4 || len(problems) != 0 {
		t.Errorf("verify during an Append: %d entries, problems %v, err %v", n, problems, err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	saved := lagGrace
	lagGrace = 100 * time.Millisecond
	defer func() { lagGrace = saved }()
	f2, _, err := l.write(Entry{User: "root", Event: "key.trust"}, true) // written, never committed
	if err != nil {
		t.Fatal(err)
	}
	f2.Close()
	verifyFinds(t, l, 5, "the head lags")
}
