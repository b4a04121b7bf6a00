package queuetest

import (
	"fmt"
	"strings"
	"time"

	"github.com/throttler-dev/throttler/internal/queue"
)

// After every step: every tenant and every job as the model has them.

// stateString describes tn's schedule for a failure.
func (r *runner) stateString(tn *mtenant, now time.Time) string {
	s := fmt.Sprintf("tat T0+%v, tenant time T0+%v, %s", tn.tat.Sub(T0), tn.pz.tenantTime(now).Sub(T0), tn.pol)
	var w []string
	for _, j := range tn.waiting() {
		w = append(w, fmt.Sprintf("#%d@T0+%v", j.n, tn.pz.told(j.slot, now).Sub(T0)))
	}
	return s + ", waiting " + strings.Join(w, " ")
}

// storeState is the state the store should show for j.
func storeState(j *mjob) queue.JobState {
	switch j.state {
	case msWaiting:
		if j.scheduled {
			return queue.StateScheduled
		}
		if j.attempts == 0 {
			return queue.StateQueued
		}
		return queue.StateRetrying
	case msInFlight:
		return queue.StateDispatching
	case msSucceeded:
		return queue.StateSucceeded
	case msFailed:
		return queue.StateFailed
	case msCancelled:
		return queue.StateCancelled
	}
	return queue.StateExpired
}

// awaitExpiries gives the store a moment to expire the jobs the model has
// expired: it does when it next looks at them (its dispatcher's wake,
// late on a busy machine), before depths and states are compared. A job
// it does not expire within the moment is the checks' to report (this
// runs on a seed's goroutine: no t.Fatal here).
func (r *runner) awaitExpiries() {
	deadline := time.Now().Add(5 * time.Second)
	for _, j := range r.m.jobs {
		if j.state != msExpired {
			continue
		}
		for time.Now().Before(deadline) {
			sj, err := r.store.Job(r.ctx, j.id)
			if err != nil || !sj.State.Waiting() {
				break
			}
			time.Sleep(time.Millisecond)
		}
	}
}

// claimable counts tn's waiting jobs that the store may have claimed a
// lead ahead of their time (a store hands a job over modelLead early; the
// Redis store's claim then counts it in flight, not waiting, and whether
// its owner has claimed it yet when a depth is read is a race with real
// time). Depths are checked within it; the sum with in_flight exactly.
func (tn *mtenant) claimable(now time.Time) int { return claimableOf(tn.queued(), now) }

// claimableOf is claimable among jobs (waiting jobs of one tenant).
func claimableOf(jobs []*mjob, now time.Time) int {
	n := 0
	for _, j := range jobs {
		tn := j.tn
		if due, ok := tn.pz.real(j.slot); ok && !due.After(now.Add(modelLead)) {
			n++
		}
	}
	return n
}

// checkAll compares every tenant and every job with the model.
func (r *runner) checkAll() {
	now := r.clk.Now()
	for _, j := range r.m.jobs {
		if j.lateExpiry && j.state == msWaiting {
			if sj, err := r.store.Job(r.ctx, j.id); err == nil && sj.State == queue.StateExpired {
				j.state = msExpired
			}
		}
	}
	r.awaitExpiries()
	for _, name := range r.m.order {
		tn := r.m.tenants[name]
		st, err := r.store.Tenant(r.ctx, name)
		if err != nil {
			r.failf("tenant", "Tenant(%s): %v", name, err)
			return
		}
		depth, inflight := len(tn.queued()), tn.count(msInFlight)
		sched := tn.scheduledJobs()
		tt := tn.pz.tenantTime(now)
		tat, _ := tn.absorbed(tt, 1, r.m.known) // as a job admitted now would be placed
		s0 := laterOf(tt, tat.Add(-tn.tau()))
		delay := tn.pz.told(s0, now).Sub(now)
		if len(tn.wins) > 0 {
			delay = tn.pz.told(tn.earliestWindow(s0, 1), now).Sub(now)
		}
		var until time.Time
		if tn.pz.held.IsZero() && now.Before(tn.pz.until) {
			until = tn.pz.until
		}
		ahead := tn.claimable(now)
		switch {
		case st.QueueDepth > depth || st.QueueDepth < depth-ahead:
			r.failf("depth", "tenant %s: queue_depth %d, want %d (%d of them claimable ahead); its jobs (model, store): %s", name, st.QueueDepth, depth, ahead, r.jobStates(tn))
		case st.Scheduled > len(sched) || st.Scheduled < len(sched)-claimableOf(sched, now):
			r.failf("scheduled", "tenant %s: scheduled %d, want %d (%d of them claimable ahead); its jobs (model, store): %s", name, st.Scheduled, len(sched), claimableOf(sched, now), r.jobStates(tn))
		case st.InFlight+st.QueueDepth+st.Scheduled != inflight+depth+len(sched):
			r.failf("in flight", "tenant %s: in_flight %d, queue_depth %d and scheduled %d, want %d, %d and %d (a job claimed ahead may count in either)", name, st.InFlight, st.QueueDepth, st.Scheduled, inflight, depth, len(sched))
		case len(tn.wins) == 0 && !tn.capped && st.ExpectedDelay != delay, (len(tn.wins) > 0 || tn.capped) && st.ExpectedDelay < delay:
			r.failf("expected delay", "tenant %s: expected_delay %v, want %v", name, st.ExpectedDelay, delay)
		case st.Held != !tn.pz.held.IsZero() || st.Paused != tn.pz.paused(now) || !st.PausedUntil.Equal(until):
			r.failf("pause", "tenant %s: paused %v held %v until %v, want %v %v %v", name, st.Paused, st.Held, st.PausedUntil, tn.pz.paused(now), !tn.pz.held.IsZero(), until)
		}
		if r.fail != nil {
			return
		}
		if r.d.TAT != nil {
			if got, err := r.d.TAT(r.store, name); err == nil && !got.Equal(tn.tat) {
				r.failf("schedule", "tenant %s: the store's schedule (tat) is T0+%v, the model's T0+%v", name, got.Sub(T0), tn.tat.Sub(T0))
				return
			}
		}
	}
	for _, j := range r.m.jobs {
		want := storeState(j)
		sj, err := r.store.Job(r.ctx, j.id)
		if err == nil && sj.State == queue.StateDispatching && sj.State != want && j.state == msWaiting {
			// Claimed a lead ahead of its dispatch time (which the gate
			// may have moved past its slot: mjob.latest), not written yet.
			if due, ok := j.tn.pz.real(j.slot); ok && !sj.DispatchAt.Before(due) && !sj.DispatchAt.After(now.Add(modelLead)) {
				continue
			}
		}
		switch {
		case err != nil:
			r.failf("lost", "%s: %v", r.m.describe(j), err)
		case sj.State != want:
			r.failf("job state", "%s is %s, want %s", r.m.describe(j), sj.State, want)
		case j.state == msWaiting && !j.staleDispatch && !sj.DispatchAt.Equal(j.tn.pz.told(j.slot, now)):
			r.failf("dispatch at", "%s dispatch_at T0+%v, want T0+%v", r.m.describe(j), sj.DispatchAt.Sub(T0), j.tn.pz.told(j.slot, now).Sub(T0))
		case j.state == msWaiting && sj.Attempts != j.attempts:
			r.failf("attempts", "%s has %d attempts, want %d", r.m.describe(j), sj.Attempts, j.attempts)
		}
		if r.fail != nil {
			return
		}
	}
}

