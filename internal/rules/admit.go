package rules

import (
	"slices"
	"time"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/leaky"
)

// Queue is what admission reads of a tenant's jobs besides its record. A
// store answers from what it holds; only a refusal by count, or a tenant
// with windows, makes Admit walk the slots.
type Queue interface {
	// Depth is how many of the tenant's jobs are admitted and not yet
	// handed to the dispatcher.
	Depth() int
	// Waiting yields the slot (tenant time) of each job counted in Depth,
	// and whether it is in the schedule: false for a job admitted by a
	// decision not yet durable, which cannot leave before it is.
	Waiting(yield func(slot time.Time, scheduled bool))
	// HandedOver yields the slot of each job handed to the dispatcher a
	// lead before its slot and not yet sent (zero slots are skipped).
	HandedOver(yield func(slot time.Time))
	// Scheduled is how many of the tenant's jobs are booked for their
	// not_before and not yet handed over (not counted in Depth).
	Scheduled() int
}

// Call is one admission's circumstances.
type Call struct {
	// Now is the real time of the decision.
	Now time.Time
	// Arrival is when the job can first be sent, in tenant time: the
	// tenant time at Now plus the time a send takes to start (Arrival).
	Arrival time.Time
	Policy  leaky.Policy
	// Ceiling is the downstream's ceiling shared with other tenants (nil:
	// none): jobs behind it go no faster than it lets them.
	Ceiling *leaky.Policy
	Cost    int
	// Deadline: a job that would be sent after it is refused (zero: none).
	Deadline time.Time
	// OwnerAt, on a store whose tenants are sent by an owner that may be
	// missing (Redis's partitions): nothing of the tenant is sent before
	// it, and then the jobs ahead go first, one interval apart. Zero: the
	// tenant has a sender.
	OwnerAt time.Time
	// Resend: the job is a failed one sent again by hand, not a new one
	// (the accepted count stays as it was; the failed count drops by it).
	Resend bool
	// Capped: the tenant or its downstream has a cap on attempts in
	// flight, which may hold due jobs past their slots: they wait, and
	// count, as behind a ceiling.
	Capped bool
	// NotBefore: the job is not sent before it (real time; zero: none).
	// Later than its place in the queue, the job is booked there
	// (admitScheduled), under Job, its id.
	NotBefore time.Time
	Job       string
}

// Verdict is how an admission ended.
type Verdict int

const (
	// Admitted: the job waits for Slot and goes at DispatchAt.
	Admitted Verdict = iota + 1
	// Refused: no room now (the queue is full, or no token is left); the
	// same job is admitted RetryAfter from now.
	Refused
	// WouldExpire: it would be sent after its deadline; nothing is kept.
	WouldExpire
	// ScheduleFull: it would be booked for later, and the tenant has
	// Policy.MaxScheduled such jobs already.
	ScheduleFull
)

// Decision is Admit's answer.
type Decision struct {
	Verdict Verdict
	// Slot is the job's place in the schedule, in tenant time; DispatchAt
	// is the real time it goes, for a held tenant as if resumed now.
	Slot, DispatchAt time.Time
	// Delay is what the job is promised: until DispatchAt, or longer when
	// the jobs ahead of it wait for the downstream's ceiling or run late
	// (Record.RunLate) (Admitted, WouldExpire).
	Delay time.Duration
	// RetryAfter is how long until the same job is admitted (Refused), in
	// real time: it counts what is left of a pause, and is at least
	// HeldRetryAfter during an operator hold, which has no end to count to.
	RetryAfter time.Duration
	// Prompt: it goes at once (no wait for the rate, a window or a pause).
	Prompt bool
	// Depth is the tenant's depth before this job.
	Depth int
	// Scheduled: it is booked at its not_before, outside the queue's
	// capacity (Queue.Scheduled counts it, not Depth).
	Scheduled bool
}

// Arrival is the tenant time a job decided at now can first be sent: now in
// tenant time plus lag, the time a send takes to start, and never before
// last, the arrival of the tenant's previous decision. A job sent at once is
// late by that lag, and every job queued behind it inherits it: scheduling
// from there keeps the promises true. Arrivals never go back, though the
// lag estimate may fall between two calls: the backlog decided from the
// later arrival would look deeper than it is to a job decided from the
// earlier one, which would be refused short of capacity.
func Arrival(pz leaky.Pause, now time.Time, lag time.Duration, last time.Time) time.Time {
	return clock.Later(pz.TenantTime(now).Add(lag), last)
}

