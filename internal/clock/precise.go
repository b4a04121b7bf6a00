package clock

import "time"

// PreciseWindow is how much of a wait a precise clock sleeps on its own
// thread (SleepPrecise) rather than on a Go timer. An idle Go runtime
// waits for its timers in whole milliseconds (its poller's timeout), so a
// timer wakes up to a millisecond late: 0.6 ms at the median here. The
// gate spaces each send from the one before's real write, so that
// lateness is added to every send after it; slept precisely, it is about
// a tenth of that.
const PreciseWindow = 2 * time.Millisecond

// preciseSleepers bounds the threads sleeping precisely at once: each
// holds an OS thread, and a thousand tenants due at one instant must not
// make a thousand threads. The rest wait on a timer.
var preciseSleepers = make(chan struct{}, 16)

// Precise reports whether c can sleep precisely (SleepPrecise).
func Precise(c Clock) bool {
	p, ok := c.(interface{ Precise() bool })
	return ok && p.Precise()
}

// SleepPrecise sleeps d (at most PreciseWindow) on the calling thread, if
// c can and a place is free, and reports whether it did; if not, the
// caller waits on c.After.
func SleepPrecise(c Clock, d time.Duration) bool {
	if d > PreciseWindow || !Precise(c) {
		return false
	}
	select {
	case preciseSleepers <- struct{}{}:
	default:
		return false
	}
	defer func() { <-preciseSleepers }()
	return sleepOnThread(d)
}

// Precise reports whether the real clock sleeps precisely here (Linux).
func (Real) Precise() bool { return canSleepOnThread }