// drain lets every job finish: a healthy downstream, every hold resumed,
// time enough; then nothing may still wait.
func (r *runner) drain() {
	r.mu.Lock()
	r.answer = Answer{Kind: AnswerOK}
	r.mu.Unlock()
	for _, name := range r.m.order {
		if !r.m.tenants[name].pz.held.IsZero() {
			r.hold(Op{Kind: OpResume, Tenant: name}, r.clk.Now())
		}
	}
	r.settleAndProcess()
	for i := 0; i < 100 && r.fail == nil; i++ {
		busy := false
		for _, j := range r.m.jobs {
			busy = busy || j.state == msWaiting || j.state == msInFlight
		}
		if !busy {
			break
		}
		r.advance(r.clk.Now().Add(5 * time.Second))
	}
	if r.fail != nil {
		return
	}
	r.checkAll()
	for _, j := range r.m.jobs {
		if r.fail == nil && (j.state == msWaiting || j.state == msInFlight) {
			r.failf("lost", "%s still %s after the drain", r.m.describe(j), j.state)
		}
	}
}

func admissionString(a queue.Admission) string {
	switch {
	case a.Impossible != nil:
		return fmt.Sprintf("422 %s (delay %v, max cost %d)", a.Impossible.Reason, a.Impossible.ExpectedDelay, a.Impossible.MaxCost)
	case a.Rejected != nil:
		return fmt.Sprintf("429 %s retry after %v (depth %d)", a.Rejected.Reason, a.Rejected.RetryAfter, a.Rejected.QueueDepth)
	case a.Duplicate:
		return fmt.Sprintf("200 duplicate of %s (delay %v, depth %d)", shortID(a.Job.ID), a.ExpectedDelay, a.QueueDepth)
	}
	return fmt.Sprintf("202 %s delay %v depth %d", shortID(a.Job.ID), a.ExpectedDelay, a.QueueDepth)
}

func relTimes(ts []time.Time) string {
	var s []string
	for _, t := range ts {
		s = append(s, t.Sub(T0).String())
	}
	return "[" + strings.Join(s, " ") + "]"
}

func lastN[T any](s []T, n int) []T {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// jobStates lists tn's jobs as the model and the store have them: what a
// failed count is made of.
func (r *runner) jobStates(tn *mtenant) string {
	var out []string
	for _, j := range tn.jobs {
		sj, err := r.store.Job(r.ctx, j.id)
		store := string(sj.State)
		if err != nil {
			store = err.Error()
		}
		desc := fmt.Sprintf("#%d %v/%s", j.n, j.state, store)
		if j.state == msWaiting || sj.State.Waiting() || sj.State == queue.StateDispatching {
			// Where each has it: the model's slot (tenant time), the
			// store's slot and dispatch time.
			desc += fmt.Sprintf(" (slot T0+%v; store slot T0+%v, dispatch_at T0+%v)", j.slot.Sub(T0), sj.Slot.Sub(T0), sj.DispatchAt.Sub(T0))
		}
		out = append(out, desc)
	}
	return strings.Join(out, ", ")
}
