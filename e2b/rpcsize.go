package e2b

import (
	"fmt"
	"net/http"

	"connectrpc.com/connect"
)

// boundedMessages refuses a Connect request whose body is over maxRPCMessage before connect-go reads
// it: connect-go's own refusal is resource_exhausted, which the SDK shows as "Rate limit exceeded,
// please try again later", when the request is too big, not too soon (a huge pty or stdin write, a
// huge path). A body of unknown length (a stream) is bounded by connect-go's limit still.
func boundedMessages(h http.Handler) http.Handler {
	ew := connect.NewErrorWriter()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > maxRPCMessage && ew.IsSupported(r) {
			_ = ew.Write(w, r, connect.NewError(connect.CodeInvalidArgument,
				fmt.Errorf("a request of %d bytes: at most %d bytes a message (at most %d of input); send it in parts", r.ContentLength, maxRPCMessage, maxStdinChunk)))
			return
		}
		h.ServeHTTP(w, r)
	})
}
