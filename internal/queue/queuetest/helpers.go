package queuetest

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/testutil"
)

// T0 is when every test's fake clock starts.
var T0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// T is the interval of the suite's usual tenant (20/s).
const T = 50 * time.Millisecond

// Leaky20 is a leaky policy of 20/s and capacity for every tenant.
func Leaky20(capacity int) queue.PolicyFunc {
	return func(string) leaky.Policy { return leaky.Policy{Interval: T, Burst: 1, Capacity: capacity} }
}

// Payload is a job whose payload says n.
func Payload(n int) queue.NewJob {
	return queue.NewJob{Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, n))}
}

// EnqueueOne enqueues nj alone and returns its admission.
func EnqueueOne(t *testing.T, s queue.Store, tenant string, nj queue.NewJob) queue.Admission {
	t.Helper()
	out, err := s.Enqueue(context.Background(), tenant, []queue.NewJob{nj})
	if err != nil {
		t.Fatalf("enqueue: %v", err)
	}
	return out[0]
}

// Handed is a job Handed to the handler, and when (on the fake clock).
type Handed struct {
	Job queue.Job
	At  time.Time
}

// readier is a store that says when a Consume of it is ready to hand over.
type readier interface {
	Ready(ctx context.Context) bool
}

// catcher is a store whose Consume works in real time too (it polls, it
// makes round trips) and says when it has caught up with its clock: every
// job due by the clock's now plus the lead handed over.
type catcher interface {
	CaughtUp(ctx context.Context) bool
	// Handed counts the handler calls begun.
	Handed() int64
}

// catching is a HandOver on a catcher: the store, and how many of its
// handler calls have read the clock (told on the channel).
type catching struct {
	store catcher
	told  *atomic.Int64
}

// caughtUp is whether the store has caught up with the clock and every
// handler call it began has read the clock: only then may it move.
func (c catching) caughtUp(ctx context.Context) bool {
	return c.store.CaughtUp(ctx) && c.store.Handed() == c.told.Load()
}

// catchers holds, per fake clock, the HandOver on a catcher that uses it
// (HandOver registers it; WaitHanded asks it).
var catchers sync.Map // *clock.Fake -> catching

