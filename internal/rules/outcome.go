package rules

import (
	"cmp"
	"time"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/queue"
)

// ApplyOutcome is what an attempt's outcome does to its job (the one
// claimed: nothing else changes a job the dispatcher holds) and to its
// tenant's record, on either backend. paused reports a new pause.
func ApplyOutcome(rec *Record, j queue.Job, o queue.Outcome, now time.Time, p leaky.Policy) (cur queue.Job, paused bool) {
	cur = j
	cur.Payload = nil
	moved := false // a pushback given a new place (Reserve counted it in the windows)
	cur.ResponseStatus = cmp.Or(o.Status, cur.ResponseStatus)
	cur.LastError = cmp.Or(o.Error, cur.LastError)
	if !o.SentAt.IsZero() {
		cur.SentAt = o.SentAt
	}
	if o.SentAt.After(rec.LastAttemptAt) {
		rec.LastAttemptAt, rec.LastAttemptCost = o.SentAt, j.EffectiveCost()
	}
	if !o.SentAt.IsZero() {
		// The windows counted the attempt at its slot: from now on they
		// count it at its write, which a crash or a takeover then keeps.
		wrote := rec.Pause.TenantTime(o.SentAt)
		rec.CountWrite(p, j.EffectiveSlot(), wrote, j.EffectiveCost())
		rec.CountMade(p, clock.Later(j.EffectiveSlot(), wrote), j.EffectiveCost())
	}
	switch o.Result {
	case queue.Succeeded:
		cur.State = queue.StateSucceeded
		cur.LastError = ""
		cur.FinishedAt = now
	case queue.Failed:
		cur.State = queue.StateFailed
		cur.FinishedAt = now
	case queue.Cancelled: // the handler ran and said not to do it
		cur.State = queue.StateCancelled
		cur.FinishedAt = now
	case queue.Released: // with a pause: nothing was sent
		cur.Attempts--
		cur.State = queue.StateQueued
		if cur.Attempts > 0 {
			cur.State = queue.StateRetrying
		}
	case queue.Expired: // nothing was sent: too late
		cur.Attempts--
		cur.State = queue.StateExpired
		cur.FinishedAt = now
		cur.LastError = "expired: its deadline passed before it could be sent"
		rec.Unbook(cur.ID)
	default: // queue.Retry
		cur.State = queue.StateRetrying
		if !o.PauseUntil.IsZero() && !o.PauseUntil.After(now) {
			// A pushback already over: not a failure, but the job needs a
			// new slot (its own has passed).
			tnow := rec.Pause.TenantTime(now)
			cur.Slot = rec.Reserve(p, tnow, tnow, cur.EffectiveCost(), cur.ID)
		} else if o.PauseUntil.IsZero() {
			// A failure. The retry takes one interval of the schedule,
			// like any job, and waits out its backoff too: past its place
			// it is booked at the backoff's end (Reserve). Moving the
			// schedule's end there instead would push it seconds ahead
			// and refuse new jobs as if the queue were full.
			cur.Failures++
			pz := rec.Pause
			cur.Slot = rec.Reserve(p, pz.TenantTime(now), pz.TenantTime(o.NotBefore), cur.EffectiveCost(), cur.ID)
		} else if fz := rec.Pause.TenantTime(now); rec.Pause.Until.After(now) && !cur.Slot.Before(fz) && cur.Slot.Before(fz.Add(p.Interval)) {
			// A pushback during a pause that another job's pushback began,
			// of a job sent with that one (a burst): at the pause's end
			// its resend would go with that one's, a burst after the pause
			// (DESIGN 3.6). It takes the schedule's next place instead.
			cur.Slot = rec.Reserve(p, fz, fz, cur.EffectiveCost(), cur.ID)
			moved = true
		} // else a pushback keeps its place: the pause moves it
	}
	if o.PauseUntil.After(now) && !cur.State.Finished() {
		if o.Result == queue.Retry && !moved {
			// The resend keeps the slot, but it is a send of its own: the
			// windows count it.
			rec.CountSend(p, cur.Slot, cur.EffectiveCost())
		}
		rec.Pause = rec.Pause.PauseUntil(now, o.PauseUntil, cur.Slot)
		// Jobs admitted during the pause go one interval apart after it,
		// not as a burst.
		rec.TAT = clock.Later(rec.TAT, rec.Pause.TenantTime(now).Add(p.Tolerance()))
		paused = true
	}
	if !cur.State.Finished() {
		cur.DispatchAt = DispatchAt(rec.Pause, cur.Slot, now)
		if !cur.Deadline.IsZero() && cur.DispatchAt.After(cur.Deadline) {
			// Its next attempt would come too late: it ends here.
			cur.State, cur.FinishedAt = queue.StateExpired, now
			cur.LastError = "expired: its deadline passes before its next attempt; last attempt: " + cur.LastError
			rec.Unbook(cur.ID)
		}
	}
	return cur, paused
}
