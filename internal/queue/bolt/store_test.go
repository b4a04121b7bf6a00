package bolt

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"
	"go.uber.org/goleak"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/queue/queuetest"
	"github.com/throttler-dev/throttler/internal/testutil"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newBackend gives each conformance test a file of its own.
func newBackend(t *testing.T) queuetest.Open {
	path := filepath.Join(t.TempDir(), "throttler.db")
	return func(t *testing.T, c queuetest.Config) queue.Store {
		t.Helper()
		s, err := Open(path, Options{Clock: c.Clock, Policy: c.Policy, Ceiling: c.Ceiling, Caps: c.Caps})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
}

// openCeiling opens a store at path whose tenants all share the downstream
// "sms" under ceiling; the caller closes it.
func openCeiling(t *testing.T, path string, clk clock.Clock, policy queue.PolicyFunc, ceiling *leaky.Policy) *Store {
	t.Helper()
	s, err := Open(path, Options{
		Clock:   clk,
		Policy:  policy,
		Ceiling: func(string) (string, *leaky.Policy) { return "sms", ceiling },
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// crashStore is a store in dir on a fake clock, every tenant one job a
// second with room for 10, whose file a test copies to stand for a crash.
type crashStore struct {
	s   *Store
	clk *clock.Fake
	dir string
}

func openCrashStore(t *testing.T) *crashStore {
	t.Helper()
	c := &crashStore{clk: clock.NewFake(queuetest.T0), dir: t.TempDir()}
	c.s = c.open(t, filepath.Join(c.dir, "live.db"))
	return c
}

// open opens the file at path (the live one, or a copy) with the same clock
// and policy; it is closed when the test ends.
func (c *crashStore) open(t *testing.T, path string) *Store {
	t.Helper()
	policy := func(string) leaky.Policy { return leaky.Policy{Interval: time.Second, Burst: 1, Capacity: 10} }
	s, err := open(path, Options{Clock: c.clk, Policy: policy}, testHooks{logIdle: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestConformance(t *testing.T) {
	queuetest.Run(t, queuetest.Driver{New: newBackend, RestartRespaces: true})
}

func TestFileInUse(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "x.db")
	policy := queuetest.Leaky20(1)
	s, err := Open(path, Options{Policy: policy})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_, err = Open(path, Options{Policy: policy})
	if err == nil || !strings.Contains(err.Error(), "locked by another process") {
		t.Fatalf("second open: %v", err)
	}
}

// Many concurrent enqueues share fsyncs and never oversubscribe a slot.
func TestConcurrentEnqueue(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(queuetest.T0)
	s := newBackend(t)(t, queuetest.Config{Clock: clk, Policy: func(string) leaky.Policy { return leaky.Policy{Interval: time.Millisecond, Burst: 1, Capacity: 500} }})
	var wg sync.WaitGroup
	var mu sync.Mutex
	slots := map[time.Time]bool{}
	admitted := 0
	for w := 0; w < 32; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 40; i++ {
				out, err := s.Enqueue(context.Background(), "t", []queue.NewJob{queuetest.Payload(i)})
				if err != nil {
					t.Error(err)
					return
				}
				if out[0].Rejected == nil {
					mu.Lock()
					if slots[out[0].Job.DispatchAt] {
						t.Errorf("slot %v given twice", out[0].Job.DispatchAt)
					}
					slots[out[0].Job.DispatchAt] = true
					admitted++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if admitted != 501 {
		t.Fatalf("admitted %d of 1280 at capacity 500, want 501", admitted)
	}
	st, _ := s.Tenant(context.Background(), "t")
	if st.QueueDepth != 501 || st.Rejected != 1280-501 {
		t.Fatalf("status %+v", st)
	}
}

func TestReapsFinishedJobsAfterRetention(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(queuetest.T0)
	s := newBackend(t)(t, queuetest.Config{Clock: clk, Policy: queuetest.Leaky20(10)}).(*Store)
	ctx := context.Background()
	a := queuetest.EnqueueOne(t, s, "acme", queue.NewJob{Payload: []byte(`1`), IdempotencyKey: "k"})
	if _, err := s.Cancel(ctx, a.Job.ID); err != nil {
		t.Fatal(err)
	}
	if n, err := s.reap(clk.Now().Add(-time.Hour), 100); err != nil || n != 0 {
		t.Fatalf("reaped %d before retention (%v)", n, err)
	}
	clk.Advance(2 * time.Hour)
	if n, err := s.reap(clk.Now().Add(-time.Hour), 100); err != nil || n != 1 {
		t.Fatalf("reaped %d after retention (%v)", n, err)
	}
	if _, err := s.Job(ctx, a.Job.ID); err == nil {
		t.Fatal("reaped job still there")
	}
	// Its idempotency key is free again.
	b := queuetest.EnqueueOne(t, s, "acme", queue.NewJob{Payload: []byte(`1`), IdempotencyKey: "k"})
	if b.Duplicate || b.Job.ID == a.Job.ID {
		t.Fatalf("key not freed: %+v", b)
	}
}

func TestForgetsIdleTenants(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(queuetest.T0)
	s := newBackend(t)(t, queuetest.Config{Clock: clk, Policy: queuetest.Leaky20(10)}).(*Store)
	queuetest.EnqueueOne(t, s, "acme", queuetest.Payload(1))
	got := make(chan queuetest.Handed, 1)
	stop := queuetest.Consume(t, s, 10*time.Millisecond, func(ctx context.Context, j queue.Job) queue.Outcome {
		got <- queuetest.Handed{Job: j, At: clk.Now()}
		return queue.Outcome{Result: queue.Succeeded, Status: 200}
	})
	queuetest.WaitHanded(t, clk, got, time.Millisecond)
	stop()
	clk.Advance(time.Second)
	if err := s.flushDirty(); err != nil {
		t.Fatal(err)
	}
	s.evictIdle()
	s.mu.Lock()
	n := len(s.tenants)
	s.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d tenants still in memory", n)
	}
	st, _ := s.Tenant(context.Background(), "acme")
	if st.Accepted != 1 || st.Delivered != 1 {
		t.Fatalf("counters lost with eviction: %+v", st)
	}
}

// A crash leaves no record of which jobs were sent: any job whose slot has
// passed may have gone at its slot. The restart spaces the first resend one
// interval (and a margin) after the last such slot, never sooner.
func TestCrashRespacesFromPossiblySentSlots(t *testing.T) {
	t.Parallel()
	c := openCrashStore(t)
	s, clk := c.s, c.clk
	var ids []string
	for i := 0; i < 4; i++ { // slots queuetest.T0, queuetest.T0+1s, queuetest.T0+2s, queuetest.T0+3s
		ids = append(ids, queuetest.EnqueueOne(t, s, "acme", queuetest.Payload(i)).Job.ID)
	}
	// The process dies at queuetest.T0+1.5s: the file as it is then is all that is left.
	clk.Set(queuetest.T0.Add(1500 * time.Millisecond))
	crashed := filepath.Join(c.dir, "crashed.db")
	if err := s.snapshot(crashed); err != nil {
		t.Fatal(err)
	}
	clk.Set(queuetest.T0.Add(1600 * time.Millisecond)) // restarted 100 ms later
	r := c.open(t, crashed)
	// Jobs 0 and 1 may have been sent at any moment before the crash (only
	// "before the restart" is sure): the next send is one interval after
	// the restart.
	first := queuetest.T0.Add(1600*time.Millisecond + time.Second)
	for i, id := range ids {
		j, err := r.Job(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if want := first.Add(time.Duration(i) * time.Second); !j.DispatchAt.Equal(want) {
			t.Fatalf("job %d slot %v, want %v", i, j.DispatchAt.Sub(queuetest.T0), want.Sub(queuetest.T0))
		}
	}
}

// Enqueue, dispatch, lookups and cancels all at once while the file grows
// (every growth remaps it and waits for readers): nothing may deadlock, and
// every job ends delivered or cancelled.
func TestStressNoDeadlock(t *testing.T) {
	testutil.SkipShort(t, "stress soak: eight writers flat out for 1.5 s")
	t.Parallel()
	s := newBackend(t)(t, queuetest.Config{Clock: clock.Real{}, Policy: func(string) leaky.Policy {
		return leaky.Policy{Interval: time.Millisecond, Burst: 1, Capacity: 100000}
	}})
	ctx := context.Background()
	stop := queuetest.Consume(t, s, 5*time.Millisecond, func(ctx context.Context, j queue.Job) queue.Outcome {
		return queue.Outcome{Result: queue.Succeeded, Status: 200, SentAt: time.Now()}
	})
	big := make([]byte, 4096)
	for i := range big {
		big[i] = 'x'
	}
	body := []byte(`"` + string(big) + `"`)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var ids []string
	deadline := time.Now().Add(1500 * time.Millisecond)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Now().Before(deadline); i++ {
				// New tenants and idempotency keys: reads under the store's lock.
				out, err := s.Enqueue(ctx, fmt.Sprintf("t%d-%d", w, i), []queue.NewJob{{Payload: body, IdempotencyKey: fmt.Sprint(i)}})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				ids = append(ids, out[0].Job.ID)
				mu.Unlock()
				if i%10 == 0 {
					s.Cancel(ctx, out[0].Job.ID)
					s.Job(ctx, out[0].Job.ID)
					s.Tenants(ctx, 0, 10)
				}
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("deadlocked")
	}
	queuetest.WaitFor(t, func() bool {
		for _, id := range ids {
			if j, err := s.Job(ctx, id); err != nil || !j.State.Finished() {
				return false
			}
		}
		return true
	})
	stop()
}

// After a restart, a new job is not sent sooner than one interval after the
// last recorded send, even when that send was long after its slot (a retry
// that waited out a long backoff): the gate that knew it is gone.
func TestRestartSpacesFromTheLastSend(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(queuetest.T0)
	open := newBackend(t)
	reopen := func(t *testing.T, clk clock.Clock, p queue.PolicyFunc) queue.Store {
		return open(t, queuetest.Config{Clock: clk, Policy: p})
	}
	policy := func(string) leaky.Policy { return leaky.Policy{Interval: time.Minute, Burst: 1, Capacity: 10} }
	s := reopen(t, clk, policy)
	queuetest.EnqueueOne(t, s, "acme", queuetest.Payload(1))
	lateSend := queuetest.T0.Add(5 * time.Minute)
	got := make(chan queuetest.Handed, 1)
	stop := queuetest.Consume(t, s, 10*time.Millisecond, func(ctx context.Context, j queue.Job) queue.Outcome {
		got <- queuetest.Handed{Job: j, At: clk.Now()}
		return queue.Outcome{Result: queue.Succeeded, Status: 200, SentAt: lateSend}
	})
	queuetest.WaitHanded(t, clk, got, time.Millisecond)
	queuetest.WaitFor(t, func() bool { st, _ := s.Tenant(context.Background(), "acme"); return st.Delivered == 1 })
	stop()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	clk.Set(lateSend.Add(2 * time.Second))
	s = reopen(t, clk, policy)
	a := queuetest.EnqueueOne(t, s, "acme", queuetest.Payload(2))
	if a.Rejected != nil || a.Job.DispatchAt.Before(lateSend.Add(time.Minute)) {
		t.Fatalf("new job due %v after the last send, want at least a minute: %+v", a.Job.DispatchAt.Sub(lateSend), a)
	}
}

// Under a downstream's ceiling, due jobs are queuetest.Handed over one per ceiling
// slot and tenants take turns: a tenant with one job waits behind at most
// one of a deep backlog's jobs, and every queuetest.Handed-over time keeps the
// ceiling's spacing.
func TestCeilingTakesTurns(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(queuetest.T0)
	const ceilingT = 100 * time.Millisecond
	ceiling := leaky.Policy{Interval: ceilingT, Burst: 1}
	s := openCeiling(t, filepath.Join(t.TempDir(), "t.db"), clk, func(string) leaky.Policy { return leaky.Policy{Interval: queuetest.T, Burst: 1, Capacity: 100} }, &ceiling)
	t.Cleanup(func() { s.Close() })
	for i := 0; i < 20; i++ {
		queuetest.EnqueueOne(t, s, "deep", queuetest.Payload(i))
	}
	got, stop := queuetest.HandOver(t, s, clk, 20*time.Millisecond, 100, queuetest.SucceedOnTime)
	defer stop()
	var prev time.Time
	var small time.Time
	var smallID string
	for i := 0; i < 12; i++ {
		h := queuetest.WaitHanded(t, clk, got, 5*time.Millisecond)
		if !prev.IsZero() && h.Job.DispatchAt.Sub(prev) < ceilingT {
			t.Fatalf("queuetest.Handed %d due %v after the one before, under a ceiling of one per %v", i, h.Job.DispatchAt.Sub(prev), ceilingT)
		}
		prev = h.Job.DispatchAt
		if h.Job.Tenant == "small" {
			if wait := h.Job.DispatchAt.Sub(small); wait > 2*ceilingT {
				t.Fatalf("the small tenant's job goes %v after it was due, behind the deep backlog", wait)
			}
			smallID = h.Job.ID
		}
		if i == 5 {
			a := queuetest.EnqueueOne(t, s, "small", queuetest.Payload(100))
			small = a.Job.DispatchAt
		}
	}
	if smallID == "" {
		t.Fatal("the small tenant's job was not queuetest.Handed over within 6 ceiling slots of being due")
	}
	st, _ := s.Tenant(context.Background(), "deep")
	if st.ExpectedDelay < time.Duration(st.QueueDepth)*ceilingT {
		t.Fatalf("deep tenant's expected delay %v with %d waiting under a ceiling of one per %v", st.ExpectedDelay, st.QueueDepth, ceilingT)
	}
}

// A downstream ceiling's window ("3 per 10 s") holds across its tenants,
// and across a restart: its bookkeeping is on disk.
func TestCeilingWindowSurvivesRestart(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(queuetest.T0)
	w, _ := leaky.ParseWindow("3/10s")
	ceiling := leaky.Policy{Interval: time.Millisecond, Burst: 1, Windows: []leaky.Window{w}}
	path := filepath.Join(t.TempDir(), "t.db")
	open := func() *Store {
		return openCeiling(t, path, clk, func(string) leaky.Policy { return leaky.Policy{Interval: queuetest.T, Burst: 1, Capacity: 100} }, &ceiling)
	}
	s := open()
	for i := 0; i < 2; i++ {
		queuetest.EnqueueOne(t, s, "a", queuetest.Payload(i))
		queuetest.EnqueueOne(t, s, "b", queuetest.Payload(i))
	}
	if a := queuetest.EnqueueOne(t, s, "a", queue.NewJob{Payload: []byte(`9`), Cost: 4}); a.Impossible == nil || a.Impossible.MaxCost != 3 {
		t.Fatalf("cost 4 under a window of 3: %+v", a)
	}
	got := make(chan queuetest.Handed, 10)
	h := func(ctx context.Context, j queue.Job) queue.Outcome {
		got <- queuetest.Handed{Job: j, At: clk.Now()}
		return queue.Outcome{Result: queue.Succeeded, Status: 200, SentAt: j.DispatchAt}
	}
	stop := queuetest.Consume(t, s, 10*time.Millisecond, h)
	var times []time.Time
	for range 3 {
		times = append(times, queuetest.WaitHanded(t, clk, got, 5*time.Millisecond).Job.DispatchAt)
	}
	queuetest.WaitFor(t, func() bool {
		st, _ := s.Tenant(context.Background(), "a")
		sb, _ := s.Tenant(context.Background(), "b")
		return st.Delivered+sb.Delivered == 3
	})
	stop()
	s.Close()

	s = open()
	defer s.Close()
	stop = queuetest.Consume(t, s, 10*time.Millisecond, h)
	defer stop()
	fourth := queuetest.WaitHanded(t, clk, got, 100*time.Millisecond).Job.DispatchAt
	if fourth.Sub(times[0]) < 10*time.Second {
		t.Fatalf("4th send %v after the 1st, under a window of 3 per 10s (sends at %v)", fourth.Sub(times[0]), times)
	}
}

// Holds retime a tenant's jobs to "never" and back; the deadlines they
// leave behind are rebuilt away, so memory follows the jobs waiting.
func TestHeapsStayBounded(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(queuetest.T0)
	s := newBackend(t)(t, queuetest.Config{Clock: clk, Policy: queuetest.Leaky20(1000)}).(*Store)
	ctx := context.Background()
	for i := 0; i < 200; i++ {
		queuetest.EnqueueOne(t, s, "acme", queue.NewJob{Payload: []byte(`1`), Deadline: queuetest.T0.Add(time.Hour)})
	}
	for range 50 {
		if _, err := s.Pause(ctx, "acme"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Resume(ctx, "acme"); err != nil {
			t.Fatal(err)
		}
	}
	s.mu.Lock()
	l, expiry, waiting := s.sched.lines["acme"], len(s.sched.expiry), s.sched.len()
	s.mu.Unlock()
	if waiting != 200 || l.len() != 200 || expiry > 2*waiting+1024 {
		t.Fatalf("%d waiting: %d in the line, %d deadlines", waiting, l.len(), expiry)
	}
}

// A pushback whose end has already passed when it is recorded is not a
// free pass: the job takes a new slot (its own has gone), uncounted as a
// failure.
func TestPushbackAlreadyOver(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(queuetest.T0)
	s := newBackend(t)(t, queuetest.Config{Clock: clk, Policy: queuetest.Leaky20(10)}).(*Store)
	ctx := context.Background()
	first := queuetest.EnqueueOne(t, s, "acme", queuetest.Payload(0)).Job.ID
	queuetest.EnqueueOne(t, s, "acme", queuetest.Payload(1)) // slot queuetest.T
	got := make(chan queuetest.Handed, 10)
	var mu sync.Mutex
	n := 0
	stop := queuetest.Consume(t, s, 10*time.Millisecond, func(ctx context.Context, j queue.Job) queue.Outcome {
		got <- queuetest.Handed{Job: j, At: clk.Now()}
		mu.Lock()
		defer mu.Unlock()
		n++
		if n == 1 {
			return queue.Outcome{Result: queue.Retry, Status: 429, SentAt: clk.Now(), PauseUntil: clk.Now()}
		}
		return queue.Outcome{Result: queue.Succeeded, Status: 200, SentAt: clk.Now()}
	})
	defer stop()
	queuetest.WaitHanded(t, clk, got, time.Millisecond)
	queuetest.WaitFor(t, func() bool { j, _ := s.Job(ctx, first); return j.State == queue.StateRetrying })
	j, _ := s.Job(ctx, first)
	if j.Failures != 0 || !j.DispatchAt.After(queuetest.T0.Add(queuetest.T)) {
		t.Fatalf("after a pushback already over: %+v (want a slot after the next job's, no failure)", j)
	}
}

// A tenant whose next job is not due yet does not hold up the ceiling for
// the others: its turn passes to the next tenant.
func TestCeilingSkipsATenantNotDueYet(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(queuetest.T0)
	ceiling := leaky.Policy{Interval: 2 * time.Millisecond, Burst: 1}
	s := openCeiling(t, filepath.Join(t.TempDir(), "t.db"), clk, func(tenant string) leaky.Policy {
		if tenant == "b" {
			return leaky.Policy{Interval: 90 * time.Millisecond, Burst: 1, Capacity: 10}
		}
		return leaky.Policy{Interval: time.Millisecond, Burst: 1, Capacity: 10}
	}, &ceiling)
	t.Cleanup(func() { s.Close() })
	queuetest.EnqueueOne(t, s, "b", queuetest.Payload(0))
	queuetest.EnqueueOne(t, s, "b", queuetest.Payload(1)) // due at 90 ms
	for i := 0; i < 10; i++ {
		queuetest.EnqueueOne(t, s, "a", queuetest.Payload(i))
	}
	got, stop := queuetest.HandOver(t, s, clk, 100*time.Millisecond, 20, queuetest.SucceedOnTime)
	defer stop()
	for seen := 0; seen < 10; {
		h := queuetest.WaitHanded(t, clk, got, time.Millisecond)
		if h.Job.Tenant != "a" {
			continue
		}
		seen++
		if late := h.Job.DispatchAt.Sub(queuetest.T0); late > 30*time.Millisecond {
			t.Fatalf("a's job %d goes at %v: held up behind b's job due at 90ms", seen, late)
		}
	}
}

// A 429 under a downstream's ceiling pauses the downstream for all its
// tenants, and the pause survives a restart.
func TestCeilingPauseSurvivesRestart(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(queuetest.T0)
	ceiling := leaky.Policy{Interval: 10 * time.Millisecond, Burst: 1}
	path := filepath.Join(t.TempDir(), "t.db")
	open := func() *Store {
		return openCeiling(t, path, clk, func(string) leaky.Policy { return leaky.Policy{Interval: queuetest.T, Burst: 1, Capacity: 100} }, &ceiling)
	}
	s := open()
	a := queuetest.EnqueueOne(t, s, "a", queuetest.Payload(0)).Job.ID
	until := queuetest.T0.Add(5 * time.Second)
	got := make(chan queuetest.Handed, 10)
	stop := queuetest.Consume(t, s, 10*time.Millisecond, func(ctx context.Context, j queue.Job) queue.Outcome {
		got <- queuetest.Handed{Job: j, At: clk.Now()}
		if j.ID == a && j.Attempts == 1 {
			return queue.Outcome{Result: queue.Retry, Status: 429, SentAt: clk.Now(), PauseUntil: until, PauseDownstream: true}
		}
		return queue.Outcome{Result: queue.Succeeded, Status: 200, SentAt: clk.Now()}
	})
	queuetest.WaitHanded(t, clk, got, time.Millisecond)
	queuetest.WaitFor(t, func() bool { j, _ := s.Job(context.Background(), a); return j.State == queue.StateRetrying })
	stop()
	s.Close()

	s = open()
	defer s.Close()
	b := queuetest.EnqueueOne(t, s, "b", queuetest.Payload(1)).Job.ID
	stop = queuetest.Consume(t, s, 10*time.Millisecond, func(ctx context.Context, j queue.Job) queue.Outcome {
		got <- queuetest.Handed{Job: j, At: clk.Now()}
		return queue.Outcome{Result: queue.Succeeded, Status: 200, SentAt: clk.Now()}
	})
	defer stop()
	for range 2 {
		h := queuetest.WaitHanded(t, clk, got, 50*time.Millisecond)
		if h.Job.DispatchAt.Before(until) {
			t.Fatalf("job of %s (b is %s) due %v, before the downstream's pause ends at %v", h.Job.Tenant, b, h.Job.DispatchAt.Sub(queuetest.T0), until.Sub(queuetest.T0))
		}
	}
}

// A prompt job's promise stays at the pipeline's real overhead however
// many have been sent: the start lag the store schedules with measures the
// hand-over and the write, not the lag itself (which it would otherwise
// feed back until its cap, 100 ms, so that an OTP that could leave in 5 ms
// waited 100).
func TestPromptJobsDoNotDriftLate(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(queuetest.T0)
	policy := func(string) leaky.Policy {
		return leaky.Policy{Interval: 10 * time.Millisecond, Burst: 1, Capacity: 10}
	} // 100/s
	s := newBackend(t)(t, queuetest.Config{Clock: clk, Policy: policy})
	const overhead = 2 * time.Millisecond // from the slot to the request written
	got := make(chan queue.Job, 1)
	queuetest.Consume(t, s, queue.DefaultLead, func(ctx context.Context, j queue.Job) queue.Outcome {
		got <- j
		return queue.Outcome{Result: queue.Succeeded, Status: 200, SentAt: j.DispatchAt.Add(overhead)}
	})
	ctx := context.Background()
	var last queue.Admission
	for i := range 300 { // one every 20 ms: well under the rate, each could go at once
		last = queuetest.EnqueueOne(t, s, "otp", queuetest.Payload(i))
		select {
		case <-got:
		case <-time.After(10 * time.Second):
			t.Fatalf("job %d not handed over", i)
		}
		clk.Advance(20 * time.Millisecond)
		if i%50 == 49 { // let the outcomes (written in groups) feed the estimate
			queuetest.WaitFor(t, func() bool { st, _ := s.Tenant(ctx, "otp"); return st.Delivered == int64(i+1) })
		}
	}
	if last.ExpectedDelay > overhead+time.Millisecond {
		t.Fatalf("after 300 prompt sends a prompt job is told %v, want about the overhead %v", last.ExpectedDelay, overhead)
	}
}

// crashCopy is what a kill -9 of s would leave right now: its file as last
// committed (bbolt commits are atomic and fsynced) and its write-ahead log.
// Opening the copy is a restart after that crash.
func crashCopy(t *testing.T, s *Store) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "crashed.db")
	if err := s.snapshot(path); err != nil {
		t.Fatal(err)
	}
	return path
}

// After a crash, sends just before it may have used the tenant's whole
// burst: the jobs re-spaced at the restart, and the jobs and retries after
// them, get no burst of their own. (Found by the model test: burst 2, a
// retry after a crash went 50 ms after the re-spaced send, T = 100 ms.)
func TestCrashLeavesNoBurstCredit(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(queuetest.T0)
	const T = 100 * time.Millisecond
	policy := func(string) leaky.Policy { return leaky.Policy{Interval: T, Burst: 2, Capacity: 5} }
	s := newBackend(t)(t, queuetest.Config{Clock: clk, Policy: policy}).(*Store)
	for i := range 2 { // both go at once: the burst
		queuetest.EnqueueOne(t, s, "acme", queuetest.Payload(i))
	}
	written := make(chan struct{}, 2)
	release := make(chan struct{})
	queuetest.Consume(t, s, 10*time.Millisecond, func(ctx context.Context, j queue.Job) queue.Outcome {
		written <- struct{}{} // the request is written now, at T0
		<-release
		return queue.Outcome{Result: queue.Succeeded, Status: 200, SentAt: clk.Now()}
	})
	for range 2 {
		select {
		case <-written:
		case <-time.After(10 * time.Second):
			t.Fatal("the burst was not handed over")
		}
	}
	path := crashCopy(t, s) // killed with both written, neither recorded
	close(release)

	clk.Advance(10 * time.Millisecond)
	r, err := Open(path, Options{Clock: clk, Policy: policy})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	next := queuetest.EnqueueOne(t, r, "acme", queuetest.Payload(9))
	var last time.Time
	for _, id := range r.sched.waitingIDs("acme") {
		if j, _ := r.Job(context.Background(), id); j.ID != next.Job.ID {
			last = clock.Later(last, j.DispatchAt)
		}
	}
	if next.Job.DispatchAt.Before(last.Add(T)) {
		t.Fatalf("after the crash a new job is due %v, the last re-spaced one %v: want at least T (%v) after it, no burst",
			next.Job.DispatchAt.Sub(queuetest.T0), last.Sub(queuetest.T0), T)
	}
}

// waitingIDs lists a tenant's waiting jobs (tests; s.mu held or the store
// not in use).
func (sc *schedule) waitingIDs(tenant string) []string {
	var ids []string
	sc.tenantEntries(tenant, func(e dueEntry) { ids = append(ids, e.id) })
	return ids
}

// A refusal's Retry-After holds whatever the start-lag estimate does
// meanwhile: a job sent again exactly then is admitted. (CI found it: a
// token bucket's second job, refused while the first was being sent, was
// refused again on its retry because the first send lowered the estimate
// the Retry-After had been taken off.)
func TestRetryAfterHoldsWhenTheStartLagFalls(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(queuetest.T0)
	policy := func(string) leaky.Policy { return leaky.Policy{Interval: time.Second, Burst: 1} } // a token bucket, 1/s
	s, err := Open(filepath.Join(t.TempDir(), "throttler.db"), Options{Clock: clk, Policy: policy, InitialStartLag: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	queuetest.EnqueueOne(t, s, "otp", queuetest.Payload(1))
	refused := queuetest.EnqueueOne(t, s, "otp", queuetest.Payload(2))
	if refused.Rejected == nil {
		t.Fatalf("second job within the interval: %+v, want refused", refused)
	}
	queuetest.Consume(t, s, queue.DefaultLead, func(ctx context.Context, j queue.Job) queue.Outcome {
		return queue.Outcome{Result: queue.Succeeded, Status: 200, SentAt: clk.Now()}
	})
	clk.Advance(50 * time.Millisecond) // the first job's time
	queuetest.WaitFor(t, func() bool { st, _ := s.Tenant(context.Background(), "otp"); return st.Delivered == 1 })
	s.lag.send.avg.Store(int64(time.Millisecond)) // the first send measured quicker than the estimate
	clk.Advance(refused.Rejected.RetryAfter - 50*time.Millisecond)
	if again := queuetest.EnqueueOne(t, s, "otp", queuetest.Payload(2)); again.Rejected != nil {
		t.Fatalf("sent again after its Retry-After %v: refused again, retry after %v", refused.Rejected.RetryAfter, again.Rejected.RetryAfter)
	}
}

// slowPassClock is a fake clock that moves on by step every time it is
// read while armed: a pass over the store that takes that long (a busy
// machine's fsync, or the model test's clock moved on meanwhile).
type slowPassClock struct {
	*clock.Fake
	step  time.Duration
	armed atomic.Bool
}

func (c *slowPassClock) Now() time.Time {
	now := c.Fake.Now()
	if c.armed.Load() {
		c.Fake.Set(now.Add(c.step))
	}
	return now
}

// The dispatcher wakes for the next job at an instant, not after a wait
// counted from the start of a pass that took a while: it waited that much
// too long (a CI run's model test found a job due at its time and not
// handed over, the clock having moved while the dispatcher read the
// store).
func TestConsumeWakesAtItsInstantAfterASlowPass(t *testing.T) {
	t.Parallel()
	clk := &slowPassClock{Fake: clock.NewFake(queuetest.T0), step: 50 * time.Millisecond}
	s := newBackend(t)(t, queuetest.Config{Clock: clk, Policy: func(string) leaky.Policy {
		return leaky.Policy{Interval: time.Second, Burst: 1, Capacity: 10}
	}})
	first := queuetest.EnqueueOne(t, s, "acme", queuetest.Payload(1))
	second := queuetest.EnqueueOne(t, s, "acme", queuetest.Payload(2))
	if !second.Job.DispatchAt.Equal(first.Job.DispatchAt.Add(time.Second)) {
		t.Fatalf("slots %v and %v, want a second apart", first.Job.DispatchAt, second.Job.DispatchAt)
	}
	got := make(chan queue.Job, 2)
	clk.armed.Store(true)
	queuetest.Consume(t, s, 20*time.Millisecond, func(ctx context.Context, j queue.Job) queue.Outcome {
		got <- j
		return queue.Outcome{Result: queue.Succeeded, Status: 200, SentAt: j.DispatchAt}
	})
	if j := <-got; j.ID != first.Job.ID {
		t.Fatalf("handed over %s first, want %s", j.ID, first.Job.ID)
	}
	clk.armed.Store(false)
	// The dispatcher's wake for the second job is set by now (or soon:
	// the deadline below is for that). Move the clock to its slot exactly.
	clk.Fake.Set(second.Job.DispatchAt)
	select {
	case j := <-got:
		if j.ID != second.Job.ID {
			t.Fatalf("handed over %s, want %s", j.ID, second.Job.ID)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("the second job, due at %v, not handed over with the clock at its slot (%v)", second.Job.DispatchAt.Sub(queuetest.T0), clk.Fake.Now().Sub(queuetest.T0))
	}
}

// A restart moves the overdue backlog in memory and writes the moved jobs'
// records after the open, in batches: once written, each record has the
// slot the schedule has, Job shows that slot before and after, and a
// second crash places the jobs again no sooner than the first restart did.
func TestRestartWritesMovedSlotsAfterTheOpen(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(queuetest.T0)
	policy := queuetest.Leaky20(3 * respacedBatch)
	s := newBackend(t)(t, queuetest.Config{Clock: clk, Policy: policy}).(*Store)
	jobs := 2*respacedBatch + 7 // more than one batch
	batch := make([]queue.NewJob, 1000)
	for n := 0; n < jobs; n += len(batch) {
		if _, err := s.Enqueue(context.Background(), "acme", batch[:min(len(batch), jobs-n)]); err != nil {
			t.Fatal(err)
		}
	}
	path := crashCopy(t, s)
	clk.Advance(time.Hour) // every job is overdue
	r, err := Open(path, Options{Clock: clk, Policy: policy})
	if err != nil {
		t.Fatal(err)
	}
	ids := r.sched.waitingIDs("acme")
	if len(ids) != jobs {
		t.Fatalf("%d waiting after the restart, want %d", len(ids), jobs)
	}
	first, err := r.Job(context.Background(), ids[0])
	if err != nil || first.DispatchAt.Before(clk.Now()) {
		t.Fatalf("the first job after the restart: %v, due %v, before now (%v)", err, first.DispatchAt, clk.Now())
	}
	select {
	case <-r.respacedDone:
	case <-time.After(30 * time.Second):
		t.Fatal("the moved slots were not written in 30 s")
	}
	slots := map[string]time.Time{}
	for _, id := range ids {
		stored, found, err := r.viewStored(id, false)
		e, waiting := r.sched.get("acme", stored.Slot, id)
		if err != nil || !found || !waiting || !stored.Slot.Equal(e.slot) {
			t.Fatalf("job %s: record's slot %v, schedule's %v (%v %v %v)", id, stored.Slot, e.slot, err, found, waiting)
		}
		shown, _ := r.Job(context.Background(), id)
		if !shown.Slot.Equal(e.slot) {
			t.Fatalf("job %s shows slot %v, the schedule has %v", id, shown.Slot, e.slot)
		}
		slots[id] = e.slot
	}
	again := crashCopy(t, r)
	r.Close()
	r2, err := Open(again, Options{Clock: clk, Policy: policy})
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	for id, slot := range slots {
		if e, ok := r2.sched.get("acme", slot, id); !ok || e.slot.Before(slot) {
			t.Fatalf("job %s after a second crash: at %v, the first restart placed it at %v", id, e.slot, slot)
		}
	}
}

// A file whose index of waiting jobs has an earlier version's values (the
// tenant's name alone) opens with every job in the place its record gives,
// the values are written anew after the open, and the next open reads the
// index alone to the same places.
func TestOpensAnIndexOfWaitingJobsWithTenantsAlone(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(queuetest.T0)
	policy := queuetest.Leaky20(100)
	s := newBackend(t)(t, queuetest.Config{Clock: clk, Policy: policy}).(*Store)
	for i := range 30 {
		queuetest.EnqueueOne(t, s, fmt.Sprintf("t%d", i%3), queue.NewJob{Payload: []byte(`1`), Deadline: queuetest.T0.Add(time.Hour)})
	}
	want := map[string]dueEntry{}
	for _, tenant := range []string{"t0", "t1", "t2"} {
		s.sched.tenantEntries(tenant, func(e dueEntry) { want[e.id] = e })
	}
	path := filepath.Join(t.TempDir(), "old.db")
	if err := s.snapshot(path); err != nil {
		t.Fatal(err)
	}
	db, err := bbolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bbolt.Tx) error {
		for id, e := range want {
			if err := tx.Bucket(bucketWaiting).Put([]byte(id), []byte(e.tenant)); err != nil {
				return err
			}
		}
		return tx.Bucket(bucketMeta).Put(keyClean, []byte("1"))
	}); err != nil {
		t.Fatal(err)
	}
	db.Close()
	same := func(s *Store) {
		t.Helper()
		if n := s.sched.len(); n != len(want) {
			t.Fatalf("%d waiting, want %d", n, len(want))
		}
		for id, e := range want {
			got, ok := s.sched.get(e.tenant, e.slot, id)
			if !ok || !got.slot.Equal(e.slot) || !got.deadline.Equal(e.deadline) || got.cost != e.cost {
				t.Fatalf("job %s: %v %+v, want %+v", id, ok, got, e)
			}
		}
	}
	for range 2 {
		r, err := Open(path, Options{Clock: clk, Policy: policy})
		if err != nil {
			t.Fatal(err)
		}
		same(r)
		<-r.respacedDone
		if err := r.db.View(func(tx *bbolt.Tx) error {
			return tx.Bucket(bucketWaiting).ForEach(func(k, v []byte) error {
				if _, current, err := decodeWaitingValue(v); !current || err != nil {
					t.Errorf("job %s: value %q after the open (%v)", k, v, err)
				}
				return nil
			})
		}); err != nil {
			t.Fatal(err)
		}
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
