package rules

import (
	"slices"
	"time"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/leaky"
)

// Placed is a waiting job as a restart or a takeover finds it: its slot
// (tenant time), cost and id, and whether Respace moved it.
type Placed struct {
	Slot  time.Time
	Cost  int // 0 read as 1
	ID    string
	Moved bool
	// NotBefore (real time) is the not_before of a job admitted into the
	// queue (its place came after it then); zero: none. Repace keeps it.
	NotBefore time.Time
	// Scheduled: booked for its not_before (queue.StateScheduled). Repace
	// keeps its slot and places the others around it.
	Scheduled bool
}

func (w Placed) cost() int { return max(w.Cost, 1) }

// Pickup is how a tenant's waiting jobs come to a process that did not
// send them: the embedded store's restart (RestartPickup) or a Redis
// partition's new owner (takeover.lua). The rule is the same; what the
// process can know of the sends before it differs.
type Pickup struct {
	// Now is when the new process looks.
	Now time.Time
	// Next is the soonest real time the next send may go by what the last
	// process recorded besides the record's last attempt (Redis: a claim's
	// next); zero for none.
	Next time.Time
	// Lost is the largest cost of a send that may have been written, at any
	// moment up to Now, without its outcome being recorded (0: none): the
	// next send comes that many intervals after Now.
	Lost int
	// Credit is whether the moved jobs keep the burst's credit: only when
	// no send can have gone unrecorded. A new Redis owner cannot tell a
	// clean handover from an owner frozen mid-send, so it gives none.
	Credit bool
	// Unrecorded are sends that may have been written without their
	// outcome being recorded, each at its slot and cost: the windows
	// count each at SentBy (zero: Now), the latest moment it could have
	// been written. A Redis owner's takeover, past the old owner's lease,
	// knows them (its jobs being sent); the embedded store's restart takes
	// every job due by the end of the last process's lease on sending.
	Unrecorded []Placed
	SentBy     time.Time
}

// NextSend is the soonest real time the tenant's next send may go after the
// handover, by what was recorded (zero: nothing was).
func (h Pickup) NextSend(rec Record, p leaky.Policy) time.Time {
	return clock.Later(h.Next, rec.NextAfterLastAttempt(p))
}

// RestartPickup is the embedded store's restart at now: its claims are
// not written, so after an unclean stop any job whose time passed may have
// been written at that time (or later: a slow connection, a held gate),
// up to sentBy, the end of the last process's lease on sending (no later
// than now). For a held tenant, whose clock stands still, a job is due if
// its slot is not past the frozen tenant time.
func RestartPickup(rec Record, jobs []Placed, now, sentBy time.Time, clean bool) Pickup {
	h := Pickup{Now: now, Credit: true}
	if clean || len(jobs) == 0 {
		return h
	}
	pz := rec.Pause
	due := func(w Placed, by time.Time) bool {
		if !pz.Held.IsZero() {
			return !w.Slot.After(pz.TenantTime(by))
		}
		at, _ := pz.Real(w.Slot)
		return !at.After(by)
	}
	h.SentBy = sentBy
	for _, w := range jobs {
		if !due(w, now) {
			break
		}
		h.Lost = max(h.Lost, w.cost())
		if due(w, sentBy) {
			h.Unrecorded = append(h.Unrecorded, w)
		}
	}
	h.Credit = h.Lost == 0
	return h
}

// Respace moves a tenant's waiting jobs (in slot order, then id) that the
// handover makes too soon: from the later of Now, the next send by what
// was recorded, and a lost send's cost after Now; one job's cost apart, in
// their order, within the windows. The sends that may have gone
// unrecorded count in the windows as made. Where the windows know the
// sends made, the jobs are placed anew from them (placeAnew); else the
// old slots stay in the windows' bookkeeping, as if sent, and the jobs
// move past them (moveFrom). A pause that ends after that
// floor moves nothing. A held tenant's clock stands still: only a lost
// send moves its jobs, past the frozen tenant time (respaceHeld). Then the
// schedule runs past the last job waiting (jobs placed at a vacant
// partition's start, or spaced at a faster rate before a reload), and no
// sooner than the next send with no burst credit. It returns how many jobs
// moved.
func Respace(rec *Record, jobs []Placed, p leaky.Policy, h Pickup) int {
	next := h.NextSend(*rec, p)
	// The jobs are placed anew from the next send: the lateness of the
	// sends before (RunLate) is spent.
	rec.Behind = time.Time{}
	moved := 0
	if len(jobs) > 0 {
		by := h.Now
		if !h.SentBy.IsZero() {
			by = h.SentBy
		}
		for _, u := range h.Unrecorded {
			rec.CountWrite(p, u.Slot, rec.Pause.TenantTime(by), u.cost())
			// Made, for all anyone knows: a later restart counts it too.
			rec.CountMade(p, rec.Pause.TenantTime(by), u.cost())
		}
		if rec.Pause.Held.IsZero() {
			moved = respaceRunning(rec, jobs, p, h, next)
		} else {
			moved = respaceHeld(rec, jobs, p, h)
		}
		rec.runPastLast(jobs, p)
	}
	// The last process's sends may have used the burst just before next.
	if !next.IsZero() {
		if floor := next.Add(p.Tolerance() - rec.Pause.Shift); floor.After(rec.Pause.TenantTime(h.Now)) {
			rec.TAT = clock.Later(rec.TAT, floor)
		}
	}
	return moved
}

