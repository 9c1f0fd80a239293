// Package e2b serves the E2B sandbox API over the supervisor's typed operations, so that the
// unmodified `e2b` SDK (and the harnesses built on it) get Benches: the control plane (create, list,
// get, kill, set the timeout of and read the metrics of sandboxes, and the secrets their proxies
// inject, secrets.go) and, on the same address, the data
// plane the SDK reaches inside a sandbox (envd's commands and filesystem, over Connect, and its /files
// API).
//
// A sandbox is a Bench that bench.create made; its id is the Bench's name; a template is a Workshop
// record's name. Every request becomes an operation of package app, called as the local user whose
// API key the control plane was given (package apikey), through the same policy and audit log as a
// request on the supervisor's socket: this package decides nothing of who may do what. The data
// plane's requests carry the sandbox's access token instead, made at create and held only in this
// process's memory, as envd's are. docs/agents.md says what is supported.
package e2b

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"os/user"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	"toolshed.dev/shed/apikey"
	"toolshed.dev/shed/app"
	"toolshed.dev/shed/bench"
	"toolshed.dev/shed/e2b/envd/filesystem/filesystemconnect"
	"toolshed.dev/shed/e2b/envd/process/processconnect"
)

// EnvdVersion is the envd version the sandboxes report: the SDK turns features on by it. 0.6.4 is
// the first with all that this package serves: file metadata (0.6.2), entries in watch events
// (0.6.3) and watches allowed on network mounts (0.6.4); the SDK gates nothing later.
const EnvdVersion = "0.6.4"

// DefaultTimeout is a sandbox's lifetime when create names none (E2B's default).
const DefaultTimeout = 300 * time.Second

// Server is the E2B API of a supervisor.
type Server struct {
	Service   *app.Service
	Operators string // the supervisor's operators group (a key of one of its members acts as an operator)
	Log       *slog.Logger
	Keys      *apikey.Keys
	// CallerOf identifies a key's user as the socket would (api.CallerOf).
	CallerOf func(uid, gid uint32, operators string) *app.Caller
	// Caps (0: the process's descriptor budget, package fdbudget): the port's connections, those not
	// yet authenticated in all and of one peer, those of one key's user, and one key's user's
	// requests in flight.
	MaxConns, MaxPreAuth, MaxPerPeer, MaxPerUser, MaxInFlight int
	// Domain is the sandboxes' domain create answers (DefaultDomain if empty): the SDK reaches a
	// sandbox's port at PORT-ID.DOMAIN on this address (ports.go).
	Domain string
	// TLS, if set, serves the address over TLS (HTTP/1.1).
	TLS *tls.Config

	limOnce sync.Once
	lim     *limits

	mu        sync.Mutex
	sandboxes map[string]*sandbox       // by id (the Bench's name)
	builds    map[string]*templateBuild // template builds, by build id (templates.go)

	// baseCtx is Serve's: template builds run in it, past the request that triggered them.
	baseCtx context.Context
}

// sandbox is what the server holds of a sandbox it made: the Bench, its owner's key, its access
// token (memory only) and its commands.
type sandbox struct {
	id       string // the Bench's name
	bench    string // the Bench's id
	template string
	keyID    string // the API key it was made with
	user     string // that key's user
	token    string // envd's X-Access-Token for it
	started  time.Time
	envs     map[string]string // added to every command's environment
	metadata map[string]string
	files    chan struct{} // a slot for each file operation in flight (each may hold MaxText twice)
	secure   bool          // made with secure (the SDK's default): its access token guards everything
	traffic  string        // made with allowPublicTraffic false: the token its ports want (ports.go)
	maskHost string        // network.maskRequestHost: the Host its ports' servers are sent
	// defaultUser and accounts are its Bench's (users.go).
	defaultUser string
	accounts    []bench.Account

	mu      sync.Mutex
	procs   map[uint32]*proc
	nextPid uint32
	killed  atomic.Bool // set by kill, before its commands are stopped
	// onTimeout is what the end of its timeout does, as create or the last resume set it (branch.go).
	onTimeout string
	// autoResume (create's lifecycle.autoResume): a request to one of its ports resumes it, paused,
	// for timeoutS seconds (create's timeout).
	autoResume bool
	timeoutS   int64

	watch watches // its directory watches (watch.go)
}

