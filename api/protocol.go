// Package api is the supervisor's socket: a typed, versioned protocol over a Unix socket, its server
// (the daemon: who the peer is, limits, recovery) and its client (the CLI through the daemon).
//
// One request per connection (docs/api.md):
//
//	client -> daemon  4 bytes big-endian length n, carrying with SCM_RIGHTS the client's stdin,
//	                  stdout and stderr (exactly three descriptors)
//	client -> daemon  n bytes: a Request (JSON), decoded strictly: unknown fields and unknown
//	                  operations are refused, and so is anything after it
//	client -> daemon  while the operation runs, the byte 'W' each time the client's terminal is resized;
//	                  closing the connection cancels the operation
//	daemon -> client  JSON messages, one per line: Notices while it runs, then one Result or Error
//
// The descriptors are how a Bench's command reaches the client's terminal, and build progress its
// stderr: everything else travels as typed fields. Who the client is comes from the kernel
// (SO_PEERCRED), never from the request.
package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"toolshed.dev/shed/api/wire"
	"toolshed.dev/shed/app"
)

// Protocol is this protocol's version. A request of another version is refused.
const Protocol = wire.Protocol

// MaxRequest bounds a request's size.
const MaxRequest = wire.MaxRequest

// Request is what a client asks (package wire has it, for clients that do not link app).
type Request = wire.Request

// Message is one line the daemon sends: exactly one field is set.
type Message struct {
	Notice *app.Notice      `json:"notice,omitempty"`
	Result *json.RawMessage `json:"result,omitempty"`
	Error  *Error           `json:"error,omitempty"`
}

// Error is an operation's failure on the wire.
type Error struct {
	Code    app.Code `json:"code"`
	Message string   `json:"message"`
	Hint    string   `json:"hint,omitempty"`
}

// Decode parses a request's body strictly and returns it with its operation and the operation's
// decoded request. Every error is an *app.Error (bad_request or unknown_operation).
func Decode(body []byte) (*Request, *app.Operation, any, error) {
	badRequest := func(format string, args ...any) error {
		return &app.Error{Code: app.CodeBadRequest, Err: fmt.Errorf(format, args...), Hint: "docs/api.md describes every operation and its fields"}
	}
	if len(body) > MaxRequest {
		return nil, nil, nil, badRequest("a request of %d bytes (at most %d)", len(body), MaxRequest)
	}
	var req Request
	if err := strict(body, &req); err != nil {
		return nil, nil, nil, badRequest("request: %v", err)
	}
	if req.Protocol != Protocol {
		return nil, nil, nil, badRequest("protocol version %d: this supervisor speaks %d (is the client's shed another version?)", req.Protocol, Protocol)
	}
	o, ok := app.Lookup(req.Op)
	if !ok {
		return nil, nil, nil, &app.Error{Code: app.CodeUnknownOperation, Err: fmt.Errorf("no operation %q", req.Op), Hint: "docs/api.md lists the operations"}
	}
	v := o.New()
	raw := []byte(req.Request)
	if len(bytes.TrimSpace(raw)) == 0 {
		raw = []byte("{}")
	}
	if err := strict(raw, v); err != nil {
		return nil, nil, nil, badRequest("%s: %v", req.Op, err)
	}
	return &req, o, v, nil
}

// strict decodes one JSON value into v: no unknown field, nothing after it, no null for the whole.
func strict(b []byte, v any) error {
	if bytes.Equal(bytes.TrimSpace(b), []byte("null")) {
		return errors.New("null")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("data after the request")
	}
	return nil
}
