package owner

import (
	"context"
	"sync"
	"time"
)

// vacancies takes partitions held vacant the moment their vacancy ends,
// not at the balancer's next pass (up to a Balance later): admission
// promises a tenant of a vacant partition its owner at the vacancy's end
// (the Redis store's enqueue.lua), and a job waits as long as the
// partition has no owner.
type vacancies struct {
	mu     sync.Mutex
	timers map[int]*time.Timer // by partition: a take at its vacancy's end (one timer for those that end together)
	done   bool
}

// passMu serializes the balancer's passes and the takes at a vacancy's
// end (both read and change what the balancer saw last).
func (m *Manager) lockPass()   { m.passMu.Lock() }
func (m *Manager) unlockPass() { m.passMu.Unlock() }

// retakeAt takes the partitions ps, as many as this worker's share
// allows, once their vacancy ends at ends (this worker's clock; a little
// after, so that Redis has expired them), in one acquire: partitions
// taken together keep one deadline, as a balancer's pass gives them. A
// take already set for a partition stands.
func (m *Manager) retakeAt(ps []int, ends time.Time) {
	v := &m.vacant
	v.mu.Lock()
	defer v.mu.Unlock()
	var mine []int
	for _, p := range ps {
		if v.timers[p] == nil {
			mine = append(mine, p)
		}
	}
	if v.done || len(mine) == 0 {
		return
	}
	if v.timers == nil {
		v.timers = map[int]*time.Timer{}
	}
	t := time.AfterFunc(time.Until(ends)+time.Millisecond, func() {
		v.mu.Lock()
		for _, p := range mine {
			delete(v.timers, p)
		}
		done := v.done
		v.mu.Unlock()
		if !done && !m.hooks.frozen.Load() {
			m.takeVacated(m.ctx, mine)
		}
	})
	for _, p := range mine {
		v.timers[p] = t
	}
}

// takeVacated is a balancer's pass narrowed to the partitions ps: as many
// taken as keep this worker within its share of the live workers it saw
// last.
func (m *Manager) takeVacated(ctx context.Context, ps []int) {
	m.lockPass()
	defer m.unlockPass()
	if ctx.Err() != nil || m.mismatch {
		return
	}
	m.mu.Lock()
	held := 0
	for _, t := range m.held {
		if !t.draining {
			held++
		}
	}
	var want []int
	for _, p := range ps {
		if _, mine := m.held[p]; !mine {
			want = append(want, p)
		}
	}
	m.mu.Unlock()
	room := shareOf(m.o.WorkerID, m.live, m.o.Partitions) - held
	m.acquire(ctx, want[:max(0, min(room, len(want)))])
}

// stopRetakes cancels the takes not yet made (Stop).
func (m *Manager) stopRetakes() {
	v := &m.vacant
	v.mu.Lock()
	defer v.mu.Unlock()
	v.done = true
	for p, t := range v.timers {
		t.Stop() // more than once for a timer of several: harmless
		delete(v.timers, p)
	}
}