// Handler is the API's HTTP handler: the control plane, envd's HTTP API and its Connect services.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	for _, prefix := range []string{"", "/v2"} {
		mux.HandleFunc("POST "+prefix+"/sandboxes", s.create)
		mux.HandleFunc("GET "+prefix+"/sandboxes", s.list)
	}
	mux.HandleFunc("GET /sandboxes/{id}", s.get)
	mux.HandleFunc("DELETE /sandboxes/{id}", s.kill)
	mux.HandleFunc("POST /sandboxes/{id}/timeout", s.setTimeout)
	mux.HandleFunc("POST /sandboxes/{id}/refreshes", s.refresh)
	// The SDK's connect is POST /sandboxes/{id}/connect (older ones: /v2/...).
	mux.HandleFunc("POST /sandboxes/{id}/connect", s.connect)
	mux.HandleFunc("POST /v2/sandboxes/{id}/connect", s.connect)
	mux.HandleFunc("PUT /sandboxes/{id}/network", s.updateNetwork)
	mux.HandleFunc("GET /sandboxes/{id}/metrics", s.metrics)
	mux.HandleFunc("GET /sandboxes/metrics", s.listMetrics)
	// Pause, resume, fork and snapshots (branch.go).
	mux.HandleFunc("POST /sandboxes/{id}/pause", s.pause)
	mux.HandleFunc("POST /sandboxes/{id}/resume", s.resume)
	mux.HandleFunc("POST /sandboxes/{id}/fork", s.fork)
	mux.HandleFunc("POST /sandboxes/{id}/snapshots", s.createSnapshot)
	mux.HandleFunc("GET /snapshots", s.listSnapshots)
	mux.HandleFunc("DELETE /templates/{id}", s.deleteTemplate)
	// The Template API (templates.go).
	// GET /templates/aliases/{alias} and GET /templates/{templateID}/tags overlap (aliases/tags):
	// one pattern, by its first segment.
	mux.HandleFunc("GET /templates/{templateID}/{what}", s.templateGet)
	mux.HandleFunc("POST /v3/templates", s.requestBuild)
	mux.HandleFunc("POST /v2/templates", s.requestBuild)
	mux.HandleFunc("GET /templates/{templateID}/files/{hash}", s.fileUploadLink)
	mux.HandleFunc("POST /v2/templates/{templateID}/builds/{buildID}", s.triggerBuild)
	mux.HandleFunc("GET /templates/{templateID}/builds/{buildID}/status", s.buildStatus)
	mux.HandleFunc("POST /templates/tags", s.assignTags)
	mux.HandleFunc("DELETE /templates/tags", s.removeTags)
	// Secrets (secrets.go): a sandbox uses them by its create's network.rules (network.go).
	mux.HandleFunc("POST /secrets", s.createSecret)
	mux.HandleFunc("GET /secrets", s.listSecrets)
	mux.HandleFunc("GET /secrets/{secretID}", s.getSecret)
	mux.HandleFunc("POST /secrets/{secretID}", s.updateSecret)
	mux.HandleFunc("DELETE /secrets/{secretID}", s.deleteSecret)

	mux.HandleFunc("/sandboxes/{id}/{what}", s.unsupportedSandboxRoute)
	mux.HandleFunc("/v2/sandboxes/{id}/{what}", s.unsupportedSandboxRoute)
	s.refuse(mux) // refusals.go: what shed does not serve, each with its reason

	mux.HandleFunc("GET /health", s.health)
	mux.HandleFunc("GET /files", s.readFile)
	mux.HandleFunc("POST /files", s.writeFile)
	// connect-go reads a whole message (decompressed) before the handler authenticates: bound it.
	limit := connect.WithReadMaxBytes(maxRPCMessage)
	for _, h := range []func() (string, http.Handler){
		func() (string, http.Handler) { return processconnect.NewProcessHandler(&processService{s}, limit) },
		func() (string, http.Handler) {
			return filesystemconnect.NewFilesystemHandler(&filesystemService{s}, limit)
		},
	} {
		path, handler := h()
		mux.Handle(path, boundedMessages(handler))
	}
	// Refusals are not logged one by one (guard counts them): a flood must not flood the log too.
	return s.hosts(s.guard(s.logged(mux)))
}

// Serve answers on ln until ctx ends; the sandboxes' Benches end with the supervisor's context.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	s.baseCtx = ctx
	s.restore() // the sandboxes paused when the supervisor last stopped
	return s.serve(ctx, ln, s.Handler())
}

func (s *Server) serve(ctx context.Context, ln net.Listener, h http.Handler) error {
	hs := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: headerTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeader,
		BaseContext:       func(net.Listener) context.Context { return ctx },
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, connKey{}, tlsConn(c))
		},
		ErrorLog: slog.NewLogLogger(s.log().Handler(), slog.LevelWarn),
	}
	// Shutdown lets the requests in flight end (2 s at most, then their connections are closed);
	// serve returns only after it, so nothing of the server runs on once its caller goes on.
	shut := make(chan struct{})
	go func() {
		defer close(shut)
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if hs.Shutdown(sctx) != nil {
			_ = hs.Close()
		}
	}()
	// Connections are bounded by party, keyed or not: each costs the root daemon a descriptor, a
	// goroutine and buffers (limits.go).
	var refused atomic.Int64
	var l net.Listener = &listener{Listener: ln, lim: s.limits(), log: func(peer string) {
		// One line per 1000: a flood must not flood the log too.
		if n := refused.Add(1); n%1000 == 1 {
			s.log().Warn("e2b connection refused: its peer holds its share", "peer", peer, "refused", n)
		}
	}}
	if s.TLS != nil {
		// After the caps: a connection over them is refused before its handshake costs anything.
		l = tls.NewListener(l, s.TLS)
	}
	err := hs.Serve(l)
	if errors.Is(err, http.ErrServerClosed) {
		<-shut
		return nil
	}
	return err
}

