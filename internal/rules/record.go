package rules

import (
	"maps"
	"slices"
	"time"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/queue"
)

// Record is the durable state of a tenant, the same on every backend:
// its schedule (TAT, in tenant time, like every slot), its pause, the last
// attempt written, its counters and its windows' bookkeeping.
type Record struct {
	TAT           time.Time   `json:"tat"`
	Pause         leaky.Pause `json:"pause,omitzero"`
	LastAttemptAt time.Time   `json:"last_attempt_at"`
	// LastAttemptCost is the cost of that attempt's job (0 read as 1): the
	// next send comes that many intervals after it.
	LastAttemptCost int   `json:"last_attempt_cost,omitempty"`
	Accepted        int64 `json:"accepted"`
	Rejected        int64 `json:"rejected"`
	Delivered       int64 `json:"delivered"`
	Failed          int64 `json:"failed"`
	Cancelled       int64 `json:"cancelled"`
	Expired         int64 `json:"expired,omitempty"`
	// Windows is each window's bookkeeping (by the window as written): the
	// slots, in tenant time (unix ns), of its last N sends.
	Windows map[string][]int64 `json:"recent,omitempty"`
	// Sent is each window's sends made (by the window as written): the
	// times, in tenant time (unix ns), its last N attempts written count
	// at (CountMade), kept with their outcomes. Windows also holds the
	// sends still to come, which crowd these out of it once more than N
	// wait; a restart or a policy change that places the waiting jobs
	// anew counts from these (Respace, Repace; Made says when they are
	// known).
	Sent map[string][]int64 `json:"sent,omitempty"`
	// Booked is the retries sent later than their place in the schedule
	// (their backoff ends after it), soonest first, until the schedule
	// reaches them (Absorb).
	Booked []Booking `json:"booked,omitempty"`
	// Behind is, while the tenant's sends run late, the soonest the next
	// job admitted can go (real time; see RunLate); zero or past, its
	// schedule tells.
	Behind time.Time `json:"behind,omitzero"`
}

// Booking is a retry due at the end of its backoff, past the schedule's
// end when it failed: it keeps that slot (tenant time, unix ns), and the
// jobs admitted meanwhile are placed around it, not on it.
type Booking struct {
	Slot int64  `json:"slot"`
	Cost int    `json:"cost,omitempty"` // 0 read as 1
	Job  string `json:"job"`
}

func (b Booking) cost() int { return max(b.Cost, 1) }

// Absorb takes into the schedule the bookings a job of cost arriving at
// arrival (tenant time) would pass or crowd: each one due before the job's
// slot, or too soon after it for the rate (the job's own place and the
// booking would be closer than the schedule allows). The job is then placed
// after them. A booking ahead of the job's place stays out of the schedule,
// so that a long backoff does not fill the queue.
func (r *Record) Absorb(p leaky.Policy, arrival time.Time, cost int) {
	cost = max(cost, 1)
	tau := p.Tolerance()
	for len(r.Booked) > 0 {
		b := r.Booked[0]
		at := time.Unix(0, b.Slot)
		slot := clock.Later(arrival, r.TAT.Add(-tau))
		after := clock.Later(r.TAT, arrival).Add(time.Duration(cost) * p.Interval)
		if CountsWaiting(p) {
			slot = leaky.WindowSlot(r.Recent(p), p, slot, cost)
			after = clock.Later(after, slot.Add(time.Duration(cost)*p.Interval))
		}
		if slot.Before(at) && !at.Before(after.Add(-tau)) {
			return
		}
		r.TAT = clock.Later(r.TAT, at).Add(time.Duration(b.cost()) * p.Interval)
		r.Booked = r.Booked[1:] // a new slice header: a copy of r shares the array
	}
}

// Unbook drops job's booking, if it has one: it will not be sent there
// (cancelled, expired). The schedule keeps the place it counted for it.
func (r *Record) Unbook(job string) {
	if i := slices.IndexFunc(r.Booked, func(b Booking) bool { return b.Job == job }); i >= 0 {
		r.Booked = slices.Delete(slices.Clone(r.Booked), i, i+1)
	}
}

