package api

import (
	"bytes"
	"encoding/json"
	"testing"

	"toolshed.dev/shed/api/wire"
	"toolshed.dev/shed/app"
)

// TestWireMessage: package wire's Message reads every message the server sends (api.Message, with
// app's types) field for field, and writes it back the same: the small shed decodes with it.
func TestWireMessage(t *testing.T) {
	res := json.RawMessage(`{"exit":3}`)
	for _, m := range []Message{
		{Notice: &app.Notice{Kind: "warning", Message: "a <warning> & more"}},
		{Notice: &app.Notice{Kind: "info"}},
		{Result: &res},
		{Error: &Error{Code: app.CodeNotFound, Message: "no Bench \"b\"", Hint: "shed bench ls lists them"}},
		{Error: &Error{Code: app.CodeUsage, Message: "m"}},
	} {
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		var w wire.Message
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&w); err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		back, err := json.Marshal(w)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(back, b) {
			t.Errorf("wire.Message writes %s back as %s", b, back)
		}
	}
}
