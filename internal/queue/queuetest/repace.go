package queuetest

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/queue"
)

// A tenant's policy changed to a faster rate (set by the API: Repace)
// brings its waiting backlog forward: after the job being sent, one new
// interval apart, each job's dispatch time saying so; a job admitted
// after goes behind it. Changed back to the slower rate, the rest of it
// moves back.
func testPolicyChangeRepacesTheBacklog(t *testing.T, d Driver) {
	ctx := context.Background()
	const slow, fast = 500 * time.Millisecond, 100 * time.Millisecond
	var interval atomic.Int64
	interval.Store(int64(slow))
	clk, s := d.start(t, func(string) leaky.Policy {
		return leaky.Policy{Interval: time.Duration(interval.Load()), Burst: 1, Capacity: 100}
	})
	rp, ok := s.(queue.Repacer)
	if !ok {
		t.Skip("the store does not re-pace")
	}
	change := func(to time.Duration) {
		interval.Store(int64(to))
		if pl, ok := s.(queue.PolicyListener); ok {
			pl.PoliciesChanged()
		}
		if err := rp.Repace(ctx, "acme"); err != nil {
			t.Fatal(err)
		}
	}
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
