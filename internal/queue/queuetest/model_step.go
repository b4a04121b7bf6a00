package queuetest

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/throttler-dev/throttler/internal/queue"
)

// The operations of a model run, each checked against the model.

// do runs one op.
func (r *runner) do(op Op) {
	now := r.clk.Now()
	switch op.Kind {
	case OpEnqueue:
		r.enqueue(op, now)
	case OpCancel:
		r.cancel(op, now)
	case OpRetry:
		r.retry(op, now)
	case OpHold, OpResume:
		r.hold(op, now)
	case OpAdvance:
		r.advance(now.Add(max(op.D, 0)))
	case OpDownstream:
		r.mu.Lock()
		r.answer = op.Answer
		r.mu.Unlock()
	case OpReload:
		tn := r.m.tenants[op.Tenant]
		if tn == nil || op.Policy.Interval <= 0 || op.Policy.Burst < 1 {
			return
		}
		r.polMu.Lock()
		r.pols[op.Tenant] = op.Policy
		r.polMu.Unlock()
		if pl, ok := r.store.(queue.PolicyListener); ok {
			pl.PoliciesChanged() // as the service does at a reload
		}
		r.m.reload(tn, op.Policy, now)
		r.mu.Lock()
		r.maxT[op.Tenant] = tn.maxT
		r.mu.Unlock()
	case OpCrash:
		r.crash(max(op.D, 0))
	case OpStale:
		r.stale(max(op.D, 0))
	case OpCrashOnWrite:
		r.mu.Lock()
		r.crashArmed = true
		r.mu.Unlock()
	}
}

func (r *runner) enqueue(op Op, now time.Time) {
	tn := r.m.tenants[op.Tenant]
	if tn == nil || len(op.Jobs) == 0 {
		return
	}
	var statusDelay time.Duration
	if len(tn.wins) > 0 {
		st, err := r.store.Tenant(r.ctx, tn.name)
		if err != nil {
			r.failf("tenant", "%v", err)
			return
		}
		statusDelay = st.ExpectedDelay
	}
	jobs := make([]queue.NewJob, len(op.Jobs))
	payloads := make([]string, len(op.Jobs))
	for i, spec := range op.Jobs {
		r.payloads++
		payloads[i] = fmt.Sprintf(`{"m":%d}`, r.payloads)
		jobs[i] = queue.NewJob{Payload: json.RawMessage(payloads[i]), IdempotencyKey: spec.Key, Cost: spec.Cost}
		if spec.Deadline != 0 {
			jobs[i].Deadline = now.Add(spec.Deadline)
		}
		if spec.NotBefore != 0 {
			jobs[i].NotBefore = now.Add(spec.NotBefore)
		}
	}
	out, err := r.store.Enqueue(r.ctx, tn.name, jobs)
	if err != nil {
		r.failf("enqueue", "Enqueue: %v", err)
		return
	}
	if len(out) != len(jobs) {
		r.failf("enqueue", "Enqueue answered %d of %d jobs", len(out), len(jobs))
		return
	}
	firstUse := map[string]int{}
	admittedAny := false
	inCall := map[*mjob]bool{}
	for i, spec := range op.Jobs {
		a := out[i]
		where := fmt.Sprintf("job %d of %d", i+1, len(jobs))
		if r.repeatsAKey(tn, spec, out, i, firstUse, where) {
			if r.fail != nil {
				return
			}
			continue
		}
		var deadline time.Time
		if spec.Deadline != 0 {
			deadline = now.Add(spec.Deadline)
		}
		var dec mdecision
		scheduled := false
		if spec.NotBefore != 0 {
			dec, scheduled = r.m.decideScheduled(tn, now, spec.Cost, deadline, now.Add(spec.NotBefore))
		}
		if !scheduled {
			dec = r.m.decide(tn, now, spec.Cost, deadline, inCall)
		}
		if !r.checkAdmission(tn, dec, a, where, now, deadline) {
			return
		}
		if dec.kind != mAdmitted || a.Job.ID == "" || a.Rejected != nil || a.Impossible != nil {
			continue
		}
		j := &mjob{n: len(r.m.jobs) + 1, id: a.Job.ID, tn: tn, key: spec.Key, cost: max(spec.Cost, 1), deadline: deadline, payload: payloads[i]}
		if dec.scheduled {
			j.notBefore, j.scheduled = now.Add(spec.NotBefore), true
		}
		if !r.admitJob(tn, j, dec, a, where, now, inCall) {
			return
		}
		if len(tn.wins) > 0 && !admittedAny && j.cost == 1 && !j.scheduled && a.ExpectedDelay != statusDelay {
			r.failf("expected delay", "tenant %s reported expected_delay %v, and the job admitted right after waits %v", tn.name, statusDelay, a.ExpectedDelay)
			return
		}
		admittedAny = true
		inCall[j] = true
		j.promisedFirst, j.admitDepth = a.ExpectedDelay, a.QueueDepth
		r.m.jobs = append(r.m.jobs, j)
		r.m.byID[j.id] = j
		tn.jobs = append(tn.jobs, j)
		if spec.Key != "" {
			tn.keys[spec.Key] = j
		}
	}
	if admittedAny {
		tn.persist()
	}
}

