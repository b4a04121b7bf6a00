package rules

import (
	"time"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/leaky"
)

// admitScheduled decides a job with a not_before later than the place an
// admission would give it: it is booked at the first slot at or after its
// not_before that the tenant's windows and the other bookings allow (the
// rule a retry's backoff follows, Record.Reserve), and the jobs admitted
// meanwhile are placed around it (Absorb). It takes no place of the
// queue's capacity, and the schedule's end does not move for it: a
// tenant's max_scheduled bounds such jobs instead (ScheduleFull). ok is
// false when its not_before comes by that place: it is an ordinary
// admission then (Admit decides it, and the not_before is met).
func admitScheduled(rec *Record, q Queue, c Call) (d Decision, ok bool) {
	p, cost := c.Policy, max(c.Cost, 1)
	r := *rec // Absorb's changes tell where the job would go, not kept
	r.Absorb(p, c.Arrival, cost)
	place := clock.Later(c.Arrival, r.TAT.Add(-p.Tolerance()))
	nb := tenantAt(rec.Pause, c.Now, c.NotBefore)
	depth := q.Depth()
	if !c.OwnerAt.IsZero() {
		// No sender before it, which then sends the jobs ahead first, one
		// interval apart (Admit): booked after them at the soonest.
		nb = clock.Later(nb, tenantAt(rec.Pause, c.Now, c.OwnerAt.Add(time.Duration(depth)*p.Interval)))
	}
	if !nb.After(place) {
		return Decision{}, false
	}
	slot := nb
	if len(p.Windows) > 0 {
		slot = leaky.WindowSlot(rec.Recent(p), p, slot, cost)
	}
	slot = rec.clearOfBookings(p, slot, cost)
	at := DispatchAt(rec.Pause, slot, c.Now)
	d = Decision{Verdict: Admitted, Slot: slot, DispatchAt: at, Delay: max(at.Sub(c.Now), 0), Depth: depth, Scheduled: true}
	if !c.Deadline.IsZero() && at.After(c.Deadline) {
		d.Verdict = WouldExpire // whatever the room: it could never go
		return d, true
	}
	if n := q.Scheduled(); p.MaxScheduled > 0 && n >= p.MaxScheduled {
		rec.Rejected++
		return Decision{Verdict: ScheduleFull, Depth: depth}, true
	}
	rec.book(Booking{Slot: slot.UnixNano(), Cost: cost, Job: c.Job})
	rec.CountSend(p, slot, cost)
	if c.Resend {
		rec.Failed = max(0, rec.Failed-1)
	} else {
		rec.Accepted++
	}
	return d, true
}

// tenantAt is real time t in tenant time under pause pz at now; for a held
// tenant, as if resumed now (DispatchAt's reading): a hold that lasts
// moves the job later, never sooner than t.
func tenantAt(pz leaky.Pause, now, t time.Time) time.Time {
	if !pz.Held.IsZero() {
		pz = pz.Resume(now)
	}
	return pz.TenantTime(t)
}