// respaceRunning is Respace for a tenant not held.
func respaceRunning(rec *Record, jobs []Placed, p leaky.Policy, h Pickup, next time.Time) int {
	pz := rec.Pause
	floor := clock.Later(h.Now, next)
	if h.Lost > 0 {
		floor = clock.Later(floor, h.Now.Add(time.Duration(h.Lost)*p.Interval))
	}
	if !pz.Until.Before(floor) {
		return 0 // every job goes at the pause's end or later
	}
	// Real(slot) is slot + Shift from here on: the pause ends before floor.
	if made, ok := rec.Made(p); ok && len(p.Windows) > 0 {
		return placeAnew(rec, jobs, p, floor.Add(-pz.Shift), made, h.Credit)
	}
	return moveFrom(rec, jobs, p, floor.Add(-pz.Shift), h.Credit)
}

// placeAnew is moveFrom for a tenant whose windows know the sends made
// (made: Record.Made, the sends that may have gone unrecorded in it). The
// windows' lists hold the sends to come too, and once more than N wait
// only those: the jobs placed from them would wait a window past the
// backlog's end. Here every job but those booked from from on is placed
// again, in order, from the sends made: at its slot if that still fits,
// else at the first place from from that the rate, the windows and the
// bookings allow; so the backlog behind an outage moves only as far as
// the outage and the windows ask, and catches up where they let it. The
// bookings keep their slots; a job is placed around them, counting them
// in a window only where they share one (leaky.EarliestAmong). The lists
// then hold the sends made, the jobs as placed and the bookings, as
// admissions would have left them.
func placeAnew(rec *Record, jobs []Placed, p leaky.Policy, from time.Time, made []leaky.Recent, credit bool) int {
	var ahead []Booking
	kept := map[string]bool{}
	for _, b := range rec.Booked {
		if !time.Unix(0, b.Slot).Before(from) {
			ahead = append(ahead, b)
			kept[b.Job] = true
		}
	}
	recent := made // recentIn's: this call's own
	moved := 0
	for i := range jobs {
		w := &jobs[i]
		if kept[w.ID] {
			continue
		}
		at := clock.Later(w.Slot, from)
		if len(ahead) == 0 && !after(recent, at) {
			// Every send counted is at or before at (the sends made by now,
			// the jobs placed before it): the newest N tell, as at an
			// admission.
			at = leaky.WindowSlot(recent, p, at, w.cost())
		} else {
			at = placeAround(p, recent, ahead, at, w.cost())
		}
		from = at.Add(time.Duration(w.cost()) * p.Interval)
		for k, win := range p.Windows {
			if n := len(recent[k]); n > 0 && recent[k][n-1].After(at) {
				recent[k] = recent[k].Add(win, at, w.cost()) // a send made after it (a clock ahead)
			} else {
				recent[k] = appendNewest(recent[k], win, at, w.cost())
			}
		}
		rec.Unbook(w.ID) // an overdue booking: in the schedule now
		if at.Equal(w.Slot) {
			continue
		}
		w.Slot, w.Moved = at, true
		next := from
		if !credit {
			next = next.Add(p.Tolerance()) // the sends before may have used it
		}
		rec.TAT = clock.Later(rec.TAT, next)
		moved++
	}
	for _, b := range ahead {
		recent = leaky.Record(recent, p, time.Unix(0, b.Slot), b.cost())
	}
	rec.SetRecent(p, recent)
	return moved
}

// after reports whether any list of recent (each in order) holds a send
// after at.
func after(recent []leaky.Recent, at time.Time) bool {
	return slices.ContainsFunc(recent, func(r leaky.Recent) bool { return len(r) > 0 && r[len(r)-1].After(at) })
}

