package dispatch

import (
	"context"
	"fmt"
	"sync"
	"time"

	"throttler/internal/clock"
	"throttler/internal/leaky"
)

// Gate enforces spacing on the moments requests are really written,
// whatever the schedule said: a tenant's rate, and a downstream's ceiling
// shared by its tenants. Each is a lane: GCRA on send times with a small
// slack, so in any window W at most (W + slack)/T + Burst requests go out.
//
// A send is known only when its first bytes are written, which can be well
// after the gate let it go: net/http writes from another goroutine, and a
// busy machine delays that goroutine. So a lane's next send waits until the
// previous one reports when it was written (Ticket.Wrote) or that it never
// was (Ticket.Done), and is spaced from the real write.
//
// A lane can be held (Hold): the downstream asked it to wait (429 with
// Retry-After) or its circuit breaker is open. Sends waiting on a held lane
// give up with a *HeldError instead of going when the hold ends: the store
// puts them back in order behind the job that was pushed back.
type Gate struct {
	clock clock.Clock

	mu    sync.Mutex
	keys  map[string]*gateKey
	calls int
	seq   uint64 // orders waiters with the same slot
}

// Lane is one rule a send must pass: Key's own GCRA under Policy, and
// Key's holds. A lane with a zero Policy.Interval only has holds. A send of
// Cost (a job that takes several slots) spaces the next one Cost intervals
// later.
type Lane struct {
	Key    string
	Policy leaky.Policy
	Cost   int // 0 or 1: one slot
}

// step is how far one send of the lane moves its schedule.
func (l Lane) step() time.Duration {
	return time.Duration(max(l.Cost, 1)) * l.Policy.Interval
}

type gateKey struct {
	tat         time.Time     // theoretical time of the next send
	outstanding chan struct{} // closed when the last release is resolved; nil if none
	heldUntil   time.Time
	held        chan struct{}  // closed (and replaced) when a hold begins
	recent      []leaky.Recent // the lane's windows: when its last sends were written
	keepUntil   time.Time      // until then, recent still limits a send
	// waiters are the sends waiting on the lane. On a send's first lane
	// (its tenant) they pass in the order of their slots (then of
	// arrival), not in the order the scheduler happens to wake them, so a
	// tenant's jobs reach the downstream in order. Only there: on a shared
	// downstream lane, a tenant held back by its own rate must not hold up
	// the others. On every lane they keep the key from being swept.
	waiters []*waiter
	moved   chan struct{} // closed (and replaced) when a waiter leaves
}

type waiter struct {
	at  time.Time
	seq uint64
}

func (w *waiter) before(o *waiter) bool {
	return w.at.Before(o.at) || (w.at.Equal(o.at) && w.seq < o.seq)
}

// first is the waiter whose turn it is.
func (k *gateKey) first() *waiter {
	var f *waiter
	for _, w := range k.waiters {
		if f == nil || w.before(f) {
			f = w
		}
	}
	return f
}

func (k *gateKey) leave(me *waiter) {
	for i, w := range k.waiters {
		if w == me {
			k.waiters = append(k.waiters[:i], k.waiters[i+1:]...)
			close(k.moved)
			k.moved = make(chan struct{})
			return
		}
	}
}

// Ticket is one send the gate let go.
type Ticket struct {
	g     *Gate
	lanes []Lane
	At    time.Time // when the gate let it go
	once  sync.Once
	done  chan struct{}
}

