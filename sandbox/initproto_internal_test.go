package sandbox

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"testing"
)

// init writes "started" pre-encoded: it must be what the encoder of message writes, and what the
// parent decodes as it.
func TestStartedMessage(t *testing.T) {
	var b bytes.Buffer
	if err := json.NewEncoder(&b).Encode(message{Started: true}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b.Bytes(), startedMsg) {
		t.Errorf("startedMsg is %q, the encoder writes %q", startedMsg, b.Bytes())
	}
	var m message
	dec := json.NewDecoder(bytes.NewReader(startedMsg))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil || !m.Started || m.Error != nil {
		t.Errorf("startedMsg decodes as %+v (%v)", m, err)
	}
}

// fill sets every field reachable from v to a value of its own, not zero (slices get two elements,
// pointers a value), so that a field the config frame leaves out comes back different.
func fill(v reflect.Value, n *int) {
	*n++
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).Type == reflect.TypeFor[*os.File]() {
				continue // Bind.SourceFD: the parent's, never sent (a mount tree goes instead)
			}
			fill(v.Field(i), n)
		}
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 2, 2))
		for i := range 2 {
			fill(v.Index(i), n)
		}
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(v.Elem(), n)
	case reflect.String:
		v.SetString(fmt.Sprintf("s%d", *n))
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int32, reflect.Int64:
		v.SetInt(int64(-*n * 1000))
	case reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(uint64(*n * 1000))
	default:
		panic("fill: a field of kind " + v.Kind().String() + ": teach encodeConfig and this test about it")
	}
}

// Every field of initConfig makes the round trip through the config frame, as do nil and empty slices.
func TestConfigWire(t *testing.T) {
	var full initConfig
	n := 0
	fill(reflect.ValueOf(&full).Elem(), &n)
	empty := initConfig{Spec: Spec{Argv: []string{}, Env: []string{}, Binds: []Bind{}}, Stdio: []int{}, UIDMap: []idMapping{}}
	for _, cfg := range []*initConfig{&full, &empty, {}} {
		frame := encodeConfig(cfg)
		if frame[0] != configByte {
			t.Fatalf("frame starts with %q", frame[0])
		}
		r := bytes.NewReader(frame[1:])
		got, proto, err := readConfig(r, r)
		if err != nil || proto != initProto {
			t.Fatalf("readConfig: version %d, %v", proto, err)
		}
		if !reflect.DeepEqual(got, cfg) {
			t.Errorf("round trip:\n got %+v\nwant %+v", got, cfg)
		}
		if r.Len() != 0 {
			t.Errorf("%d bytes left after the frame", r.Len())
		}
		// Cut short anywhere, the frame is refused, not half read.
		body := frame[1:]
		for i := 1; i < len(body); i++ {
			r := bytes.NewReader(body[:i])
			if got, _, err := readConfig(r, r); err == nil {
				t.Fatalf("a frame cut at %d of %d bytes was read: %+v", i, len(body), got)
			}
		}
	}
	// Another version is told, not decoded.
	var w wireWriter
	w.uint(initProto + 1)
	if cfg, proto, err := decodeConfig(w.b); cfg != nil || proto != initProto+1 || err != nil {
		t.Errorf("version %d: got %v, %d, %v", initProto+1, cfg, proto, err)
	}
}
