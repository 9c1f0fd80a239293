package derivation

import (
	"bytes"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"toolshed.dev/shed/store"
)

// Kind is what a derivation builds.
type Kind string

const (
	// KindSeed builds a base root filesystem (mmdebstrap, or an OCI import).
	KindSeed Kind = "seed"
	// KindFetch downloads one file whose hash is known in advance (fixed-output).
	KindFetch Kind = "fetch"
	// KindLayer installs fetched files over its parent, with no network.
	KindLayer Kind = "layer"
)

func (k Kind) valid() bool { return k == KindSeed || k == KindFetch || k == KindLayer }

// Input is a store path a derivation builds on, with the derivation that
// builds it (zero for a path that was added, not built).
type Input struct {
	Drv store.Path
	Out store.Path
}

// Fixed is the expected content hash of a fixed-output derivation's output,
// as the signed index that named the file publishes it.
type Fixed struct {
	Algo string // "sha256"
	Hash string // lowercase hex
}

// Derivation is one build step. Compute its output with Finish; its fields
// are then frozen by convention: any change needs a new Finish.
type Derivation struct {
	Name    string
	Kind    Kind
	Builder string
	// Network is the network the build may use: "none" for layers, a
	// description of the allowed destinations for fetches and seeds.
	Network string
	Fixed   *Fixed
	Inputs  []Input
	Args    []string
	Env     map[string]string
	// Output is the store path the derivation produces, set by Finish.
	Output store.Path
}

// Version is the encoding's header; bump it (and the golden tests) for any change.
const Version = "shed-derivation v1"

var (
	builderRE = regexp.MustCompile(`^[a-z][a-z0-9-]*:[A-Za-z0-9._/-]+$`)
	envKeyRE  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	hexRE     = regexp.MustCompile(`^[0-9a-f]+$`)
)

// ErrInvalid marks a derivation that breaks the rules Validate checks.
var ErrInvalid = errors.New("invalid derivation")

// Validate checks everything that does not depend on the store.
func (d *Derivation) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w %q: %s", ErrInvalid, d.Name, fmt.Sprintf(format, a...))
	}
	if err := store.CheckName(d.Name); err != nil {
		return bad("name: %v", err)
	}
	if len(d.Name)+len(".drv") > store.MaxNameLen {
		return bad("name too long for a .drv file")
	}
	if !d.Kind.valid() {
		return bad("unknown kind %q", d.Kind)
	}
	if !builderRE.MatchString(d.Builder) {
		return bad("bad builder %q", d.Builder)
	}
	if d.Network == "" || !isPrintableASCII(d.Network) {
		return bad("bad network %q", d.Network)
	}
	if (d.Kind == KindFetch) != (d.Fixed != nil) {
		return bad("a fetch, and only a fetch, has a fixed output hash")
	}
	if d.Kind == KindLayer && d.Network != "none" {
		return bad("a layer builds without network, not %q", d.Network)
	}
	if d.Fixed != nil {
		if d.Fixed.Algo != "sha256" || len(d.Fixed.Hash) != 64 || !hexRE.MatchString(d.Fixed.Hash) {
			return bad("fixed output must be sha256 with 64 lowercase hex digits")
		}
		if len(d.Inputs) > 0 {
			return bad("a fetch has no inputs")
		}
	}
	for i, in := range d.Inputs {
		if in.Out.IsZero() {
			return bad("input %d has no output path", i)
		}
		if i > 0 && d.Inputs[i-1].Out.String() >= in.Out.String() {
			return bad("inputs must be sorted by output path, without duplicates")
		}
	}
	for k := range d.Env {
		if !envKeyRE.MatchString(k) {
			return bad("bad environment variable name %q", k)
		}
	}
	return nil
}

func isPrintableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// SortInputs sorts the inputs into canonical order.
func (d *Derivation) SortInputs() {
	slices.SortFunc(d.Inputs, func(a, b Input) int { return strings.Compare(a.Out.String(), b.Out.String()) })
}

