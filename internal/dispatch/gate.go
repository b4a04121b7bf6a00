package dispatch

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/leaky"
)

// Gate enforces spacing on the moments requests are really written,
// whatever the schedule said: a tenant's rate, and a downstream's ceiling
// shared by its tenants. Each is a lane: GCRA on send times, so in any
// window W at most W/T + Burst requests go out. No send goes before its
// time: DESIGN.md's 2 ms of jitter belong to the machine, not to the gate.
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

	mu     sync.Mutex
	keys   map[string]*gateKey
	passes int    // sends let go, to sweep now and then
	seq    uint64 // orders waiters with the same slot
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

// windowGrace is the longest a send waits in the gate for room in a
// window; a longer wait goes back to the store as a pause.
const windowGrace = 100 * time.Millisecond

// Wait is WaitLanes with one lane.
func (g *Gate) Wait(ctx context.Context, key string, p leaky.Policy, notBefore time.Time) (*Ticket, error) {
	return g.WaitLanes(ctx, notBefore, Lane{Key: key, Policy: p})
}

// WaitLanes blocks until a send may go at or after notBefore on every lane
// (one or two) and returns its ticket. It returns early when ctx is done, or
// with a *HeldError when a lane is held. The caller must resolve the ticket:
// Wrote when the request is written, Done when the attempt ends (either is
// enough; both are fine).
func (g *Gate) WaitLanes(ctx context.Context, notBefore time.Time, lanes ...Lane) (*Ticket, error) {
	if len(lanes) < 1 || len(lanes) > 2 {
		panic("dispatch: a send passes one or two lanes")
	}
	me := g.join(notBefore, lanes)
	for {
		g.mu.Lock()
		now := g.clock.Now()
		tr, err := g.look(me, lanes, now)
		if err != nil {
			g.leave(me, lanes)
			g.mu.Unlock()
			return nil, err
		}
		if tr.ready(now) {
			t := g.let(me, lanes, now)
			g.mu.Unlock()
			return t, nil
		}
		g.mu.Unlock()
		if err := tr.wait(ctx, g.clock); err != nil {
			g.mu.Lock()
			g.leave(me, lanes)
			g.mu.Unlock()
			return nil, err
		}
	}
}

// turn is what one look at a send's lanes found: the earliest it may go,
// and what else it waits for.
type turn struct {
	at    time.Time        // the earliest it may go
	busy  chan struct{}    // a lane's last send is not resolved yet (closed when it is)
	ahead chan struct{}    // an earlier send of its tenant goes first (closed when a waiter leaves)
	holds [2]chan struct{} // closed when a hold begins on one of its lanes
}

// ready reports whether the send may go now.
func (tr turn) ready(now time.Time) bool {
	return tr.busy == nil && tr.ahead == nil && !now.Before(tr.at)
}

// wait blocks until something the send waits for changes (or its time
// comes), or ctx is done. The timer is set from the clock read here, not
// from the look's: time that passed since does not make it late. A send
// waits for nothing else only for its time: on a precise clock its last
// moments are slept precisely (a late wake-up would delay every send of
// its lanes after it), and the caller looks again after, holds included.
func (tr turn) wait(ctx context.Context, clk clock.Clock) error {
	var timer <-chan time.Time
	if tr.busy == nil && tr.ahead == nil {
		d := tr.at.Sub(clk.Now())
		if clock.SleepPrecise(clk, d) {
			return ctx.Err()
		}
		if d > clock.PreciseWindow && clock.Precise(clk) {
			d -= clock.PreciseWindow // then precisely
		}
		timer = clk.After(d)
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-tr.busy:
	case <-tr.ahead:
	case <-timer:
	case <-tr.holds[0]: // a hold on any lane wakes it to give up
	case <-tr.holds[1]:
	}
	return nil
}

// join puts a send of slot notBefore in line on its lanes.
func (g *Gate) join(notBefore time.Time, lanes []Lane) *waiter {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.seq++
	me := &waiter{at: notBefore, seq: g.seq}
	for _, l := range lanes {
		k := g.key(l.Key)
		k.waiters = append(k.waiters, me)
	}
	return me
}

// leave takes a send out of line (g.mu held).
func (g *Gate) leave(me *waiter, lanes []Lane) {
	for _, l := range lanes {
		g.keys[l.Key].leave(me)
	}
}

