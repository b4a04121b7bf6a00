package queuetest

import (
	"slices"
	"time"

	"github.com/throttler-dev/throttler/internal/queue"
)

// What the downstream saw: each write checked against the model (when, how
// often, within the windows) and its answer applied.

// process applies the writes seen and the answers due at now to the model.
func (r *runner) process(now time.Time) {
	r.mu.Lock()
	evs := r.events
	r.events = nil
	r.mu.Unlock()
	// By tenant, then (writes of one moment) the one given the least
	// burst first, then the cheapest: the order that allows most, as a
	// downstream that counts them at once would (a cost-c job in a burst
	// spaces the next c intervals on: last, it delays none of the moment).
	order := func(ev writeEvent) (int, time.Duration, int, int) {
		if j := r.m.byID[ev.job.ID]; j != nil {
			return slices.Index(r.m.order, j.tn.name), j.tag.tau, j.cost, j.n
		}
		return len(r.m.order), 0, 0, 0
	}
	slices.SortStableFunc(evs, func(a, b writeEvent) int {
		ta, ua, ca, na := order(a)
		tb, ub, cb, nb := order(b)
		if ta != tb {
			return ta - tb
		}
		if ua != ub {
			return int(ua - ub)
		}
		if ca != cb {
			return ca - cb
		}
		return na - nb
	})
	r.checkCaps(evs, now)
	if r.fail != nil {
		return
	}
	// Writes of one moment are checked against the schedule as it was
	// before any of their answers: they were all under way already.
	var written []*mjob
	for _, ev := range evs {
		j := r.checkWrite(ev)
		if r.fail != nil {
			return
		}
		written = append(written, j)
	}
	// The store records the timeouts answered now before the outcomes of
	// the writes made now (the handler sees to it): so does the model.
	var reserved []reservation
	for _, j := range r.m.jobs {
		if j.state == msInFlight && !j.answerAt.IsZero() && !j.answerAt.After(now) && !slices.Contains(written, j) {
			reserved = append(reserved, r.onFailure(j, now, now.Add(j.answer.Backoff), j.writeAt, 0))
		}
	}
	r.adopt(reserved, now)
	reserved = nil
	var pushed []*mjob
	var moved []writeEvent // pushbacks the store gave a new place (movedByPushback)
	for i, ev := range evs {
		if ev.answer.Kind == AnswerPushback && !ev.crash && r.movedByPushback(written[i], ev.at) {
			moved = append(moved, ev)
			continue
		}
		if rv, ok := r.answerWrite(written[i], ev); ok {
			reserved = append(reserved, rv)
		}
		if ev.answer.Kind == AnswerPushback && !ev.crash {
			pushed = append(pushed, written[i])
		}
	}
	for _, ev := range moved {
		j := r.m.byID[ev.job.ID]
		tn := j.tn
		fz := tn.pz.tenantTime(ev.at)
		// (A capped tenant's jobs go later than their slots, waiting for
		// a place: which of them the pause's first stopped is the
		// store's to tell.)
		if !tn.pz.until.After(ev.at) || (!tn.capped && (j.slot.Before(fz) || !j.slot.Before(fz.Add(tn.pol.Interval)))) {
			r.failf("pushback slot", "%s answered 429 at T0+%v was given a new slot, but its resend would not go with another's after the pause (its slot T0+%v, the pause's tenant time T0+%v, until T0+%v)", r.m.describe(j), ev.at.Sub(T0), j.slot.Sub(T0), fz.Sub(T0), tn.pz.until.Sub(T0))
			return
		}
		r.recorded(j, ev.at)
		j.state = msWaiting
		reserved = append(reserved, reservation{j: j, now: now, nb: now, phase: 1, pushback: ev.at.Add(ev.retryAfter)})
		pushed = append(pushed, j)
	}
	r.adopt(reserved, now)
	// A job answered 429 now whose pause another 429 of the moment made
	// longer, past its deadline: it expires now if the store recorded the
	// longer pause first, else when its deadline comes. Either is right.
	for _, j := range pushed {
		if j.state == msWaiting && !j.deadline.IsZero() && j.tn.pz.told(j.slot, now).After(j.deadline) {
			if sj, err := r.store.Job(r.ctx, j.id); err == nil && sj.State == queue.StateExpired {
				j.state = msExpired
			}
		}
	}
}

