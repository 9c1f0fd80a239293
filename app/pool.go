package app

import (
	"context"
	"time"

	"toolshed.dev/shed/sandbox"
)

// Pool keeps sandbox inits started ahead (sandbox.Prestart): a Bench an API caller creates takes one,
// so its creation is its configuration, mounts and exec, not a new process's start. Each holds an id
// slot (docs/sandbox.md), so the pool is small. An init is bound to no Workshop until its spec
// arrives: a Workshop's own inits are a reservation (its creates take them first, and others never
// do), the shared ones serve any Workshop.
type Pool struct {
	shared   chan *sandbox.Pending
	workshop map[string]chan *sandbox.Pending
}

// NewPool keeps n shared inits ready, and perWorkshop[name] more for each Workshop record named,
// until ctx ends (then they are killed with it).
func NewPool(ctx context.Context, n int, perWorkshop map[string]int) *Pool {
	p := &Pool{shared: fill(ctx, n), workshop: map[string]chan *sandbox.Pending{}}
	for name, k := range perWorkshop {
		p.workshop[name] = fill(ctx, k)
	}
	return p
}

// fill keeps n inits ready in the channel it returns.
func fill(ctx context.Context, n int) chan *sandbox.Pending {
	ready := make(chan *sandbox.Pending, max(n, 0))
	if n <= 0 {
		return ready
	}
	go func() {
		for {
			pd, err := sandbox.Prestart(ctx, sandbox.Stdio{})
			if err != nil {
				// Every id slot in use, or the machine refuses: try again later; creates start
				// their own meanwhile.
				select {
				case <-ctx.Done():
					return
				case <-time.After(time.Second):
					continue
				}
			}
			select {
			case ready <- pd:
			case <-ctx.Done():
				pd.Close()
				for {
					select {
					case pd := <-ready:
						pd.Close()
					default:
						return
					}
				}
			}
		}
	}()
	return ready
}

// Take returns a ready init for a Bench of the Workshop record name (its own first, then a shared
// one), or nil when none is (the caller starts its own).
func (p *Pool) Take(name string) *sandbox.Pending {
	if p == nil {
		return nil
	}
	select {
	case pd := <-p.workshop[name]:
		return pd
	default:
	}
	select {
	case pd := <-p.shared:
		return pd
	default:
		return nil
	}
}
