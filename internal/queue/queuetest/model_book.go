package queuetest

import (
	"slices"
	"time"
)

// The model's side of the retries booked past their place in the schedule
// (queue.TenantRecord.Booked), of the jobs booked for their not_before
// (decideScheduled), and of the dispatcher's gate, which may hold a send
// past its slot (mjob.latest).

type mbooking struct {
	slot time.Time
	cost int
	j    *mjob
}

// absorbed is the schedule's end and bookings once a job of cost arriving
// at tenant time tt is placed around the bookings (queue.TenantRecord's
// Absorb): each one it would pass or crowd is taken into the schedule.
// A booking of a job cancelled or expired meanwhile is dropped: the store
// drops it then.
func (tn *mtenant) absorbed(tt time.Time, cost int, known Defect) (time.Time, []mbooking) {
	T, tau := tn.pol.Interval, tn.tau()
	tat, booked := tn.tat, tn.booked
	for len(booked) > 0 {
		b := booked[0]
		if b.j.state == msCancelled || b.j.state == msExpired {
			booked = booked[1:]
			continue
		}
		slot := laterOf(tt, tat.Add(-tau))
		after := laterOf(tat, tt).Add(time.Duration(cost) * T)
		if len(tn.wins) > 0 && tn.pol.Capacity > 0 {
			if known&DefectWindowFuture != 0 {
				slot = tn.earliestAsIfBefore(slot, cost)
			} else {
				slot = tn.earliestWindow(slot, cost)
			}
			after = laterOf(after, slot.Add(time.Duration(cost)*T))
		}
		if slot.Before(b.slot) && !b.slot.Before(after.Add(-tau)) {
			break
		}
		tat = laterOf(tat, b.slot).Add(time.Duration(b.cost) * T)
		booked = booked[1:]
	}
	return tat, booked
}

// unbook drops j's booking, if any; it reports whether there was one.
func (tn *mtenant) unbook(j *mjob) bool {
	i := slices.IndexFunc(tn.booked, func(b mbooking) bool { return b.j == j })
	if i >= 0 {
		tn.booked = slices.Delete(slices.Clone(tn.booked), i, i+1)
	}
	return i >= 0
}

// clearOfBookings is the first time at or after at when a send of cost is
// a whole cost apart from every booking (and fits the windows).
func (tn *mtenant) clearOfBookings(at time.Time, cost int) time.Time {
	T := tn.pol.Interval
	for range len(tn.booked) + 1 {
		moved := false
		for _, b := range tn.booked {
			if b.j.state == msCancelled || b.j.state == msExpired {
				continue
			}
			if end := b.slot.Add(time.Duration(b.cost) * T); at.Before(end) && b.slot.Before(at.Add(time.Duration(cost)*T)) {
				at, moved = end, true
			}
		}
		if len(tn.wins) > 0 {
			ws := tn.earliestWindow(at, cost)
			moved = moved || ws.After(at)
			at = ws
		}
		if !moved {
			break
		}
	}
	return at
}

// book books j's retry at slot (its backoff ends past its place).
func (tn *mtenant) book(j *mjob, slot time.Time) {
	i := len(tn.booked)
	for i > 0 && tn.booked[i-1].slot.After(slot) {
		i--
	}
	tn.booked = slices.Insert(slices.Clone(tn.booked), i, mbooking{slot: slot, cost: j.cost, j: j})
}

// expiresAt reports whether j, given slot at now, expires then (its next
// attempt as told would come after its deadline): the store keeps no
// booking of it.
func (j *mjob) expiresAt(slot, now time.Time) bool {
	return !j.deadline.IsZero() && j.tn.pz.told(slot, now).After(j.deadline)
}

// latest is the last moment j may be written at: its slot's real time,
// or, where the tenant's writes so far and the rate in force do not allow
// that yet (as the dispatcher's gate keeps them), when they do. A reload
// to a slower rate leaves the jobs scheduled before it at their slots,
// and the dispatcher's gate holds them back to the new rate (Redis's
// owner paces its claims as the gate will: it reads the gate ahead), and
// the jobs after them with them; a reload to less burst takes the
// tolerance away from sends the old one allowed. For a schedule kept at
// the rate in force this is the slot.
func (j *mjob) latest() (time.Time, bool) {
	tn := j.tn
	due, ok := tn.pz.real(j.slot)
	if !ok || len(tn.writes) == 0 {
		return due, ok
	}
	return laterOf(due, tn.gateTAT().Add(-tn.tau())), true
}

// gateTAT is the dispatcher's gate's schedule after tn's writes so far:
// GCRA on the latest writes, each moving it on by its cost at the
// interval in force when it was written (the tolerance is the policy's
// now, the caller's). Zero if nothing was written.
func (tn *mtenant) gateTAT() time.Time {
	var tat time.Time
	for i := max(0, len(tn.writes)-32); i < len(tn.writes); i++ {
		tat = laterOf(tat, tn.writes[i]).Add(tn.writeSteps[i])
	}
	return tat
}

// queued are tn's waiting jobs in its depth: all but those booked for
// their not_before and not attempted yet.
func (tn *mtenant) queued() []*mjob {
	var out []*mjob
	for _, j := range tn.jobs {
		if j.state == msWaiting && !j.scheduled {
			out = append(out, j)
		}
	}
	return out
}

// scheduledJobs are tn's jobs booked for their not_before, not attempted.
func (tn *mtenant) scheduledJobs() []*mjob {
	var out []*mjob
	for _, j := range tn.jobs {
		if j.state == msWaiting && j.scheduled {
			out = append(out, j)
		}
	}
	return out
}

// decideScheduled decides a job with a not_before (real time) for tn at
// now: past the job's place in the queue, it is booked at the first slot
// at or after it clear of the other bookings and within the windows; the
// schedule's end stays. ok false: its place comes later, an ordinary job.
func (m *model) decideScheduled(tn *mtenant, now time.Time, cost int, deadline, notBefore time.Time) (d mdecision, ok bool) {
	cost = max(cost, 1)
	if mc := tn.maxCost(); cost > mc {
		return mdecision{kind: mCostTooLarge, maxCost: mc}, true
	}
	tt := tn.pz.tenantTime(now)
	tat, _ := tn.absorbed(tt, cost, m.known)
	nb := tn.pz.resume(now).tenantTime(notBefore) // held: as if resumed now
	if !nb.After(laterOf(tt, tat.Add(-tn.tau()))) {
		return mdecision{}, false
	}
	// With windows, the earliest slot the store may give: its window rule
	// may place it later (DefectWindowFuture), never sooner.
	slot := tn.clearOfBookings(tn.earliestWindow(nb, cost), cost)
	d = mdecision{kind: mAdmitted, slot: slot, delay: tn.pz.told(slot, now).Sub(now), exact: len(tn.wins) == 0, scheduled: true}
	switch {
	case !deadline.IsZero() && now.Add(d.delay).After(deadline):
		return mdecision{kind: mWouldExpire, delay: d.delay, exact: d.exact}, true
	case tn.pol.MaxScheduled > 0 && len(tn.scheduledJobs()) >= tn.pol.MaxScheduled:
		return mdecision{kind: mScheduleFull}, true
	}
	return d, true
}
