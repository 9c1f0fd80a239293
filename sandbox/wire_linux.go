package sandbox

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// The config goes to init in a compact binary form instead of JSON: a new init decodes it once, and
// encoding/json would first build its decoder for the config's whole type by reflection, a cost every
// init would pay afresh (about as much as the rest of the decoding). Replies (started, a SetupError)
// stay JSON: an init of another build can still say it speaks another version.
//
// A frame is configByte, then the length of the rest as a uvarint, then initProto as a uvarint and
// the fields of initConfig in the order of encodeConfig: unsigned numbers as uvarints, signed ones as
// varints, booleans as one byte, strings as their length and bytes, slices as their length plus one (0
// is nil) and their elements. TestConfigWire checks that every field makes the round trip.

// configByte starts the config frame on the sync socket; neither filesByte nor a JSON value does.
const configByte = 'C'

// maxConfig bounds the frame init reads (argv, env and paths).
const maxConfig = 64 << 20

// byteReader reads a file a byte at a time: the frame's length is read without reading past it.
type byteReader struct{ f io.Reader }

func (r byteReader) ReadByte() (byte, error) {
	var b [1]byte
	_, err := io.ReadFull(r.f, b[:])
	return b[0], err
}

type wireWriter struct{ b []byte }

func (w *wireWriter) uint(v uint64) { w.b = binary.AppendUvarint(w.b, v) }
func (w *wireWriter) int(v int64)   { w.b = binary.AppendVarint(w.b, v) }
func (w *wireWriter) bool(v bool) {
	if v {
		w.b = append(w.b, 1)
	} else {
		w.b = append(w.b, 0)
	}
}
func (w *wireWriter) str(s string) { w.uint(uint64(len(s))); w.b = append(w.b, s...) }

// count writes a slice's length, or 0 for nil.
func (w *wireWriter) count(n int, isNil bool) {
	if isNil {
		w.uint(0)
	} else {
		w.uint(uint64(n) + 1)
	}
}

func (w *wireWriter) strs(s []string) {
	w.count(len(s), s == nil)
	for _, x := range s {
		w.str(x)
	}
}

func (w *wireWriter) ints(s []int) {
	w.count(len(s), s == nil)
	for _, x := range s {
		w.int(int64(x))
	}
}

func (w *wireWriter) maps(s []idMapping) {
	w.count(len(s), s == nil)
	for _, m := range s {
		w.uint(uint64(m.Inside))
		w.uint(uint64(m.Outside))
		w.uint(uint64(m.Count))
	}
}

type wireReader struct {
	b   []byte
	err error
}

var errWire = errors.New("malformed config")

func (r *wireReader) fail() { r.err, r.b = errWire, nil }

func (r *wireReader) uint() uint64 {
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail()
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *wireReader) int() int64 {
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.fail()
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *wireReader) u32() uint32 {
	v := r.uint()
	if v > 1<<32-1 {
		r.fail()
	}
	return uint32(v)
}

func (r *wireReader) bool() bool {
	if len(r.b) == 0 || r.b[0] > 1 {
		r.fail()
		return false
	}
	v := r.b[0] == 1
	r.b = r.b[1:]
	return v
}