// appendNewest is r with cost sends at at, no earlier than r's last,
// added, and only its newest N kept: in place, in O(cost) amortised
// (append copies the newest N when it outgrows its array), where
// Recent.Add inserts and trims by copying, O(N) each.
func appendNewest(r leaky.Recent, w leaky.Window, at time.Time, cost int) leaky.Recent {
	for range cost {
		r = append(r, at)
	}
	return r[max(len(r)-w.N, 0):]
}

// placeAround is the first time at or after at when a send of cost is a
// whole cost apart from every booking of ahead and fits in every window of
// p, counting the sends of recent (before at) and the bookings.
func placeAround(p leaky.Policy, recent []leaky.Recent, ahead []Booking, at time.Time, cost int) time.Time {
	sends := make([][]time.Time, len(p.Windows))
	for i := range p.Windows {
		sends[i] = slices.Clone(recent[i])
		for _, b := range ahead {
			for range b.cost() {
				sends[i] = append(sends[i], time.Unix(0, b.Slot))
			}
		}
		slices.SortFunc(sends[i], time.Time.Compare)
	}
	for {
		moved := false
		for _, b := range ahead {
			bs := time.Unix(0, b.Slot)
			if at.Before(bs.Add(time.Duration(b.cost())*p.Interval)) && bs.Before(at.Add(time.Duration(cost)*p.Interval)) {
				at, moved = bs.Add(time.Duration(b.cost())*p.Interval), true
			}
		}
		for i, w := range p.Windows {
			if t := leaky.EarliestAmong(sends[i], w, at, cost); t.After(at) {
				at, moved = t, true
			}
		}
		if !moved {
			return at
		}
	}
}

// respaceHeld is Respace for a tenant an operator holds. Its clock stands
// still until the resume, which may come at once: a lost send moves the
// jobs, in the tenant's time, past the frozen now by the largest of its
// cost and the last recorded attempt's (whose real time a frozen clock
// cannot place), so that after the resume they go that many intervals
// after it. With no lost send the resume's floor is the owner's.
func respaceHeld(rec *Record, jobs []Placed, p leaky.Policy, h Pickup) int {
	if h.Lost == 0 {
		return 0
	}
	cost := max(h.Lost, rec.LastAttemptCost, 1)
	from := rec.Pause.TenantTime(h.Now).Add(time.Duration(cost) * p.Interval)
	return moveFrom(rec, jobs, p, from, false)
}

// moveFrom moves the jobs whose slots are before from (tenant time), one
// cost apart from it, in their order, within the windows, and raises the
// schedule past them (with the burst's tolerance unless credit).
func moveFrom(rec *Record, jobs []Placed, p leaky.Policy, from time.Time, credit bool) int {
	recent := rec.Recent(p)
	moved := 0
	for i := range jobs {
		w := &jobs[i]
		if !w.Slot.Before(from) {
			break // on schedule: so are the later ones
		}
		w.Slot, w.Moved = leaky.WindowSlot(recent, p, from, w.cost()), true
		recent = leaky.Record(recent, p, w.Slot, w.cost())
		from = w.Slot.Add(time.Duration(w.cost()) * p.Interval)
		next := from
		if !credit {
			next = next.Add(p.Tolerance()) // the sends before may have used it
		}
		rec.TAT = clock.Later(rec.TAT, next)
		rec.Unbook(w.ID) // a booked retry moved: it is in the schedule now
		moved++
	}
	rec.SetRecent(p, recent)
	return moved
}

// runPastLast raises the schedule to a cost past the last job waiting that
// has no booking (the jobs admitted are placed around a booking: Absorb).
func (r *Record) runPastLast(jobs []Placed, p leaky.Policy) {
	for i := len(jobs) - 1; i >= 0; i-- {
		if w := jobs[i]; !r.IsBooked(w.ID) {
			r.TAT = clock.Later(r.TAT, w.Slot.Add(time.Duration(w.cost())*p.Interval))
			return
		}
	}
}

// MissedDeadline is the deadline of a waiting job of slot if its tenant's
// pause moves its dispatch time past it, or its tenant is held (the resume
// may come after it); else zero. Its sender looks at such a job at its
// deadline, when the job expires, not when its tenant's pace lets it go.
func MissedDeadline(pz leaky.Pause, slot, deadline time.Time) time.Time {
	if deadline.IsZero() {
		return time.Time{}
	}
	if at, ok := pz.Real(slot); ok && !at.After(deadline) {
		return time.Time{}
	}
	return deadline
}
