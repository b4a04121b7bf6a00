package queuetest

import (
	"context"
	"slices"
	"testing"
	"time"

	"throttler/internal/clock"
	"throttler/internal/leaky"
	"throttler/internal/queue"
)

// Windows: at most N sends in any window beside the rate.

func testWindowBesideTheRate(t *testing.T, d Driver) {
	t.Parallel()
	clk := clock.NewFake(T0)
	w, _ := leaky.ParseWindow("20/m")
	const rateT = 200 * time.Millisecond // 5/s
	s := d.open(t, clk, func(string) leaky.Policy {
		return leaky.Policy{Interval: rateT, Burst: 1, Capacity: 100, Windows: []leaky.Window{w}}
	})
	promised := map[string]time.Time{}
	for i := 0; i < 60; i++ {
		a := EnqueueOne(t, s, "acme", Payload(i))
		if a.Rejected != nil {
			t.Fatalf("job %d refused: %+v", i, a.Rejected)
		}
		want := T0.Add(time.Duration(i/20)*time.Minute + time.Duration(i%20)*rateT)
		if !a.Job.DispatchAt.Equal(want) || a.ExpectedDelay != want.Sub(T0) {
			t.Fatalf("job %d promised %v (delay %v), want %v", i, a.Job.DispatchAt.Sub(T0), a.ExpectedDelay, want.Sub(T0))
		}
		promised[a.Job.ID] = a.Job.DispatchAt
	}
	if st, _ := s.Tenant(context.Background(), "acme"); st.ExpectedDelay != 3*time.Minute {
		t.Fatalf("expected delay for a 61st job %v, want 3m (the window)", st.ExpectedDelay)
	}
	got := make(chan Handed, 100)
	stop := Consume(t, s, 10*time.Millisecond, func(ctx context.Context, j queue.Job) queue.Outcome {
		got <- Handed{Job: j, At: clk.Now()}
		return queue.Outcome{Result: queue.Succeeded, Status: 200, SentAt: j.DispatchAt}
	})
	defer stop()
	var sent []time.Time
	for len(sent) < 60 {
		h := WaitHanded(t, clk, got, 100*time.Millisecond)
		// (When it is Handed over depends on how fast this test moves
		// the fake clock; what it is due at does not.)
		if !h.Job.DispatchAt.Equal(promised[h.Job.ID]) {
			t.Fatalf("job due %v, promised %v", h.Job.DispatchAt.Sub(T0), promised[h.Job.ID].Sub(T0))
		}
		sent = append(sent, h.Job.DispatchAt)
	}
	slices.SortFunc(sent, func(a, b time.Time) int { return a.Compare(b) })
	for i := range sent {
		for j := i; j < len(sent); j++ {
			span := sent[j].Sub(sent[i])
			if n := j - i + 1; (span < time.Second && n > 5+1) || (span < time.Minute && n > 20) {
				t.Fatalf("%d sends within %v", n, span)
			}
		}
	}
}