func (r *wireReader) str() string {
	n := r.uint()
	if n > uint64(len(r.b)) {
		r.fail()
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}

// count reads a slice's length (-1: nil); each element takes at least a byte, which bounds it.
func (r *wireReader) count() int {
	n := r.uint()
	if n > uint64(len(r.b))+1 {
		r.fail()
		return -1
	}
	return int(n) - 1
}

func (r *wireReader) strs() []string {
	n := r.count()
	if n < 0 {
		return nil
	}
	s := make([]string, n)
	for i := range s {
		s[i] = r.str()
	}
	return s
}

func (r *wireReader) ints() []int {
	n := r.count()
	if n < 0 {
		return nil
	}
	s := make([]int, n)
	for i := range s {
		s[i] = int(r.int())
	}
	return s
}

func (r *wireReader) maps() []idMapping {
	n := r.count()
	if n < 0 {
		return nil
	}
	s := make([]idMapping, n)
	for i := range s {
		s[i] = idMapping{r.u32(), r.u32(), r.u32()}
	}
	return s
}

// encodeConfig returns the config frame.
func encodeConfig(cfg *initConfig) []byte {
	var w wireWriter
	w.uint(initProto)
	s := &cfg.Spec
	w.bool(s.Root.Host)
	w.strs(s.Root.Hide)
	w.strs(s.Root.Lowers)
	w.str(s.Root.Upper)
	w.str(s.Root.Work)
	w.bool(s.Root.UpperTmpfs)
	w.bool(s.Root.UpperHostIDs)
	w.int(s.Root.UpperSize)
	w.bool(s.Root.Setuid)
	w.count(len(s.Binds), s.Binds == nil)
	for _, b := range s.Binds { // SourceFD stays here: the parent sends the mount trees instead
		w.str(b.Source)
		w.str(b.Target)
		w.bool(b.Writable)
		w.int(int64(b.IDs))
	}
	w.strs(s.Network.Listen)
	w.strs(s.Argv)
	w.strs(s.Env)
	w.str(s.Dir)
	w.bool(s.MakeDir)
	w.count(len(s.Files), s.Files == nil)
	for _, f := range s.Files {
		w.str(f.Path)
		w.str(string(f.Data))
		w.uint(uint64(f.Mode))
	}
	w.uint(uint64(s.UID))
	w.uint(uint64(s.GID))
	w.str(s.Hostname)
	w.int(s.Limits.MemoryBytes)
	w.int(s.Limits.Pids)
	w.bool(s.Account)
	w.bool(s.Pausable)
	w.str(s.Control)
	w.count(len(cfg.Binds), cfg.Binds == nil)
	for _, b := range cfg.Binds {
		w.int(int64(b.FD))
		w.str(b.Target)
		w.bool(b.File)
	}
	w.ints(cfg.CgroupProcs)
	w.int(int64(cfg.Freezer))
	w.str(cfg.Thaw)
	w.int(int64(cfg.UpperTree))
	w.int(int64(cfg.Control))
	w.uint(uint64(cfg.ControlUID))
	w.int(int64(cfg.Console))
	w.bool(cfg.Terminal != nil)
	if cfg.Terminal != nil {
		w.uint(uint64(cfg.Terminal.Rows))
		w.uint(uint64(cfg.Terminal.Cols))
	}
	w.uint(uint64(cfg.IDBase))
	w.int(int64(cfg.Userns))
	w.maps(cfg.UIDMap)
	w.maps(cfg.GIDMap)
	w.ints(cfg.Stdio)
	w.bool(cfg.Rootless)
	frame := binary.AppendUvarint([]byte{configByte}, uint64(len(w.b)))
	return append(frame, w.b...)
}

// readConfig reads a config frame whose first byte, configByte, was read already. A frame of
// another protocol version returns that version and no config.
func readConfig(rd io.ByteReader, body io.Reader) (*initConfig, int, error) {
	size, err := binary.ReadUvarint(rd)
	if err != nil {
		return nil, 0, err
	}
	if size > maxConfig {
		return nil, 0, fmt.Errorf("config of %d bytes, at most %d", size, maxConfig)
	}
	b := make([]byte, size)
	if _, err := io.ReadFull(body, b); err != nil {
		return nil, 0, err
	}
	return decodeConfig(b)
}

func decodeConfig(b []byte) (*initConfig, int, error) {
	r := &wireReader{b: b}
	if proto := r.uint(); r.err != nil || proto != initProto {
		return nil, int(proto), r.err
	}
	cfg := &initConfig{}
	s := &cfg.Spec
	s.Root.Host = r.bool()
	s.Root.Hide = r.strs()
	s.Root.Lowers = r.strs()
	s.Root.Upper = r.str()
	s.Root.Work = r.str()
	s.Root.UpperTmpfs = r.bool()
	s.Root.UpperHostIDs = r.bool()
	s.Root.UpperSize = r.int()
	s.Root.Setuid = r.bool()
	if n := r.count(); n >= 0 {
		s.Binds = make([]Bind, n)
		for i := range s.Binds {
			s.Binds[i] = Bind{Source: r.str(), Target: r.str(), Writable: r.bool(), IDs: BindIDs(r.int())}
		}
	}
	s.Network.Listen = r.strs()
	s.Argv = r.strs()
	s.Env = r.strs()
	s.Dir = r.str()
	s.MakeDir = r.bool()
	if n := r.count(); n >= 0 {
		s.Files = make([]File, n)
		for i := range s.Files {
			s.Files[i] = File{Path: r.str(), Data: []byte(r.str()), Mode: r.u32()}
		}
	}
	s.UID = r.u32()
	s.GID = r.u32()
	s.Hostname = r.str()
	s.Limits.MemoryBytes = r.int()
	s.Limits.Pids = r.int()
	s.Account = r.bool()
	s.Pausable = r.bool()
	s.Control = r.str()
	if n := r.count(); n >= 0 {
		cfg.Binds = make([]initBind, n)
		for i := range cfg.Binds {
			cfg.Binds[i] = initBind{FD: int(r.int()), Target: r.str(), File: r.bool()}
		}
	}
	cfg.CgroupProcs = r.ints()
	cfg.Freezer = int(r.int())
	cfg.Thaw = r.str()
	cfg.UpperTree = int(r.int())
	cfg.Control = int(r.int())
	cfg.ControlUID = r.u32()
	cfg.Console = int(r.int())
	if r.bool() {
		rows, cols := r.uint(), r.uint()
		if rows > 1<<16-1 || cols > 1<<16-1 {
			r.fail()
		}
		cfg.Terminal = &Winsize{Rows: uint16(rows), Cols: uint16(cols)}
	}
	cfg.IDBase = r.u32()
	cfg.Userns = int(r.int())
	cfg.UIDMap = r.maps()
	cfg.GIDMap = r.maps()
	cfg.Stdio = r.ints()
	cfg.Rootless = r.bool()
	if r.err == nil && len(r.b) != 0 {
		r.err = fmt.Errorf("%w: %d bytes left over", errWire, len(r.b))
	}
	if r.err != nil {
		return nil, initProto, r.err
	}
	return cfg, initProto, nil
}
