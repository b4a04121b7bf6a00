package bolt

import (
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/rules"
)

// giveBackCeiling returns the ceiling's window places a claimed job took and
// did not use (nothing was sent). s.mu held.
func (s *Store) giveBackCeiling(j queue.Job) {
	ds, c := s.ceiling(j.Tenant)
	if c == nil || len(c.Windows) == 0 {
		return
	}
	if q := s.fair[ds]; q != nil {
		q.unuse(j.DispatchAt, j.EffectiveCost())
	}
}

// pauseCeiling stops a tenant's downstream ceiling until until (s.mu
// held): no tenant of it is handed a slot sooner. Saved with the outcome.
func (s *Store) pauseCeiling(tenant string, until time.Time) {
	ds, c := s.ceiling(tenant)
	if c == nil {
		return
	}
	q := s.fairQueue(ds, *c)
	if until.After(q.pausedUntil) {
		q.pausedUntil = until
		q.lane.TAT = clock.Later(q.lane.TAT, until.Add(c.Tolerance()))
		q.version++
	}
}

// fairQueue returns a downstream's fair queue, made (and its saved state
// read) if needed. s.mu held.
func (s *Store) fairQueue(ds string, ceiling leaky.Policy) *fairQueue {
	q := s.fair[ds]
	if q == nil {
		q = newFairQueue(ceiling)
		q.lane.Recent, q.pausedUntil = s.loadCeiling(ds, ceiling)
		q.lane.TAT = q.pausedUntil.Add(ceiling.Tolerance())
		if !s.fairStarted[ds] && !s.cleanStart {
			// A send may have used the ceiling just before a crash.
			q.lane.TAT = clock.Later(q.lane.TAT, s.clock.Now().Add(ceiling.Interval))
		}
		s.fairStarted[ds] = true
		s.fair[ds] = q
	}
	q.policy = ceiling // config can change it
	return q
}

// ceilingKey is where a downstream ceiling's window bookkeeping is kept.
func ceilingKey(ds string) []byte { return []byte("ceiling-windows:" + ds) }

// ceilingState is what of a ceiling is kept on disk: a vendor's daily cap
// and its pushback must survive a restart.
type ceilingState struct {
	Recent      map[string][]int64 `json:"recent,omitempty"` // as a tenant's windows
	PausedUntil time.Time          `json:"paused_until,omitzero"`
}

// loadCeiling reads a ceiling's saved state (s.mu held).
func (s *Store) loadCeiling(ds string, p leaky.Policy) ([]leaky.Recent, time.Time) {
	var st ceilingState
	err := s.db.View(func(tx *bbolt.Tx) error {
		_, err := getJSON(tx.Bucket(bucketMeta), ceilingKey(ds), &st)
		return err
	})
	if err != nil {
		s.log.Error("cannot read a ceiling's saved state; starting it afresh", "downstream", ds, "err", err)
	}
	return rules.Record{Windows: st.Recent}.Recent(p), st.PausedUntil
}

// saveCeilingWindows writes the window bookkeeping of ceilings that changed
// (with the outcomes of the sends that changed it). It returns what to mark
// saved once the transaction commits.
func (s *Store) saveCeilingWindows(tx *bbolt.Tx) (func(), error) {
	s.mu.Lock()
	type save struct {
		q       *fairQueue
		key     []byte
		state   ceilingState
		version int
	}
	var saves []save
	for ds, q := range s.fair {
		if q.saved != q.version {
			var rec rules.Record
			if len(q.lane.Recent) == len(q.policy.Windows) {
				rec.SetRecent(q.policy, q.lane.Recent)
			}
			saves = append(saves, save{q, ceilingKey(ds), ceilingState{Recent: rec.Windows, PausedUntil: q.pausedUntil}, q.version})
		}
	}
	s.mu.Unlock()
	for _, sv := range saves {
		if err := putJSON(tx.Bucket(bucketMeta), sv.key, sv.state); err != nil {
			return nil, err
		}
	}
	return func() {
		for _, sv := range saves {
			sv.q.saved = max(sv.q.saved, sv.version) // s.mu held by the caller
		}
	}, nil
}