// HeldError is a send given up because a lane is held (paused) until
// Until, or, with Busy, cannot go before Until for now (not a pause).
type HeldError struct {
	Key   string
	Until time.Time
	Busy  bool
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("%s is paused until %s", e.Key, e.Until.Format(time.RFC3339Nano))
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

// windowGrace is the longest a send waits in the gate for room in a
// window; a longer wait goes back to the store as a pause.
const windowGrace = 100 * time.Millisecond

// Wait is WaitLanes with one lane.
func (g *Gate) Wait(ctx context.Context, key string, p leaky.Policy, notBefore time.Time) (*Ticket, error) {
	return g.WaitLanes(ctx, notBefore, Lane{Key: key, Policy: p})
}

// WaitLanes blocks until a send may go at or after notBefore on every lane
// (one or two) and returns its ticket. It returns early when ctx is done, or with a
// *HeldError when a lane is held. The caller must resolve the ticket: Wrote
// when the request is written, Done when the attempt ends (either is
// enough; both are fine).
func (g *Gate) WaitLanes(ctx context.Context, notBefore time.Time, lanes ...Lane) (*Ticket, error) {
	if len(lanes) < 1 || len(lanes) > 2 {
		panic("dispatch: a send passes one or two lanes")
	}
	g.mu.Lock()
	g.seq++
	me := &waiter{at: notBefore, seq: g.seq}
	for _, l := range lanes {
		k := g.key(l.Key)
		k.waiters = append(k.waiters, me)
	}
	g.mu.Unlock()
	leave := func() { // g.mu held
		for _, l := range lanes {
			g.keys[l.Key].leave(me)
		}
	}
	for {
		g.mu.Lock()
		now := g.clock.Now()
		var busy, ahead chan struct{}
		var heldWake []chan struct{}
		allowed := notBefore
		if k := g.keys[lanes[0].Key]; lanes[0].Policy.Interval > 0 && k.first() != me {
			ahead = k.moved // an earlier send of this tenant goes first
		}
		for _, l := range lanes {
			k := g.key(l.Key)
			// Held past the moment this send would go: give up, and go
			// back in line. A hold that ends before then only delays it.
			if k.heldUntil.After(clock.Later(now, notBefore)) {
				until := k.heldUntil
				leave()
				g.mu.Unlock()
				return nil, &HeldError{Key: l.Key, Until: until}
			}
			allowed = clock.Later(allowed, k.heldUntil)
			heldWake = append(heldWake, k.held)
			if l.Policy.Interval == 0 {
				continue // a lane for holds only: no rate
			}
			if k.outstanding != nil && busy == nil {
				busy = k.outstanding
			}
			if a := k.tat.Add(-l.Policy.Tolerance() - slack(l.Policy)); a.After(allowed) {
				allowed = a
			}
		}
		// Windows count real writes: a send delayed past its slot (a
		// ceiling, a slow connection, a pushback's resend) must not crowd
		// a window. A window that is full for longer than windowGrace
		// holds the lane instead: the job goes back in line, unsent, and
		// nothing counts it as a failure.
		for _, l := range lanes {
			if len(l.Policy.Windows) == 0 {
				continue
			}
			w := leaky.WindowSlot(g.keys[l.Key].recent, l.Policy, allowed, max(l.Cost, 1))
			if w.Sub(clock.Later(now, notBefore)) > windowGrace {
				leave()
				g.mu.Unlock()
				return nil, &HeldError{Key: l.Key, Until: w}
			}
			allowed = w
		}
		if busy == nil && ahead == nil && !now.Before(allowed) {
			leave()
			t := &Ticket{g: g, lanes: lanes, At: now, done: make(chan struct{})}
			for _, l := range lanes {
				if l.Policy.Interval > 0 {
					k := g.keys[l.Key]
					k.tat = clock.Later(k.tat, now).Add(l.step())
					k.outstanding = t.done
				}
			}
			g.sweep(now)
			g.mu.Unlock()
			return t, nil
		}
		g.mu.Unlock()
		var timer <-chan time.Time
		if busy == nil && ahead == nil {
			timer = g.clock.After(allowed.Sub(now))
		}
		// A hold on any lane wakes us to give up (a send has at most two
		// lanes: its tenant and its downstream).
		var held0, held1 <-chan struct{}
		held0 = heldWake[0]
		if len(heldWake) > 1 {
			held1 = heldWake[1]
		}
		select {
		case <-ctx.Done():
			g.mu.Lock()
			leave()
			g.mu.Unlock()
			return nil, ctx.Err()
		case <-busy:
		case <-ahead:
		case <-timer:
		case <-held0:
		case <-held1:
		}
	}
}

// key returns the state of key, creating it (g.mu held).
func (g *Gate) key(name string) *gateKey {
	k := g.keys[name]
	if k == nil {
		k = &gateKey{held: make(chan struct{}), moved: make(chan struct{})}
		g.keys[name] = k
	}
	return k
}

// Hold stops sends on key until until: those waiting give up (HeldError),
// later ones are refused. A hold never shortens another.
func (g *Gate) Hold(key string, until time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	k := g.key(key)
	if until.After(k.heldUntil) {
		k.heldUntil = until
		close(k.held)
		k.held = make(chan struct{})
	}
}

// Space makes key's next send go no earlier than tat minus its tolerance:
// after a pause, one send at its end and the rest one interval apart, not
// the burst the tolerance would allow.
func (g *Gate) Space(key string, tat time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	k := g.key(key)
	k.tat = clock.Later(k.tat, tat)
}

// Unhold ends a hold on key at once (an operator's resume).
func (g *Gate) Unhold(key string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if k := g.keys[key]; k != nil {
		k.heldUntil = time.Time{}
	}
}

// Wrote records that the request was written at wrote: each lane's next
// send is spaced from then.
func (t *Ticket) Wrote(wrote time.Time) {
	t.resolve(func(k *gateKey, l Lane) {
		if next := wrote.Add(l.step()); k.tat.Before(next) {
			k.tat = next
		}
		if len(l.Policy.Windows) > 0 {
			k.recent = leaky.Record(k.recent, l.Policy, wrote, max(l.Cost, 1))
			for _, w := range l.Policy.Windows {
				k.keepUntil = clock.Later(k.keepUntil, wrote.Add(w.Length))
			}
		}
	})
}

// Done records that the attempt ended; if Wrote was not called, nothing was
// written (the slot stays used: a gap is safe).
func (t *Ticket) Done() { t.resolve(nil) }

func (t *Ticket) resolve(f func(*gateKey, Lane)) {
	t.once.Do(func() {
		t.g.mu.Lock()
		for _, l := range t.lanes {
			if k := t.g.keys[l.Key]; k != nil {
				if f != nil {
					f(k, l)
				}
				if k.outstanding == t.done {
					k.outstanding = nil
				}
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
		if k.outstanding == nil && k.tat.Before(now) && !k.heldUntil.After(now) && !k.keepUntil.After(now) && len(k.waiters) == 0 {
			delete(g.keys, key)
		}
	}
}
