// Package startstop is the one shape of every background part of a store
// (a maintainer, a reaper, a lease renewer, a sweeper): Start begins it in
// a goroutine of its own, Stop ends it and waits until it has returned.
package startstop

import (
	"context"
	"sync"
	"time"
)

// Periodic runs Run every Every from Start until Stop. Run is given a
// context that Stop cancels, so a long pass ends early. Safe to Stop more
// than once, or without Start.
type Periodic struct {
	Name  string // what the part does, named when it is misconfigured
	Every time.Duration
	Run   func(ctx context.Context)

	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
}

// Start begins the loop; the first pass comes one Every after it.
func (p *Periodic) Start(ctx context.Context) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done != nil {
		return
	}
	if p.Every <= 0 {
		panic("startstop: " + p.Name + ": Every must be positive") // a ticker cannot run on it
	}
	ctx, p.cancel = context.WithCancel(ctx)
	p.done = make(chan struct{})
	go func() {
		defer close(p.done)
		tick := time.NewTicker(p.Every)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				p.Run(ctx)
			}
		}
	}()
}

// Stop ends the loop and waits for a pass under way to return.
func (p *Periodic) Stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done == nil {
		return
	}
	p.cancel()
	<-p.done
}
