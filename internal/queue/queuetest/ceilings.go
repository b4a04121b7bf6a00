package queuetest

// Ceilings: a downstream's limit across all its tenants. A ceiling spaces
// and never refuses; what a tenant is told counts it.

import (
	"context"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/queue"
)

// startCeiling is start for a store whose tenants all deliver to "sms"
// under ceiling.
func (d Driver) startCeiling(t *testing.T, policy queue.PolicyFunc, ceiling *leaky.Policy) (*clock.Fake, queue.Store) {
	t.Helper()
	clk, s, _ := d.startWith(t, Config{Policy: policy, Ceiling: func(string) (string, *leaky.Policy) { return "sms", ceiling }})
	return clk, s
}

// The expected delay a job is told, and the tenant's, count the ceiling:
// with the tenant's jobs ahead of it, a job waits at least that many of the
// ceiling's intervals, even when its own rate is faster (invariant 5).
func testExpectedDelayCountsTheCeiling(t *testing.T, d Driver) {
	ctx := context.Background()
	ceiling := &leaky.Policy{Interval: 2 * T, Burst: 1} // the tenant may send every 50 ms; its downstream, every 100 ms
	_, s := d.startCeiling(t, Leaky20(10), ceiling)
	for i := range 5 {
		a := EnqueueOne(t, s, "acme", Payload(i))
		want := max(time.Duration(i)*T, time.Duration(i)*ceiling.Interval) // burst 1: each one ahead takes an interval
		if !a.Admitted() || a.ExpectedDelay != want || a.Job.AdmitDelay != want {
			t.Fatalf("job %d: %+v, want an expected delay of %v (%d ahead at the ceiling's %v)", i, a, want, i, ceiling.Interval)
		}
	}
	if st, err := s.Tenant(ctx, "acme"); err != nil || st.ExpectedDelay != 5*ceiling.Interval {
		t.Fatalf("status: expected delay %v %v, want %v", st.ExpectedDelay, err, 5*ceiling.Interval)
	}
	// Its own schedule would send it in 250 ms; the ceiling, in 500 ms.
	late := queue.NewJob{Payload: []byte(`1`), Deadline: T0.Add(450 * time.Millisecond)}
	if a := EnqueueOne(t, s, "acme", late); a.Impossible == nil || a.Impossible.Reason != queue.ReasonWouldExpire || a.Impossible.ExpectedDelay != 500*time.Millisecond {
		t.Fatalf("a job due in 450 ms behind 5 at the ceiling: %+v, want would_expire after 500ms", a)
	}
}

// A ceiling's windows bound what one job may cost; its rate does not.
func testCeilingWindowsBoundTheCost(t *testing.T, d Driver) {
	w, _ := leaky.ParseWindow("3/1m")
	_, s := d.startCeiling(t, Leaky20(10), &leaky.Policy{Interval: time.Second, Burst: 1, Windows: []leaky.Window{w}})
	if a := EnqueueOne(t, s, "acme", queue.NewJob{Payload: []byte(`1`), Cost: 3}); !a.Admitted() {
		t.Fatalf("cost 3 under a 3/1m ceiling: %+v", a)
	}
	a := EnqueueOne(t, s, "acme", queue.NewJob{Payload: []byte(`1`), Cost: 4})
	if a.Impossible == nil || a.Impossible.Reason != queue.ReasonCostTooLarge || a.Impossible.MaxCost != 3 {
		t.Fatalf("cost 4 under a 3/1m ceiling: %+v, want cost_too_large, at most 3", a)
	}
}

// A failed job sent again is told its wait as a new job is: the ceiling
// counts there too.
func testRetryCountsTheCeiling(t *testing.T, d Driver) {
	ctx := context.Background()
	ceiling := &leaky.Policy{Interval: 4 * T, Burst: 1}
	clk, s := d.startCeiling(t, Leaky20(10), ceiling)
	failed := EnqueueOne(t, s, "acme", Payload(0)).Job.ID
	got, stop := HandOver(t, s, clk, 10*time.Millisecond, 1, func(ctx context.Context, j queue.Job) queue.Outcome {
		return queue.Outcome{Result: queue.Failed, Status: 400, Error: "400 Bad Request", SentAt: clk.Now()}
	})
	WaitHanded(t, clk, got, time.Millisecond)
	WaitState(t, s, failed, queue.StateFailed)
	stop()
	for i := range 3 {
		EnqueueOne(t, s, "acme", Payload(i+1))
	}
	a, err := s.Retry(ctx, failed)
	if want := 3 * ceiling.Interval; err != nil || !a.Admitted() || a.ExpectedDelay < want {
		t.Fatalf("retry behind 3 at the ceiling: %+v %v, want an expected delay of at least %v", a, err, want)
	}
}
