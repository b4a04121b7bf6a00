package bolt

import (
	"bytes"
	"context"
	"errors"
	"time"

	bbolt "go.etcd.io/bbolt"

	"throttler/internal/queue"
)

// queue.Job implements queue.Store.
func (s *Store) Job(ctx context.Context, id string) (queue.Job, error) {
	if !queue.ValidID(id) {
		return queue.Job{}, queue.ErrNotFound
	}
	var j queue.Job
	var found bool
	err := s.db.View(func(tx *bbolt.Tx) error {
		var err error
		j, found, err = getJob(tx, id, true)
		return err
	})
	if err != nil {
		return queue.Job{}, queue.Unavailable(err)
	}
	if !found {
		return queue.Job{}, queue.ErrNotFound
	}
	s.mu.Lock()
	if c, ok := s.claims[id]; ok {
		j.State, j.Attempts, j.DispatchAt = queue.StateDispatching, c.Attempts, c.DispatchAt
	} else if e, ok := s.sched.waiting[id]; ok {
		if tm, ok := s.tenants[e.tenant]; ok {
			j.DispatchAt = queue.DispatchAt(tm.rec.Pause, e.slot, s.clock.Now()) // pauses move it
		}
	}
	s.mu.Unlock()
	return j, nil
}

// Cancel implements queue.Store.
func (s *Store) Cancel(ctx context.Context, id string) (queue.Job, error) {
	if !queue.ValidID(id) {
		return queue.Job{}, queue.ErrNotFound
	}
	// Take the job out of the schedule first, so the dispatcher cannot hand
	// it over meanwhile; put it back if the cancel does not happen.
	s.mu.Lock()
	if _, ok := s.claims[id]; ok {
		s.mu.Unlock()
		return queue.Job{}, &queue.StateError{ID: id, State: queue.StateDispatching, Op: "cancel"}
	}
	entry, waiting := s.sched.remove(id)
	s.mu.Unlock()

	var j queue.Job
	err := s.db.Batch(func(tx *bbolt.Tx) error {
		var found bool
		var err error
		j, found, err = getJob(tx, id, false)
		if err != nil {
			return err
		}
		if !found {
			return queue.ErrNotFound
		}
		if !j.State.Waiting() {
			return &queue.StateError{ID: id, State: j.State, Op: "cancel"}
		}
		if err := tx.Bucket(bucketDue).Delete(dueKey(j.EffectiveSlot(), j.ID)); err != nil {
			return err
		}
		j.State = queue.StateCancelled
		j.FinishedAt = s.clock.Now()
		if err := putJob(tx, j); err != nil {
			return err
		}
		return tx.Bucket(bucketDone).Put(dueKey(j.FinishedAt, j.ID), nil)
	})
	s.mu.Lock()
	if err == nil {
		if tm, ok := s.tenants[j.Tenant]; ok {
			tm.depth--
			tm.rec.Cancelled++
			tm.dirty = true
			// The last job of the schedule gives its place back, so that
			// cancelling does not leave the queue looking fuller than it is.
			// (Only then: a place in the middle is already spaced around.)
			p := s.policy(j.Tenant)
			if p.Burst == 1 && len(p.Windows) == 0 && j.EffectiveSlot().Add(time.Duration(j.EffectiveCost())*p.Interval).Equal(tm.rec.TAT) {
				tm.rec.TAT = j.EffectiveSlot()
			}
		}
	} else if waiting {
		s.readd(entry) // not cancelled after all: it waits as before
	}
	s.mu.Unlock()
	var se *queue.StateError
	if errors.Is(err, queue.ErrNotFound) || errors.As(err, &se) {
		return queue.Job{}, err
	}
	if err != nil {
		return queue.Job{}, queue.Unavailable(err)
	}
	return j, nil
}

