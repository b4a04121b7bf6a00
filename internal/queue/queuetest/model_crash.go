package queuetest

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/queue"
)

// kill -9 and the restart after it.

// crash kills the process now and restarts it down later.
func (r *runner) crash(down time.Duration) {
	x := r.halt()
	restart, err := r.d.Crash(r.t, r.store)
	if err != nil {
		r.failf("crash", "%v", err)
		return
	}
	r.stop()
	r.store.Close()
	r.endProcess(false)
	r.startNext(restart, x, down)
}

// stale stops the process (SIGSTOP) past its lease: a new one starts and
// takes its data over down later, and then the stopped one wakes
// (SIGCONT) and goes on from where it was, against data it no longer
// owns: the commands it had under way reach Redis now, and its handlers
// waiting for a job's time go on. Every write of its must be refused (the
// fence) and its handlers must not write (queue.MaySend); then it is
// stopped. For the model it is a crash: what the stopped process was
// doing is lost, and a job it may have written may go again (with its
// key). A driver without Freeze has no other process to take over: it is
// a crash there.
func (r *runner) stale(down time.Duration) {
	if r.d.Freeze == nil {
		r.crash(down)
		return
	}
	x := r.halt()
	restart, thaw, err := r.d.Freeze(r.t, r.store)
	if err != nil {
		r.failf("freeze", "%v", err)
		return
	}
	old, stopOld := r.store, r.stop
	waiting := r.endProcess(true)
	started := r.startNext(restart, x, down)
	if started {
		// It wakes while the new process works: first its handlers that
		// were waiting for a job's time (the dispatcher's wait may end
		// before the process sees its tenure gone), each asking whether
		// it may still write; then everything else.
		r.wakeStale(waiting)
	}
	thaw()
	stopOld()
	old.Close()
	r.mu.Lock()
	sends := r.staleSends
	r.staleSends = nil
	r.mu.Unlock()
	if len(sends) > 0 {
		r.failf("stale send", "a process stopped past its lease woke and its store let it write %s: the partition is another worker's", strings.Join(sends, ", "))
	}
}

// halt marks the process as going (no handler of its writes from now on)
// and returns the moment.
func (r *runner) halt() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.crashing, r.crashArmed = true, false
	r.cond.Broadcast()
	return r.clk.Now()
}

// endProcess begins the next process: what the ended one had under way is
// forgotten (the model's crash). frozen keeps the ended one's handlers
// waiting for the clock, returned, to go on when it wakes.
func (r *runner) endProcess(frozen bool) (waiting []*parking) {
	r.mu.Lock()
	if frozen {
		if r.frozen == nil {
			r.frozen = map[int]bool{}
		}
		r.frozen[r.gen] = true
		for _, p := range r.parked {
			if p.gen == r.gen {
				waiting = append(waiting, p)
			}
		}
	}
	r.gen++
	r.crashing, r.crashReq, r.inHandler = false, false, 0
	r.pending, r.parked, r.events, r.answering = map[string]bool{}, nil, nil, map[string]bool{}
	r.mu.Unlock()
	r.m.crash(r.d.Durable)
	return waiting
}

// startNext starts the next process down after x, checks what it made of
// the data and lets it consume.
func (r *runner) startNext(restart func(testing.TB, Config) (queue.Store, error), x time.Time, down time.Duration) bool {
	if down > 0 {
		r.clk.Set(x.Add(down))
	}
	at := r.clk.Now()
	s, err := restart(r.t, r.cfg)
	if err != nil {
		r.failf("restart", "%v", err)
		r.store = nil
		return false
	}
	r.store = s
	r.recover(at)
	r.startConsume()
	return true
}

// wakeStale lets a woken process's handlers that were waiting for a job's
// time go on, and waits until each has asked whether it may write
// (checkStaleSend); those waiting for an answer go on too.
func (r *runner) wakeStale(waiting []*parking) {
	r.mu.Lock()
	want := r.staleAsked
	r.mu.Unlock()
	for _, p := range waiting {
		if p.answer == "" {
			want++
		}
		close(p.ch)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		r.mu.Lock()
		asked := r.staleAsked
		r.mu.Unlock()
		if asked >= want {
			return
		}
		if time.Now().After(deadline) {
			r.failf("stale send", "the woken process's handlers waiting for a job's time did not go on within 10s (%d of %d asked whether they may write)", asked, want)
			return
		}
	}
}

