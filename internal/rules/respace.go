package rules

import (
	"time"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/leaky"
)

// Placed is a waiting job as a restart finds it: its slot (tenant time),
// cost and id, and whether Respace moved it.
type Placed struct {
	Slot  time.Time
	Cost  int // 0 read as 1
	ID    string
	Moved bool
}

func (w Placed) cost() int { return max(w.Cost, 1) }

// Respace moves, after a restart at now, a tenant's waiting jobs (in slot
// order) whose time passed while nothing sent them: from the later of now
// and the last moment a send may have happened, plus its cost in intervals,
// one job's cost apart, in their order, within the windows. After an
// unclean stop any job whose time passed may have been sent at that time,
// and the sends before the crash may have used the tenant's whole burst
// just before now: the moved jobs and what comes after them get no burst
// of their own. A tenant an operator holds is left to its resume after a
// clean stop. It returns how many jobs moved.
func Respace(rec *Record, jobs []Placed, p leaky.Policy, now time.Time, clean bool) int {
	if len(jobs) == 0 {
		return 0
	}
	pz := rec.Pause
	if !pz.Held.IsZero() {
		if clean {
			return 0 // held: nothing goes until an operator resumes it
		}
		return respaceHeld(rec, jobs, p, now)
	}
	floor := clock.Later(now, rec.NextAfterLastAttempt(p))
	crashed := false
	if at, _ := pz.Real(jobs[0].Slot); !at.After(now) && !clean {
		// One of them may have been written at any moment before the
		// crash (its time, or later: a slow connection, a held gate):
		// only "before now" is sure. Whichever it was, the next send
		// comes its cost in intervals later.
		floor = clock.Later(floor, now.Add(time.Duration(overdueCost(jobs, pz, now))*p.Interval))
		crashed = true
	}
	recent := rec.Recent(p)
	moved := 0
	for i := range jobs {
		w := &jobs[i]
		if at, _ := pz.Real(w.Slot); !at.Before(floor) {
			break // on schedule: so are the later ones
		}
		// Real(floor - Shift) is floor: floor is past the pause's end.
		// The old slot stays in the windows' bookkeeping: it may have
		// been sent.
		w.Slot, w.Moved = leaky.WindowSlot(recent, p, floor.Add(-pz.Shift), w.cost()), true
		recent = leaky.Record(recent, p, w.Slot, w.cost())
		floor = w.Slot.Add(pz.Shift).Add(time.Duration(w.cost()) * p.Interval)
		next := w.Slot.Add(time.Duration(w.cost()) * p.Interval)
		if crashed {
			next = next.Add(p.Tolerance()) // no burst credit: see above
		}
		rec.TAT = clock.Later(rec.TAT, next)
		rec.Unbook(w.ID) // a booked retry moved: it is in the schedule now
		moved++
	}
	rec.SetRecent(p, recent)
	return moved
}

// respaceHeld is Respace after an unclean stop for a tenant an operator
// holds. Its clock stands still until the resume, and the jobs that were
// due when it was held may have been written at any moment before the
// crash: they move, in the tenant's time, past the frozen now by the
// largest of their costs (and the last recorded attempt's), so that after
// the resume they go that many intervals after it, not at once.
func respaceHeld(rec *Record, jobs []Placed, p leaky.Policy, now time.Time) int {
	tnow := rec.Pause.TenantTime(now)
	if jobs[0].Slot.After(tnow) {
		return 0 // none was due: none was written
	}
	cost := max(rec.LastAttemptCost, 1)
	for _, w := range jobs {
		if w.Slot.After(tnow) {
			break
		}
		cost = max(cost, w.cost())
	}
	floor := tnow.Add(time.Duration(cost) * p.Interval)
	recent := rec.Recent(p)
	moved := 0
	for i := range jobs {
		w := &jobs[i]
		if !w.Slot.Before(floor) {
			break
		}
		w.Slot, w.Moved = leaky.WindowSlot(recent, p, floor, w.cost()), true
		recent = leaky.Record(recent, p, w.Slot, w.cost())
		floor = w.Slot.Add(time.Duration(w.cost()) * p.Interval)
		rec.TAT = clock.Later(rec.TAT, floor.Add(p.Tolerance())) // no burst credit
		rec.Unbook(w.ID)
		moved++
	}
	rec.SetRecent(p, recent)
	return moved
}

// overdueCost is the largest cost among jobs (in slot order) whose time has
// passed at now: any of them may be the last one written.
func overdueCost(jobs []Placed, pz leaky.Pause, now time.Time) int {
	most := 1
	for _, w := range jobs {
		if at, _ := pz.Real(w.Slot); at.After(now) {
			break
		}
		most = max(most, w.cost())
	}
	return most
}