// Admit decides one job under its tenant's rate, burst, capacity, windows,
// pause, the downstream's ceiling and its deadline, and keeps an admission
// in rec (its schedule, bookings, windows and accepted count; a refusal
// counts in rejected, a job that would expire changes nothing).
//
// Beside the schedule (leaky.Decide) it bounds the queue by count where the
// schedule alone does not:
//   - while paused, nothing goes at once: capacity jobs wait, no more (the
//     job at the frozen "now" looks as if it goes at once, but it waits);
//   - under a downstream's ceiling shared with others, sends are slower
//     than the tenant's rate, so jobs wait past their slots;
//   - with windows, a job waits for room in a window, not only for its
//     slot: capacity jobs may wait however long that is.
func Admit(rec *Record, q Queue, c Call) Decision {
	if !c.NotBefore.IsZero() {
		if d, ok := admitScheduled(rec, q, c); ok {
			return d
		}
	}
	p, cost := c.Policy, max(c.Cost, 1)
	depth := q.Depth()
	paused, _ := rec.Pause.Paused(c.Now)
	r := *rec // Absorb's and Decide's changes are kept only for an admission
	recent := r.Recent(p)
	d, st, counted := place(&r, q, c, paused, depth, cost)
	if !d.Admitted {
		rec.Rejected++
		return Decision{Verdict: Refused, RetryAfter: d.RetryAfter, Depth: depth}
	}
	slot := d.Slot
	at := DispatchAt(r.Pause, slot, c.Now)
	if owner := c.OwnerAt.Add(time.Duration(depth) * p.Interval); !c.OwnerAt.IsZero() && !paused && owner.After(at) {
		// No sender until OwnerAt, which then sends the jobs ahead
		// first, one interval apart. The slot moves there too: a sender
		// that comes in time finds the job on schedule and sends it then,
		// not at once, so the promise holds both ways. The schedule's end
		// stays: the wait for a sender is not the queue's.
		at = owner
		slot = at.Add(-r.Pause.Shift)
		counted = leaky.Record(recent, p, slot, cost)
	}
	// Behind a queue running late it goes when the sends ahead let it
	// (RunLate), not at its slot: its promise says so, and the next job
	// admitted comes its cost after it.
	late := r.Behind.After(at)
	out := Decision{
		Verdict: Admitted, Slot: slot, DispatchAt: at, Depth: depth,
		Delay:  max(r.behindAt(at).Sub(c.Now), CeilingDelay(c.Ceiling, depth)),
		Prompt: !slot.After(c.Arrival) && !paused,
	}
	if !c.Deadline.IsZero() && c.Now.Add(out.Delay).After(c.Deadline) {
		out.Verdict, out.Prompt = WouldExpire, false
		return out
	}
	if late {
		rec.Behind = rec.Behind.Add(time.Duration(cost) * p.Interval)
	}
	rec.TAT, rec.Booked = st.TAT, r.Booked
	rec.SetRecent(p, counted)
	rec.ForgetSpentWindows(p, r.Pause.TenantTime(c.Now))
	if c.Resend {
		// It waits again: no longer one of the tenant's failed jobs (it
		// counts there again if it fails again).
		rec.Failed = max(0, rec.Failed-1)
	} else {
		rec.Accepted++
	}
	return out
}

// CountsWaiting is whether admission bounds p's queue by the jobs that
// really wait (those due after the arrival, claimed or not), not by its
// depth: with windows and a capacity, where a job may wait for a window
// long after its slot of the rate. Only then does a store keep an index
// of the jobs being sent by slot.
func CountsWaiting(p leaky.Policy) bool { return len(p.Windows) > 0 && p.Capacity > 0 }