// checkCaps checks the writes of the moment now against each tenant's
// max_in_flight: no attempt starts while that many are open (written,
// their outcome not recorded: a timeout not yet answered). The store
// frees a place as it records an outcome, and the writes answered at
// once may come in the same moment, one after another: the moment holds
// an order that keeps the cap when the attempts open before it and those
// it leaves open (timeouts, and writes a crash cut short) are at most the
// cap, and, if it leaves none open, fewer were open before it. An attempt
// a crash cut short also holds its place in the store for a while after
// the restart, which the model does not count: it checks a lower bound.
func (r *runner) checkCaps(evs []writeEvent, now time.Time) {
	type moment struct{ open, leftOpen, writes int }
	by := map[*mtenant]*moment{}
	for _, ev := range evs {
		j := r.m.byID[ev.job.ID]
		if j == nil || j.tn.pol.MaxInFlight == 0 {
			continue
		}
		m := by[j.tn]
		if m == nil {
			m = &moment{}
			for _, o := range j.tn.jobs {
				if o.state == msInFlight && o.answerAt.After(now) {
					m.open++
				}
			}
			by[j.tn] = m
		}
		m.writes++
		if ev.crash || ev.answer.Kind == AnswerTimeout {
			m.leftOpen++
		}
	}
	for tn, m := range by {
		c := tn.pol.MaxInFlight
		if m.open+m.leftOpen > c || (m.leftOpen == 0 && m.open >= c) {
			r.failf("in flight", "tenant %s (max_in_flight %d): %d attempts written at T0+%v (%d of them left open) while %d were open: more than the cap at once", tn.name, c, m.writes, now.Sub(T0), m.leftOpen, m.open)
			return
		}
	}
}

// reservation is an attempt that failed at now: it needs a new slot, no
// sooner than notBefore. Outcomes of one moment reach the store in any
// order within a phase (timeouts answered, then writes answered: the
// handler keeps that order), and the order decides who gets which slot.
type reservation struct {
	j       *mjob
	now, nb time.Time
	phase   int
	// pushback: a job answered 429 (until then) during a pause another's
	// began, given the schedule's next place (queue.ApplyOutcome)
	pushback time.Time
}

// movedByPushback reports whether the store gave j, answered 429 just now,
// a new slot (a resend that would go with another's after the pause).
// The store's slot says so when it changed; when the schedule's next
// place is the job's own slot (a burst the tolerance allows again), the
// rule does: a pause running, the slot within an interval of where the
// pause stopped the tenant's clock.
func (r *runner) movedByPushback(j *mjob, at time.Time) bool {
	sj, err := r.store.Job(r.ctx, j.id)
	if err != nil || !(sj.State.Waiting() || sj.State == queue.StateExpired) {
		return false
	}
	if !sj.Slot.Equal(j.slot) {
		return true
	}
	tn := j.tn
	fz := tn.pz.tenantTime(at)
	return tn.pz.until.After(at) && !j.slot.Before(fz) && j.slot.Before(fz.Add(tn.pol.Interval))
}