// Finish validates d and sets its output path for a store bound to storeDir.
//
// A fixed-output derivation's path depends only on its expected hash and name,
// so the same file fetched by any recipe from any mirror has one path. Any
// other derivation's path is BLAKE3 over its encoding "modulo" its input
// derivations: inputs count by their output paths only, so that a layer over
// a .deb fetched from another mirror is still the same layer.
func (d *Derivation) Finish(storeDir string) error {
	if err := d.Validate(); err != nil {
		return err
	}
	var (
		p   store.Path
		err error
	)
	if d.Fixed != nil {
		p, err = store.MakePath("fixed:"+d.Fixed.Algo, d.Fixed.Hash, storeDir, d.Name)
	} else {
		p, err = store.MakePath("output", d.ModuloHash().Hex(), storeDir, d.Name)
	}
	if err != nil {
		return err
	}
	d.Output = p
	return nil
}

// ModuloHash is the hash that keys a non-fixed output: the encoding with the
// output left out and input derivations replaced by nothing.
func (d *Derivation) ModuloHash() store.Hash {
	m := *d
	m.Output = store.Path{}
	m.Inputs = make([]Input, len(d.Inputs))
	for i, in := range d.Inputs {
		m.Inputs[i] = Input{Out: in.Out}
	}
	return store.Sum(m.encode())
}

// Encode returns the canonical encoding, the content of the .drv file. One
// field per line, in a fixed order; every string is Go-quoted, so a value can
// hold spaces, quotes or newlines without blurring a field boundary.
func (d *Derivation) Encode() []byte {
	if d.Output.IsZero() {
		panic("derivation: Encode before Finish")
	}
	return d.encode()
}

func (d *Derivation) encode() []byte {
	var b bytes.Buffer
	b.WriteString(Version)
	b.WriteByte('\n')
	line := func(key string, vals ...string) {
		b.WriteString(key)
		for _, v := range vals {
			b.WriteByte(' ')
			b.WriteString(strconv.Quote(v))
		}
		b.WriteByte('\n')
	}
	line("name", d.Name)
	line("kind", string(d.Kind))
	line("builder", d.Builder)
	line("network", d.Network)
	if d.Fixed != nil {
		line("fixed", d.Fixed.Algo, d.Fixed.Hash)
	}
	for _, in := range d.Inputs {
		line("input", pathString(in.Drv), pathString(in.Out))
	}
	for _, a := range d.Args {
		line("arg", a)
	}
	keys := make([]string, 0, len(d.Env))
	for k := range d.Env {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		line("env", k, d.Env[k])
	}
	line("output", pathString(d.Output))
	return b.Bytes()
}

func pathString(p store.Path) string {
	if p.IsZero() {
		return ""
	}
	return p.String()
}

// References are the store paths a .drv file refers to: its input
// derivations, and inputs that were added rather than built. Input outputs
// that are built are not references of the .drv: they need not exist yet.
func (d *Derivation) References() []store.Path {
	var refs []store.Path
	for _, in := range d.Inputs {
		if in.Drv.IsZero() {
			refs = append(refs, in.Out)
		} else {
			refs = append(refs, in.Drv)
		}
	}
	return refs
}

// DrvName is the name of the .drv file's store path.
func (d *Derivation) DrvName() string { return d.Name + ".drv" }

// Decode parses a .drv file. It accepts only the canonical encoding: the
// result encodes back to exactly b, and its output matches what Finish
// computes for storeDir, so a .drv edited by hand is refused, not trusted.
func Decode(b []byte, storeDir string) (*Derivation, error) {
	d, err := parse(b)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	want := d.Output
	if err := d.Finish(storeDir); err != nil {
		return nil, err
	}
	if d.Output != want {
		return nil, fmt.Errorf("%w %q: output %s does not match its inputs (want %s)", ErrInvalid, d.Name, want, d.Output)
	}
	if !bytes.Equal(d.encode(), b) {
		return nil, fmt.Errorf("%w %q: not in canonical form", ErrInvalid, d.Name)
	}
	return d, nil
}

