package dispatch

import (
	"context"
	"sync"
	"time"

	"throttler/internal/clock"
	"throttler/internal/leaky"
)

// Gate enforces a tenant's spacing on the moments requests are really
// written, whatever the schedule said. It is GCRA on send times with a small
// slack, so in any window W at most (W + slack)/T + Burst requests go out.
//
// A send is known only when its first bytes are written, which can be well
// after the gate let it go: net/http writes from another goroutine, and a
// busy machine delays that goroutine. So a key's next send waits until the
// previous one reports when it was written (Ticket.Wrote) or that it never
// was (Ticket.Done), and is spaced from the real write.
type Gate struct {
	clock clock.Clock

	mu    sync.Mutex
	keys  map[string]*gateKey
	calls int
}

type gateKey struct {
	tat         time.Time     // theoretical time of the next send
	outstanding chan struct{} // closed when the last release is resolved; nil if none
}

// Ticket is one send the gate let go.
type Ticket struct {
	g    *Gate
	key  string
	p    leaky.Policy
	At   time.Time // when the gate let it go
	once sync.Once
	done chan struct{}
}

// NewGate returns an empty gate on clk.
func NewGate(clk clock.Clock) *Gate {
	return &Gate{clock: clk, keys: map[string]*gateKey{}}
}

// slack is how much earlier than its theoretical time a send may go, so that
// a send late by less than that costs the sends after it nothing: without
// it, every timer that fires late (here: 0.3 ms at the median, 1 ms at the
// 90th percentile) would push the rest of a backlog back for good. DESIGN.md
// allows 2 ms of scheduling jitter in the window rule; the gate takes 1.5 ms
// of it, measured on the send itself, and leaves 0.5 ms to the network.
func slack(p leaky.Policy) time.Duration {
	return min(1500*time.Microsecond, p.Interval/8)
}

// Wait blocks until key may send at or after notBefore under p and returns
// the ticket of that send. It returns early only when ctx is done. The
// caller must resolve the ticket: Wrote when the request is written, Done
// when the attempt ends (either is enough; both are fine).
func (g *Gate) Wait(ctx context.Context, key string, p leaky.Policy, notBefore time.Time) (*Ticket, error) {
	for {
		g.mu.Lock()
		k := g.keys[key]
		if k == nil {
			k = &gateKey{}
			g.keys[key] = k
		}
		if busy := k.outstanding; busy != nil {
			g.mu.Unlock()
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-busy:
			}
			continue
		}
		now := g.clock.Now()
		allowed := k.tat.Add(-p.Tolerance() - slack(p))
		if allowed.Before(notBefore) {
			allowed = notBefore
		}
		if !now.Before(allowed) {
			tat := k.tat
			if tat.Before(now) {
				tat = now
			}
			k.tat = tat.Add(p.Interval)
			t := &Ticket{g: g, key: key, p: p, At: now, done: make(chan struct{})}
			k.outstanding = t.done
			g.sweep(now)
			g.mu.Unlock()
			return t, nil
		}
		g.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-g.clock.After(allowed.Sub(now)):
		}
	}
}

// Wrote records that the request was written at wrote: the key's next send
// is spaced from then.
func (t *Ticket) Wrote(wrote time.Time) {
	t.resolve(func(k *gateKey) {
		if next := wrote.Add(t.p.Interval); k.tat.Before(next) {
			k.tat = next
		}
	})
}

// Done records that the attempt ended; if Wrote was not called, nothing was
// written (the slot stays used: a gap is safe).
func (t *Ticket) Done() { t.resolve(nil) }

func (t *Ticket) resolve(f func(*gateKey)) {
	t.once.Do(func() {
		t.g.mu.Lock()
		if k := t.g.keys[t.key]; k != nil {
			if f != nil {
				f(k)
			}
			if k.outstanding == t.done {
				k.outstanding = nil
			}
		}
		close(t.done)
		t.g.mu.Unlock()
	})
}

// sweep forgets keys that can no longer hold anyone back, now and then:
// memory grows with active tenants only.
func (g *Gate) sweep(now time.Time) {
	g.calls++
	if g.calls%4096 != 0 {
		return
	}
	for key, k := range g.keys {
		if k.outstanding == nil && k.tat.Before(now) {
			delete(g.keys, key)
		}
	}
}
