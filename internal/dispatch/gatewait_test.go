package dispatch

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/testutil"
)

// fakeDownstream answers 200 and records, on the fake clock, when each
// request reached it and with which Idempotency-Key.
type fakeDownstream struct {
	*httptest.Server
	clk  clock.Clock
	mu   sync.Mutex
	keys []string
	at   []time.Time
}

func newFakeDownstream(t *testing.T, clk clock.Clock) *fakeDownstream {
	t.Helper()
	f := &fakeDownstream{clk: clk}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.keys = append(f.keys, r.Header.Get("Idempotency-Key"))
		f.at = append(f.at, f.clk.Now())
		f.mu.Unlock()
	}))
	t.Cleanup(f.Close)
	return f
}

func (f *fakeDownstream) arrivals() ([]string, []time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.keys), slices.Clone(f.at)
}

// A rate lowered with a backlog waiting (a SIGHUP: from then on the Routes
// func answers the new rate) holds the jobs already scheduled at the old
// rate at the gate, the last of them far longer than Timeout + 10 s. A wait
// at the gate is not an attempt: every job reaches the downstream, in slot
// order, spaced by the new rate, and none fails, times out or opens the
// breaker. The jobs are handed over as the store does: all at once (each
// before its slot), or at most a few at a time (the later ones long after
// their slots, behind the jobs that wait at the gate).
func TestLoweredRateBacklogWaitsAtTheGate(t *testing.T) {
	for _, concurrency := range []int{64, 4} {
		t.Run(fmt.Sprintf("%d at a time", concurrency), func(t *testing.T) {
			t.Parallel()
			testLoweredRateBacklog(t, concurrency)
		})
	}
}

func testLoweredRateBacklog(t *testing.T, concurrency int) {
	const n = 22
	oldT, newT := 50*time.Millisecond, time.Second
	clk := clock.NewFake(t0)
	ds := newFakeDownstream(t, clk)
	var lowered atomic.Bool
	client := NewClient(n)
	t.Cleanup(client.CloseIdleConnections)
	d := New(Options{Clock: clk, Client: client, Routes: func(string) Route {
		p := leaky.Policy{Interval: oldT, Burst: 1, Capacity: 100}
		if lowered.Load() {
			p.Interval = newT
		}
		return Route{Downstream: "test", URL: ds.URL, Timeout: time.Second, MaxAttempts: 5, Policy: p}
	}})
	b := newBacklog(t, d, clk, concurrency, n, oldT)

	// Two jobs go at the old rate, then the rate is lowered: the other 20
	// were scheduled 50 ms apart and go 1 s apart.
	go b.handOver(0, 2)
	b.drive(2)
	lowered.Store(true)
	go b.handOver(2, n)
	b.drive(n)

	for i, o := range b.outcomes {
		if o.Result != queue.Succeeded {
			t.Errorf("job %d (slot %v): outcome %+v", i, time.Duration(i)*oldT, o)
		}
	}
	if open := d.Breakers()["test"]; open {
		t.Error("the breaker opened")
	}
	keys, at := ds.arrivals()
	if want := b.ids(); !slices.Equal(keys, want) {
		t.Fatalf("arrivals %v, want every job once in slot order %v", keys, want)
	}
	for i := 1; i < n; i++ {
		want := newT
		if i <= 2 { // the first send at the new rate follows one at the old
			want = oldT
		}
		if gap := at[i].Sub(at[i-1]); gap < want-2*time.Millisecond || gap > want+50*time.Millisecond {
			t.Errorf("arrival %d came %v after the one before, want %v (-2 ms, +50 ms)", i, gap, want)
		}
	}
}

// backlog plays the store in a test on the fake clock: it hands its jobs
// (one tenant's, slots interval apart from t0) over to the dispatcher in
// slot order, at most concurrency at a time, and moves the clock on while
// every job handed over waits at the gate.
type backlog struct {
	t           *testing.T
	d           *Dispatcher
	clk         *clock.Fake
	concurrency int32
	jobs        []queue.Job
	outcomes    []queue.Outcome

	handed, finished atomic.Int32
}