// Consume runs s.Consume in the background; the returned func stops it and
// waits for it to return.
func Consume(t *testing.T, s queue.Store, lead time.Duration, h queue.Handler) func() {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Consume(ctx, h, queue.ConsumeOptions{Lead: lead, Concurrency: 16}) }()
	if r, ok := s.(readier); ok {
		// A store that takes a while to start handing over (Redis's
		// partition owners take their partitions) says when it is ready:
		// the fake clock must not run ahead meanwhile. A deadline, not a
		// speed: loading 100,000 tenants' arrivals took over 30 s in a
		// busy CI run.
		testutil.WaitFor(t, 2*time.Minute, "the store ready to hand over", func() bool { return r.Ready(ctx) })
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Consume: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// WaitHanded advances the fake clock by step until a job is handed over.
func WaitHanded(t *testing.T, clk *clock.Fake, got <-chan Handed, step time.Duration) Handed {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	if c, ok := catchers.Load(clk); ok {
		return waitHandedCaughtUp(t, clk, got, step, c.(catching), deadline)
	}
	// The store hands over from goroutines of its own: first a moment for
	// what is due already, then steps far enough apart in real time (more
	// so under the race detector, which slows it down) that jobs due one
	// step apart are Handed over in order.
	step1, stepN := 25*time.Millisecond, 2*time.Millisecond
	if testutil.Race {
		step1, stepN = 4*step1, 4*stepN
	}
	pause := step1
	for time.Now().Before(deadline) {
		select {
		case h := <-got:
			return h
		case <-time.After(pause):
			clk.Advance(step)
		}
		pause = stepN
	}
	t.Fatal("no job Handed over within 10s")
	return Handed{}
}

// waitHandedCaughtUp is WaitHanded for a store that says when it has
// caught up with the clock: the clock moves only then, however long the
// store's real-time work takes on a busy machine (a fixed pace of the
// clock would measure the machine: a claim slower than a step would make
// a job handed over on time look late).
func waitHandedCaughtUp(t *testing.T, clk *clock.Fake, got <-chan Handed, step time.Duration, c catching, deadline time.Time) Handed {
	t.Helper()
	ctx := context.Background()
	for time.Now().Before(deadline) {
		select {
		case h := <-got:
			return h
		default:
		}
		if !c.caughtUp(ctx) {
			time.Sleep(time.Millisecond)
			continue
		}
		select {
		case h := <-got: // handed over while it was asked
			return h
		default:
			clk.Advance(step)
		}
	}
	t.Fatal("no job Handed over within 10s")
	return Handed{}
}

// WaitFor waits up to 10 s for cond.
func WaitFor(t *testing.T, cond func() bool) {
	t.Helper()
	testutil.WaitFor(t, 10*time.Second, "condition", cond)
}

// EnqueueN enqueues n jobs Payload(0) to Payload(n-1) one at a time, all
// of them admitted, and returns their ids.
func EnqueueN(t *testing.T, s queue.Store, tenant string, n int) []string {
	t.Helper()
	ids := make([]string, n)
	for i := range ids {
		a := EnqueueOne(t, s, tenant, Payload(i))
		if !a.Admitted() {
			t.Fatalf("job %d of %d for %s not admitted: %+v", i, n, tenant, a)
		}
		ids[i] = a.Job.ID
	}
	return ids
}

// HandOver runs s.Consume in the background, as Consume does, and tells
// every job handed over, and when, on the returned channel (buffered to
// size) before outcome answers it.
func HandOver(t *testing.T, s queue.Store, clk *clock.Fake, lead time.Duration, size int, outcome queue.Handler) (<-chan Handed, func()) {
	t.Helper()
	got := make(chan Handed, size)
	told := new(atomic.Int64)
	if c, ok := s.(catcher); ok {
		told.Store(c.Handed()) // the calls of an earlier Consume of s
		catchers.Store(clk, catching{store: c, told: told})
		t.Cleanup(func() { catchers.Delete(clk) })
	}
	stop := Consume(t, s, lead, func(ctx context.Context, j queue.Job) queue.Outcome {
		got <- Handed{Job: j, At: clk.Now()}
		told.Add(1)
		return outcome(ctx, j)
	})
	return got, stop
}

// Succeed is an outcome: the job was sent now and succeeded.
func Succeed(clk clock.Clock) queue.Handler {
	return func(context.Context, queue.Job) queue.Outcome {
		return queue.Outcome{Result: queue.Succeeded, Status: 200, SentAt: clk.Now()}
	}
}

// SucceedOnTime is an outcome: the job was sent at its dispatch time, to
// the microsecond, and succeeded (a test of the spacing between sends
// takes them as they were due, not as the fake clock stood).
func SucceedOnTime(_ context.Context, j queue.Job) queue.Outcome {
	return queue.Outcome{Result: queue.Succeeded, Status: 200, SentAt: j.DispatchAt}
}

// PushBackOnce is an outcome: the first job handed over is pushed back by
// a 429 that pauses the tenant until until(now); every other one
// succeeds.
func PushBackOnce(clk clock.Clock, until func(now time.Time) time.Time) queue.Handler {
	var mu sync.Mutex
	pushed := false
	return func(context.Context, queue.Job) queue.Outcome {
		mu.Lock()
		defer mu.Unlock()
		now := clk.Now()
		if !pushed {
			pushed = true
			return queue.Outcome{Result: queue.Retry, Status: 429, Error: "429 Too Many Requests", SentAt: now, PauseUntil: until(now)}
		}
		return queue.Outcome{Result: queue.Succeeded, Status: 200, SentAt: now}
	}
}

// WaitState waits up to 10 s for job id to be in state.
func WaitState(t *testing.T, s queue.Store, id string, state queue.JobState) {
	t.Helper()
	testutil.WaitFor(t, 10*time.Second, "job "+id+" "+string(state), func() bool {
		j, _ := s.Job(context.Background(), id)
		return j.State == state
	})
}