func parse(b []byte) (*Derivation, error) {
	lines := strings.Split(string(b), "\n")
	if len(lines) < 2 || lines[len(lines)-1] != "" {
		return nil, errors.New("not a derivation (no final newline)")
	}
	lines = lines[:len(lines)-1]
	if lines[0] != Version {
		return nil, fmt.Errorf("line 1: want %q", Version)
	}
	d := &Derivation{}
	// order is the rank of each key: keys must come in this order, and only
	// input, arg and env may repeat.
	order := map[string]int{"name": 1, "kind": 2, "builder": 3, "network": 4, "fixed": 5, "input": 6, "arg": 7, "env": 8, "output": 9}
	arity := map[string]int{"name": 1, "kind": 1, "builder": 1, "network": 1, "fixed": 2, "input": 2, "arg": 1, "env": 2, "output": 1}
	last := 0
	for i, l := range lines[1:] {
		n := i + 2
		key, rest, _ := strings.Cut(l, " ")
		rank, ok := order[key]
		if !ok {
			return nil, fmt.Errorf("line %d: unknown field %q", n, key)
		}
		if rank < last || (rank == last && key != "input" && key != "arg" && key != "env") {
			return nil, fmt.Errorf("line %d: field %q out of order", n, key)
		}
		last = rank
		vals, err := splitQuoted(rest)
		if err != nil {
			return nil, fmt.Errorf("line %d: %v", n, err)
		}
		if len(vals) != arity[key] {
			return nil, fmt.Errorf("line %d: %s wants %d values, got %d", n, key, arity[key], len(vals))
		}
		switch key {
		case "name":
			d.Name = vals[0]
		case "kind":
			d.Kind = Kind(vals[0])
		case "builder":
			d.Builder = vals[0]
		case "network":
			d.Network = vals[0]
		case "fixed":
			d.Fixed = &Fixed{Algo: vals[0], Hash: vals[1]}
		case "input":
			var in Input
			if vals[0] != "" {
				if in.Drv, err = store.ParsePath(vals[0]); err != nil {
					return nil, fmt.Errorf("line %d: %v", n, err)
				}
			}
			if in.Out, err = store.ParsePath(vals[1]); err != nil {
				return nil, fmt.Errorf("line %d: %v", n, err)
			}
			d.Inputs = append(d.Inputs, in)
		case "arg":
			d.Args = append(d.Args, vals[0])
		case "env":
			if d.Env == nil {
				d.Env = map[string]string{}
			}
			if _, dup := d.Env[vals[0]]; dup {
				return nil, fmt.Errorf("line %d: duplicate env %q", n, vals[0])
			}
			d.Env[vals[0]] = vals[1]
		case "output":
			if d.Output, err = store.ParsePath(vals[0]); err != nil {
				return nil, fmt.Errorf("line %d: %v", n, err)
			}
		}
	}
	if last != order["output"] {
		return nil, errors.New("missing output field")
	}
	return d, nil
}

// splitQuoted splits ` "a" "b"` (already without the key) into unquoted values.
func splitQuoted(s string) ([]string, error) {
	var vals []string
	for s != "" {
		if s[0] != '"' {
			return nil, fmt.Errorf("want a quoted string at %q", s)
		}
		q, err := strconv.QuotedPrefix(s)
		if err != nil {
			return nil, fmt.Errorf("bad quoted string at %q", s)
		}
		v, _ := strconv.Unquote(q)
		vals = append(vals, v)
		s = s[len(q):]
		if s == "" {
			break
		}
		if s[0] != ' ' || len(s) == 1 {
			return nil, fmt.Errorf("want one space between values at %q", s)
		}
		s = s[1:]
	}
	return vals, nil
}

// DrvPath is the store path of d's .drv file in a store bound to storeDir.
// It equals what store.AddText gives for the encoding.
func (d *Derivation) DrvPath(storeDir string) (store.Path, error) {
	return store.MakePath("text", store.Sum(d.Encode()).Hex(), storeDir, d.DrvName())
}
