package queuetest

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/queue"
)

const slow, fast = 500 * time.Millisecond, 100 * time.Millisecond

// startRepacing opens a store whose tenant acme goes at slow until change
// sets its interval, as a policy set by the API does (Repace).
func startRepacing(t *testing.T, d Driver) (*clock.Fake, queue.Store, func(time.Duration)) {
	var interval atomic.Int64
	interval.Store(int64(slow))
	clk, s := d.start(t, func(string) leaky.Policy {
		return leaky.Policy{Interval: time.Duration(interval.Load()), Burst: 1, Capacity: 100}
	})
	rp, ok := s.(queue.Repacer)
	if !ok {
		t.Skip("the store does not re-pace")
	}
	return clk, s, func(to time.Duration) {
		interval.Store(int64(to))
		if pl, ok := s.(queue.PolicyListener); ok {
			pl.PoliciesChanged()
		}
		if err := rp.Repace(context.Background(), "acme"); err != nil {
			t.Fatal(err)
		}
	}
}

// A tenant's policy changed to a faster rate (set by the API: Repace)
// brings its waiting backlog forward: after the job being sent, one new
// interval apart, each job's dispatch time saying so; a job admitted
// after goes behind it. Changed back to the slower rate, the rest of it
// moves back.
func testPolicyChangeRepacesTheBacklog(t *testing.T, d Driver) {
	ctx := context.Background()
	clk, s, change := startRepacing(t, d)
	ids := EnqueueN(t, s, "acme", 8) // 500 ms apart from T0
	got, _ := HandOver(t, s, clk, 10*time.Millisecond, 10, Succeed(clk))
	first := WaitHanded(t, clk, got, 5*time.Millisecond)
	if first.Job.ID != ids[0] {
		t.Fatalf("first handed over: %s, want %s", first.Job.ID, ids[0])
	}
	change(fast)
	// The owner of a shared store's tenant does it between two claims.
	var last time.Time
	WaitFor(t, func() bool {
		j, err := s.Job(ctx, ids[7])
		last = j.DispatchAt
		return err == nil && last.Before(T0.Add(time.Second))
	})
	prev := first.Job.DispatchAt
	for i := 1; i <= 3; i++ {
		h := WaitHanded(t, clk, got, 5*time.Millisecond)
		if h.Job.ID != ids[i] || h.Job.DispatchAt.Sub(prev) < fast || h.Job.DispatchAt.Sub(prev) > fast+20*time.Millisecond {
			t.Fatalf("job %d: %s due at %v (handed over at %v), %v after the one before; want %s, %v after", i, h.Job.ID, h.Job.DispatchAt.Sub(T0), h.At.Sub(T0), h.Job.DispatchAt.Sub(prev), ids[i], fast)
		}
		prev = h.Job.DispatchAt
	}
	if want := prev.Add(4 * fast); !last.Equal(want) {
		t.Errorf("the last job of the backlog is due at %v; want %v, one interval after each ahead", last.Sub(T0), want.Sub(T0))
	}
	after := EnqueueOne(t, s, "acme", Payload(99))
	if !after.Admitted() || !after.Job.DispatchAt.Equal(last.Add(fast)) {
		t.Errorf("a job admitted after the change: %+v, want it due at %v (behind the backlog)", after, last.Add(fast).Sub(T0))
	}
	// Slower again: the rest moves back, one slow interval apart.
	change(slow)
	WaitFor(t, func() bool {
		j, err := s.Job(ctx, after.Job.ID)
		return err == nil && j.DispatchAt.Sub(last) >= slow
	})
}

// A job admitted with a not_before its place in the queue came after is
// an ordinary job, and keeps its not_before: a faster policy brings the
// backlog forward but not that job before its time (it is booked there,
// and the jobs behind go around it); it is still counted in the queue,
// and handed over no sooner.
func testPolicyChangeKeepsANotBefore(t *testing.T, d Driver) {
	ctx := context.Background()
	clk, s, change := startRepacing(t, d)
	ahead := EnqueueN(t, s, "acme", 4) // T0 to T0+1.5s
	nb := Payload(50)
	nb.NotBefore = T0.Add(1200 * time.Millisecond)
	kept := EnqueueOne(t, s, "acme", nb)
	if !kept.Admitted() || kept.Job.State != queue.StateQueued || !kept.Job.DispatchAt.Equal(T0.Add(2*time.Second)) || !kept.Job.NotBefore.Equal(nb.NotBefore) {
		t.Fatalf("a job whose place (T0+2s) passes its not_before (T0+1.2s): %+v, want an ordinary job due at T0+2s", kept)
	}
	behind := EnqueueN(t, s, "acme", 2) // T0+2.5s, T0+3s
	got, _ := HandOver(t, s, clk, 10*time.Millisecond, 10, Succeed(clk))
	if first := WaitHanded(t, clk, got, 5*time.Millisecond); first.Job.ID != ahead[0] {
		t.Fatalf("first handed over: %s, want %s", first.Job.ID, ahead[0])
	}
	change(fast)
	var last queue.Job
	WaitFor(t, func() bool { // the owner of a shared store's tenant does it between two claims
		j, err := s.Job(ctx, behind[1])
		last = j
		return err == nil && last.DispatchAt.Before(T0.Add(time.Second))
	})
	j, err := s.Job(ctx, kept.Job.ID)
	if err != nil || !j.DispatchAt.Equal(nb.NotBefore) || j.State != queue.StateQueued || !j.NotBefore.Equal(nb.NotBefore) {
		t.Fatalf("after a faster policy, the job with a not_before: %+v %v; want it queued, due at its not_before T0+1.2s", j, err)
	}
	if st, err := s.Tenant(ctx, "acme"); err != nil || st.QueueDepth != 6 || st.Scheduled != 0 {
		t.Fatalf("tenant %+v %v: want 6 in the queue, none scheduled", st, err)
	}
	var order []string
	for range 6 {
		h := WaitHanded(t, clk, got, 5*time.Millisecond)
		if h.Job.ID == kept.Job.ID && (h.Job.DispatchAt.Before(nb.NotBefore) || h.At.Before(nb.NotBefore.Add(-10*time.Millisecond))) {
			t.Fatalf("handed over at %v for %v, before its not_before less the lead", h.At.Sub(T0), h.Job.DispatchAt.Sub(T0))
		}
		order = append(order, h.Job.ID)
	}
	if want := append(append(ahead[1:], behind...), kept.Job.ID); fmt.Sprint(order) != fmt.Sprint(want) {
		t.Errorf("handed over in the order %v; want %v (those behind go around it)", order, want)
	}
}

