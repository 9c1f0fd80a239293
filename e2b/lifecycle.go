package e2b

import (
	"context"
	"net/http"

	"toolshed.dev/shed/app"
)

// health is envd's GET /health as E2B's proxy answers it: 204 while the sandbox the headers name
// (E2b-Sandbox-Id, with its X-Access-Token) runs, 502 once it ended (killed, past its timeout,
// `shed bench rm`) or for any other id or token. The SDK's isRunning() and its "the sandbox was
// killed" error read the 502. Without a sandbox id it is the port's own liveness: 204.
func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("E2b-Sandbox-Id") == "" {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	sb, c, err := s.byToken(r.Header)
	// A sandbox being killed is not running from the moment its commands are stopped: their broken
	// streams make the SDK ask at once, before its Bench is gone.
	if err != nil || sb.killed.Load() || !s.benchRunning(r.Context(), c, sb.bench) {
		writeError(w, http.StatusBadGateway, "%v", errNoSandbox)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// benchRunning says whether the Bench (by id) still runs, as its caller sees the Benches; an error
// counts as not running, and so does a paused Bench (E2B's proxy answers a paused sandbox as a
// stopped one: the SDK's isRunning() is false until connect resumes it).
func (s *Server) benchRunning(ctx context.Context, c *app.Caller, benchID string) bool {
	res, err := s.Service.Do(ctx, &app.Call{Caller: c}, "bench.ls", &app.BenchListRequest{})
	if err != nil {
		return false
	}
	for _, rec := range res.(*app.BenchListResult).Benches {
		if rec.ID == benchID {
			return rec.Running && rec.Paused == nil
		}
	}
	return false
}
