package queue

import (
	"time"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/leaky"
)

// TenantRecord is the durable state of a tenant, the same on every backend:
// its schedule (TAT, in tenant time, like every slot), its pause, the last
// attempt written, its counters and its windows' bookkeeping.
type TenantRecord struct {
	TAT           time.Time   `json:"tat"`
	Pause         leaky.Pause `json:"pause,omitzero"`
	LastAttemptAt time.Time   `json:"last_attempt_at"`
	// LastAttemptCost is the cost of that attempt's job (0 read as 1): the
	// next send comes that many intervals after it.
	LastAttemptCost int   `json:"last_attempt_cost,omitempty"`
	Accepted        int64 `json:"accepted"`
	Rejected        int64 `json:"rejected"`
	Delivered       int64 `json:"delivered"`
	Failed          int64 `json:"failed"`
	Cancelled       int64 `json:"cancelled"`
	Expired         int64 `json:"expired,omitempty"`
	// Windows is each window's bookkeeping (by the window as written): the
	// slots, in tenant time (unix ns), of its last N sends.
	Windows map[string][]int64 `json:"recent,omitempty"`
}

// Recent is the bookkeeping of p's windows (empty for a window new to it).
func (r TenantRecord) Recent(p leaky.Policy) []leaky.Recent {
	if len(p.Windows) == 0 {
		return nil
	}
	out := make([]leaky.Recent, len(p.Windows))
	for i, w := range p.Windows {
		for _, ns := range r.Windows[w.String()] {
			out[i] = append(out[i], time.Unix(0, ns))
		}
	}
	return out
}

// SetRecent stores the bookkeeping of p's windows (and drops windows no
// longer configured).
func (r *TenantRecord) SetRecent(p leaky.Policy, recent []leaky.Recent) {
	if len(p.Windows) == 0 {
		r.Windows = nil
		return
	}
	r.Windows = make(map[string][]int64, len(p.Windows))
	for i, w := range p.Windows {
		ns := make([]int64, len(recent[i]))
		for k, t := range recent[i] {
			ns[k] = t.UnixNano()
		}
		r.Windows[w.String()] = ns
	}
}

// Record counts a send of cost at slot in the tenant's windows.
func (r *TenantRecord) Record(p leaky.Policy, slot time.Time, cost int) {
	if len(p.Windows) == 0 {
		return
	}
	r.SetRecent(p, leaky.Record(r.Recent(p), p, slot, cost))
}

// Reserve takes a slot for another attempt of a job of cost, at or after
// tenant time from and no earlier than notBefore (a backoff), paced like any
// job and within every window; it does not refuse (the job was admitted).
func (r *TenantRecord) Reserve(p leaky.Policy, from, notBefore time.Time, cost int) time.Time {
	slot, st := leaky.ReserveCost(leaky.State{TAT: r.TAT}, from, p, cost)
	at := clock.Later(slot, notBefore)
	if len(p.Windows) > 0 {
		at = leaky.WindowSlot(r.Recent(p), p, at, cost)
		r.Record(p, at, cost)
		if !notBefore.After(slot) {
			st = leaky.Push(st, at, p, cost) // a window moved it: the rest follow
		}
	}
	r.TAT = st.TAT
	return at
}

// NextAfterLastAttempt is the soonest real time the next send may come
// after the last attempt recorded: its cost in intervals after it (zero if
// there was none).
func (r *TenantRecord) NextAfterLastAttempt(p leaky.Policy) time.Time {
	if r.LastAttemptAt.IsZero() {
		return time.Time{}
	}
	return r.LastAttemptAt.Add(time.Duration(max(r.LastAttemptCost, 1)) * p.Interval)
}

// FloorAfterLastAttempt raises the schedule so that the next send comes no
// sooner than NextAfterLastAttempt, even if the schedule says so (a retry
// sent long after its reserved slot, a late write). A running process's
// gate knows that; after a restart or an eviction only this does.
func (r *TenantRecord) FloorAfterLastAttempt(p leaky.Policy) {
	if r.LastAttemptAt.IsZero() {
		return
	}
	// In tenant time, with the burst's tolerance: the next conforming job
	// then goes at NextAfterLastAttempt.
	if floor := r.NextAfterLastAttempt(p).Add(p.Tolerance() - r.Pause.Shift); r.TAT.Before(floor) {
		r.TAT = floor
	}
}

// RealAt is when a job of slot goes under pause (clock.Never while held).
func RealAt(p leaky.Pause, slot time.Time) time.Time {
	if at, ok := p.Real(slot); ok {
		return at
	}
	return clock.Never
}

// DispatchAt is what to tell people of a job's dispatch time: for a held
// tenant, the time it would have if resumed now.
func DispatchAt(p leaky.Pause, slot, now time.Time) time.Time {
	if at, ok := p.Real(slot); ok {
		return at
	}
	at, _ := p.Resume(now).Real(slot)
	return at
}