// A job booked for its not_before keeps its slot through a faster policy,
// and the backlog placed anew goes around it, also once the queue had
// reached it: no two jobs are due closer than the new interval.
func testPolicyChangeGoesAroundScheduledJobs(t *testing.T, d Driver) {
	ctx := context.Background()
	clk, s, change := startRepacing(t, d)
	first := EnqueueN(t, s, "acme", 1)
	nb := Payload(50)
	nb.NotBefore = T0.Add(1200 * time.Millisecond)
	booked := EnqueueOne(t, s, "acme", nb)
	if !booked.Admitted() || booked.Job.State != queue.StateScheduled || !booked.Job.DispatchAt.Equal(nb.NotBefore) {
		t.Fatalf("a job not before T0+1.2s: %+v, want it booked there", booked)
	}
	rest := EnqueueN(t, s, "acme", 12) // the queue reaches the booking, and goes past it
	got, _ := HandOver(t, s, clk, 10*time.Millisecond, 20, Succeed(clk))
	if h := WaitHanded(t, clk, got, 5*time.Millisecond); h.Job.ID != first[0] {
		t.Fatalf("first handed over: %s, want %s", h.Job.ID, first[0])
	}
	change(fast)
	WaitFor(t, func() bool { // the owner of a shared store's tenant does it between two claims
		j, err := s.Job(ctx, rest[11])
		return err == nil && j.DispatchAt.Before(T0.Add(2*time.Second))
	})
	var due []time.Time
	for range 13 {
		h := WaitHanded(t, clk, got, 5*time.Millisecond)
		if h.Job.ID == booked.Job.ID && !h.Job.DispatchAt.Equal(nb.NotBefore) {
			t.Fatalf("the booked job is due at %v after the change; want it kept at its not_before", h.Job.DispatchAt.Sub(T0))
		}
		due = append(due, h.Job.DispatchAt)
	}
	slices.SortFunc(due, time.Time.Compare)
	for i := 1; i < len(due); i++ {
		if gap := due[i].Sub(due[i-1]); gap < fast {
			t.Fatalf("two jobs due %v apart (at %v); want at least %v: %v", gap, due[i].Sub(T0), fast, due)
		}
	}
}

// A policy change with a backlog longer than a window's N: 12 jobs at
// 10/s with a window of 3 per second go in four groups of three, the
// window's list then holding only the backlog's end. The first group is
// sent; the rate changed to 5/s places the rest anew from the sends made,
// not from the backlog's old places: 1, 1.2 and 1.4 s (the window frees at
// 1 s), then 2, 2.2, 2.4 and 3, 3.2, 3.4 s; not past the old backlog's
// end, which is where a full list of old places would put them.
func testPolicyChangeWithALongBacklogInAWindow(t *testing.T, d Driver) {
	ctx := context.Background()
	w, _ := leaky.ParseWindow("3/1s")
	var interval atomic.Int64
	interval.Store(int64(100 * time.Millisecond))
	clk, s := d.start(t, func(string) leaky.Policy {
		return leaky.Policy{Interval: time.Duration(interval.Load()), Burst: 1, Capacity: 100, Windows: []leaky.Window{w}}
	})
	rp, ok := s.(queue.Repacer)
	if !ok {
		t.Skip("the store does not re-pace")
	}
	ids := EnqueueN(t, s, "acme", 12)
	got, stop := HandOver(t, s, clk, 10*time.Millisecond, 10, SucceedOnTime)
	defer stop()
	for range 3 {
		WaitHanded(t, clk, got, 5*time.Millisecond)
	}
	for _, id := range ids[:3] {
		WaitState(t, s, id, queue.StateSucceeded)
	}
	interval.Store(int64(200 * time.Millisecond))
	if pl, ok := s.(queue.PolicyListener); ok {
		pl.PoliciesChanged()
	}
	if err := rp.Repace(ctx, "acme"); err != nil {
		t.Fatal(err)
	}
	want := []time.Duration{1000, 1200, 1400, 2000, 2200, 2400, 3000, 3200, 3400}
	WaitFor(t, func() bool { // the owner of a shared store's tenant does it between two claims
		j, err := s.Job(ctx, ids[11])
		return err == nil && !j.DispatchAt.Equal(T0.Add(3200*time.Millisecond))
	})
	for i, id := range ids[3:] {
		j, err := s.Job(ctx, id)
		if at := T0.Add(want[i] * time.Millisecond); err != nil || !j.DispatchAt.Equal(at) {
			t.Errorf("job %d due at T0+%v (%v), want T0+%v", i+3, j.DispatchAt.Sub(T0), err, at.Sub(T0))
		}
	}
}
