package bolt

import (
	"context"

	bbolt "go.etcd.io/bbolt"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/queue"
)

// Pause implements queue.Store.
func (s *Store) Pause(ctx context.Context, tenant string) (queue.TenantStatus, error) {
	return s.hold(tenant, true)
}

// Resume implements queue.Store.
func (s *Store) Resume(ctx context.Context, tenant string) (queue.TenantStatus, error) {
	return s.hold(tenant, false)
}

// hold starts or ends an operator hold, durably: a restart keeps it.
func (s *Store) hold(tenant string, hold bool) (queue.TenantStatus, error) {
	s.mu.Lock()
	tm, err := s.loadTenant(tenant)
	if err != nil {
		s.mu.Unlock()
		return queue.TenantStatus{}, err
	}
	now := s.clock.Now()
	before := tm.rec.Pause
	if hold {
		tm.rec.Pause = before.Hold(now)
		// Jobs admitted while held go one interval apart after it.
		tm.rec.TAT = clock.Later(tm.rec.TAT, tm.rec.Pause.TenantTime(now).Add(s.policy(tenant).Tolerance()))
	} else {
		tm.rec.Pause = before.Resume(now)
	}
	set := tm.rec.Pause
	if set != before {
		s.sched.retime(tenant, set)
	}
	tm.pending++
	s.mu.Unlock()

	if set != before {
		err = s.commit(func(tx *bbolt.Tx) error { return s.putTenant(tx, tenant) })
	}
	s.mu.Lock()
	tm.pending--
	if err != nil && tm.rec.Pause == set {
		// Not durable, so not done: the caller is told and may try again.
		tm.rec.Pause = before
		s.sched.retime(tenant, before)
	}
	st := s.status(tenant, tm, s.clock.Now())
	s.mu.Unlock()
	if err != nil {
		return queue.TenantStatus{}, queue.Unavailable(err)
	}
	if !hold {
		s.poke()
	}
	return st, nil
}
