package queuetest

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/queue"
)

// A job with a not_before later than its place in the queue is booked at
// its time, promised it, counted apart from the queue (it takes no place
// of capacity, max_scheduled bounds it), and handed over no sooner; jobs
// admitted meanwhile go around it; a second one for the same time takes
// the next slot; one due before its place is an ordinary job; a deadline
// before its time refuses it; a cancel gives its count back; a restart
// keeps it booked where it was.
func testScheduledJobsWaitForTheirTime(t *testing.T, d Driver) {
	ctx := context.Background()
	policy := func(string) leaky.Policy {
		return leaky.Policy{Interval: T, Burst: 1, Capacity: 3, MaxScheduled: 3}
	}
	clk, s, reopen := d.startWith(t, Config{Policy: policy})
	at := func(nb time.Duration) queue.NewJob {
		j := Payload(int(nb / time.Millisecond))
		j.NotBefore = T0.Add(nb)
		return j
	}
	a := EnqueueOne(t, s, "acme", at(time.Second))
	if !a.Admitted() || a.Job.State != queue.StateScheduled || !a.Job.DispatchAt.Equal(T0.Add(time.Second)) ||
		a.ExpectedDelay != time.Second || !a.Job.NotBefore.Equal(T0.Add(time.Second)) {
		t.Fatalf("a job not before T0+1s: %+v", a)
	}
	b := EnqueueOne(t, s, "acme", at(time.Second))
	if !b.Admitted() || !b.Job.DispatchAt.Equal(T0.Add(time.Second+T)) {
		t.Fatalf("a second job not before T0+1s: %+v, want it booked one interval after the first", b)
	}
	// The queue's capacity is the prompt jobs': capacity and burst of
	// them, as if nothing were scheduled.
	var prompt []string
	for i := range 5 {
		p := EnqueueOne(t, s, "acme", Payload(i))
		if i < 4 && (!p.Admitted() || p.Job.State != queue.StateQueued || !p.Job.DispatchAt.Equal(T0.Add(time.Duration(i)*T))) {
			t.Fatalf("prompt job %d beside two scheduled ones: %+v", i, p)
		}
		if i == 4 && (p.Rejected == nil || p.Rejected.Reason != queue.ReasonQueueFull) {
			t.Fatalf("a prompt job past capacity: %+v, want queue_full", p)
		}
		if p.Admitted() {
			prompt = append(prompt, p.Job.ID)
		}
	}
	st, err := s.Tenant(ctx, "acme")
	if err != nil || st.QueueDepth != 4 || st.Scheduled != 2 {
		t.Fatalf("tenant %+v %v: want 4 in the queue and 2 scheduled", st, err)
	}
	// Due before its place in the queue (T0+200ms; the queue runs to
	// T0+200ms): an ordinary job, refused like one when the queue is full.
	if early := EnqueueOne(t, s, "acme", at(4*T)); !early.Admitted() && (early.Rejected == nil || early.Rejected.Reason != queue.ReasonQueueFull) {
		t.Fatalf("a job whose not_before its place in the queue passes: %+v", early)
	}
	// Its deadline comes before its time: refused, nothing kept.
	late := at(2 * time.Second)
	late.Deadline = T0.Add(1500 * time.Millisecond)
	if r := EnqueueOne(t, s, "acme", late); r.Impossible == nil || r.Impossible.Reason != queue.ReasonWouldExpire {
		t.Fatalf("a job whose deadline comes before its not_before: %+v, want would_expire", r)
	}
	c := EnqueueOne(t, s, "acme", at(3*time.Second))
	if !c.Admitted() || !c.Job.DispatchAt.Equal(T0.Add(3*time.Second)) {
		t.Fatalf("a third scheduled job: %+v", c)
	}
	full := EnqueueOne(t, s, "acme", at(4*time.Second))
	if r := full.Rejected; r == nil || r.Reason != queue.ReasonScheduleFull || r.Scheduled != 3 || r.MaxScheduled != 3 || r.RetryAfter != 0 {
		t.Fatalf("a fourth scheduled job with max_scheduled 3: %+v, want schedule_full", full)
	}
	if _, err := s.Cancel(ctx, c.Job.ID); err != nil {
		t.Fatal(err)
	}
	if st, err := s.Tenant(ctx, "acme"); err != nil || st.Scheduled != 2 || st.Cancelled != 1 {
		t.Fatalf("after cancelling a scheduled job: %+v %v", st, err)
	}
	// A restart keeps them booked where they were (their time has not
	// come: nothing moves them).
	if d.RestartRespaces {
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		s = reopen()
		if st, err := s.Tenant(ctx, "acme"); err != nil || st.Scheduled != 2 || st.QueueDepth != 4 {
			t.Fatalf("after a restart: %+v %v", st, err)
		}
		if j, err := s.Job(ctx, b.Job.ID); err != nil || j.State != queue.StateScheduled || !j.DispatchAt.Equal(b.Job.DispatchAt) {
			t.Fatalf("a scheduled job after a restart: %+v %v", j, err)
		}
	}
	handOverAroundBookings(t, s, clk, prompt, a, b)
}

