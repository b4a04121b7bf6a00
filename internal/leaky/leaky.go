// Package leaky owns the rules of one bucket: admission and spacing by GCRA
// (the generic cell rate algorithm, ITU-T I.371) with a bounded queue, the
// windows beside the rate, pauses (tenant time), rates as written in config,
// and how far ahead a policy may schedule (MaxHorizon).
//
// The whole state of a bucket is one timestamp, TAT: the theoretical arrival
// time of the next conforming job. With tolerance tau = (Burst-1)*Interval, a
// job arriving at now gets slot = max(now, TAT - tau). It is admitted iff
// slot - now <= Capacity*Interval; then TAT = max(TAT, now) + Interval and the
// job is due at slot. A rejected job leaves TAT as it was.
//
//   - leaky mode: Burst 1, Capacity C: one job goes now, C wait, spaced Interval.
//   - token mode: Burst B, Capacity 0: B jobs go at once, none wait.
//   - both: Burst B, Capacity C: B go at once after a quiet spell, then C wait.
//
// Everything here is a pure function of (state, now, policy): no clock, no
// I/O, no locks (internal/clock is imported only for its pure Later). The
// stores call it (the Redis backend runs the same rules in Lua, checked
// against this code) and so does the simulator.
package leaky

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/throttler-dev/throttler/internal/clock"
)

// Policy is how one bucket admits and spaces jobs.
type Policy struct {
	// Interval is T = 1/rate: the spacing between sends. Must be > 0.
	Interval time.Duration
	// Burst is how many jobs may go at once after a quiet spell (>= 1).
	Burst int
	// Capacity is how many jobs may wait (>= 0). Token mode has 0.
	Capacity int
	// Windows are limits beside the rate: never more than N sends in any
	// window of a length (see Window). Optional.
	Windows []Window
	// MaxScheduled bounds the jobs booked ahead of the queue for their
	// not_before, apart from Capacity (0: no bound). The bucket never
	// reads it: the stores count those jobs.
	MaxScheduled int
}

// Validate says what is wrong with p, if anything.
func (p Policy) Validate() error {
	switch {
	case p.Interval <= 0:
		return errors.New("interval must be positive")
	case p.Burst < 1:
		return fmt.Errorf("burst must be at least 1, got %d", p.Burst)
	case p.Capacity < 0:
		return fmt.Errorf("capacity must not be negative, got %d", p.Capacity)
	case p.Horizon() > MaxHorizon:
		return fmt.Errorf("schedules %.0f years ahead, more than MaxHorizon (%v)", p.HorizonYears(), MaxHorizon)
	}
	return nil
}

// MaxHorizon is the furthest ahead a policy may schedule: ten years (of 365
// days). Far past anything a queue needs, and far short of where the
// arithmetic stops being exact: a time.Duration ends at 292 years, and the
// Redis backend's doubles hold whole microseconds to 285 years.
const MaxHorizon = 10 * 365 * Day

// Horizon is how far ahead of now the policy can schedule a job: the
// schedule of a full bucket, Capacity waiting behind Burst sent at once,
// spans (Capacity + Burst - 1) intervals; each window can hold that queue
// back by its length for every N jobs in it (and the first, behind sends
// already made). The bucket's state (TAT) reaches one interval further.
// A horizon past what a Duration holds saturates at its largest value.
func (p Policy) Horizon() time.Duration {
	jobs := int64(max(p.Capacity, 0)) + int64(max(p.Burst, 1)) - 1
	h := mulSat(jobs, p.Interval)
	for _, w := range p.Windows {
		h = addSat(h, mulSat(jobs/int64(max(w.N, 1))+1, w.Length))
	}
	return h
}

// HorizonYears is Horizon in years of 365 days, in floating point so that
// it still says how far when the Duration saturates (for messages).
func (p Policy) HorizonYears() float64 {
	jobs := float64(max(p.Capacity, 0)) + float64(max(p.Burst, 1)) - 1
	h := jobs * float64(p.Interval)
	for _, w := range p.Windows {
		h += math.Floor(jobs/float64(max(w.N, 1))+1) * float64(w.Length)
	}
	return h / float64(365*Day)
}

// mulSat is n * d, or the largest Duration if that overflows.
func mulSat(n int64, d time.Duration) time.Duration {
	if n <= 0 || d <= 0 {
		return 0
	}
	if n > math.MaxInt64/int64(d) {
		return math.MaxInt64
	}
	return time.Duration(n) * d
}