// IsBooked reports whether job has a booking.
func (r Record) IsBooked(job string) bool {
	return slices.ContainsFunc(r.Booked, func(b Booking) bool { return b.Job == job })
}

// Recent is the bookkeeping of p's windows (empty for a window new to it).
func (r Record) Recent(p leaky.Policy) []leaky.Recent { return recentIn(r.Windows, p) }

// recentIn is p's windows' lists in m (empty for a window m lacks).
func recentIn(m map[string][]int64, p leaky.Policy) []leaky.Recent {
	if len(p.Windows) == 0 {
		return nil
	}
	out := make([]leaky.Recent, len(p.Windows))
	for i, w := range p.Windows {
		for _, ns := range m[w.String()] {
			out[i] = append(out[i], time.Unix(0, ns))
		}
	}
	return out
}

// SetRecent stores the bookkeeping of p's windows. A window p no longer
// has keeps its sends: a reload that brings it back finds them there, as
// the jobs sent or waiting under it still count in it (Redis keeps each
// window's list apart, for as long as it counts). ForgetSpentWindows drops
// such a window once it counts nothing.
func (r *Record) SetRecent(p leaky.Policy, recent []leaky.Recent) {
	if len(p.Windows) == 0 && len(r.Windows) == 0 {
		return
	}
	r.Windows = maps.Clone(r.Windows) // a copy of r shares the map
	for i, w := range p.Windows {
		r.Windows = withRecent(r.Windows, w.String(), recent[i])
	}
}

// withRecent sets m[name] to the times of r, allocating m if need be.
func withRecent(m map[string][]int64, name string, r leaky.Recent) map[string][]int64 {
	if m == nil {
		m = map[string][]int64{}
	}
	ns := make([]int64, len(r))
	for k, t := range r {
		ns[k] = t.UnixNano()
	}
	m[name] = ns
	return m
}

// Made is the sends made in each of p's windows (Sent), and whether they
// are known: not for a window that counts sends to come (Windows) and no
// send made, as a store written by a build that did not record them has
// it. (Redis keeps no empty list, so neither does a record: a window with
// no send made yet waits for its first as if unknown.)
func (r Record) Made(p leaky.Policy) (made []leaky.Recent, known bool) {
	known = true
	for _, w := range p.Windows {
		if len(r.Windows[w.String()]) > 0 && len(r.Sent[w.String()]) == 0 {
			known = false
		}
	}
	return recentIn(r.Sent, p), known
}

// SetMade stores the sends made in p's windows (a store that keeps them
// apart from the record reads them in).
func (r *Record) SetMade(p leaky.Policy, made []leaky.Recent) {
	r.Sent = maps.Clone(r.Sent)
	for i, w := range p.Windows {
		r.Sent = withRecent(r.Sent, w.String(), made[i])
	}
}

// CountMade counts an attempt of cost written, at at (tenant time: the
// later of its slot and its write), in the sends made of p's windows.
func (r *Record) CountMade(p leaky.Policy, at time.Time, cost int) {
	if len(p.Windows) == 0 {
		return
	}
	made := recentIn(r.Sent, p)
	for i, w := range p.Windows {
		made[i] = made[i].Add(w, at, cost)
	}
	r.SetMade(p, made)
}

// ForgetSpentWindows drops the bookkeeping of each window p does not have
// whose sends all lie a window's length or more before tenant time tnow:
// no slot from tnow on is in the same window as any of them. Its sends made
// (Sent) go by the same rule.
func (r *Record) ForgetSpentWindows(p leaky.Policy, tnow time.Time) {
	r.Windows = forgetSpent(r.Windows, p, tnow)
	r.Sent = forgetSpent(r.Sent, p, tnow)
}

