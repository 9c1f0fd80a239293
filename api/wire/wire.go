// Package wire is the supervisor's protocol as data (docs/api.md): the request frame, the messages
// back, the socket's name. It imports nothing of shed's, so that a client links it without package
// app and its libraries: the small `shed` (cmd/shed-front) sends requests with it, package api
// serves and sends them with the same types.
package wire

import "encoding/json"

// Protocol is this protocol's version. A request of another version is refused.
const Protocol = 1

// MaxRequest bounds a request's size.
const MaxRequest = 1 << 20

// The supervisor's socket, and the variable that names another (or "none": no supervisor).
const (
	DefaultSocket = "/run/toolshed/shed.sock"
	SocketEnv     = "SHED_SOCKET"
)

// MsgWinch is the byte a client sends each time its terminal is resized.
const MsgWinch = 'W'

// Request is what a client asks.
type Request struct {
	Protocol int    `json:"protocol"`
	Op       string `json:"op"`
	// Request is the operation's request (see docs/api.md); absent means all fields zero.
	Request json.RawMessage `json:"request,omitempty"`
	// Dir is the client's working directory: relative paths in an operator's request are relative to
	// it. It is the client's claim, so it resolves paths only for callers who may name any path.
	Dir string `json:"dir,omitempty"`
	// Progress asks for build progress on the client's stderr; Verbose for the builds' own output.
	Progress bool `json:"progress,omitempty"`
	Verbose  bool `json:"verbose,omitempty"`
	// Via is the agent's face the client serves, "mcp" (`shed mcp`), or "": the client's word, about
	// its own requests only. It marks their audit entries, and their errors leave out the host's
	// paths (the store's, the socket's), which an agent would pass on to a model.
	Via string `json:"via,omitempty"`
}

// Message is one line the supervisor sends: exactly one field is set. It is api.Message without
// package app's types (api's tests check that the two read the same).
type Message struct {
	Notice *Notice          `json:"notice,omitempty"`
	Result *json.RawMessage `json:"result,omitempty"`
	Error  *Error           `json:"error,omitempty"`
}

// Notice is an operation's info or warning line while it runs (app.Notice).
type Notice struct {
	Kind    string `json:"kind"` // "info" or "warning"
	Message string `json:"message"`
}

// Error is an operation's failure on the wire; Code is one of app's codes (docs/api.md).
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Hint    string `json:"hint,omitempty"`
}