func newBacklog(t *testing.T, d *Dispatcher, clk *clock.Fake, concurrency, n int, interval time.Duration) *backlog {
	b := &backlog{t: t, d: d, clk: clk, concurrency: int32(concurrency), outcomes: make([]queue.Outcome, n)}
	for i := range n {
		b.jobs = append(b.jobs, job(fmt.Sprintf("job-%02d", i), 1, t0.Add(time.Duration(i)*interval)))
	}
	return b
}

func (b *backlog) ids() []string {
	var ids []string
	for _, j := range b.jobs {
		ids = append(ids, j.ID)
	}
	return ids
}

// handOver hands jobs from..to-1 over, and returns once all are.
func (b *backlog) handOver(from, to int) {
	sem := make(chan struct{}, b.concurrency)
	for i := from; i < to; i++ {
		sem <- struct{}{}
		b.handed.Add(1)
		go func() {
			b.outcomes[i] = b.d.Handle(context.Background(), b.jobs[i])
			b.finished.Add(1)
			<-sem
		}()
	}
}

// resting reports whether every job handed over (of the first to) waits at
// the gate, none being handed over, connecting, written or answered:
// nothing moves until the clock does.
func (b *backlog) resting(to int) bool {
	h, f := b.handed.Load(), b.finished.Load()
	inFlight := h - f
	return inFlight > 0 && h == min(int32(to), f+b.concurrency) && b.d.gate.restingOn(tenantKey(b.jobs[0].Tenant), int(inFlight))
}

// drive moves the clock on in steps of 5 ms while all is resting, until the
// first to jobs have finished.
func (b *backlog) drive(to int) {
	b.t.Helper()
	for {
		testutil.WaitFor(b.t, 30*time.Second, "the jobs to wait at the gate or finish", func() bool { return b.finished.Load() >= int32(to) || b.resting(to) })
		if b.finished.Load() >= int32(to) {
			return
		}
		before := b.clk.Waiters()
		b.clk.Advance(5 * time.Millisecond)
		if b.clk.Waiters() < before {
			// A timer fired: let what waited on it move before the clock
			// does again. (It may be one that nobody waits on any more,
			// and then nothing moves.)
			briefly(10*time.Millisecond, func() bool { return !b.resting(to) })
		}
	}
}

// briefly polls cond for up to d and reports whether it came to hold: a
// wait for a change that may not come.
func briefly(d time.Duration, cond func() bool) bool {
	for end := time.Now().Add(d); !cond(); time.Sleep(20 * time.Microsecond) {
		if time.Now().After(end) {
			return false
		}
	}
	return true
}

// restingOn reports whether exactly n sends wait on key's lane, no send of
// it is out (let go, not yet reported written or done), and the first in
// line is not due yet (a lane of burst 1): nothing of that lane moves until
// the clock does. One whose time has come is still to move, however long
// a busy machine takes to wake it: a clock moved on meanwhile sent it late.
func (g *Gate) restingOn(key string, n int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	k := g.keys[key]
	if k == nil || len(k.waiters) != n || k.outstanding != nil {
		return false
	}
	first := k.first()
	return first != nil && clock.Later(first.at, k.tat).After(g.clock.Now())
}

// tellingClock is a fake clock that says how long each After waits, once it
// is waiting.
type tellingClock struct {
	*clock.Fake
	after chan time.Duration
}

func (c *tellingClock) After(d time.Duration) <-chan time.Time {
	ch := c.Fake.After(d)
	select {
	case c.after <- d:
	default:
	}
	return ch
}