// checkWrite checks a write against the model.
func (r *runner) checkWrite(ev writeEvent) *mjob {
	j := r.m.byID[ev.job.ID]
	if j == nil {
		r.failf("unknown job", "the downstream got job %s (%s), which the model never admitted", ev.job.ID, ev.job.Payload)
		return nil
	}
	tn := j.tn
	desc := r.m.describe(j)
	r.logf("write %s attempt %d (store due T0+%v), answer %v", desc, ev.job.Attempts, ev.job.DispatchAt.Sub(T0), map[bool]string{true: "crash", false: Op{Kind: OpDownstream, Answer: ev.answer}.String()}[ev.crash])
	if j.state != msWaiting {
		r.failf("sent twice", "%s written at T0+%v while %s (writes so far %v): only a crash between a write and its recorded outcome allows a repeat", desc, ev.at.Sub(T0), j.state, relTimes(j.writes))
		return nil
	}
	due, ok := tn.pz.real(j.slot)
	switch {
	case !ok:
		r.failf("sent while held", "%s written at T0+%v while its tenant is held by an operator", desc, ev.at.Sub(T0))
	case !due.Equal(ev.at) && !j.staleDispatch && !heldByGate(j, due, ev.at) && !(tn.capped && ev.at.After(due)):
		r.failf("send time", "%s written at T0+%v, due at T0+%v (the store handed it due at T0+%v)", desc, ev.at.Sub(T0), due.Sub(T0), ev.job.DispatchAt.Sub(T0))
	case ev.job.Attempts != j.attempts+1:
		r.failf("attempts", "%s handed over as attempt %d, want %d", desc, ev.job.Attempts, j.attempts+1)
	case ev.job.Tenant != tn.name || string(ev.job.Payload) != j.payload || ev.job.IdempotencyKey != j.key:
		r.failf("job", "%s handed over as tenant %q payload %s key %q, want %q %s %q", desc, ev.job.Tenant, ev.job.Payload, ev.job.IdempotencyKey, tn.name, j.payload, j.key)
	case j.attempts == 0 && len(j.writes) == 0 && !j.disturbed && ev.at.Sub(j.admittedAt) != j.promised && !(tn.capped && ev.at.After(due)) &&
		!(r.m.known&DefectSlowReloadPromise != 0 && tn.slowed && heldByGate(j, due, ev.at)):
		r.failf("honest delay", "%s admitted at T0+%v with expected_delay %v, first written after %v", desc, j.admittedAt.Sub(T0), j.promised, ev.at.Sub(j.admittedAt))
	}
	if r.fail != nil {
		return nil
	}
	if ev.at.After(due) && !j.staleDispatch {
		tn.gateHeld = append(tn.gateHeld, ev.at) // heldByGate
	}
	if !j.notBefore.IsZero() && ev.at.Before(j.notBefore) {
		r.failf("not before", "%s written at T0+%v, before its not_before T0+%v", desc, ev.at.Sub(T0), j.notBefore.Sub(T0))
		return nil
	}
	r.checkRate(j, ev.at)
	j.writes = append(j.writes, ev.at)
	j.writeAt = ev.at
	j.possiblySent, j.pushedBack, j.scheduled = false, false, false
	j.state = msInFlight
	return j
}

// heldByGate reports whether a write of j at at, after its slot's time
// due, is one the rate in force held back (mjob.latest).
func heldByGate(j *mjob, due, at time.Time) bool {
	latest, ok := j.latest()
	return ok && at.After(due) && !at.After(latest)
}

// answerWrite applies a write's answer to the model.
func (r *runner) answerWrite(j *mjob, ev writeEvent) (reservation, bool) {
	tn := j.tn
	if ev.crash {
		j.state, j.answerAt = msInFlight, time.Time{}
		return reservation{}, false
	}
	switch ev.answer.Kind {
	case AnswerOK:
		r.recorded(j, ev.at)
		j.state = msSucceeded
	case AnswerPermanent:
		r.recorded(j, ev.at)
		j.state = msFailed
	case AnswerPushback:
		r.recorded(j, ev.at)
		j.pushedBack = true
		until := ev.at.Add(ev.retryAfter)
		for _, w := range tn.wins {
			w.entries = append(w.entries, mentry{at: j.slot, weight: j.cost}) // the resend is a send of its own
		}
		tn.pz = tn.pz.pushback(ev.at, until, j.slot)
		tn.tat = laterOf(tn.tat, tn.pz.tenantTime(ev.at).Add(tn.tau()))
		tn.disturb()
		j.state = msWaiting
		r.m.expireIfLate(j, ev.at)
		tn.persist()
	case AnswerRetry:
		return r.onFailure(j, ev.at, ev.at.Add(ev.answer.Backoff), ev.at, 1), true
	case AnswerTimeout:
		j.state, j.answer, j.answerAt = msInFlight, ev.answer, ev.at.Add(ev.answer.Timeout)
	}
	return reservation{}, false
}

