package app

import (
	"context"
	"time"

	"toolshed.dev/shed/sandbox"
)

// Pool keeps sandbox inits started ahead (sandbox.Prestart): a Bench an API caller creates takes one,
// so its creation is its configuration, mounts and exec, not a new process's start. Each holds an id
// slot (docs/sandbox.md), so the pool is small.
type Pool struct {
	ready chan *sandbox.Pending
}

// NewPool keeps n inits ready until ctx ends (then they are killed with it).
func NewPool(ctx context.Context, n int) *Pool {
	p := &Pool{ready: make(chan *sandbox.Pending, n)}
	if n <= 0 {
		return p
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
			case p.ready <- pd:
			case <-ctx.Done():
				pd.Close()
				for {
					select {
					case pd := <-p.ready:
						pd.Close()
					default:
						return
					}
				}
			}
		}
	}()
	return p
}

// Take returns a ready init, or nil when none is (the caller starts its own).
func (p *Pool) Take() *sandbox.Pending {
	if p == nil {
		return nil
	}
	select {
	case pd := <-p.ready:
		return pd
	default:
		return nil
	}
}