// place is leaky.Decide in the tenant's time, around the retries booked
// ahead (r absorbs them), with the bounds by count Admit names and a
// refusal's Retry-After in real time.
func place(r *Record, q Queue, c Call, paused bool, depth, cost int) (leaky.Decision, leaky.State, []leaky.Recent) {
	p := c.Policy
	tnow := r.Pause.TenantTime(c.Now)
	r.Absorb(p, c.Arrival, cost)
	windowed := CountsWaiting(p)
	var waiting []time.Time
	if windowed {
		// Depth is not the count of jobs that wait: jobs leave it when
		// handed to the dispatcher, a lead before their slot. Counted as
		// of the arrival: a job due by then goes at once, it does not
		// wait; paused or behind a ceiling, due jobs wait on.
		waiting = waitingAt(q, c.Arrival, paused || c.Ceiling != nil || c.Capped)
		depth = len(waiting)
	}
	d, st, recent := leaky.Decide(leaky.State{TAT: r.TAT}, r.Recent(p), c.Arrival, p, cost, depth)
	if !d.Admitted {
		// Decide's Retry-After counts from the arrival, the start lag
		// ahead of now; the lag is an estimate and may fall before the
		// job comes back. Counted from now, as if the lag were nil, it
		// holds whatever the estimate does.
		d.RetryAfter += c.Arrival.Sub(tnow)
	}
	room := p.Capacity + p.Burst // waiting, and going at once
	if paused {
		room = p.Capacity // nothing goes at once: all of them wait
	}
	refuse := func(until time.Time) {
		d = leaky.Decision{RetryAfter: countRetryAfter(c, paused, until, tnow)}
	}
	full := func() bool { return depth >= room && countedAtArrival(q, c, paused, depth) >= room }
	switch {
	case windowed && !d.Admitted && depth >= p.Capacity+p.Burst:
		// Decide refused it by count: room comes when enough have gone.
		refuse(untilFewer(waiting, p.Capacity+p.Burst))
	case !d.Admitted:
		// The rate refused it; the count may refuse it for longer
		// (retries booked past their places fill the room): the later.
		if !windowed && full() {
			ra := countRetryAfter(c, paused, untilFewer(depthSlots(q), p.Capacity+p.Burst), tnow)
			d.RetryAfter = max(d.RetryAfter, ra)
		}
	case windowed && (paused || d.Slot.After(c.Arrival)) && depth >= p.Capacity:
		// It would wait, and capacity jobs wait already.
		refuse(untilFewer(waiting, p.Capacity))
	case !windowed && full():
		// After a pause the room is capacity and burst again.
		refuse(untilFewer(depthSlots(q), p.Capacity+p.Burst))
	}
	if !d.Admitted {
		d.RetryAfter = DispatchAt(r.Pause, tnow.Add(d.RetryAfter), c.Now).Sub(c.Now)
		if !r.Pause.Held.IsZero() {
			// Counted as if resumed now, which no clock says will happen:
			// nothing leaves until an operator resumes the tenant.
			d.RetryAfter = max(d.RetryAfter, HeldRetryAfter)
		}
	}
	return d, st, recent
}

// countedAtArrival is how many of the tenant's depth jobs will still be
// counted when this job arrives (asked only when depth is at the bound). A
// job in the schedule due by then leaves as the dispatcher takes it: the
// schedule has let this one in as of its arrival, and a dispatcher a few ms
// late on a busy machine must not refuse it while the queue has room.
// Paused, behind a ceiling or under a cap, due jobs wait on: all of them
// count. Jobs not
// yet in the schedule always count (a batch's burst is counted whole).
func countedAtArrival(q Queue, c Call, paused bool, depth int) int {
	if paused || c.Ceiling != nil || c.Capped {
		return depth
	}
	q.Waiting(func(slot time.Time, scheduled bool) {
		if scheduled && !slot.After(c.Arrival) {
			depth--
		}
	})
	return depth
}

// waitingAt lists the slots, in no order, of the jobs that wait at tenant
// time at: admitted, not being sent, and due later than at, or held back
// by a ceiling or a pause (dueWaits: due ones wait too); and those handed
// to the dispatcher that wait there for a slot after at.
func waitingAt(q Queue, at time.Time, dueWaits bool) []time.Time {
	var slots []time.Time
	q.Waiting(func(slot time.Time, _ bool) {
		if dueWaits || slot.After(at) {
			slots = append(slots, slot)
		}
	})
	q.HandedOver(func(slot time.Time) {
		if slot.After(at) {
			slots = append(slots, slot)
		}
	})
	return slots
}

// depthSlots lists the slots, in no order, of the jobs in the depth.
func depthSlots(q Queue) []time.Time {
	var slots []time.Time
	q.Waiting(func(slot time.Time, _ bool) { slots = append(slots, slot) })
	return slots
}

// untilFewer is when fewer than n of the jobs at slots still wait: the slot
// (tenant time) of the one that leaves n behind it. Zero when fewer than n
// wait already. It sorts slots: only a refusal needs the order.
func untilFewer(slots []time.Time, n int) time.Time {
	if len(slots) < n {
		return time.Time{}
	}
	slices.SortFunc(slots, time.Time.Compare)
	return slots[len(slots)-n]
}