// forgetSpent is m without the windows ForgetSpentWindows drops (a copy
// if it drops any: a copy of a record shares its maps).
func forgetSpent(m map[string][]int64, p leaky.Policy, tnow time.Time) map[string][]int64 {
	shared := true
	for name, ns := range m {
		if slices.ContainsFunc(p.Windows, func(w leaky.Window) bool { return w.String() == name }) {
			continue
		}
		w, err := leaky.ParseWindow(name)
		if err == nil && len(ns) > 0 && tnow.Before(time.Unix(0, slices.Max(ns)).Add(w.Length)) {
			continue
		}
		if shared {
			m, shared = maps.Clone(m), false
		}
		delete(m, name)
	}
	if len(m) == 0 {
		return nil
	}
	return m
}

// CountSend counts a send of cost at slot in the tenant's windows.
func (r *Record) CountSend(p leaky.Policy, slot time.Time, cost int) {
	if len(p.Windows) == 0 {
		return
	}
	r.SetRecent(p, leaky.Record(r.Recent(p), p, slot, cost))
}

// Reserve takes a slot for another attempt of job (of cost), at or after
// tenant time from and no earlier than notBefore (a backoff), paced like any
// job and within every window; it does not refuse (the job was admitted).
// The attempt takes the schedule's next place, which counts it in the
// queue's bound; when its backoff ends after that place it is booked at
// the backoff's end instead, and the jobs admitted meanwhile are placed
// around it (Absorb), so that no two sends share a slot.
func (r *Record) Reserve(p leaky.Policy, from, notBefore time.Time, cost int, job string) time.Time {
	r.Absorb(p, from, cost)
	slot, st := leaky.ReserveCost(leaky.State{TAT: r.TAT}, from, p, cost)
	at := clock.Later(slot, notBefore)
	if len(p.Windows) > 0 {
		at = leaky.WindowSlot(r.Recent(p), p, at, cost)
	}
	if notBefore.After(slot) {
		at = r.clearOfBookings(p, at, cost)
		r.book(Booking{Slot: at.UnixNano(), Cost: cost, Job: job})
	}
	if len(p.Windows) > 0 {
		r.CountSend(p, at, cost)
		if !notBefore.After(slot) {
			st = leaky.Push(st, at, p, cost) // a window moved it: the rest follow
		}
	}
	r.TAT = st.TAT
	return at
}

// clearOfBookings is the first time at or after at when a send of cost is
// a whole cost apart from every booking, in every window.
func (r *Record) clearOfBookings(p leaky.Policy, at time.Time, cost int) time.Time {
	for range len(r.Booked) + 1 {
		moved := false
		for _, b := range r.Booked {
			bs := time.Unix(0, b.Slot)
			if at.Before(bs.Add(time.Duration(b.cost())*p.Interval)) && bs.Before(at.Add(time.Duration(cost)*p.Interval)) {
				at, moved = bs.Add(time.Duration(b.cost())*p.Interval), true
			}
		}
		if len(p.Windows) > 0 {
			ws := leaky.WindowSlot(r.Recent(p), p, at, cost)
			moved = moved || ws.After(at)
			at = ws
		}
		if !moved {
			break
		}
	}
	return at
}

// book adds b in slot order (after any of the same slot).
func (r *Record) book(b Booking) {
	if b.Cost <= 1 {
		b.Cost = 0
	}
	i := len(r.Booked)
	for i > 0 && r.Booked[i-1].Slot > b.Slot {
		i--
	}
	r.Booked = slices.Insert(slices.Clone(r.Booked), i, b)
}

// NextAfterLastAttempt is the soonest real time the next send may come
// after the last attempt recorded: its cost in intervals after it (zero if
// there was none).
func (r *Record) NextAfterLastAttempt(p leaky.Policy) time.Time {
	if r.LastAttemptAt.IsZero() {
		return time.Time{}
	}
	return r.LastAttemptAt.Add(time.Duration(max(r.LastAttemptCost, 1)) * p.Interval)
}