// recover checks what the restarted store made of each waiting job and
// takes its times: a job keeps its slot unless that is too soon; then it
// goes at or after the restart, and no sooner than one interval after the
// last write of its tenant (recorded, or written and lost in the crash).
func (r *runner) recover(at time.Time) {
	for _, name := range r.m.order {
		if r.recoverTenant(r.m.tenants[name], at); r.fail != nil {
			return
		}
	}
}

// recoverTenant is recover for one tenant.
func (r *runner) recoverTenant(tn *mtenant, at time.Time) {
	if r.m.known&DefectRestartCost != 0 && len(tn.writes) > 0 {
		// Found by the model: a restart spaces the next
		// send one interval after the last one, whatever its cost.
		last := tn.writes[len(tn.writes)-1]
		tn.rateTAT = earliest(tn.rateTAT, laterOf(last.Add(tn.lastWriteT), tn.rateTAT1))
	}
	if r.d.SentBy != nil {
		tn.countUnrecorded(at, r.d.SentBy(r.store, at))
	}
	held := !tn.pz.held.IsZero()
	respaced := len(tn.waiting()) > 0 && !held // a held tenant is left as it is, unless its jobs move
	var overdue []*mjob                        // left at their passed slots (DefectRestartOverdue)
	for _, j := range tn.waiting() {
		sj, waits := r.restartedJob(j, at)
		switch {
		case r.fail != nil:
			return
		case !waits:
		case held:
			respaced = r.recoverHeldJob(tn, j, sj) || respaced
		case r.recoverJob(tn, j, sj, at):
			overdue = append(overdue, j)
		}
		if r.fail != nil {
			return
		}
	}
	r.respaceOverdue(tn, overdue, at)
	if respaced && !held && r.d.Windows != nil {
		r.takeRestartWindows(tn)
	}
	r.takeRestartTAT(tn, respaced, at)
}

// takeRestartWindows takes the store's windows after a restart placed a
// tenant's jobs anew. What they count is the store's to choose, as its
// schedule is (takeRestartTAT): one that knows its sends made counts the
// slots the jobs had before no more, as no send will come at them. Too
// little counted shows at the downstream, where every write is checked
// against every window.
func (r *runner) takeRestartWindows(tn *mtenant) {
	for _, w := range tn.wins {
		got, err := r.d.Windows(r.store, tn.name, leaky.Window{N: w.spec.N, Length: w.spec.Length})
		if err != nil {
			r.failf("tenant", "Windows(%s): %v", tn.name, err)
			return
		}
		w.entries = w.entries[:0:0]
		for _, at := range got {
			w.entries = append(w.entries, mentry{at: at, weight: 1})
		}
	}
}

// restartBound is the soonest j may go after a restart: no sooner than the
// writes so far allow (lost in the crash or not, with the burst of the
// policy the job was given its slot under or of the one now), and one
// interval after the last recorded one.
func (tn *mtenant) restartBound(j *mjob) time.Time {
	var bound time.Time
	if len(tn.writes) > 0 {
		bound = tn.rateTAT.Add(-max(tn.tau(), j.tag.tau))
	}
	if !tn.lastRecorded.IsZero() {
		bound = laterOf(bound, tn.lastRecorded.Add(min(tn.pol.Interval, j.tag.T)))
	}
	return bound
}

// restartedJob reads j from the restarted store; waits is false for a job
// expired meanwhile (taken as such) or one not waiting (a failure).
func (r *runner) restartedJob(j *mjob, at time.Time) (sj queue.Job, waits bool) {
	sj, err := r.store.Job(r.ctx, j.id)
	if err != nil {
		r.failf("lost", "%s after a restart: %v", r.m.describe(j), err)
		return sj, false
	}
	if sj.State == queue.StateExpired && !j.deadline.IsZero() && j.deadline.Before(at) {
		j.state = msExpired // past its deadline: expired before the crash, or at the restart
		return sj, false
	}
	if !sj.State.Waiting() {
		r.failf("lost", "%s is %s after a restart, want waiting", r.m.describe(j), sj.State)
		return sj, false
	}
	return sj, true
}

