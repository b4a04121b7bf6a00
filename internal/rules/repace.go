package rules

import (
	"slices"
	"time"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/leaky"
)

// Repace places a tenant's waiting jobs anew by p after a change of its
// policy (set by the API): in their order (jobs: slot order, then id),
// each as the schedule's next place from the later of now, after (real
// time: the jobs already handed over, which keep their slots) and the next
// send by its last attempt, within the windows, with no burst credit (the
// sends just before may have used it). A faster policy brings the backlog
// forward, a slower one moves it back, so that each job says when it goes.
//
// The windows count, first, the sends made (Record.Made), the jobs handed
// over (handed: sent, or about to be) and the bookings: the jobs' old
// places were not sent. Where the sends made are not known, the old places
// leave each window's list that is not full; a full one keeps them (the
// sends before them have left it, and would be forgotten with them), and
// the jobs are placed after them as far as that window asks. A booked retry and a job
// booked for its not_before (Scheduled) keep their slots, and the others
// are placed around them as admissions are (Absorb). A job whose
// not_before its new place would come before is booked at its not_before
// instead, as a retry's backoff is (Reserve), and the others go around it.
// A paused or held tenant is left as it is: its jobs go at the pause's
// end, paced at the gate by the policy in force then. It returns how many
// jobs moved.
func Repace(rec *Record, jobs []Placed, p leaky.Policy, now, after time.Time, handed []Placed) int {
	pz := rec.Pause
	queued := slices.ContainsFunc(jobs, func(j Placed) bool { return !j.Scheduled })
	if !pz.Held.IsZero() || pz.Until.After(now) || !queued {
		return 0
	}
	booked := map[string]bool{}
	for _, b := range rec.Booked {
		booked[b.Job] = true
	}
	for _, j := range jobs {
		if j.Scheduled && !booked[j.ID] {
			// The queue had reached it (Absorb): booked again, as the
			// queue is placed anew.
			rec.book(Booking{Slot: j.Slot.UnixNano(), Cost: j.cost(), Job: j.ID})
			booked[j.ID] = true
		}
	}
	floor := clock.Later(clock.Later(now, after), rec.NextAfterLastAttempt(p)).Add(-pz.Shift) // tenant time
	if made, known := rec.Made(p); known && len(p.Windows) > 0 {
		recent := made
		for _, h := range handed {
			recent = leaky.Record(recent, p, h.Slot, h.cost())
		}
		for _, b := range rec.Booked {
			recent = leaky.Record(recent, p, time.Unix(0, b.Slot), b.cost())
		}
		rec.SetRecent(p, recent)
	} else if len(p.Windows) > 0 {
		recent := rec.Recent(p)
		for i, w := range p.Windows {
			if len(recent[i]) >= w.N {
				continue // full: the sends before the jobs have left it
			}
			for _, j := range jobs {
				if !booked[j.ID] {
					recent[i] = forget(recent[i], j.Slot, j.cost())
				}
			}
		}
		rec.SetRecent(p, recent)
	}
	rec.TAT = floor.Add(p.Tolerance()) // the next place is at floor, with no burst credit
	rec.Behind = time.Time{}
	moved := 0
	for i := range jobs {
		j := &jobs[i]
		if booked[j.ID] {
			continue
		}
		var notBefore time.Time // tenant time
		if !j.NotBefore.IsZero() {
			notBefore = j.NotBefore.Add(-pz.Shift)
		}
		slot := rec.Reserve(p, floor, notBefore, j.cost(), j.ID)
		if !slot.Equal(j.Slot) {
			j.Slot, j.Moved = slot, true
			moved++
		}
	}
	return moved
}

// forget takes cost sends counted at slot out of a window's list (those
// there are).
func forget(r leaky.Recent, slot time.Time, cost int) leaky.Recent {
	for range cost {
		i := slices.IndexFunc(r, func(t time.Time) bool { return t.Equal(slot) })
		if i < 0 {
			break
		}
		r = slices.Delete(r, i, i+1)
	}
	return r
}
