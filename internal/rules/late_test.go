package rules

import (
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/queue"
)

// A queue running late: the first of ten jobs at 20/s was written 300 ms
// after its dispatch time (a slow connection). The gate spaces each send
// from the write before it, so the nine behind it go 300 ms late too, and
// a job admitted behind them is promised that: 300 ms past its slot, then
// the next one its interval after it. A write late by no more than
// LateEnough moves nothing.
func TestAJobBehindALateQueueIsPromisedItsLateness(t *testing.T) {
	t.Parallel()
	T := 50 * ms
	p := leaky.Policy{Interval: T, Burst: 1, Capacity: 100}
	for _, tc := range []struct {
		name string
		late time.Duration
		want time.Duration // the probe's promise, from t0
	}{
		{"on time", 0, 10 * T},
		{"within the machine's jitter", LateEnough, 10 * T},
		{"late", 300 * ms, 10*T + 300*ms},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var rec Record
			q := &slots{}
			var first Decision
			for i := range 10 {
				d := Admit(&rec, q, Call{Now: t0, Arrival: t0, Policy: p, Cost: 1})
				if i == 0 {
					first = d
				}
				q.scheduled = append(q.scheduled, d.Slot)
			}
			j := queue.Job{ID: "first", Tenant: "acme", Slot: first.Slot, DispatchAt: first.DispatchAt, Cost: 1}
			sentAt := first.DispatchAt.Add(tc.late)
			now := sentAt.Add(20 * ms) // its answer
			ApplyOutcome(&rec, j, queue.Outcome{Result: queue.Succeeded, Status: 200, SentAt: sentAt}, now, p)
			q.scheduled = q.scheduled[1:]
			rec.RunLate(p, j, sentAt, len(q.scheduled))
			if got := ExpectedDelay(rec, now, p, nil, len(q.scheduled), time.Time{}); got != tc.want-now.Sub(t0) {
				t.Fatalf("expected delay %v, want %v", got, tc.want-now.Sub(t0))
			}
			probe := Admit(&rec, q, Call{Now: now, Arrival: now, Policy: p, Cost: 1})
			if probe.Verdict != Admitted || probe.Delay != tc.want-now.Sub(t0) {
				t.Fatalf("probe: %+v, want admitted with delay %v", probe, tc.want-now.Sub(t0))
			}
			if probe.DispatchAt != t0.Add(10*T) {
				t.Fatalf("probe's slot moved: dispatch %v after t0, want %v", probe.DispatchAt.Sub(t0), 10*T)
			}
			q.scheduled = append(q.scheduled, probe.Slot)
			next := Admit(&rec, q, Call{Now: now, Arrival: now, Policy: p, Cost: 1})
			if next.Delay != probe.Delay+T {
				t.Fatalf("the job after the probe: delay %v, want %v", next.Delay, probe.Delay+T)
			}
		})
	}
}

// Lateness moves promises, never the schedule's room: a tenant running late
// still admits its capacity (it is refused only when its queue is full).
func TestLatenessRefusesNothing(t *testing.T) {
	t.Parallel()
	T := 50 * ms
	p := leaky.Policy{Interval: T, Burst: 1, Capacity: 10}
	var rec Record
	rec.Behind = t0.Add(time.Hour)
	admitted, refused, _ := burst(&rec, &slots{}, p, 20)
	if admitted != 11 || refused != 9 {
		t.Fatalf("admitted %d, refused %d; want 11 and 9, as on time", admitted, refused)
	}
}
