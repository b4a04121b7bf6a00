package leaky

import (
	"time"

	"github.com/throttler-dev/throttler/internal/clock"
)

// Pause is a tenant's own clock: tenant time is real time minus the pauses
// so far, and it stands still while the tenant is paused. Admission, slots,
// depth and delay are all worked out in tenant time, so a pause is O(1): no
// job is rewritten, spacing and order survive it, and a long pause fills the
// queue to its capacity and no further. A job's real dispatch time is its
// slot plus the pauses so far (Real).
//
// The zero value is a tenant never paused: tenant time is real time.
type Pause struct {
	// Shift is how far tenant time runs behind real time once the current
	// pause (if any) is over.
	Shift time.Duration `json:"shift,omitempty"`
	// Until is the real time a timed pause ends (the downstream's
	// Retry-After, an open circuit breaker); before it, tenant time stands
	// still.
	Until time.Time `json:"until,omitzero"`
	// Held is when an operator hold began (zero: none). Tenant time stands
	// still from then until Resume.
	Held time.Time `json:"held,omitzero"`
}

// TenantTime is the tenant's time at real time now.
func (p Pause) TenantTime(now time.Time) time.Time {
	t := now
	if !p.Held.IsZero() && p.Held.Before(t) {
		t = p.Held
	}
	if t.Before(p.Until) {
		t = p.Until
	}
	return t.Add(-p.Shift)
}

// Real is the real time at which tenant time reaches slot, if no other pause
// comes; false while an operator hold has no end.
func (p Pause) Real(slot time.Time) (time.Time, bool) {
	if !p.Held.IsZero() {
		return time.Time{}, false
	}
	return clock.Later(p.Until, slot.Add(p.Shift)), true
}

// Paused reports whether tenant time stands still at now, and until when
// (zero for an operator hold, which has no end).
func (p Pause) Paused(now time.Time) (bool, time.Time) {
	if !p.Held.IsZero() {
		return true, time.Time{}
	}
	if now.Before(p.Until) {
		return true, p.Until
	}
	return false, time.Time{}
}

// PauseUntil stops tenant time from now until the real time until, and also
// winds it back to from if from is earlier: from is the slot
// of the job that was pushed back, so that it goes first when the pause ends
// and the jobs after it keep their spacing. A pause that ends no later than an earlier
// one only moves the clock back.
func (p Pause) PauseUntil(now, until, from time.Time) Pause {
	if !until.After(now) {
		return p
	}
	frozen := p.TenantTime(now)
	if from.Before(frozen) && !from.IsZero() {
		frozen = from
	}
	p.Until = clock.Later(p.Until, until)
	p.Shift = p.Until.Sub(frozen)
	return p
}

// Hold stops tenant time from now until Resume (an operator's pause).
func (p Pause) Hold(now time.Time) Pause {
	if p.Held.IsZero() {
		p.Held = now
	}
	return p
}

// Resume ends an operator hold at now: tenant time runs again from where it
// stood (after any timed pause still running).
func (p Pause) Resume(now time.Time) Pause {
	if p.Held.IsZero() {
		return p
	}
	frozen := p.TenantTime(now)
	p.Held = time.Time{}
	p.Until = clock.Later(p.Until, now)
	p.Shift = p.Until.Sub(frozen)
	return p
}