// addSat is a + b (both >= 0), or the largest Duration if that overflows.
func addSat(a, b time.Duration) time.Duration {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// Tolerance is tau = (Burst-1) * Interval.
func (p Policy) Tolerance() time.Duration {
	return time.Duration(p.Burst-1) * p.Interval
}

// MaxDelay is the longest an admitted job may wait: Capacity * Interval.
func (p Policy) MaxDelay() time.Duration {
	return time.Duration(p.Capacity) * p.Interval
}

// MaxCost is the largest cost a job can have and ever be admitted: what the
// bucket holds when it is quiet (Burst at once and Capacity waiting), and
// what every window allows.
func (p Policy) MaxCost() int {
	n := p.Capacity + p.Burst
	for _, w := range p.Windows {
		n = min(n, w.N)
	}
	return n
}

// State is one bucket. The zero value is a bucket that has been quiet forever.
type State struct {
	// TAT is the theoretical arrival time of the next conforming job.
	TAT time.Time
}

// Decision is the answer for one job.
type Decision struct {
	Admitted bool
	// Slot is when the job may be sent (admitted jobs only).
	Slot time.Time
	// Delay is Slot - now: how long the job waits (admitted jobs only).
	Delay time.Duration
	// RetryAfter is how long until the same job would be admitted (rejected
	// jobs only): a job arriving exactly then is admitted.
	RetryAfter time.Duration
}

// Admit decides one job arriving at now and returns the bucket's new state.
// A rejected job leaves the state unchanged.
func Admit(s State, now time.Time, p Policy) (Decision, State) {
	return AdmitCost(s, now, p, 1)
}

// AdmitCost decides a job that takes cost slots of the schedule (cost >= 1;
// say, the segments of an SMS): it is sent at its slot and the next job
// comes cost intervals later. It is admitted iff its last slot would wait
// at most Capacity intervals, the weighted GCRA: with cost 1 this is Admit.
// A cost above p.MaxCost() is never admitted.
func AdmitCost(s State, now time.Time, p Policy, cost int) (Decision, State) {
	cost = max(cost, 1)
	slot := earliestSlot(s, now, p)
	// How far the job's last slot is past now, beyond what goes at once.
	excess := clock.Later(s.TAT, now).Add(time.Duration(cost-1)*p.Interval).Sub(now) - p.Tolerance()
	if excess > p.MaxDelay() {
		return Decision{RetryAfter: excess - p.MaxDelay()}, s
	}
	return Decision{Admitted: true, Slot: slot, Delay: slot.Sub(now)}, advanceCost(s, now, p, cost)
}

// Reserve takes the next slot at or after notBefore whatever the capacity:
// for a job already accepted that must be sent again (a retry), so that every
// attempt is paced like the first.
func Reserve(s State, notBefore time.Time, p Policy) (time.Time, State) {
	return ReserveCost(s, notBefore, p, 1)
}

// ReserveCost is Reserve for a job of cost slots.
func ReserveCost(s State, notBefore time.Time, p Policy, cost int) (time.Time, State) {
	return earliestSlot(s, notBefore, p), advanceCost(s, notBefore, p, max(cost, 1))
}

// Push moves a job's slot to at (later than the bucket would have it, for
// a window): the schedule after it follows from there.
func Push(s State, at time.Time, p Policy, cost int) State {
	if next := at.Add(time.Duration(max(cost, 1)) * p.Interval); next.After(s.TAT) {
		s.TAT = next
	}
	return s
}

// ExpectedDelay is how long a job admitted at now would wait before its slot.
// When the bucket is full it is the wait the job would have had.
func ExpectedDelay(s State, now time.Time, p Policy) time.Duration {
	return earliestSlot(s, now, p).Sub(now)
}

// Waiting is how many admitted jobs have a slot after now, by the schedule
// alone (a store that counts its jobs knows better once jobs are cancelled or
// retried). It never exceeds p.Capacity for a bucket fed only by Admit.
func Waiting(s State, now time.Time, p Policy) int {
	// The k-th most recent admission (k = 0, 1, ...) has slot
	// TAT - (k+1)*T - tau when the schedule is contiguous.
	ahead := s.TAT.Sub(now) - p.Tolerance()
	if ahead <= 0 {
		return 0
	}
	n := int((ahead + p.Interval - 1) / p.Interval) // ceil
	return n - 1
}

// Idle reports whether the state no longer matters at now: a quiet bucket
// would decide exactly the same. Stores drop idle state.
func Idle(s State, now time.Time) bool {
	return !s.TAT.After(now)
}

func earliestSlot(s State, now time.Time, p Policy) time.Time {
	slot := s.TAT.Add(-p.Tolerance())
	if slot.Before(now) {
		return now
	}
	return slot
}

func advanceCost(s State, now time.Time, p Policy, cost int) State {
	return State{TAT: clock.Later(s.TAT, now).Add(time.Duration(cost) * p.Interval)}
}
