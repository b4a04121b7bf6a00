package owner

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/throttler-dev/throttler/internal/luascript"
)

// renew is the renewer's pass (every Renew): one renew.lua per partition
// held, pipelined, each by compare. A renewal that succeeds moves the
// tenure's deadline to Lease-Margin after it was sent.
func (m *Manager) renew(stop context.Context) {
	type item struct {
		p     int
		epoch int64
	}
	var items []item
	m.mu.Lock()
	for p, t := range m.held {
		items = append(items, item{p, t.epoch})
	}
	m.mu.Unlock()
	if len(items) == 0 {
		return
	}
	calls := make([]luascript.Call, len(items))
	for i, it := range items {
		calls[i] = luascript.Call{Keys: []string{leaseKey(it.p)}, Args: []any{token(m.o.WorkerID, it.epoch), ms(m.o.Lease)}}
	}
	// No renewal may outlast the next: a hung one must not hold the
	// others back (the deadlines do not wait for it either).
	ctx, cancel := context.WithTimeout(stop, m.o.Renew)
	defer cancel()
	sent := time.Now()
	reps, errs := luascript.RunEachInto[renewReply](ctx, renewScript, m.rdb, calls)

	m.cbMu.Lock()
	defer m.cbMu.Unlock()
	var late, refused []int
	var failed error
	m.mu.Lock()
	now := time.Now()
	for i, it := range items {
		t := m.held[it.p]
		switch {
		case t == nil || t.epoch != it.epoch:
			// released or lost meanwhile
		case !now.Before(t.deadline):
			late = append(late, it.p) // too late, whatever Redis said
		case errs[i] != nil:
			failed = errs[i] // the watchdog ends it at its deadline unless a renewal gets through
		case reps[i].OK:
			t.deadline = maxTime(t.deadline, sent.Add(m.o.Lease-m.o.Margin))
		default:
			refused = append(refused, it.p)
		}
	}
	for _, p := range slices.Concat(late, refused) {
		delete(m.held, p)
	}
	m.mu.Unlock()
	if stop.Err() == nil {
		m.trouble.report(m.log, "renew the partition leases", failed)
	}
	m.announceLost(late, "no renewal got through in time (Lease-Margin since the last)")
	m.announceLost(refused, "Redis refused its renewal: the lease is not this worker's any more (it lapsed, or Redis lost it)")
}

// announceLost tells the user of partitions lost (cbMu held).
func (m *Manager) announceLost(lost []int, why string) {
	for _, p := range lost {
		m.log.Warn("lost a partition: "+why, "partition", p)
		m.o.Lost(p)
	}
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// watch ends each tenure at its deadline, whether or not the renewer is
// stuck on an unreachable Redis: from a timer set to the next deadline.
// When ctx ends, it ends every tenure left (after Stop there is none: a
// cancelled Start context abandons them).
func (m *Manager) watch(ctx context.Context) {
	defer close(m.watchDone)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		timer.Reset(m.untilNextDeadline())
		select {
		case <-ctx.Done():
			m.expire(true)
			return
		case <-m.poke:
		case <-timer.C:
			if !m.hooks.blind.Load() {
				m.expire(false)
			}
		}
	}
}

// untilNextDeadline is how long until the earliest deadline held.
func (m *Manager) untilNextDeadline() time.Duration {
	if m.hooks.blind.Load() {
		return 5 * time.Millisecond
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var next time.Time
	for _, t := range m.held {
		if next.IsZero() || t.deadline.Before(next) {
			next = t.deadline
		}
	}
	if next.IsZero() {
		return time.Hour
	}
	return max(time.Until(next), 0)
}

// expire ends the tenures whose deadline has come (all: every one).
func (m *Manager) expire(all bool) {
	m.cbMu.Lock()
	defer m.cbMu.Unlock()
	var lost []int
	m.mu.Lock()
	now := time.Now()
	for p, t := range m.held {
		if all || !now.Before(t.deadline) {
			lost = append(lost, p)
			delete(m.held, p)
		}
	}
	m.mu.Unlock()
	why := "no renewal got through in time (Lease-Margin since the last)"
	if all {
		why = "the worker's context ended (abandoned without release)"
	}
	m.announceLost(lost, why)
}

// pokeWatch has the watchdog look at the deadlines again (a new one may
// be the earliest).
func (m *Manager) pokeWatch() {
	select {
	case m.poke <- struct{}{}:
	default:
	}
}

// troubles logs when a part starts failing to reach Redis and when it
// reaches it again: state changes, not every pass.
type troubles struct {
	mu      sync.Mutex
	failing map[string]bool
}

func (tr *troubles) report(log *slog.Logger, part string, err error) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.failing == nil {
		tr.failing = map[string]bool{}
	}
	switch {
	case err != nil && !tr.failing[part]:
		log.Warn("cannot "+part, "err", err)
	case err == nil && tr.failing[part]:
		log.Info("can " + part + " again")
	}
	tr.failing[part] = err != nil
}