// recoverHeldJob checks a held tenant's job after a restart, and reports
// whether the restart moved it. Its clock stands still: a job may move
// only later in the tenant's time (one that may have been written before
// the crash must, so that it does not go again the moment the operator
// resumes: checked when it is written).
func (r *runner) recoverHeldJob(tn *mtenant, j *mjob, sj queue.Job) bool {
	if j.possiblySent && r.m.known&DefectHeldRestart != 0 {
		j.heldResend = true
	}
	if sj.Slot.Before(j.slot) {
		r.failf("restart", "%s of a held tenant moved earlier by a restart: slot %v, was %v", r.m.describe(j), sj.Slot.Sub(T0), j.slot.Sub(T0))
		return false
	}
	if sj.Slot.After(j.slot) {
		r.takeRestartSlot(tn, j, sj.Slot)
		return true
	}
	return false
}

// recoverJob checks a job's time after a restart and takes it; overdue
// reports one left at a passed slot, which DefectRestartOverdue tolerates
// (respaceOverdue places it).
func (r *runner) recoverJob(tn *mtenant, j *mjob, sj queue.Job, at time.Time) (overdue bool) {
	old, _ := tn.pz.real(j.slot)
	bound := tn.restartBound(j)
	if (sj.DispatchAt.Before(at) || !bound.IsZero() && sj.DispatchAt.Before(bound)) && r.m.known&DefectRestartOverdue != 0 {
		return true
	}
	switch {
	case sj.DispatchAt.Before(at):
		r.failf("restart", "%s due at T0+%v after a restart at T0+%v", r.m.describe(j), sj.DispatchAt.Sub(T0), at.Sub(T0))
	case !bound.IsZero() && sj.DispatchAt.Before(bound):
		r.failf("restart spacing", "%s due at T0+%v after a restart at T0+%v, sooner than its tenant's writes so far allow (T0+%v; T %v; writes %v)", r.m.describe(j), sj.DispatchAt.Sub(T0), at.Sub(T0), bound.Sub(T0), tn.pol.Interval, relTimes(lastN(tn.writes, 4)))
	case !j.possiblySent && sj.DispatchAt.Before(old):
		r.failf("restart", "%s moved earlier by a restart: T0+%v, was T0+%v", r.m.describe(j), sj.DispatchAt.Sub(T0), old.Sub(T0))
	}
	if r.fail == nil && !sj.Slot.Equal(j.slot) {
		r.takeRestartSlot(tn, j, sj.Slot)
	}
	return false
}

// respaceOverdue places the jobs a restart left at passed slots
// (DefectRestartOverdue) as the embedded store does: from the restart, no
// sooner than the tenant's writes allow, a cost apart.
func (r *runner) respaceOverdue(tn *mtenant, overdue []*mjob, at time.Time) {
	if len(overdue) == 0 {
		return
	}
	slot := tn.pz.tenantTime(laterOf(at, tn.restartBound(overdue[0])))
	for _, j := range overdue {
		r.takeRestartSlot(tn, j, slot)
		j.staleDispatch = true
		slot = slot.Add(time.Duration(j.cost) * tn.pol.Interval)
	}
}

// takeRestartTAT checks the tenant's schedule after a restart at at and
// takes it; respaced says whether the restart wrote it back.
func (r *runner) takeRestartTAT(tn *mtenant, respaced bool, at time.Time) {
	// The next send no sooner than one interval after the last one
	// recorded, whatever the schedule says.
	if !tn.lastRecorded.IsZero() {
		tn.tat = laterOf(tn.tat, tn.lastRecorded.Add(tn.pol.Interval+tn.tau()-tn.pz.shift))
	}
	// What the restart chose beyond that is the store's to choose.
	if got, ok := r.storeTAT(tn); ok {
		// A schedule behind the restart's moment admits as one at it
		// (the next slot is max(now, tat - tolerance)): only a part
		// ahead of it can give burst credit.
		tnow := tn.pz.tenantTime(at)
		if laterOf(got, tnow).Before(laterOf(tn.tat, tnow)) {
			r.failf("restart", "tenant %s: after a restart its schedule is at T0+%v (tenant time), sooner than its jobs and last send allow (T0+%v)", tn.name, got.Sub(T0), tn.tat.Sub(T0))
			return
		}
		tn.tat = got
	}
	// Written back only for a tenant with jobs to re-space; for the
	// others the floor holds in memory and is found again at the next
	// start.
	if respaced {
		tn.persist()
	}
}

