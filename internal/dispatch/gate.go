package dispatch

import (
	"context"
	"sync"
	"time"

	"throttler/internal/clock"
	"throttler/internal/leaky"
)

// Gate enforces a tenant's spacing on the moments requests are actually
// written, whatever the schedule said: a late attempt (a cold connection, a
// busy CPU) pushes the next one back instead of letting the two arrive
// closer than the rate allows. It is GCRA on real send times with a small
// slack, so in any window W at most (W + slack)/T + Burst requests go out.
type Gate struct {
	clock clock.Clock

	mu    sync.Mutex
	tat   map[string]time.Time // theoretical time of the next send per key
	calls int
}

// NewGate returns an empty gate on clk.
func NewGate(clk clock.Clock) *Gate {
	return &Gate{clock: clk, tat: map[string]time.Time{}}
}

// slack is how much earlier than its theoretical time a send may go, so that
// a send late by less than that (a timer fires ~0.3 ms late here) costs the
// sends after it nothing. DESIGN.md allows 2 ms of jitter in the window rule;
// the gate takes a quarter of it and leaves the rest to the path from here to
// the downstream's handler, measured at up to ~2 ms on a busy 2-core machine.
func slack(p leaky.Policy) time.Duration {
	return min(500*time.Microsecond, p.Interval/8)
}

// Wait blocks until key may send at or after notBefore under p, records the
// send and returns its time. It returns early only when ctx is done.
func (g *Gate) Wait(ctx context.Context, key string, p leaky.Policy, notBefore time.Time) (time.Time, error) {
	for {
		g.mu.Lock()
		now := g.clock.Now()
		tat := g.tat[key]
		allowed := tat.Add(-p.Tolerance() - slack(p))
		if allowed.Before(notBefore) {
			allowed = notBefore
		}
		if !now.Before(allowed) {
			if tat.Before(now) {
				tat = now
			}
			g.tat[key] = tat.Add(p.Interval)
			g.sweep(now)
			g.mu.Unlock()
			return now, nil
		}
		g.mu.Unlock()
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-g.clock.After(allowed.Sub(now)):
		}
	}
}

// Late records that a send the gate released earlier was really written at
// wrote: the next send of key is spaced from then.
func (g *Gate) Late(key string, p leaky.Policy, wrote time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if next := wrote.Add(p.Interval); g.tat[key].Before(next) {
		g.tat[key] = next
	}
}

// sweep forgets keys that can no longer hold anyone back (their theoretical
// time has passed), now and then: memory grows with active tenants only.
func (g *Gate) sweep(now time.Time) {
	g.calls++
	if g.calls%4096 != 0 {
		return
	}
	for k, tat := range g.tat {
		if tat.Before(now) {
			delete(g.tat, k)
		}
	}
}

// Len is how many keys the gate remembers.
func (g *Gate) Len() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.tat)
}