// recorded counts an attempt whose outcome the store records.
func (r *runner) recorded(j *mjob, sentAt time.Time) {
	j.attempts++
	j.tn.lastRecorded = laterOf(j.tn.lastRecorded, sentAt)
	j.tn.persist()
}

// onFailure: a 5xx or a timeout answered at now; the next attempt no
// sooner than notBefore.
func (r *runner) onFailure(j *mjob, now, notBefore, sentAt time.Time, phase int) reservation {
	j.attempts++
	j.tn.lastRecorded = laterOf(j.tn.lastRecorded, sentAt)
	j.state, j.answerAt = msWaiting, time.Time{}
	return reservation{j: j, now: now, nb: notBefore, phase: phase}
}

// adopt gives the attempts that failed at now their new slots: the order
// (within a phase) that gives the slots the store gave; with windows each
// slot at or after the earliest the model allows, as the store chose.
func (r *runner) adopt(rs []reservation, now time.Time) {
	byTenant := map[*mtenant][]reservation{}
	for _, rv := range rs {
		byTenant[rv.j.tn] = append(byTenant[rv.j.tn], rv)
	}
	for _, name := range r.m.order {
		tn := r.m.tenants[name]
		group := byTenant[tn]
		if len(group) == 0 {
			continue
		}
		stored := map[*mjob]time.Time{}
		if len(group) > 1 || len(tn.wins) > 0 {
			for _, rv := range group {
				sj, err := r.store.Job(r.ctx, rv.j.id)
				if err != nil {
					r.failf("lost", "%s after a failed attempt: %v", r.m.describe(rv.j), err)
					return
				}
				stored[rv.j] = sj.Slot
			}
		}
		if len(tn.wins) > 0 {
			if !r.placeWindowed(tn, group, stored, now) {
				return
			}
		} else if !r.placeInSomeOrder(tn, group, stored) {
			return
		}
		for _, rv := range group {
			if !rv.pushback.IsZero() {
				tn.pz = tn.pz.pushback(now, rv.pushback, rv.j.slot)
				tn.tat = laterOf(tn.tat, tn.pz.tenantTime(now).Add(tn.tau()))
				tn.disturb()
			}
			r.m.expireIfLate(rv.j, now)
		}
		tn.persist()
	}
}

// placeWindowed takes the slots the store gave failed attempts of a
// tenant with windows (each no sooner than the earliest the windows allow),
// in the order of their outcomes that gives the store's schedule.
func (r *runner) placeWindowed(tn *mtenant, group []reservation, stored map[*mjob]time.Time, now time.Time) bool {
	tat0, booked0 := tn.tat, tn.booked
	entries := make([][]mentry, len(tn.wins))
	for i, w := range tn.wins {
		entries[i] = slices.Clone(w.entries)
	}
	// In some order each slot is at or after the earliest the windows
	// allow: sorted, the store's slots are no sooner than the model's.
	var mins, got []time.Time
	for _, rv := range group {
		min, late := r.m.reserve(tn, rv.j, now, rv.nb)
		tn.recordWindows(min, rv.j.cost)
		if late && !rv.j.expiresAt(min, now) {
			tn.book(rv.j, min)
		}
		mins, got = append(mins, min), append(got, stored[rv.j])
	}
	slices.SortFunc(mins, func(a, b time.Time) int { return a.Compare(b) })
	slices.SortFunc(got, func(a, b time.Time) int { return a.Compare(b) })
	for i := range mins {
		if got[i].Before(mins[i]) {
			r.failf("retry slot", "tenant %s: attempts that failed at T0+%v were given slots %v, sooner than its windows allow (%v)", tn.name, now.Sub(T0), relTimes(got), relTimes(mins))
			return false
		}
	}
	for i, w := range tn.wins {
		w.entries = entries[i]
	}
	apply := func(order []reservation) {
		tn.tat, tn.booked = tat0, booked0
		for _, rv := range order {
			_, late := r.m.reserve(tn, rv.j, rv.now, rv.nb)
			r.m.placeReserved(tn, rv.j, stored[rv.j], late)
			if late && !rv.j.expiresAt(stored[rv.j], rv.now) {
				tn.book(rv.j, stored[rv.j])
			}
		}
	}
	if r.d.TAT == nil || len(group) == 1 {
		apply(group)
		return true
	}
	want, err := r.d.TAT(r.store, tn.name)
	if err != nil {
		r.failf("tenant", "TAT(%s): %v", tn.name, err)
		return false
	}
	var found []reservation
	tries := 0
	permuteInPhases(group, func(order []reservation) bool {
		if tries++; tries > 5000 {
			return false
		}
		for i, w := range tn.wins {
			w.entries = slices.Clone(entries[i])
		}
		apply(order)
		if tn.tat.Equal(want) {
			found = order
			return false
		}
		return true
	})
	for i, w := range tn.wins {
		w.entries = slices.Clone(entries[i])
	}
	if found == nil {
		found = group // the schedule check will tell
	}
	apply(found)
	return true
}

