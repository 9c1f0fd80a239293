package e2b

import (
	"errors"
	"net/http"
	"strings"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/reflect/protoreflect"

	"toolshed.dev/shed/e2b/envd/filesystem"
	"toolshed.dev/shed/e2b/envd/process"
)

// A refusal is an E2B route or envd RPC that shed does not serve, and why. It is answered in E2B's
// shape ({code, message} under 501, or a Connect error `unimplemented` for an RPC) with its reason,
// never a bare 404, and only after the request is authenticated and the sandbox it names is found:
// an unknown or killed sandbox is E2B's 404 first (the SDK's SandboxNotFoundError), whatever the
// route. docs/agents.md's table has a row for each.
//
// To serve one, delete its row and register the handler: ServeMux panics on a pattern registered
// twice, and Handler on a refused RPC the generated service has, so a row left behind shows at once.
type refusal struct {
	route  string // a ServeMux pattern ("POST /sandboxes/{id}/pause"), or an RPC's procedure ("/filesystem.Filesystem/WatchDir")
	reason string // why, and what to do instead
}

// refusedRoutes are E2B's control-plane routes (and envd's HTTP routes) that shed refuses.
var refusedRoutes = []refusal{
	{"GET /sandboxes/{id}/logs", "sandbox logs are not supported: `shed bench logs` shows a Bench's"},
	{"GET /v2/sandboxes/{id}/logs", "sandbox logs are not supported: `shed bench logs` shows a Bench's"},
	{"/templates", "templates are Workshop records: the SDK's build, exists, tags and delete are served; `shed workshop ls` lists them"},
	{"/templates/", "templates are Workshop records: the SDK's build, exists, tags and delete are served; `shed workshop ls` lists them"},
	{"/v2/templates", "templates are Workshop records: the SDK's build, exists, tags and delete are served; `shed workshop ls` lists them"},
	{"/v2/templates/", "templates are Workshop records: the SDK's build, exists, tags and delete are served; `shed workshop ls` lists them"},
	{"/v3/templates", "templates are Workshop records: the SDK's build, exists, tags and delete are served; `shed workshop ls` lists them"},
	{"/volumes", "volumes are not supported: an operator grants directories in a Workshop's recipe"},
	{"/volumes/", "volumes are not supported: an operator grants directories in a Workshop's recipe"},
	{"/teams", "teams are not supported: a key acts as its user (`shed agent key create USER`)"},
	{"/teams/", "teams are not supported: a key acts as its user (`shed agent key create USER`)"},
	{"/api-keys", "API keys are made by an operator: `shed agent key create USER`"},
	{"/api-keys/", "API keys are made by an operator: `shed agent key create USER`"},
	{"/access-tokens", "access tokens are not supported: use an API key (`shed agent key create USER`)"},
	{"/access-tokens/", "access tokens are not supported: use an API key (`shed agent key create USER`)"},
	// envd's own HTTP API, beside /health and /files.
	{"/metrics", "envd's /metrics is the orchestrator's: a sandbox's metrics are GET /sandboxes/{id}/metrics on the API (the SDK's getMetrics)"},
	{"/envs", "a sandbox's environment is set at create (envVars) and per command (envs)"},
	{"/init", "envd's /init is the orchestrator's, not a client's"},
	{"/files/compose", "composing files is not supported: write the whole file, or join parts with a command"},
}

// refusedRPCs are envd RPCs (of services shed serves) that shed refuses: none today (the watcher
// RPCs are served, watch.go); a row names a procedure and why.
var refusedRPCs = []refusal{}

// envdServices are the services whose procedures a refused RPC must not be one of.
var envdServices = []protoreflect.ServiceDescriptor{
	filesystem.File_filesystem_proto.Services().Get(0),
	process.File_process_proto.Services().Get(0),
}

// refuse registers the refusals on mux.
func (s *Server) refuse(mux *http.ServeMux) {
	for _, rf := range refusedRoutes {
		mux.HandleFunc(rf.route, s.refusedRoute(rf))
	}
	for _, rf := range refusedRPCs {
		svc, method, _ := strings.Cut(strings.TrimPrefix(rf.route, "/"), "/")
		for _, sd := range envdServices {
			if string(sd.FullName()) == svc && sd.Methods().ByName(protoreflect.Name(method)) != nil {
				panic("e2b: " + rf.route + " is served and refused: delete its row of refusedRPCs")
			}
		}
		mux.HandleFunc("POST "+rf.route, s.refusedRPC(rf))
	}
	// Whatever no row names: E2B's shape still, with the route named.
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if s.authorized(w, r) == nil {
			return
		}
		writeError(w, http.StatusNotFound, "%s %s is no route of E2B's API that shed knows: docs/agents.md lists what it serves", r.Method, r.URL.Path)
	})
}

// refusedRoute answers a refused control-plane route: a key, then the sandbox it names (404 if it
// is not the caller's running sandbox), then the reason.
func (s *Server) refusedRoute(rf refusal) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("id") != "" {
			if _, sb, _ := s.lookup(w, r); sb == nil {
				return
			}
		} else if s.authorized(w, r) == nil {
			return
		}
		writeError(w, http.StatusNotImplemented, "%s %s: %s (docs/agents.md lists what shed serves)", r.Method, r.URL.Path, rf.reason)
	}
}

// unsupportedSandboxRoute answers a sandbox's route that no row names (E2B may add some): the
// sandbox first, as refusedRoute.
func (s *Server) unsupportedSandboxRoute(w http.ResponseWriter, r *http.Request) {
	if _, sb, _ := s.lookup(w, r); sb == nil {
		return
	}
	writeError(w, http.StatusNotImplemented, "%s %s is not supported by shed's E2B API: docs/agents.md lists what is", r.Method, r.URL.Path)
}

// refusedRPC answers a refused envd RPC as a Connect error, in the protocol the client spoke: the
// sandbox's access token first, as for the RPCs shed serves.
func (s *Server) refusedRPC(rf refusal) http.HandlerFunc {
	ew := connect.NewErrorWriter()
	return func(w http.ResponseWriter, r *http.Request) {
		if _, _, err := s.byToken(r.Header); err != nil {
			_ = ew.Write(w, r, connect.NewError(connect.CodeUnauthenticated, errNoSandbox))
			return
		}
		_ = ew.Write(w, r, connect.NewError(connect.CodeUnimplemented, errors.New(rf.reason)))
	}
}