// look finds when a send may go on its lanes, as of now (g.mu held): after
// its slot, its turn among its tenant's sends, each lane's spacing and
// holds, and room in each lane's windows. A lane held past the moment the
// send would go is a *HeldError: it gives up, and goes back in line. A hold
// that ends before then only delays it.
func (g *Gate) look(me *waiter, lanes []Lane, now time.Time) (turn, error) {
	tr := turn{at: me.at}
	if k := g.keys[lanes[0].Key]; lanes[0].Policy.Interval > 0 && k.first() != me {
		tr.ahead = k.moved
	}
	goesAt := clock.Later(now, me.at)
	for i, l := range lanes {
		k := g.key(l.Key)
		if k.heldUntil.After(goesAt) {
			return tr, &HeldError{Key: l.Key, Until: k.heldUntil}
		}
		tr.at = clock.Later(tr.at, k.heldUntil)
		tr.holds[i] = k.held
		if l.Policy.Interval == 0 {
			continue // a lane for holds only: no rate
		}
		if k.outstanding != nil && tr.busy == nil {
			tr.busy = k.outstanding
		}
		tr.at = clock.Later(tr.at, k.tat.Add(-l.Policy.Tolerance()))
	}
	return g.roomInWindows(tr, lanes, goesAt)
}

// roomInWindows moves tr.at on to when every lane's windows have room (g.mu
// held). Windows count real writes: a send delayed past its slot (a
// ceiling, a slow connection, a pushback's resend) must not crowd a window.
// A window that is full for longer than windowGrace past goesAt holds the
// lane instead: the job goes back in line, unsent, and nothing counts it as
// a failure.
func (g *Gate) roomInWindows(tr turn, lanes []Lane, goesAt time.Time) (turn, error) {
	for _, l := range lanes {
		if len(l.Policy.Windows) == 0 {
			continue
		}
		w := leaky.WindowSlot(g.keys[l.Key].recent, l.Policy, tr.at, max(l.Cost, 1))
		if w.Sub(goesAt) > windowGrace {
			return tr, &HeldError{Key: l.Key, Until: w}
		}
		tr.at = w
	}
	return tr, nil
}

// let lets a send go now (g.mu held): it leaves the line, and each lane
// with a rate moves its schedule on and waits for the send to be resolved.
func (g *Gate) let(me *waiter, lanes []Lane, now time.Time) *Ticket {
	g.leave(me, lanes)
	t := &Ticket{g: g, lanes: lanes, At: now, done: make(chan struct{})}
	for _, l := range lanes {
		if l.Policy.Interval > 0 {
			k := g.keys[l.Key]
			k.tat = clock.Later(k.tat, now).Add(l.step())
			k.outstanding = t.done
		}
	}
	g.sweep(now)
	return t
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
	t.resolve(func(k *gateKey, l Lane) { wroteAt(k, l, wrote) })
}

// WroteNow is Wrote at the clock's now, read once the gate's lock is held
// and returned: for a send that starts right after it (a Go handler's
// call), so that a wait for the lock, which a busy machine can stretch by
// milliseconds, comes before the instant recorded, never between it and
// the send.
func (t *Ticket) WroteNow() time.Time {
	var at time.Time
	t.resolve(func(k *gateKey, l Lane) {
		if at.IsZero() {
			at = t.g.clock.Now()
		}
		wroteAt(k, l, at)
	})
	if at.IsZero() { // no lane left to record on: nothing to space
		at = t.g.clock.Now()
	}
	return at
}

// Later moves each lane's next send on to one step after a send at at:
// for a send resolved (WroteNow) that then started later than recorded.
// It wakes no one: a send waiting for its time looks at the lanes again
// when its timer fires, and sees it.
func (t *Ticket) Later(at time.Time) {
	t.g.mu.Lock()
	defer t.g.mu.Unlock()
	for _, l := range t.lanes {
		if k := t.g.keys[l.Key]; k != nil && l.Policy.Interval > 0 {
			k.tat = clock.Later(k.tat, at.Add(l.step()))
		}
	}
}

// wroteAt spaces lane l's next send (its key k) from a write at wrote.
func wroteAt(k *gateKey, l Lane, wrote time.Time) {
	if next := wrote.Add(l.step()); k.tat.Before(next) {
		k.tat = next
	}
	if len(l.Policy.Windows) > 0 {
		k.recent = leaky.Record(k.recent, l.Policy, wrote, max(l.Cost, 1))
		for _, w := range l.Policy.Windows {
			k.keepUntil = clock.Later(k.keepUntil, wrote.Add(w.Length))
		}
	}
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
	g.passes++
	if g.passes%4096 != 0 {
		return
	}
	for key, k := range g.keys {
		if k.outstanding == nil && k.tat.Before(now) && !k.heldUntil.After(now) && !k.keepUntil.After(now) && len(k.waiters) == 0 {
			delete(g.keys, key)
		}
	}
}