// placeInSomeOrder reserves the group's slots in its given order, or, if
// the store's slots are known (stored), in the first order within phases
// that gives them.
func (r *runner) placeInSomeOrder(tn *mtenant, group []reservation, stored map[*mjob]time.Time) bool {
	tat0, booked0 := tn.tat, tn.booked
	late := map[*mjob]bool{}
	run := func(order []reservation) (map[*mjob]time.Time, time.Time) {
		tn.tat, tn.booked = tat0, booked0
		slots := map[*mjob]time.Time{}
		for _, rv := range order {
			slots[rv.j], late[rv.j] = r.m.reserve(tn, rv.j, rv.now, rv.nb)
			if late[rv.j] && !rv.j.expiresAt(slots[rv.j], rv.now) {
				tn.book(rv.j, slots[rv.j])
			}
		}
		return slots, tn.tat
	}
	first, firstTAT := run(group)
	firstBooked := tn.booked
	if len(stored) == 0 {
		tn.booked = firstBooked
		for j, at := range first {
			r.m.placeReserved(tn, j, at, late[j])
		}
		tn.tat = firstTAT
		return true
	}
	var found map[*mjob]time.Time
	var foundTAT time.Time
	var foundOrder []reservation
	tries := 0
	permuteInPhases(group, func(order []reservation) bool {
		if tries++; tries > 5000 {
			return false
		}
		slots, tat := run(order)
		for j, at := range slots {
			if !at.Equal(stored[j]) {
				return true
			}
		}
		found, foundTAT, foundOrder = slots, tat, slices.Clone(order)
		return false
	})
	if found == nil {
		var want, got []time.Time
		for _, rv := range group {
			want, got = append(want, first[rv.j]), append(got, stored[rv.j])
		}
		r.failf("retry slot", "tenant %s: attempts that failed at T0+%v (%d) were given slots %v; the model gives %v, or the same in another order of their outcomes", tn.name, group[0].now.Sub(T0), len(group), relTimes(got), relTimes(want))
		return false
	}
	run(foundOrder) // once more, to leave late as found
	for j, at := range found {
		r.m.placeReserved(tn, j, at, late[j])
	}
	tn.tat = foundTAT
	return true
}

// permuteInPhases calls f with each order of rs that keeps phases in
// order, until f returns false.
func permuteInPhases(rs []reservation, f func([]reservation) bool) {
	var phases [][]reservation
	for _, rv := range rs {
		if len(phases) == 0 || phases[len(phases)-1][0].phase != rv.phase {
			phases = append(phases, nil)
		}
		phases[len(phases)-1] = append(phases[len(phases)-1], rv)
	}
	var rec func(i int, acc []reservation) bool
	rec = func(i int, acc []reservation) bool {
		if i == len(phases) {
			return f(acc)
		}
		return permute(phases[i], func(p []reservation) bool { return rec(i+1, append(append([]reservation(nil), acc...), p...)) })
	}
	rec(0, nil)
}

func permute(rs []reservation, f func([]reservation) bool) bool {
	if len(rs) <= 1 {
		return f(rs)
	}
	for i := range rs {
		rest := append(append([]reservation(nil), rs[:i]...), rs[i+1:]...)
		if !permute(rest, func(p []reservation) bool { return f(append([]reservation{rs[i]}, p...)) }) {
			return false
		}
	}
	return true
}