// FloorAfterLastAttempt raises the schedule so that the next send comes no
// sooner than NextAfterLastAttempt, even if the schedule says so (a retry
// sent long after its reserved slot, a late write), with no burst credit:
// the sends before may have used it. Only for an attempt made by started
// (when this process began; one at that instant is taken as the last
// process's): this process's gate spaces its own sends from their real
// writes, and a tenant it forgot while idle and loads again decides as if
// it had stayed (TestEvictionKeepsBurstCredit).
func (r *Record) FloorAfterLastAttempt(p leaky.Policy, started time.Time) {
	if r.LastAttemptAt.IsZero() || r.LastAttemptAt.After(started) {
		return
	}
	// In tenant time, with the burst's tolerance: the next conforming job
	// then goes at NextAfterLastAttempt.
	if floor := r.NextAfterLastAttempt(p).Add(p.Tolerance() - r.Pause.Shift); r.TAT.Before(floor) {
		r.TAT = floor
	}
}

// RealAt is when a job of slot goes under pause (clock.Never while held).
func RealAt(p leaky.Pause, slot time.Time) time.Time {
	if at, ok := p.Real(slot); ok {
		return at
	}
	return clock.Never
}

// DispatchAt is what to tell people of a job's dispatch time: for a held
// tenant, the time it would have if resumed now.
func DispatchAt(p leaky.Pause, slot, now time.Time) time.Time {
	if at, ok := p.Real(slot); ok {
		return at
	}
	at, _ := p.Resume(now).Real(slot)
	return at
}

// Quiet reports whether the tenant's schedule no longer matters at now: not
// paused, and run out, so that a quiet bucket would decide the same.
func (r Record) Quiet(now time.Time) bool {
	paused, _ := r.Pause.Paused(now)
	return !paused && leaky.Idle(leaky.State{TAT: r.TAT}, r.Pause.TenantTime(now))
}

// CountWrite moves a send of cost counted at slot in p's windows (tenant
// time) to when it was written, wrote (tenant time), if that is later:
// the windows then count real sends, across a restart or a takeover too.
func (r *Record) CountWrite(p leaky.Policy, slot, wrote time.Time, cost int) {
	if len(p.Windows) == 0 || !wrote.After(slot) {
		return
	}
	r.SetRecent(p, leaky.Written(r.Recent(p), p, slot, wrote, cost))
}

// LateEnough is how much later than its dispatch time a write may come and
// leave the promises of the jobs behind it as they are: lateness under it
// is the machine's jitter (invariant 1's), not a queue running late.
const LateEnough = 5 * time.Millisecond

// RunLate keeps in Behind how soon the jobs behind j can go when its
// attempt, written at sentAt, came more than LateEnough after its dispatch
// time (a slow connection, a stalled machine): the gate spaces each send
// from the write before it, so the lateness passes down the queue, and a
// job admitted behind it is promised that, not its slot. behind counts the
// tenant's jobs after j that wait or are being sent; each is taken at cost
// 1, so a queue of costlier jobs is promised no later than it goes. Behind
// only moves later: a queue catches up only when it runs dry, and then
// Behind is past.
func (r *Record) RunLate(p leaky.Policy, j queue.Job, sentAt time.Time, behind int) {
	if next := LateNext(p, j, sentAt); !next.IsZero() {
		r.Behind = clock.Later(r.Behind, next.Add(time.Duration(max(behind, 0))*p.Interval))
	}
}

// LateNext is, if j's attempt written at sentAt came more than LateEnough
// after its dispatch time, the soonest the job after it can go: the write
// plus j's cost in intervals (RunLate's start). Zero if it came in time.
func LateNext(p leaky.Policy, j queue.Job, sentAt time.Time) time.Time {
	if j.DispatchAt.IsZero() || !sentAt.After(j.DispatchAt.Add(LateEnough)) {
		return time.Time{}
	}
	return sentAt.Add(time.Duration(j.EffectiveCost()) * p.Interval)
}

// behindAt is when a job due at at (real time) goes, with Behind: later
// than at while the tenant's sends run late.
func (r Record) behindAt(at time.Time) time.Time { return clock.Later(at, r.Behind) }
