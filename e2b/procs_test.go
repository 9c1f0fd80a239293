package e2b

import (
	"context"
	"sync"
	"testing"

	"toolshed.dev/shed/app"
	"toolshed.dev/shed/e2b/envd/process"
)

// TestStartsRaceNotPastMaxProcs: a sandbox runs at most maxProcs commands, however many are started at
// once. Each command here stays running (its bench.exec waits in the policy) while the others start.
func TestStartsRaceNotPastMaxProcs(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hold := make(chan struct{})
	var waiting sync.WaitGroup
	svc := &app.Service{Root: t.TempDir(), Detached: &app.Detached{Ctx: ctx}, Policy: func(*app.Service, *app.Caller, string, any) error {
		<-hold
		return app.ErrDenied
	}}
	s := &Server{Service: svc}
	sb := &sandbox{id: "b", bench: "b", procs: map[uint32]*proc{}}
	caller := &app.Caller{User: "nobody", Role: app.User}
	var mu sync.Mutex
	started := 0
	var wg sync.WaitGroup
	for range 3 * maxProcs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, _, err := s.start(sb, caller, "", &process.ProcessConfig{Cmd: "true"}, nil, true, nil, "")
			if err == nil {
				waiting.Add(1)
				go func() { defer waiting.Done(); <-p.done }()
				mu.Lock()
				started++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	sb.mu.Lock()
	running := len(sb.procs)
	sb.mu.Unlock()
	if started > maxProcs || running > maxProcs {
		t.Errorf("%d starts at once: %d started, %d running; at most %d may", 3*maxProcs, started, running, maxProcs)
	}
	close(hold)
	waiting.Wait()
}