func (s *Server) log() *slog.Logger {
	if s.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Log
}

// logged logs each request: method, path, status, who. Never a header: they hold the keys.
func (s *Server) logged(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		start := time.Now()
		h.ServeHTTP(sw, r)
		s.log().Info("e2b request", "method", r.Method, "path", r.URL.Path, "sandbox", r.Header.Get("E2b-Sandbox-Id"),
			"status", sw.status, "ms", time.Since(start).Milliseconds())
	})
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// errNoSandbox is the data plane's one answer to a sandbox that is not running and to a token that is
// not its: which of the two would tell a stranger which sandbox names exist.
var errNoSandbox = errors.New("no running sandbox with this id and access token (killed, past its timeout, its key removed, or not the envdAccessToken its create returned)")

// errNoKey is the control plane's answer to a missing, unknown or removed key.
var errNoKey = errors.New("no valid API key: an operator makes one with `shed agent key create USER`; set it as E2B_API_KEY")

// errUnauthorized is the answer to a missing, unknown or removed key or token.
var errUnauthorized = errors.New("unauthorized")

// callerOfKey is the caller an API key acts as: its user, with the roles and groups the socket would
// give that user, and the key's id (never the key) for the audit log.
func (s *Server) callerOfKey(secret string) (*app.Caller, *apikey.Key, error) {
	if secret == "" {
		return nil, nil, errUnauthorized
	}
	k, err := s.Keys.Lookup(secret)
	if err != nil {
		return nil, nil, errUnauthorized
	}
	c, err := s.callerOfUser(k.User, k.ID)
	return c, k, err
}

func (s *Server) callerOfUser(name, keyID string) (*app.Caller, error) {
	u, err := user.Lookup(name)
	if err != nil {
		return nil, errUnauthorized // the key's user is gone: the key acts as no one
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	c := s.CallerOf(uint32(uid), uint32(gid), s.Operators)
	c.Dir, c.Via = "/", "e2b key "+keyID
	return c, nil
}

// maxFileOps bounds a sandbox's file operations in flight.
const maxFileOps = 4

// fileSlot waits for one of the sandbox's file-operation slots; release gives it back.
func (sb *sandbox) fileSlot(ctx context.Context) (release func(), err error) {
	select {
	case sb.files <- struct{}{}:
		return func() { <-sb.files }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// keyLive says whether the key id is still the store's: a removed key's sandboxes are refused too.
func (s *Server) keyLive(id string) bool {
	keys, err := s.Keys.List()
	if err != nil {
		return false
	}
	for _, k := range keys {
		if k.ID == id {
			return true
		}
	}
	return false
}

func newToken() string {
	var b [24]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // the kernel's random source failed: nothing secret can be made
	}
	return hex.EncodeToString(b[:])
}

func (s *Server) add(sb *sandbox) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sandboxes == nil {
		s.sandboxes = map[string]*sandbox{}
	}
	s.sandboxes[sb.id] = sb
}

func (s *Server) drop(id string) {
	s.mu.Lock()
	sb := s.sandboxes[id]
	delete(s.sandboxes, id)
	s.mu.Unlock()
	if sb != nil {
		s.unsave(sb.bench)
	}
}

// byToken returns the sandbox a data-plane request is for, and the caller it acts as, if its access
// token is that sandbox's and the key that made it still exists.
func (s *Server) byToken(h http.Header) (*sandbox, *app.Caller, error) {
	sb := s.sandboxOf(h)
	if sb == nil {
		return nil, nil, errUnauthorized
	}
	c, err := s.callerOfUser(sb.user, sb.keyID)
	if err != nil {
		return nil, nil, err
	}
	return sb, c, nil
}

// sandboxOf returns the sandbox whose access token the headers carry, if the key that made it still
// exists; nil otherwise.
func (s *Server) sandboxOf(h http.Header) *sandbox {
	id, token := h.Get("E2b-Sandbox-Id"), h.Get("X-Access-Token")
	s.mu.Lock()
	sb := s.sandboxes[id]
	s.mu.Unlock()
	if sb == nil || token == "" || subtle.ConstantTimeCompare([]byte(token), []byte(sb.token)) != 1 || !s.keyLive(sb.keyID) {
		return nil
	}
	return sb
}