// takeRestartSlot takes the slot a restart gave j.
func (r *runner) takeRestartSlot(tn *mtenant, j *mjob, slot time.Time) {
	tag := tn.tagNow()
	tag.T, tag.tau = min(tag.T, j.tag.T), max(tag.tau, j.tag.tau)
	j.slot, j.tag = slot, tag
	tn.unbook(j) // a booked retry moved: it is in the schedule now
	tn.recordWindows(slot, j.cost)
	tn.tat = laterOf(tn.tat, slot.Add(time.Duration(j.cost)*tn.pol.Interval))
}

// storeTAT is the store's schedule of tn, if it can be known.
func (r *runner) storeTAT(tn *mtenant) (time.Time, bool) {
	if r.d.TAT != nil {
		at, err := r.d.TAT(r.store, tn.name)
		if err != nil {
			r.failf("tenant", "TAT(%s): %v", tn.name, err)
			return time.Time{}, false
		}
		return at, true
	}
	if len(tn.wins) > 0 {
		return time.Time{}, false
	}
	// expected_delay says where the schedule's next slot is, once it is
	// past now.
	st, err := r.store.Tenant(r.ctx, tn.name)
	if err != nil || st.ExpectedDelay <= 0 || !tn.pz.held.IsZero() {
		return time.Time{}, false
	}
	now := r.clk.Now()
	return tn.pz.tenantTime(now).Add(st.ExpectedDelay).Add(tn.tau()), true
}

// crash is what a kill -9 at at leaves: every attempt in flight is
// forgotten (its job waits at its slot as committed, and may be sent
// again), and what was held only in memory is gone.
func (m *model) crash(durable bool) {
	for _, name := range m.order {
		tn := m.tenants[name]
		if durable {
			tn.persist()
		}
		tn.tat, tn.booked = tn.persistedTAT, tn.persistedBooked
		for _, j := range tn.jobs {
			if j.state == msInFlight {
				j.state = msWaiting
				j.possiblySent = true
				j.answerAt = time.Time{}
				// Its first attempt, unrecorded, is not counted: one booked
				// for its not_before is that again.
				j.scheduled = !j.notBefore.IsZero() && j.attempts == 0
			}
			if j.state == msWaiting {
				j.disturbed = true
			}
		}
	}
}

func (m *model) describe(j *mjob) string {
	return fmt.Sprintf("job #%d (%s of %s, cost %d)", j.n, shortID(j.id), j.tn.name, j.cost)
}

func shortID(id string) string {
	if len(id) > 8 {
		return id[len(id)-8:]
	}
	return id
}

// countUnrecorded counts in tn's windows, at by, each waiting job that a
// restart at at finds due by then, as the store does (rules.RestartPickup):
// in slot order, up to the first not due at at. A window counts it only
// if it still holds its slot among its newest N (the store keeps no more).
func (tn *mtenant) countUnrecorded(at, by time.Time) {
	jobs := tn.waiting()
	slices.SortFunc(jobs, func(a, b *mjob) int { return cmp.Or(a.slot.Compare(b.slot), cmp.Compare(a.id, b.id)) })
	due := func(j *mjob, t time.Time) bool {
		if !tn.pz.held.IsZero() {
			return !j.slot.After(tn.pz.tenantTime(t))
		}
		real, _ := tn.pz.real(j.slot)
		return !real.After(t)
	}
	to := tn.pz.tenantTime(by)
	for _, j := range jobs {
		if !due(j, at) {
			break
		}
		if due(j, by) && to.After(j.slot) {
			for _, w := range tn.wins {
				w.move(j.slot, to, j.cost)
			}
		}
	}
}

// move counts up to cost sends of w at slot at to instead, if w's newest N
// sends hold them.
func (w *mwin) move(slot, to time.Time, cost int) {
	var newest []time.Time
	for _, e := range w.entries {
		for range e.weight {
			newest = append(newest, e.at)
		}
	}
	slices.SortFunc(newest, func(a, b time.Time) int { return a.Compare(b) })
	if len(newest) > w.spec.N {
		newest = newest[len(newest)-w.spec.N:]
	}
	n := 0
	for _, t := range newest {
		if t.Equal(slot) {
			n++
		}
	}
	n = min(n, cost)
	for i := 0; i < len(w.entries) && n > 0; i++ {
		e := &w.entries[i]
		if !e.at.Equal(slot) {
			continue
		}
		k := min(e.weight, n)
		e.weight -= k
		n -= k
		w.entries = append(w.entries, mentry{at: to, weight: k})
	}
	w.entries = slices.DeleteFunc(w.entries, func(e mentry) bool { return e.weight == 0 })
}
