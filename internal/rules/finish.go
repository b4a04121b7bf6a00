package rules

import (
	"time"

	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/queue"
)

// CountEnd counts a job that ended in state st in its tenant's counters;
// false if st is no end (the job waits again, counted in no counter).
func (r *Record) CountEnd(st queue.JobState) bool {
	switch st {
	case queue.StateSucceeded:
		r.Delivered++
	case queue.StateFailed:
		r.Failed++
	case queue.StateCancelled:
		r.Cancelled++
	case queue.StateExpired:
		r.Expired++
	default:
		return false
	}
	return true
}

// Finish is what an attempt's outcome does on a store that keeps a
// tenant's handover (Redis): ApplyOutcome's job and record, the job counted
// in its tenant's counters if it ended (CountEnd), and the tenant's next
// moved on past the write (h). For an outcome that ends the job with no
// pause (Succeeded, or Failed for good) that is all of it: the tenant's
// schedule, pause and bookings stay as they were, and so do its windows
// unless the send was written after its slot (LateInWindows): they count
// it at its write.
func Finish(rec *Record, h *Handover, j queue.Job, o queue.Outcome, now time.Time, p leaky.Policy, margin time.Duration) (cur queue.Job, paused bool) {
	cur, paused = ApplyOutcome(rec, j, o, now, p)
	rec.CountEnd(cur.State)
	h.Wrote(AfterWrite(p, o.SentAt, j.EffectiveCost(), margin))
	return cur, paused
}

// KeepRecord is how long a tenant's record must be kept from now: for good
// (forever) while the tenant has jobs (waiting or being sent) or an
// operator's hold; else until its schedule runs out in real time, plus
// idle. Past that a tenant with no record is decided as it would be with
// it (Quiet).
func KeepRecord(rec Record, jobs int, now time.Time, idle time.Duration) (ttl time.Duration, forever bool) {
	if jobs > 0 || !rec.Pause.Held.IsZero() {
		return 0, true
	}
	return max(DispatchAt(rec.Pause, rec.TAT, now).Sub(now), 0) + idle, false
}

// LateInWindows reports whether an attempt of j under p, written at sentAt,
// moves a send in p's windows (CountWrite): p has windows and the write
// came after the job's dispatch time.
func LateInWindows(p leaky.Policy, j queue.Job, sentAt time.Time) bool {
	return len(p.Windows) > 0 && sentAt.After(j.DispatchAt)
}
