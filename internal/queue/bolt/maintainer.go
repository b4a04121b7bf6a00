package bolt

import (
	"context"
	"time"

	bbolt "go.etcd.io/bbolt"

	"throttler/internal/leaky"
	"throttler/internal/startstop"
)

// maintainEvery is how often tenant counters are saved and idle tenants
// forgotten, and how often finished jobs past retention are removed.
const maintainEvery = 10 * time.Second

// newMaintainer saves tenant counters (changed in memory by refusals and
// outcomes) and forgets idle tenants, so memory grows with active tenants.
func (s *Store) newMaintainer() *startstop.Periodic {
	return &startstop.Periodic{Name: "maintainer", Every: maintainEvery, Run: func(context.Context) {
		if err := s.flushDirty(); err != nil {
			s.log.Error("cannot save tenant counters", "err", err)
		}
		s.evictIdle()
	}}
}

func (s *Store) flushDirty() error {
	// Clean before writing: a change made meanwhile marks the tenant dirty
	// again and is written next time; a failed write marks them all again.
	s.mu.Lock()
	var names []string
	for name, tm := range s.tenants {
		if tm.dirty {
			names = append(names, name)
			tm.dirty = false
		}
	}
	s.mu.Unlock()
	if len(names) == 0 {
		return nil
	}
	err := s.db.Update(func(tx *bbolt.Tx) error {
		for _, n := range names {
			if err := s.putTenant(tx, n); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		s.mu.Lock()
		for _, n := range names {
			if tm, ok := s.tenants[n]; ok {
				tm.dirty = true
			}
		}
		s.mu.Unlock()
	}
	return err
}

// evictIdle drops tenants whose state no longer matters from memory (their
// record stays on disk): memory grows with active tenants only.
func (s *Store) evictIdle() {
	now := s.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, tm := range s.tenants {
		paused, _ := tm.rec.Pause.Paused(now)
		if tm.depth == 0 && tm.inFlight == 0 && tm.pending == 0 && !tm.dirty && !paused && leaky.Idle(leaky.State{TAT: tm.rec.TAT}, tm.rec.Pause.TenantTime(now)) {
			delete(s.tenants, name)
		}
	}
}
