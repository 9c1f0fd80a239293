package recipe

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/pelletier/go-toml/v2"
	"github.com/pelletier/go-toml/v2/unstable"
)

// Why go-toml/v2 and not BurntSushi/toml: every value error must name its line,
// including the line of one element of a multi-line array or of the third
// [[grant]]. BurntSushi keeps key positions private (MetaData.keyInfo) and has
// none for array elements. go-toml/v2 gives both halves from one parser:
// toml.Unmarshal into `any` checks the whole of TOML (syntax, duplicate keys,
// table redefinitions, dates, integer range) and yields the values, and its
// unstable.Parser, the same parser, yields the byte range of every key and
// value, from which we build a path → offset index. Using one library for both
// means the values and the positions cannot disagree.

// document is a decoded TOML file with the position of every key and element.
type document struct {
	root  map[string]any
	pos   map[string]int // field.canon → byte offset of the key or element
	lines []int          // byte offsets at which lines start
}

// decode parses data as TOML. Its error has no File; the caller sets it.
func decode(data []byte) (*document, *Error) {
	if bytes.HasPrefix(data, []byte("\uFEFF")) {
		return nil, &Error{Line: 1, Msg: "file starts with a byte order mark (U+FEFF)",
			Hint: "save the file as UTF-8 without a byte order mark"}
	}
	doc := &document{pos: make(map[string]int), lines: []int{0}}
	for i, b := range data {
		if b == '\n' {
			doc.lines = append(doc.lines, i+1)
		}
	}
	var v any
	if err := toml.Unmarshal(data, &v); err != nil {
		return nil, tomlError(err)
	}
	root, ok := v.(map[string]any)
	if !ok { // cannot happen: a TOML document is a table
		return nil, &Error{Msg: "invalid TOML: the document is not a table", Hint: tomlHint}
	}
	doc.root = root

	ix := indexer{pos: doc.pos, arrays: make(map[string]int)}
	var p unstable.Parser
	p.Reset(data)
	var ctx field
	for p.NextExpression() {
		e := p.Expression()
		switch e.Kind {
		case unstable.KeyValue:
			ix.keyValue(ctx, e)
		case unstable.Table:
			ctx = ix.header(e, false)
		case unstable.ArrayTable:
			ctx = ix.header(e, true)
		}
	}
	// p.Error() is nil: toml.Unmarshal ran the same parser over the same bytes.
	return doc, nil
}

const tomlHint = "fix the TOML syntax there; the format is described at https://toml.io"

func tomlError(err error) *Error {
	var de *toml.DecodeError
	if !errors.As(err, &de) {
		return &Error{Msg: "invalid TOML: " + strings.TrimPrefix(err.Error(), "toml: "), Hint: tomlHint}
	}
	line, col := de.Position()
	msg := strings.TrimPrefix(de.Error(), "toml: ")
	e := &Error{Line: line, Msg: fmt.Sprintf("invalid TOML: %s (column %d)", msg, col), Hint: tomlHint}
	// No Field: DecodeError.Key is the key as written in its expression,
	// relative to the table header above it, so it would name the wrong field.
	if strings.Contains(msg, "already") {
		e.Hint = "define each key and each [table] once; use [[table]] for a list of tables"
	}
	return e
}

// offset returns the byte offset of f, or -1 if it has none (the root table).
func (d *document) offset(f field) int {
	if off, ok := d.pos[f.canon]; ok {
		return off
	}
	return -1
}

// line returns the 1-based line of a byte offset, 0 for -1.
func (d *document) line(off int) int {
	if off < 0 {
		return 0
	}
	return sort.Search(len(d.lines), func(i int) bool { return d.lines[i] > off })
}

// field is a path in the document: canon is unambiguous (keys quoted) and keys
// the position index; name is what users read in errors, e.g. grant[0].path.
type field struct{ canon, name string }

func (f field) key(k string) field {
	n := displayKey(k)
	if f.name != "" {
		n = f.name + "." + n
	}
	return field{canon: f.canon + "." + strconv.Quote(k), name: n}
}

func (f field) index(i int) field {
	s := "[" + strconv.Itoa(i) + "]"
	return field{canon: f.canon + s, name: f.name + s}
}

// displayKey writes a key as TOML would: bare when it can be, quoted otherwise
// (in ASCII, so that an odd key shows its code points).
func displayKey(k string) string {
	if k == "" {
		return `""`
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return strconv.QuoteToASCII(k)
		}
	}
	return k
}

// indexer records the first position of every path, walking the parser's
// expressions in file order and tracking [[array table]] element counts the
// way the decoder does.
type indexer struct {
	pos    map[string]int
	arrays map[string]int // canon of each [[array table]] → elements so far
}

func (ix *indexer) set(f field, off int) {
	if _, ok := ix.pos[f.canon]; !ok && off >= 0 {
		ix.pos[f.canon] = off
	}
}

// header handles [a.b] and [[a.b]] and returns the new context.
func (ix *indexer) header(e *unstable.Node, array bool) field {
	var f field
	it := e.Key()
	for it.Next() {
		k := it.Node()
		off := int(k.Raw.Offset)
		f = f.key(string(k.Data))
		last := it.IsLast()
		switch {
		case last && array:
			n := ix.arrays[f.canon]
			ix.arrays[f.canon] = n + 1
			ix.set(f, off)
			f = f.index(n)
		case !last:
			// [grant.x] after [[grant]] means the last grant element.
			if n, ok := ix.arrays[f.canon]; ok {
				ix.set(f, off)
				f = f.index(n - 1)
			}
		}
		ix.set(f, off)
	}
	return f
}

func (ix *indexer) keyValue(ctx field, kv *unstable.Node) {
	f := ctx
	it := kv.Key()
	for it.Next() {
		k := it.Node()
		f = f.key(string(k.Data))
		off := int(k.Raw.Offset)
		if it.IsLast() {
			off = int(kv.Raw.Offset) // the whole key, dotted or not
		}
		ix.set(f, off)
	}
	ix.value(f, kv.Value(), ix.pos[f.canon])
}

func (ix *indexer) value(f field, n *unstable.Node, off int) {
	switch n.Kind {
	case unstable.Array:
		i := 0
		for it := n.Children(); it.Next(); {
			c := it.Node()
			if c.Kind == unstable.Comment {
				continue
			}
			ef := f.index(i)
			eoff := nodeOffset(c, off)
			ix.set(ef, eoff)
			ix.value(ef, c, eoff)
			i++
		}
	case unstable.InlineTable:
		for it := n.Children(); it.Next(); {
			if c := it.Node(); c.Kind == unstable.KeyValue {
				ix.keyValue(f, c)
			}
		}
	}
}

// nodeOffset is where n starts. Array nodes carry no range, so an array
// element that is itself an array is placed at its first element, or at the
// fallback when it is empty.
func nodeOffset(n *unstable.Node, fallback int) int {
	if n.Kind != unstable.Array {
		return int(n.Raw.Offset)
	}
	for it := n.Children(); it.Next(); {
		if c := it.Node(); c.Kind != unstable.Comment {
			return nodeOffset(c, fallback)
		}
	}
	return fallback
}

// noOffset sorts errors that have no position (a missing top-level key) last.
const noOffset = math.MaxInt