// repeatsAKey checks the answer out[i] to a job whose idempotency key an
// earlier job of the call (firstUse: key -> its place) or of the run used:
// the first answer again. It reports whether the job was such a repeat
// (r.fail says if its answer was wrong).
func (r *runner) repeatsAKey(tn *mtenant, spec JobSpec, out []queue.Admission, i int, firstUse map[string]int, where string) bool {
	if spec.Key == "" {
		return false
	}
	a := out[i]
	if f, ok := firstUse[spec.Key]; ok {
		b := out[f]
		if a.Job.ID != b.Job.ID || a.Duplicate != b.Admitted() || (a.Rejected == nil) != (b.Rejected == nil) || (a.Impossible == nil) != (b.Impossible == nil) {
			r.failf("idempotency", "%s repeats key %q of job %d in the call: answered %s, the first %s", where, spec.Key, f+1, admissionString(a), admissionString(b))
		}
		return true
	}
	firstUse[spec.Key] = i
	mj := tn.keys[spec.Key]
	if mj == nil {
		return false
	}
	if r.m.known&DefectRepeatCost != 0 && max(spec.Cost, 1) > tn.maxCost() && a.Impossible != nil && a.Impossible.Reason == queue.ReasonCostTooLarge {
		return true
	}
	if !a.Duplicate || a.Job.ID != mj.id || a.ExpectedDelay != mj.promisedFirst || a.QueueDepth != mj.admitDepth {
		r.failf("idempotency", "%s repeats key %q of %s (delay %v, depth %d): answered %s", where, spec.Key, r.m.describe(mj), mj.promisedFirst, mj.admitDepth, admissionString(a))
	}
	return true
}

// checkAdmission compares a store's answer with the model's decision (all
// but an admission's details, which admitJob checks).
func (r *runner) checkAdmission(tn *mtenant, dec mdecision, a queue.Admission, where string, now, deadline time.Time) bool {
	got := admissionString(a)
	depth := len(tn.queued())
	switch dec.kind {
	case mScheduleFull:
		if a.Rejected == nil || a.Rejected.Reason != queue.ReasonScheduleFull || a.Rejected.MaxScheduled != tn.pol.MaxScheduled {
			r.failf("admission", "%s for %s: want 429 schedule_full (%d booked for their not_before), got %s", where, tn.name, tn.pol.MaxScheduled, got)
			return false
		}
	case mCostTooLarge:
		if a.Impossible == nil || a.Impossible.Reason != queue.ReasonCostTooLarge || a.Impossible.MaxCost != dec.maxCost {
			r.failf("admission", "%s for %s: want 422 cost_too_large (at most %d), got %s", where, tn.name, dec.maxCost, got)
			return false
		}
	case mWouldExpire:
		if tt := tn.pz.tenantTime(now); a.Rejected != nil && tn.pol.Capacity == 0 && len(tn.wins) > 0 && r.m.known&DefectWindowFuture != 0 &&
			tn.earliestAsIfBefore(tt, 1).After(tt) {
			return true // refused for the window (as DefectWindowFuture has it) before its deadline was looked at
		}
		if a.Impossible == nil || a.Impossible.Reason != queue.ReasonWouldExpire || (dec.exact && !tn.capped && a.Impossible.ExpectedDelay != dec.delay) || a.Impossible.ExpectedDelay < dec.delay {
			r.failf("admission", "%s for %s: want 422 would_expire (delay %v past the deadline T0+%v), got %s", where, tn.name, dec.delay, deadline.Sub(T0), got)
			return false
		}
	case mRejected:
		reason := queue.ReasonQueueFull
		if tn.pol.Capacity == 0 {
			reason = queue.ReasonRateLimited
		}
		// A capped tenant's owner on Redis claims a job when it gets a
		// place, at a moment of its own: a depth is within the jobs it may
		// have claimed ahead then (as checkAll has it).
		ahead := 0
		if tn.capped {
			ahead = tn.claimable(now)
		}
		if a.Rejected == nil || a.Rejected.Reason != reason || a.Rejected.QueueDepth > depth || a.Rejected.QueueDepth < depth-ahead || a.QueueDepth != a.Rejected.QueueDepth {
			r.failf("admission", "%s for %s: want 429 %s with depth %d (the %s is full), got %s", where, tn.name, reason, depth, dec.raWhy, got)
			return false
		}
		r.checkRetryAfter(tn, dec, a.Rejected.RetryAfter, where, now)
	case mAdmitted:
		if (len(tn.wins) > 0 || tn.capped) && a.Impossible != nil && a.Impossible.Reason == queue.ReasonWouldExpire && !deadline.IsZero() &&
			a.Impossible.ExpectedDelay >= dec.delay && now.Add(a.Impossible.ExpectedDelay).After(deadline) {
			return true // a window gave it a later slot than the earliest possible (a cap made its queue late), and that is past its deadline
		}
		if tt := tn.pz.tenantTime(now); a.Rejected != nil && tn.pol.Capacity == 0 && len(tn.wins) > 0 && r.m.known&DefectWindowFuture != 0 &&
			tn.earliestAsIfBefore(tt, 1).After(tt) {
			return true // a send recorded later in the window holds it back (as if before it)
		}
		if a.Rejected != nil || a.Impossible != nil || a.Job.ID == "" || a.Duplicate {
			r.failf("admission", "%s for %s: want admitted with delay %v (depth %d before, %s), got %s", where, tn.name, dec.delay, depth, r.stateString(tn, now), got)
			return false
		}
	}
	return r.fail == nil
}