// handOverAroundBookings hands over the prompt jobs, then a and b (booked
// for their not_before) no sooner than their time less the lead, checks
// that nothing is left counted, that a job admitted after goes after b,
// and that a sent scheduled job cannot be cancelled.
func handOverAroundBookings(t *testing.T, s queue.Store, clk *clock.Fake, prompt []string, a, b queue.Admission) {
	t.Helper()
	ctx := context.Background()
	got, _ := HandOver(t, s, clk, 10*time.Millisecond, 10, Succeed(clk))
	order := append(prompt, a.Job.ID, b.Job.ID)
	for i, id := range order {
		h := WaitHanded(t, clk, got, 5*time.Millisecond)
		if h.Job.ID != id {
			t.Fatalf("handed over %d: %s, want %s", i, h.Job.ID, id)
		}
		if i >= len(prompt) && h.At.Before(h.Job.DispatchAt.Add(-10*time.Millisecond)) {
			t.Fatalf("scheduled job %s handed over at %v, before its time %v less the lead", id, h.At.Sub(T0), h.Job.DispatchAt.Sub(T0))
		}
	}
	WaitState(t, s, b.Job.ID, queue.StateSucceeded)
	if st, err := s.Tenant(ctx, "acme"); err != nil || st.Scheduled != 0 || st.QueueDepth != 0 {
		t.Fatalf("after the sends: %+v %v", st, err)
	}
	// A job admitted once the time has passed goes after the booked ones.
	after := EnqueueOne(t, s, "acme", Payload(9))
	if !after.Admitted() || after.Job.DispatchAt.Before(b.Job.DispatchAt.Add(T)) {
		t.Fatalf("a job after the scheduled ones: %+v, want it no sooner than %v", after, b.Job.DispatchAt.Add(T).Sub(T0))
	}
	var se *queue.StateError
	if _, err := s.Cancel(ctx, a.Job.ID); !errors.As(err, &se) {
		t.Fatalf("cancel of a sent scheduled job: %v", err)
	}
}

// A job booked for its not_before, handed over and released unsent (the
// service stopping, the gate busy), waits again and is counted once, as
// scheduled or in the depth; cancelled then, it leaves both at zero; and a
// tenant whose only other job ended meanwhile keeps its booking.
func testScheduledJobReleasedIsCountedOnce(t *testing.T, d Driver) {
	ctx := context.Background()
	clk, s := d.start(t, Leaky20(3))
	nj := Payload(1)
	nj.NotBefore = T0.Add(200 * time.Millisecond)
	a := EnqueueOne(t, s, "acme", nj)
	if !a.Admitted() || a.Job.State != queue.StateScheduled {
		t.Fatalf("a job not before T0+200ms: %+v", a)
	}
	var handed atomic.Bool
	stop := Consume(t, s, 10*time.Millisecond, func(_ context.Context, j queue.Job) queue.Outcome {
		if j.ID == a.Job.ID {
			handed.Store(true)
		}
		return queue.Outcome{Result: queue.Released}
	})
	WaitFor(t, func() bool {
		if !handed.Load() {
			clk.Advance(5 * time.Millisecond)
			time.Sleep(2 * time.Millisecond) // the store's own goroutines, in real time
		}
		return handed.Load()
	})
	stop()
	WaitFor(t, func() bool {
		st, err := s.Tenant(ctx, "acme")
		return err == nil && st.InFlight == 0
	})
	st, err := s.Tenant(ctx, "acme")
	if err != nil || st.Scheduled+st.QueueDepth != 1 || st.Scheduled < 0 || st.QueueDepth < 0 {
		t.Fatalf("after the release: %+v %v, want it counted once", st, err)
	}
	if _, err := s.Cancel(ctx, a.Job.ID); err != nil {
		t.Fatal(err)
	}
	if st, err := s.Tenant(ctx, "acme"); err != nil || st.Scheduled != 0 || st.QueueDepth != 0 {
		t.Fatalf("after cancelling it: %+v %v", st, err)
	}
}

// A not_before between two microseconds (a store may keep times to the
// microsecond) is neither promised nor handed over before it: the store
// rounds it up, not down.
func testNotBeforeToTheNanosecond(t *testing.T, d Driver) {
	clk, s := d.start(t, Leaky20(3))
	nj := Payload(1)
	nj.NotBefore = T0.Add(time.Second + 500*time.Nanosecond)
	a := EnqueueOne(t, s, "acme", nj)
	if !a.Admitted() || a.Job.State != queue.StateScheduled || a.Job.DispatchAt.Before(nj.NotBefore) {
		t.Fatalf("a job not before T0+1s+500ns: %+v, want it booked no sooner", a)
	}
	got, _ := HandOver(t, s, clk, 10*time.Millisecond, 1, Succeed(clk))
	if h := WaitHanded(t, clk, got, 5*time.Millisecond); h.Job.DispatchAt.Before(nj.NotBefore) || h.Job.DispatchAt.Sub(nj.NotBefore) > time.Millisecond {
		t.Fatalf("handed over for +%v: want it within a millisecond from its not_before +%v", h.Job.DispatchAt.Sub(T0), nj.NotBefore.Sub(T0))
	}
}
