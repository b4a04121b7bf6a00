package rules

import (
	"slices"
	"time"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/leaky"
)

// Lane is a bucket that paces sends as they go, in real time, rather than
// jobs as they are admitted: a downstream's ceiling shared by its tenants.
// The zero value is a lane that has been quiet forever.
type Lane struct {
	// TAT is the theoretical arrival time of the next conforming send.
	TAT time.Time
	// Recent is the bookkeeping of the policy's windows (leaky.Recent).
	Recent []leaky.Recent
}

// Earliest is the earliest the lane's rate lets any send go at or after
// now (a pause of the lane raises its TAT).
func (l Lane) Earliest(p leaky.Policy, now time.Time) time.Time {
	return clock.Later(now, l.TAT.Add(-p.Tolerance()))
}

// Slot is the earliest the lane (its rate and its windows) lets a send of
// cost go, at or after now and at.
func (l Lane) Slot(p leaky.Policy, now, at time.Time, cost int) time.Time {
	return leaky.WindowSlot(l.Recent, p, clock.Later(at, l.Earliest(p, now)), cost)
}

// Use takes the lane's slot at for a send of cost. It reports whether the
// windows' bookkeeping changed.
func (l *Lane) Use(p leaky.Policy, at time.Time, cost int) bool {
	l.TAT = clock.Later(l.TAT, at).Add(time.Duration(max(cost, 1)) * p.Interval)
	if len(p.Windows) == 0 {
		return false
	}
	l.Recent = leaky.Record(l.Recent, p, at, cost)
	return true
}

// Unuse gives back the window places of a send at at that did not happen.
// It reports whether the windows' bookkeeping changed.
func (l *Lane) Unuse(at time.Time, cost int) bool {
	changed := false
	for i := range l.Recent {
		for range max(cost, 1) {
			if k := slices.IndexFunc(l.Recent[i], at.Equal); k >= 0 {
				l.Recent[i] = slices.Delete(l.Recent[i], k, k+1)
				changed = true
			}
		}
	}
	return changed
}
