package queuetest

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/queue"
)

// Deadlines: refused when they cannot be met, expired when a pause pushes them past.

func testDeadlines(t *testing.T, d Driver) {
	clk, s := d.start(t, Leaky20(10))
	ctx := context.Background()
	EnqueueN(t, s, "acme", 5) // slots 0, T, ..., 4T
	// Would wait 5T: refused at once, nothing taken.
	a := EnqueueOne(t, s, "acme", queue.NewJob{Payload: json.RawMessage(`9`), Deadline: T0.Add(4 * T)})
	if a.Impossible == nil || a.Impossible.Reason != queue.ReasonWouldExpire || a.Impossible.ExpectedDelay != 5*T {
		t.Fatalf("would expire: %+v", a)
	}
	if st, _ := s.Tenant(ctx, "acme"); st.QueueDepth != 5 || st.ExpectedDelay != 5*T {
		t.Fatalf("after a would_expire: %+v", st)
	}
	// Fits now (slot 5T, deadline 8T); a pause pushes it past.
	late := EnqueueOne(t, s, "acme", queue.NewJob{Payload: json.RawMessage(`10`), Deadline: T0.Add(8 * T)}).Job.ID
	after := EnqueueOne(t, s, "acme", Payload(11)).Job.ID
	// The first job: come back in a second.
	got, stop := HandOver(t, s, clk, 10*time.Millisecond, 20, PushBackOnce(clk, func(now time.Time) time.Time { return now.Add(time.Second) }))
	defer stop()
	var handedIDs []string
	for len(handedIDs) < 7 { // 6 jobs, the first twice
		handedIDs = append(handedIDs, WaitHanded(t, clk, got, 5*time.Millisecond).Job.ID)
	}
	for _, id := range handedIDs {
		if id == late {
			t.Fatal("a job past its deadline was Handed over")
		}
	}
	WaitState(t, s, late, queue.StateExpired)
	WaitState(t, s, after, queue.StateSucceeded)
	st, _ := s.Tenant(ctx, "acme")
	if st.Expired != 1 || st.Delivered != 6 || st.QueueDepth != 0 {
		t.Fatalf("status %+v", st)
	}
	if _, err := s.Cancel(ctx, late); err == nil {
		t.Fatal("cancelled an expired job")
	}
}

// A deadline already past is refused as would_expire, however far past:
// one before 1970 or at its first instant is a deadline too (zero, which
// the API never passes for a given deadline, is none).
func testDeadlinesInThePast(t *testing.T, d Driver) {
	_, s := d.start(t, Leaky20(10))
	for _, deadline := range []time.Time{T0.Add(-time.Second), time.Unix(0, 0), time.Date(1969, 12, 31, 23, 59, 59, 0, time.UTC), time.Date(1, 1, 1, 0, 0, 1, 0, time.UTC)} {
		a := EnqueueOne(t, s, "acme", queue.NewJob{Payload: json.RawMessage(`1`), Deadline: deadline})
		if a.Impossible == nil || a.Impossible.Reason != queue.ReasonWouldExpire {
			t.Fatalf("deadline %v: %+v, want would_expire", deadline, a)
		}
	}
	if st, _ := s.Tenant(context.Background(), "acme"); st.QueueDepth != 0 || st.Accepted != 0 {
		t.Fatalf("jobs past their deadline were taken: %+v", st)
	}
}

// The longest horizon config accepts (leaky.MaxHorizon: ten years of
// queue) is computed exactly: the last place is exactly capacity intervals
// away, and the next job is refused for exactly one interval.
func testLongHorizonIsExact(t *testing.T, d Driver) {
	const day = 24 * time.Hour
	const capacity = 3650 // 1/d: ten years
	_, s := d.start(t, func(string) leaky.Policy { return leaky.Policy{Interval: day, Burst: 1, Capacity: capacity} })
	jobs := make([]queue.NewJob, capacity+2)
	for i := range jobs {
		jobs[i] = Payload(i)
	}
	out, err := s.Enqueue(context.Background(), "slow", jobs)
	if err != nil {
		t.Fatal(err)
	}
	last := out[capacity]
	if last.Rejected != nil || !last.Job.DispatchAt.Equal(T0.Add(capacity*day)) || last.ExpectedDelay != capacity*day {
		t.Fatalf("the last place: %+v, want due in exactly %d days", last, capacity)
	}
	if r := out[capacity+1].Rejected; r == nil || r.RetryAfter != day || r.QueueDepth != capacity+1 {
		t.Fatalf("one past capacity: %+v, want refused for exactly a day", out[capacity+1])
	}
}
