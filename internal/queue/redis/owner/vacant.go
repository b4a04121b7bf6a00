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
	timers map[int]*time.Timer // by partition: a take at its vacancy's end
	done   bool
}

// passMu serializes the balancer's passes and the takes at a vacancy's
// end (both read and change what the balancer saw last).
func (m *Manager) lockPass()   { m.passMu.Lock() }
func (m *Manager) unlockPass() { m.passMu.Unlock() }

// retakeAt takes partition p, if this worker is still under its share,
// once its vacancy ends at ends (this worker's clock; a little after, so
// that Redis has expired it). A take already set for p stands.
func (m *Manager) retakeAt(p int, ends time.Time) {
	v := &m.vacant
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.done || v.timers[p] != nil {
		return
	}
	if v.timers == nil {
		v.timers = map[int]*time.Timer{}
	}
	v.timers[p] = time.AfterFunc(time.Until(ends)+time.Millisecond, func() {
		v.mu.Lock()
		delete(v.timers, p)
		done := v.done
		v.mu.Unlock()
		if !done && !m.hooks.frozen.Load() {
			m.takeVacated(m.ctx, p)
		}
	})
}

// takeVacated is a balancer's pass narrowed to partition p: taken if this
// worker holds less than its share of the live workers it saw last.
func (m *Manager) takeVacated(ctx context.Context, p int) {
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
	_, mine := m.held[p]
	m.mu.Unlock()
	if mine || held >= shareOf(m.o.WorkerID, m.live, m.o.Partitions) {
		return
	}
	m.acquire(ctx, []int{p})
}

// stopRetakes cancels the takes not yet made (Stop).
func (m *Manager) stopRetakes() {
	v := &m.vacant
	v.mu.Lock()
	defer v.mu.Unlock()
	v.done = true
	for p, t := range v.timers {
		t.Stop()
		delete(v.timers, p)
	}
}