// On a store that processes share (Redis), a downstream's ceiling with a
// backlog keeps a send at the shared gate, each answer asking it to wait a
// little more (less than maxRemoteWait, so it does not go back to the
// store): here 15 times 900 ms, far longer than Timeout + 10 s. That wait is
// not an attempt either: the job is sent once the gate lets it go.
func TestLongWaitAtTheSharedGateIsNotAFailure(t *testing.T) {
	t.Parallel()
	const waits, wait = 15, 900 * time.Millisecond
	clk := &tellingClock{Fake: clock.NewFake(t0), after: make(chan time.Duration, 64)}
	ds := newFakeDownstream(t, clk)
	var asked atomic.Int32
	shared := func(ctx context.Context, r queue.GateRequest) (queue.GateAnswer, error) {
		if asked.Add(1) <= waits {
			return queue.GateAnswer{Wait: wait}, nil
		}
		return queue.GateAnswer{}, nil
	}
	client := NewClient(4)
	t.Cleanup(client.CloseIdleConnections)
	d := New(Options{Clock: clk, Client: client, Shared: shared, Routes: func(string) Route {
		return Route{Downstream: "test", URL: ds.URL, Timeout: 100 * time.Millisecond, MaxAttempts: 5,
			Policy: leaky.Policy{Interval: 10 * time.Millisecond, Burst: 1, Capacity: 10}}
	}})
	out := make(chan queue.Outcome, 1)
	go func() { out <- d.Handle(context.Background(), job(jobID, 1, t0)) }()
	for {
		select {
		case o := <-out:
			if o.Result != queue.Succeeded {
				t.Fatalf("after %d answers of the shared gate (%v on the clock): outcome %+v", asked.Load(), clk.Now().Sub(t0), o)
			}
			if _, at := ds.arrivals(); len(at) != 1 || !at[0].Equal(t0.Add(waits*wait)) {
				t.Fatalf("arrivals at %v, want one at %v", at, waits*wait)
			}
			return
		case d := <-clk.after:
			if d == wait { // the send waits for the shared gate
				clk.Advance(wait)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("stuck")
		}
	}
}

// A wait at the gate that is cut short, by the service stopping or by an
// operator's pause of the tenant, is not an attempt: the job is Released
// (back in line at its slot), nothing is sent, the breaker hears nothing.
func TestWaitAtTheGateCutShortIsReleased(t *testing.T) {
	for _, c := range []struct {
		name string
		cut  func(d *Dispatcher, stop context.CancelFunc)
	}{
		{"the service stops", func(_ *Dispatcher, stop context.CancelFunc) { stop() }},
		{"the tenant is paused", func(d *Dispatcher, _ context.CancelFunc) { d.HoldTenant("acme") }},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			clk := clock.NewFake(t0)
			ds := newFakeDownstream(t, clk)
			client := NewClient(4)
			t.Cleanup(client.CloseIdleConnections)
			d := New(Options{Clock: clk, Client: client, Routes: func(string) Route {
				return Route{Downstream: "test", URL: ds.URL, Timeout: 100 * time.Millisecond, MaxAttempts: 1,
					Policy: leaky.Policy{Interval: time.Second, Burst: 1, Capacity: 10}}
			}})
			stop, cancel := context.WithCancel(context.Background())
			defer cancel()
			out := make(chan queue.Outcome, 1)
			// Its slot is a minute away: it waits at the gate.
			go func() { out <- d.Handle(stop, job(jobID, 1, t0.Add(time.Minute))) }()
			testutil.WaitFor(t, 5*time.Second, "the send to wait at the gate", func() bool { return d.gate.restingOn(tenantKey("acme"), 1) })
			c.cut(d, cancel)
			select {
			case o := <-out:
				if o.Result != queue.Released || !o.SentAt.IsZero() || !o.PauseUntil.IsZero() || o.Error != "" {
					t.Fatalf("outcome %+v, want Released as it was", o)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the wait at the gate was not cut short")
			}
			if keys, _ := ds.arrivals(); len(keys) != 0 {
				t.Fatalf("sent %v", keys)
			}
			if d.Breakers()["test"] {
				t.Fatal("the breaker opened")
			}
		})
	}
}
