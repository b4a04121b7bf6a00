package queuetest

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/queue"
)

// Windows: at most N sends in any window beside the rate.

func testWindowBesideTheRate(t *testing.T, d Driver) {
	w, _ := leaky.ParseWindow("20/m")
	const rateT = 200 * time.Millisecond // 5/s
	clk, s := d.start(t, func(string) leaky.Policy {
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
	got, stop := HandOver(t, s, clk, 10*time.Millisecond, 100, SucceedOnTime)
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

// Windows never change the queue bound: a tenant with a window refuses a
// job exactly when the same tenant without one does, though jobs leave its
// depth when handed to the dispatcher, a lead before their slot.
func testWindowsKeepTheQueueBound(t *testing.T, d Driver) {
	w, _ := leaky.ParseWindow("100/1m")
	for _, windows := range [][]leaky.Window{nil, {w}} {
		clk, s := d.start(t, func(string) leaky.Policy {
			return leaky.Policy{Interval: 100 * time.Millisecond, Burst: 1, Capacity: 5, Windows: windows}
		})
		for i := range 6 { // one at once, five waiting
			if a := EnqueueOne(t, s, "acme", Payload(i)); a.Rejected != nil {
				t.Fatalf("windows %v: job %d refused: %+v", windows, i, a.Rejected)
			}
		}
		got, _ := HandOver(t, s, clk, 100*time.Millisecond, 10, func(ctx context.Context, j queue.Job) queue.Outcome {
			// As the dispatcher does: the request is written at its slot
			// (at the slot exactly: the test may have moved the clock on
			// by the time this goroutine runs again).
			select {
			case <-clk.After(j.DispatchAt.Sub(clk.Now())):
			case <-ctx.Done():
				return queue.Outcome{Result: queue.Released}
			}
			return queue.Outcome{Result: queue.Succeeded, Status: 200, SentAt: j.DispatchAt}
		})
		WaitHanded(t, clk, got, time.Millisecond) // slot 0
		WaitHanded(t, clk, got, time.Millisecond) // slot 100 ms, handed a lead early
		clk.Set(T0.Add(30 * time.Millisecond))
		a := EnqueueOne(t, s, "acme", Payload(7))
		if a.Rejected == nil || a.Rejected.Reason != queue.ReasonQueueFull {
			t.Fatalf("windows %v: a seventh job at 30 ms: %+v, want queue_full (five wait, capacity 5)", windows, a)
		}
		// Retry-After is exact: at 100 ms the second job is sent and a place frees.
		if want := 70 * time.Millisecond; a.Rejected.RetryAfter != want {
			t.Fatalf("windows %v: Retry-After %v, want %v", windows, a.Rejected.RetryAfter, want)
		}
	}
}

// A refusal because a window holds the queue full says how long until a
// place frees (the first waiting job's slot), not one interval: with a
// window full for a minute, a client told 100 ms would be refused for that
// whole minute.
func testFullWindowRetryAfterIsExact(t *testing.T, d Driver) {
	w, _ := leaky.ParseWindow("3/1m")
	clk, s := d.start(t, func(string) leaky.Policy {
		return leaky.Policy{Interval: 100 * time.Millisecond, Burst: 1, Capacity: 5, Windows: []leaky.Window{w}}
	})
	var slots []time.Duration
	for i := range 6 { // at 0, 100, 200 ms; then 60 s, 60.1 s, 60.2 s (the window)
		a := EnqueueOne(t, s, "acme", Payload(i))
		if a.Rejected != nil {
			t.Fatalf("job %d refused: %+v", i, a.Rejected)
		}
		slots = append(slots, a.Job.DispatchAt.Sub(T0))
	}
	if want := time.Minute; slots[3] != want {
		t.Fatalf("slots %v: the fourth job should wait for the window, to %v", slots, want)
	}
	if r := EnqueueOne(t, s, "acme", Payload(6)).Rejected; r == nil || r.RetryAfter != 100*time.Millisecond {
		t.Fatalf("a seventh job at 0: %+v, want refused until the second job's slot (100 ms)", r)
	}
	clk.Set(T0.Add(300 * time.Millisecond)) // the first three are due: three wait, for the window
	for i := 7; i < 9; i++ {
		if a := EnqueueOne(t, s, "acme", Payload(i)); a.Rejected != nil {
			t.Fatalf("job %d at 300 ms refused: %+v (three wait, capacity 5)", i, a.Rejected)
		}
	}
	r := EnqueueOne(t, s, "acme", Payload(9)).Rejected
	if want := time.Minute - 300*time.Millisecond; r == nil || r.RetryAfter != want {
		t.Fatalf("with five waiting for the window: %+v, want refused for %v", r, want)
	}
}