// countRetryAfter is a refusal's Retry-After, in tenant time from tnow,
// when the count bound refused the job until a waiting job's slot. A job
// due already and still counted leaves as soon as the dispatcher takes it
// (a job of the same call sent at once, or one a busy machine hands over
// late): 0, a retry at once (clients add their jitter). One held past its
// slot by a downstream's ceiling leaves when the ceiling lets it, which no
// slot says: one interval, as a guess. A pause is added by the caller.
func countRetryAfter(c Call, paused bool, until, tnow time.Time) time.Duration {
	if until.After(tnow) {
		return until.Sub(tnow)
	}
	if c.Ceiling != nil && !paused {
		return c.Policy.Interval
	}
	return 0
}

// ExpectedDelay is how long a job of cost 1 admitted at now would wait (the
// wait it would have had when the queue is full): placed around the
// retries booked ahead, within the windows, behind a pause, behind the
// depth jobs ahead at the downstream's ceiling, behind sends running late,
// and after ownerAt as Admit places it (zero: the tenant has a sender).
func ExpectedDelay(rec Record, now time.Time, p leaky.Policy, ceiling *leaky.Policy, depth int, ownerAt time.Time) time.Duration {
	tnow := rec.Pause.TenantTime(now)
	rec.Absorb(p, tnow, 1)
	slot := tnow.Add(leaky.ExpectedDelay(leaky.State{TAT: rec.TAT}, tnow, p))
	slot = leaky.WindowSlot(rec.Recent(p), p, slot, 1)
	at := DispatchAt(rec.Pause, slot, now)
	if paused, _ := rec.Pause.Paused(now); !ownerAt.IsZero() && !paused {
		at = clock.Later(at, ownerAt.Add(time.Duration(depth)*p.Interval))
	}
	return max(rec.behindAt(at).Sub(now), CeilingDelay(ceiling, depth))
}

// The limits that can bind a tenant's wait (LimitOf; the API adds
// LimitInFlight, an estimate it makes from its downstream's latency).
const (
	LimitRate     = "rate"
	LimitWindow   = "window"
	LimitCeiling  = "ceiling"
	LimitPaused   = "paused"
	LimitInFlight = "in_flight"
)

// LimitOf is which limit binds the wait ExpectedDelay gives with the same
// arguments: a pause, the downstream's ceiling, a window, or the rate.
func LimitOf(rec Record, now time.Time, p leaky.Policy, ceiling *leaky.Policy, depth int) string {
	if paused, _ := rec.Pause.Paused(now); paused {
		return LimitPaused
	}
	tnow := rec.Pause.TenantTime(now)
	rec.Absorb(p, tnow, 1)
	slot := tnow.Add(leaky.ExpectedDelay(leaky.State{TAT: rec.TAT}, tnow, p))
	windowed := leaky.WindowSlot(rec.Recent(p), p, slot, 1)
	own := rec.behindAt(DispatchAt(rec.Pause, windowed, now)).Sub(now)
	switch {
	case CeilingDelay(ceiling, depth) > own:
		return LimitCeiling
	case windowed.After(slot):
		return LimitWindow
	}
	return LimitRate
}

// MaxCost is the largest cost a tenant of policy p can ever be admitted
// with, under its downstream's ceiling (nil: none). A ceiling spaces, it
// never refuses: only its windows bound a cost.
func MaxCost(p leaky.Policy, ceiling *leaky.Policy) int {
	most := p.MaxCost()
	if ceiling != nil {
		for _, w := range ceiling.Windows {
			most = min(most, w.N)
		}
	}
	return most
}

// CeilingDelay is the least a tenant's next job waits for its downstream's
// ceiling with ahead of the tenant's jobs before it: as if it had the
// ceiling to itself (sharing it with others who are due makes it longer).
func CeilingDelay(c *leaky.Policy, ahead int) time.Duration {
	if c == nil || ahead <= 0 {
		return 0
	}
	return time.Duration(max(0, ahead+1-c.Burst)) * c.Interval
}

// HeldRetryAfter is the least Retry-After of a refusal while an operator
// hold is on. The hold has no end to count to, and the answer as if it
// were resumed now (0 for a queue due already) would have a client that
// obeys it spin; a minute keeps such a client quiet and costs it at most
// a minute after the resume.
const HeldRetryAfter = time.Minute