// queue.Retry implements queue.Store.
func (s *Store) Retry(ctx context.Context, id string) (queue.Admission, error) {
	if !queue.ValidID(id) {
		return queue.Admission{}, queue.ErrNotFound
	}
	s.mu.Lock()
	if _, held := s.claims[id]; held {
		s.mu.Unlock()
		return queue.Admission{}, &queue.StateError{ID: id, State: queue.StateDispatching, Op: "retry"}
	}
	var j queue.Job
	var found bool
	err := s.db.View(func(tx *bbolt.Tx) error {
		var err error
		j, found, err = getJob(tx, id, false)
		return err
	})
	switch {
	case err != nil:
		s.mu.Unlock()
		return queue.Admission{}, queue.Unavailable(err)
	case !found:
		s.mu.Unlock()
		return queue.Admission{}, queue.ErrNotFound
	case j.State != queue.StateFailed:
		s.mu.Unlock()
		return queue.Admission{}, &queue.StateError{ID: id, State: j.State, Op: "retry"}
	}
	tm, err := s.loadTenant(j.Tenant)
	if err != nil {
		s.mu.Unlock()
		return queue.Admission{}, err
	}
	policy := s.policy(j.Tenant)
	now := s.clock.Now()
	pz := tm.rec.Pause
	d, st, recent := admit(tm.rec, tm.depth, pz.TenantTime(now).Add(s.startLag()), now, policy, j.EffectiveCost())
	if d.Admitted && !j.Deadline.IsZero() && queue.DispatchAt(pz, d.Slot, now).After(j.Deadline) {
		s.mu.Unlock()
		delay := queue.DispatchAt(pz, d.Slot, now).Sub(now)
		return queue.Admission{Impossible: &queue.ImpossibleError{Tenant: j.Tenant, Reason: queue.ReasonWouldExpire, ExpectedDelay: delay, Deadline: j.Deadline}, QueueDepth: tm.depth, Capacity: policy.Capacity}, nil
	}
	if !d.Admitted {
		tm.rec.Rejected++
		tm.dirty = true
		depth := tm.depth
		s.mu.Unlock()
		return queue.Admission{Rejected: queue.Rejection(j.Tenant, policy, d, depth), QueueDepth: depth, Capacity: policy.Capacity}, nil
	}
	failed := j
	tm.rec.TAT = st.TAT
	tm.rec.SetRecent(policy, recent)
	tm.depth++
	tm.pending++
	j.State, j.Attempts, j.Failures, j.FinishedAt = queue.StateQueued, 0, 0, time.Time{}
	j.Slot, j.DispatchAt = d.Slot, queue.DispatchAt(pz, d.Slot, now)
	paused, _ := pz.Paused(now)
	j.Prompt = d.Delay == 0 && !paused
	s.claims[id] = queue.Job{ID: id, Tenant: j.Tenant} // held until durable: no second retry, no dispatch
	s.mu.Unlock()

	err = s.db.Batch(func(tx *bbolt.Tx) error {
		// Still there and still failed? (The reaper may have removed it
		// since it was read.)
		if cur, ok, err := getJob(tx, id, false); err != nil {
			return err
		} else if !ok || cur.State != queue.StateFailed {
			return queue.ErrNotFound
		}
		if err := putJob(tx, j); err != nil {
			return err
		}
		if err := tx.Bucket(bucketDone).Delete(dueKey(failed.FinishedAt, id)); err != nil {
			return err
		}
		if err := tx.Bucket(bucketFailed).Delete(failedKey(failed)); err != nil {
			return err
		}
		if err := tx.Bucket(bucketDue).Put(dueKey(j.Slot, id), []byte(j.Tenant)); err != nil {
			return err
		}
		return s.putTenant(tx, j.Tenant)
	})
	s.mu.Lock()
	tm.pending--
	delete(s.claims, id)
	at := queue.RealAt(tm.rec.Pause, j.Slot)
	if err != nil {
		tm.depth--
	} else {
		s.sched.add(entryOf(j, at))
	}
	depth := tm.depth
	s.mu.Unlock()
	if errors.Is(err, queue.ErrNotFound) {
		return queue.Admission{}, err
	}
	if err != nil {
		return queue.Admission{}, queue.Unavailable(err)
	}
	s.pokeIfSooner(at)
	return queue.Admission{Job: j, ExpectedDelay: j.DispatchAt.Sub(now), QueueDepth: depth, Capacity: policy.Capacity}, nil
}

// queue.Failed implements queue.Store.
func (s *Store) Failed(ctx context.Context, tenant string, limit int) ([]queue.Job, error) {
	var out []queue.Job
	prefix := append([]byte(tenant), 0)
	err := s.db.View(func(tx *bbolt.Tx) error {
		c := tx.Bucket(bucketFailed).Cursor()
		for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix) && (limit <= 0 || len(out) < limit); k, _ = c.Next() {
			id := string(k[len(prefix)+8:])
			j, ok, err := getJob(tx, id, false)
			if err != nil {
				return err
			}
			if ok && j.State == queue.StateFailed {
				out = append(out, j)
			}
		}
		return nil
	})
	return out, queue.Unavailable(err)
}
