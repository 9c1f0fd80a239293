package bench

import (
	"context"
	"net"
	"net/http"
	"os"
	"time"
)

// listenPropose makes the propose socket, mode 0600. The mode is set after the bind, not by a umask
// around it: the umask is the process's, and the supervisor launches Benches concurrently. The
// Bench's directory is root's and 0700, so nobody else reaches the socket in between.
func listenPropose(path string) (*net.UnixListener, error) {
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, err
	}
	ln.SetUnlinkOnClose(true)
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// serveProposals answers POST /propose, one at a time, and nothing else: this socket is all an agent
// in the Bench can reach of shed.
func serveProposals(ctx context.Context, ln *net.UnixListener, propose func(context.Context) (string, error)) {
	one := make(chan struct{}, 1)
	mux := http.NewServeMux()
	mux.HandleFunc("POST /propose", func(w http.ResponseWriter, r *http.Request) {
		select {
		case one <- struct{}{}:
			defer func() { <-one }()
		default:
			http.Error(w, "a proposal is being made; try again when it is done\n", http.StatusTooManyRequests)
			return
		}
		text, err := propose(r.Context())
		if err != nil {
			http.Error(w, "shed: error: "+err.Error()+"\n", http.StatusUnprocessableEntity)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Write([]byte(text))
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "shed: only POST /propose is served to a Bench\n", http.StatusForbidden)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, MaxHeaderBytes: 16 << 10}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	_ = srv.Serve(ln) // ends when the Bench does
}