// checkRate checks a write of j at at against the tenant's rate and windows,
// as given to the job's slot: GCRA on the writes (no write sooner than the
// previous writes allow with the burst's tolerance), counting attempts
// (invariant 1) and, apart, counting each job's cost (the schedule spaces
// a cost-c job c intervals from the next); and at most N sends in any
// window of each length.
func (r *runner) checkRate(j *mjob, at time.Time) {
	tn := j.tn
	tn.writes = append(tn.writes, at)
	tn.writeCosts = append(tn.writeCosts, j.cost)
	tn.writeSteps = append(tn.writeSteps, time.Duration(j.cost)*tn.pol.Interval)
	if due, ok := tn.pz.real(j.slot); tn.capped && ok && at.After(due) {
		// Held for a place past its slot: the dispatcher's gate spaces
		// it from the writes before it (the embedded store's driver has
		// none), as it does a job a reload left at an old slot.
		j.heldResend, j.staleDispatch = false, false
		return
	}
	r.checkSpacing(j, at)
	if r.fail == nil && !(j.pushedBack && r.m.known&DefectPushbackWindow != 0) && !j.heldResend && !j.staleDispatch { // else: the store makes no room for it
		r.checkWindows(j, at)
	}
	j.heldResend, j.staleDispatch = false, false
}

func (r *runner) checkSpacing(j *mjob, at time.Time) {
	tn := j.tn
	if j.pushedBack && r.m.known&DefectPushbackBurst != 0 || j.heldResend || j.staleDispatch {
		return // the store does not space it: see the Defect
	}
	// Only a slot given under the rate in force is checked against it: a
	// reload does not move jobs already scheduled (their sends are the
	// dispatcher's gate's to re-pace).
	T, tau := tn.pol.Interval, tn.tau()
	if j.tag.T != T || j.tag.tau != tau {
		return
	}
	burst := tau/T + 1
	prev := relTimes(lastN(tn.writes[:len(tn.writes)-1], 6))
	if at.Before(tn.rateTAT1.Add(-tau)) {
		r.failf("rate", "tenant %s: %s written at T0+%v, sooner than the rate allows (T0+%v; T %v, burst %d); the tenant's last writes: %v", tn.name, r.m.describe(j), at.Sub(T0), tn.rateTAT1.Add(-tau).Sub(T0), T, burst, prev)
		return
	}
	if at.Before(tn.rateTAT.Add(-tau)) {
		r.failf("cost spacing", "tenant %s: %s written at T0+%v, sooner than the costs of the writes before allow (T0+%v; T %v, burst %d); the tenant's last writes: %v", tn.name, r.m.describe(j), at.Sub(T0), tn.rateTAT.Add(-tau).Sub(T0), T, burst, prev)
		return
	}
	tn.rateTAT = laterOf(tn.rateTAT, at).Add(time.Duration(j.cost) * T)
	tn.rateTAT1 = laterOf(tn.rateTAT1, at).Add(T)
	tn.lastWriteT, tn.lastWriteCost = T, j.cost
}

// checkWindows counts a write in every window its slot was given under.
func (r *runner) checkWindows(j *mjob, at time.Time) {
	tn := j.tn
	for _, w := range j.tag.wins {
		if j.cost > w.spec.N {
			continue // admitted before a reload made the window smaller than it: no slot keeps it
		}
		w.writes = append(w.writes, mentry{at: at, weight: j.cost})
		n := 0
		var in []time.Time
		for _, e := range w.writes {
			if e.at.After(at.Add(-w.spec.Length)) {
				n += e.weight
				in = append(in, e.at)
			}
		}
		if n > w.spec.N && !slices.ContainsFunc(tn.gateHeld, func(g time.Time) bool { return g.After(at.Add(-w.spec.Length)) }) {
			// (A write the gate held back, in the window: the dispatcher's
			// gate counts real writes in every window and holds the next
			// send too, but the model has no gate, and Redis's owner reads
			// ahead only the gate's rate.)
			r.failf("window", "tenant %s: %d sends within %v (window %d/%v): %v", tn.name, n, at.Sub(in[0]), w.spec.N, w.spec.Length, relTimes(in))
			return
		}
	}
}