func (r *runner) checkRetryAfter(tn *mtenant, dec mdecision, ra time.Duration, where string, now time.Time) {
	switch {
	case dec.raWhy == "count" && r.m.known&DefectCountRetryAfter != 0,
		dec.raWhy == "window" && r.m.known&DefectWindowRetryAfter != 0,
		dec.raWhy == "window count" && dec.over && r.m.known&DefectWindowRetryAfter != 0:
		return
	}
	if tn.pz.paused(now) {
		// What a refusal says during a pause depends on how the pause will
		// end: check only that it does not invite a retry before the end.
		if until := tn.pz.until; tn.pz.held.IsZero() && ra < until.Sub(now) {
			r.failf("retry-after", "%s for %s: Retry-After %v during a pause that ends in %v", where, tn.name, ra, until.Sub(now))
		}
		return
	}
	if (dec.raExact && ra != dec.ra) || ra < dec.ra {
		how := "exactly"
		if !dec.raExact {
			how = "at least"
		}
		r.failf("retry-after", "%s for %s refused (%s) with Retry-After %v, want %s %v: a job arriving then is admitted, not a moment sooner", where, tn.name, dec.raWhy, ra, how, dec.ra)
	}
}

// admitJob checks an admission's details and takes it into the model.
func (r *runner) admitJob(tn *mtenant, j *mjob, dec mdecision, a queue.Admission, where string, now time.Time, inCall map[*mjob]bool) bool {
	slot := dec.slot
	if !dec.exact {
		if a.Job.Slot.Before(dec.slot) {
			r.failf("window slot", "%s for %s: slot T0+%v, sooner than every window allows (T0+%v)", where, tn.name, a.Job.Slot.Sub(T0), dec.slot.Sub(T0))
			return false
		}
		slot = a.Job.Slot
	}
	told := tn.pz.told(slot, now)
	depth, ahead := len(tn.queued())+1, tn.claimable(now) // see claimable
	state := queue.StateQueued
	if dec.scheduled {
		depth, state = depth-1, queue.StateScheduled // not in the depth
	}
	switch {
	case a.ExpectedDelay != told.Sub(now) && !(tn.capped && a.ExpectedDelay > told.Sub(now)): // a capped queue may run late (rules.Record.RunLate)
		r.failf("expected delay", "%s for %s: expected_delay %v, want %v (slot T0+%v)", where, tn.name, a.ExpectedDelay, told.Sub(now), slot.Sub(T0))
	case !a.Job.DispatchAt.Equal(told):
		r.failf("admission", "%s for %s: dispatch_at T0+%v, want T0+%v", where, tn.name, a.Job.DispatchAt.Sub(T0), told.Sub(T0))
	case a.QueueDepth > depth || a.QueueDepth < depth-ahead:
		r.failf("depth", "%s for %s: queue_depth %d, want %d (%d of them claimable ahead)", where, tn.name, a.QueueDepth, depth, ahead)
	case a.Job.State != state || a.Job.Attempts != 0:
		r.failf("admission", "%s for %s: admitted as %s with %d attempts", where, tn.name, a.Job.State, a.Job.Attempts)
	case a.Capacity != tn.pol.Capacity:
		r.failf("admission", "%s for %s: capacity %d, want %d", where, tn.name, a.Capacity, tn.pol.Capacity)
	}
	if r.fail != nil {
		return false
	}
	r.m.take(tn, j, now, slot)
	if dec.scheduled {
		return true // booked apart: it adds nothing to the queue's bound
	}
	// The bound: queued jobs that wait (not going at once) never exceed
	// the capacity.
	n, oldest := 0, now
	for _, w := range tn.queued() {
		if len(tn.wins) > 0 && inCall[w] && r.m.known&DefectBatchWindow != 0 {
			continue
		}
		if w.attempts == 0 && !w.possiblySent && (tn.pz.told(w.slot, now).After(now) || tn.pz.paused(now)) {
			n++
			oldest = earliest(oldest, w.admittedAt)
		}
	}
	if c := tn.capacityBound(oldest); n > c {
		r.failf("bound", "tenant %s holds %d queued jobs waiting, capacity %d", tn.name, n, c)
		return false
	}
	return true
}

