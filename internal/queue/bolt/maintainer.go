package bolt

import (
	"context"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/throttler-dev/throttler/internal/rules"
	"github.com/throttler-dev/throttler/internal/startstop"
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

// flushDirty writes the records of dirty tenants in place and empties the
// tenant log (logTenant), in one transaction.
func (s *Store) flushDirty() error {
	s.mu.Lock()
	dirty := false
	for _, tm := range s.tenants {
		dirty = dirty || tm.dirty
	}
	s.mu.Unlock()
	if !dirty {
		return nil
	}
	var names []string
	err := s.update(func(tx *bbolt.Tx) error {
		// Clean before writing, inside the transaction (no other write
		// runs meanwhile, so every tenant in the log is dirty now): a change
		// made meanwhile marks the tenant dirty again and is written next
		// time; a failed write marks them all again.
		type rec struct {
			name string
			rec  rules.Record
		}
		var recs []rec
		names = names[:0]
		s.mu.Lock()
		for name, tm := range s.tenants {
			if tm.dirty {
				names = append(names, name)
				recs = append(recs, rec{name, tm.rec})
				tm.dirty = false
			}
		}
		s.mu.Unlock()
		for _, r := range recs {
			if err := putTenantRecord(tx, r.name, r.rec); err != nil {
				return err
			}
		}
		return resetTenantLog(tx)
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
		if tm.depth == 0 && tm.scheduled == 0 && tm.inFlight == 0 && tm.pending == 0 && !tm.dirty && tm.rec.Quiet(now) {
			delete(s.tenants, name)
		}
	}
}
