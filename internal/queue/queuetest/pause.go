package queuetest

import (
	"context"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/queue"
)

// Pauses: downstream pushback and operator holds.

func testPushbackPausesTheTenantAndKeepsOrder(t *testing.T, d Driver) {
	clk, s := d.start(t, Leaky20(5))
	ctx := context.Background()
	ids := EnqueueN(t, s, "acme", 4)
	until := T0.Add(2 * time.Second)
	got, stop := HandOver(t, s, clk, 10*time.Millisecond, 10, PushBackOnce(clk, func(time.Time) time.Time { return until }))
	if h := WaitHanded(t, clk, got, time.Millisecond); h.Job.ID != ids[0] {
		t.Fatalf("first Handed %s", h.Job.ID)
	}
	WaitState(t, s, ids[0], queue.StateRetrying)
	st, _ := s.Tenant(ctx, "acme")
	if !st.Paused || !st.PausedUntil.Equal(until) || st.Held || st.QueueDepth != 4 {
		t.Fatalf("status during the pause %+v", st)
	}
	if j, _ := s.Job(ctx, ids[0]); j.Failures != 0 || j.Attempts != 1 || j.DispatchAt.Before(until) {
		t.Fatalf("pushed-back job %+v: no failure counted, due after the pause", j)
	}
	// While paused the queue takes only what fits (4 wait, capacity 5),
	// and what it says includes the rest of the pause.
	a := EnqueueOne(t, s, "acme", Payload(4))
	if a.Rejected != nil || a.ExpectedDelay < until.Sub(clk.Now())+4*T {
		t.Fatalf("during the pause: %+v, want a delay past the pause plus 4 intervals", a)
	}
	ids = append(ids, a.Job.ID)
	r := EnqueueOne(t, s, "acme", Payload(5)).Rejected
	if r == nil || r.RetryAfter < until.Sub(clk.Now()) {
		t.Fatalf("a sixth waiting job: %+v, want refused until after the pause", r)
	}
	// Then all of them in their original order, one interval apart,
	// none before the pause ends. The clock goes to an interval before
	// the end at once: stepping there (hundreds of steps, each a pause in
	// real time) took over WaitHanded's 10 s on a busy machine.
	if rest := until.Sub(clk.Now()) - T; rest > 0 {
		clk.Advance(rest)
	}
	var first time.Time
	for i, id := range ids {
		h := WaitHanded(t, clk, got, 5*time.Millisecond)
		if h.Job.ID != id {
			t.Fatalf("after the pause, Handed %d is %s, want %s", i, h.Job.ID, id)
		}
		if i == 0 {
			first = h.Job.DispatchAt
			if first.Before(until) {
				t.Fatalf("first after the pause due at %v, before its end", first.Sub(T0))
			}
		} else if want := first.Add(time.Duration(i) * T); !h.Job.DispatchAt.Equal(want) {
			t.Fatalf("job %d due at %v, want %v", i, h.Job.DispatchAt.Sub(T0), want.Sub(T0))
		}
	}
	WaitFor(t, func() bool { st, _ := s.Tenant(ctx, "acme"); return st.Delivered == 5 })
	stop()
	if st, _ := s.Tenant(ctx, "acme"); st.Paused {
		t.Fatalf("still paused: %+v", st)
	}
}

func testOperatorHoldAndResume(t *testing.T, d Driver) {
	clk, s, reopen := d.startWith(t, Config{Policy: Leaky20(3)})
	ctx := context.Background()
	ids := EnqueueN(t, s, "acme", 2)
	st, err := s.Pause(ctx, "acme")
	if err != nil || !st.Paused || !st.Held || !st.PausedUntil.IsZero() {
		t.Fatalf("pause: %+v %v", st, err)
	}
	// Held: accepted while there is room (all of them wait: capacity 3
	// holds 3), and kept across a restart.
	ids = append(ids, EnqueueOne(t, s, "acme", Payload(2)).Job.ID)
	// Nothing frees until it is resumed: the refusal asks for no retry
	// within a minute (docs/api.md), though its jobs are due already.
	if a := EnqueueOne(t, s, "acme", Payload(3)); a.Rejected == nil || a.Rejected.RetryAfter < time.Minute {
		t.Fatalf("a held tenant past its capacity: %+v, want refused for at least a minute", a.Rejected)
	}
	s.Close()
	s = reopen()
	if st, _ := s.Tenant(ctx, "acme"); !st.Held || st.QueueDepth != 3 {
		t.Fatalf("after a restart: %+v", st)
	}
	got, stop := HandOver(t, s, clk, 10*time.Millisecond, 10, Succeed(clk))
	for range 50 {
		clk.Advance(100 * time.Millisecond)
		time.Sleep(time.Millisecond)
	}
	select {
	case h := <-got:
		t.Fatalf("a held tenant's job was Handed over: %+v", h.Job)
	case <-time.After(20 * time.Millisecond):
	}
	resumeAt := clk.Now()
	if st, err := s.Resume(ctx, "acme"); err != nil || st.Paused || st.Held {
		t.Fatalf("resume: %+v %v", st, err)
	}
	for i, id := range ids {
		h := WaitHanded(t, clk, got, 5*time.Millisecond)
		want := resumeAt.Add(time.Duration(i) * T)
		if h.Job.ID != id || !h.Job.DispatchAt.Equal(want) {
			t.Fatalf("after resume, Handed %d: %s due %v, want %s due %v", i, h.Job.ID, h.Job.DispatchAt.Sub(T0), id, want.Sub(T0))
		}
	}
	stop()
}