func (r *runner) pick(op Op, want func(*mjob) bool) *mjob {
	var list []*mjob
	for _, j := range r.m.jobs {
		if op.Pick%2 == 1 || want(j) {
			list = append(list, j)
		}
	}
	if len(list) == 0 {
		return nil
	}
	return list[(op.Pick/2)%len(list)]
}

// wantStateError checks that op on j, which is in no state for it, failed
// with a StateError that names j's state.
func (r *runner) wantStateError(op string, j *mjob, err error) {
	var se *queue.StateError
	if !errors.As(err, &se) || se.State != storeState(j) {
		r.failf(op, "%s of %s (%s): want a StateError %s, got %v", op, r.m.describe(j), j.state, storeState(j), err)
	}
}

func (r *runner) cancel(op Op, now time.Time) {
	j := r.pick(op, func(j *mjob) bool { return j.state == msWaiting })
	if j == nil {
		return
	}
	got, err := r.store.Cancel(r.ctx, j.id)
	if j.state != msWaiting {
		r.wantStateError("cancel", j, err)
		return
	}
	if err != nil || got.State != queue.StateCancelled {
		r.failf("cancel", "cancel of waiting %s: %+v %v", r.m.describe(j), got.State, err)
		return
	}
	j.state = msCancelled
	tn := j.tn
	// The last job of the schedule gives its place back (leaky, no
	// windows); only in memory until the tenant's record is next written.
	// A booked retry gives back its booking only.
	if !tn.unbook(j) && tn.pol.Burst == 1 && len(tn.wins) == 0 && j.slot.Add(time.Duration(j.cost)*tn.pol.Interval).Equal(tn.tat) {
		tn.tat = j.slot
	}
}

func (r *runner) retry(op Op, now time.Time) {
	j := r.pick(op, func(j *mjob) bool { return j.state == msFailed })
	if j == nil {
		return
	}
	tn := j.tn
	a, err := r.store.Retry(r.ctx, j.id)
	if j.state != msFailed {
		r.wantStateError("retry", j, err)
		return
	}
	if err != nil {
		r.failf("retry", "retry of failed %s: %v", r.m.describe(j), err)
		return
	}
	dec := r.m.decide(tn, now, j.cost, j.deadline, nil)
	if dec.kind == mCostTooLarge && r.m.known&DefectRetryCost != 0 {
		// Retry does not check the cost against the policy now: it
		// decides the job as any.
		dec = r.m.decideCost(tn, now, j.cost, j.deadline, nil, false)
	}
	if !r.checkAdmission(tn, dec, a, "retry of "+r.m.describe(j), now, j.deadline) || dec.kind != mAdmitted || !a.Admitted() {
		return // refused (or a refusal a known defect makes): the job stays failed
	}
	if a.Job.ID != j.id {
		r.failf("retry", "retry of %s answered job %s", r.m.describe(j), a.Job.ID)
		return
	}
	j.scheduled, j.notBefore = false, time.Time{} // sent again as an ordinary job
	if r.admitJob(tn, j, dec, a, "retry of "+r.m.describe(j), now, nil) {
		tn.persist()
	}
}

func (r *runner) hold(op Op, now time.Time) {
	tn := r.m.tenants[op.Tenant]
	if tn == nil {
		return
	}
	var st queue.TenantStatus
	var err error
	before := tn.pz
	if op.Kind == OpHold {
		st, err = r.store.Pause(r.ctx, tn.name)
		tn.pz = tn.pz.hold(now)
		tn.tat = laterOf(tn.tat, tn.pz.tenantTime(now).Add(tn.tau())) // jobs admitted while held go one interval apart after it
		tn.disturb()
	} else {
		st, err = r.store.Resume(r.ctx, tn.name)
		tn.pz = tn.pz.resume(now)
		tn.disturb() // jobs admitted while held were told: as if resumed then
	}
	if tn.pz != before {
		tn.persist()
	}
	if err != nil {
		r.failf("hold", "%v of %s: %v", op.Kind, tn.name, err)
		return
	}
	if st.Held != !tn.pz.held.IsZero() || st.Paused != tn.pz.paused(now) {
		r.failf("hold", "%v of %s answered held %v paused %v", op.Kind, tn.name, st.Held, st.Paused)
	}
}
