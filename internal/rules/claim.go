package rules

import (
	"time"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/queue"
)

// Handover is what a tenant's sends leave for the next sender of its jobs,
// on a store whose tenants are sent by the owner of their partition, which
// a new owner may take over (Redis: the takeover starts the tenant from
// here, as the old owner may have sent up to then). The zero value is a
// tenant none of whose jobs was claimed.
type Handover struct {
	// Next is the earliest the tenant's next send may go, in real time:
	// past every claim (its dispatch time) and every write (its time), by
	// its cost in intervals, plus how early the claimer's or the writer's
	// reading of the clock may be.
	Next time.Time
	// Last is the dispatch time of the claim that goes last, and LastCost
	// its cost: a takeover spaces the next send from it by the rate in
	// force then (a reload may have slowed it since Next was worked out).
	Last     time.Time
	LastCost int
	// NoCredit is until when a takeover gives the tenant no burst credit:
	// Next plus the burst's tolerance as of the last claim (the old owner
	// may have used the credit up to then).
	NoCredit time.Time
}

// claimed moves h past a claim of cost going at at.
func (h *Handover) claimed(p leaky.Policy, at time.Time, cost int, margin time.Duration) {
	h.Next = clock.Later(h.Next, at.Add(time.Duration(cost)*p.Interval+margin))
	if !at.Before(h.Last) {
		h.Last, h.LastCost = at, cost
	}
	h.NoCredit = h.Next.Add(p.Tolerance())
}

// AfterWrite is the earliest a tenant's next send may go after a send of
// cost written at sentAt (zero: nothing was written, and the zero time):
// its cost in intervals after it, plus margin, how early the writer's
// reading of the clock may be.
func AfterWrite(p leaky.Policy, sentAt time.Time, cost int, margin time.Duration) time.Time {
	if sentAt.IsZero() {
		return time.Time{}
	}
	return sentAt.Add(time.Duration(max(cost, 1))*p.Interval + margin)
}

// Wrote moves h's Next on to after (AfterWrite), if that is later: a write
// comes when it comes, later than its claim's dispatch time under load. It
// reports whether Next moved.
func (h *Handover) Wrote(after time.Time) bool {
	if !after.After(h.Next) {
		return false
	}
	h.Next = after
	return true
}

// ClaimVerdict is what a claim does with a job due for its tenant's sender.
type ClaimVerdict int

const (
	// ClaimDrop: the job is not waiting (gone, done, or being sent
	// already): nothing to claim.
	ClaimDrop ClaimVerdict = iota + 1
	// ClaimNotYet: not now; look again in Wait.
	ClaimNotYet
	// Claimed: it goes at DispatchAt, its attempt counted in Attempts.
	Claimed
	// ClaimExpired: its deadline came before it could go.
	ClaimExpired
	// ClaimHeld: its tenant is held by an operator; look again in Wait.
	ClaimHeld
)

// ClaimCall is one claim's circumstances.
type ClaimCall struct {
	// Now is the real time of the claim.
	Now time.Time
	// Horizon: a job is claimed this long before its dispatch time.
	Horizon time.Duration
	// Recheck (positive): a held tenant's job looks again at the next
	// multiple of it since 1970 (a resume by another process is seen
	// within it).
	Recheck time.Duration
	Policy  leaky.Policy
	// Margin is how early the claimer's reading of the clock may be: the
	// tenant's next send waits that much more.
	Margin time.Duration
}

// ClaimDecision is Claim's answer.
type ClaimDecision struct {
	Verdict ClaimVerdict
	// Wait: look again this long from now (ClaimNotYet, ClaimHeld).
	Wait time.Duration
	// DispatchAt is when the job goes (Claimed), or would (ClaimNotYet).
	DispatchAt time.Time
	// Attempts is the job's attempts, this one counted (Claimed).
	Attempts int
}

// heldTick is how far past its deadline a held tenant's job looks again:
// the stores' finest time (Redis's microseconds), so that it expires then.
const heldTick = time.Microsecond

// Claim decides a claim of job j, due for its tenant's sender at c.Now, for
// one attempt, under the tenant's pause (rec.Pause) and j's deadline, and
// keeps it in rec and h:
//   - held by an operator, the job looks again at the next multiple of
//     c.Recheck, plus its place in the schedule past the frozen tenant
//     time, so that after a resume the tenant's jobs come back in slot
//     order; or just past its deadline if that comes first, and expires
//     once its deadline has passed (it would be sent too late whenever
//     the resume comes);
//   - else it goes at its slot under the pause (RealAt); it expires once
//     its deadline has come and it would go after it, or once its deadline
//     has passed anyway (its tenant's pace held it); one that a pause moved
//     past its deadline waits, and counts, until then;
//   - it is claimed within c.Horizon of its dispatch time, else it looks
//     again then (or at its deadline, if sooner);
//   - claimed, the tenant's next send goes the job's cost in intervals
//     after it, plus c.Margin (h); expired, it counts in rec.Expired and
//     its booking goes (it will not be sent there).
func Claim(rec *Record, h *Handover, j queue.Job, c ClaimCall) ClaimDecision {
	if !j.State.Waiting() {
		return ClaimDecision{Verdict: ClaimDrop}
	}
	var d ClaimDecision
	if !rec.Pause.Held.IsZero() {
		d = claimHeld(rec.Pause, j.EffectiveSlot(), j.Deadline, c)
	} else {
		d = claimAt(RealAt(rec.Pause, j.EffectiveSlot()), j.Deadline, c)
	}
	switch d.Verdict {
	case ClaimExpired:
		rec.CountEnd(queue.StateExpired)
		rec.Unbook(j.ID)
	case Claimed:
		d.Attempts = j.Attempts + 1
		h.claimed(c.Policy, d.DispatchAt, j.EffectiveCost(), c.Margin)
	}
	return d
}

// claimHeld is Claim for a held tenant.
func claimHeld(pz leaky.Pause, slot, deadline time.Time, c ClaimCall) ClaimDecision {
	if !deadline.IsZero() && c.Now.After(deadline) {
		return ClaimDecision{Verdict: ClaimExpired}
	}
	frozen := pz.TenantTime(pz.Held) // tenant time stands still from the hold on
	wait := c.Recheck - time.Duration(c.Now.UnixNano()%int64(c.Recheck)) + max(slot.Sub(frozen), 0)
	if !deadline.IsZero() {
		wait = min(wait, deadline.Add(heldTick).Sub(c.Now))
	}
	return ClaimDecision{Verdict: ClaimHeld, Wait: wait}
}

// claimAt is Claim for a job going at at.
func claimAt(at, deadline time.Time, c ClaimCall) ClaimDecision {
	now := c.Now
	hasDeadline := !deadline.IsZero()
	late := hasDeadline && at.After(deadline) // a pause moved it past its deadline
	switch {
	case late && !now.Before(deadline), hasDeadline && now.After(deadline):
		return ClaimDecision{Verdict: ClaimExpired}
	case late:
		return ClaimDecision{Verdict: ClaimNotYet, Wait: deadline.Sub(now), DispatchAt: at}
	case at.Sub(now) > c.Horizon:
		wait := at.Sub(now) - c.Horizon
		if hasDeadline {
			wait = min(wait, deadline.Sub(now))
		}
		return ClaimDecision{Verdict: ClaimNotYet, Wait: wait, DispatchAt: at}
	}
	return ClaimDecision{Verdict: Claimed, DispatchAt: at}
}
