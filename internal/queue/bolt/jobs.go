package bolt

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/rules"
)

// Job implements queue.Store.
func (s *Store) Job(ctx context.Context, id string) (queue.Job, error) {
	if !queue.ValidID(id) {
		return queue.Job{}, queue.ErrNotFound
	}
	j, found, err := s.viewJob(id)
	if err != nil {
		return queue.Job{}, queue.Unavailable(err)
	}
	if !found {
		return queue.Job{}, queue.ErrNotFound
	}
	s.mu.Lock()
	if c, ok := s.claims[id]; ok {
		j.State, j.Attempts, j.DispatchAt = queue.StateDispatching, c.Attempts, c.DispatchAt
	} else if j.State.Waiting() {
		s.placeWaiting(&j)
	}
	s.mu.Unlock()
	return j, nil
}

// placeWaiting gives a waiting job its place as the schedule has it (s.mu
// held): a pause moves its dispatch time, and a restart may have moved its
// slot before its record was written (writeRespaced). Asked only of a job
// whose record says it waits: one that does not would have its tenant's
// line searched through.
func (s *Store) placeWaiting(j *queue.Job) {
	e, ok := s.sched.get(j.Tenant, j.EffectiveSlot(), j.ID)
	if !ok {
		return
	}
	j.Slot = e.slot
	if tm, ok := s.tenants[e.tenant]; ok {
		j.DispatchAt = rules.DispatchAt(tm.rec.Pause, e.slot, s.clock.Now())
	}
}

// viewJob is getShown in a read transaction of its own, or the admitted
// job from memory while only the write-ahead log has it (no answer yet).
func (s *Store) viewJob(id string) (j queue.Job, found bool, err error) {
	s.mu.Lock()
	j, ok := s.loggedJob(id)
	s.mu.Unlock()
	if ok {
		j.Payload = slices.Clone(j.Payload)
		return j, true, nil
	}
	err = s.db.View(func(tx *bbolt.Tx) error {
		j, found, err = getShown(tx, id)
		return err
	})
	return j, found, err
}

// viewStored is getJob in a read transaction of its own: the bbolt file's
// record only.
func (s *Store) viewStored(id string, withPayload bool) (j queue.Job, found bool, err error) {
	err = s.db.View(func(tx *bbolt.Tx) error {
		j, found, err = getJob(tx, id, withPayload)
		return err
	})
	return j, found, err
}

// Cancel implements queue.Store.
func (s *Store) Cancel(ctx context.Context, id string) (queue.Job, error) {
	if !queue.ValidID(id) {
		return queue.Job{}, queue.ErrNotFound
	}
	// Its tenant and slot say where the schedule keeps it.
	s.mu.Lock()
	seen, found := s.loggedJob(id)
	s.mu.Unlock()
	var err error
	if !found {
		seen, found, err = s.viewStored(id, false)
	}
	if err != nil {
		return queue.Job{}, queue.Unavailable(err)
	}
	if !found {
		return queue.Job{}, queue.ErrNotFound
	}
	// Take the job out of the schedule first, so the dispatcher cannot hand
	// it over meanwhile; put it back if the cancel does not happen.
	s.mu.Lock()
	if _, ok := s.claims[id]; ok {
		s.mu.Unlock()
		return queue.Job{}, &queue.StateError{ID: id, State: queue.StateDispatching, Op: "cancel"}
	}
	var entry dueEntry
	var waiting bool
	if seen.State.Waiting() { // else the commit below says why not, and no line is searched
		entry, waiting = s.sched.remove(seen.Tenant, seen.EffectiveSlot(), id)
	}
	s.mu.Unlock()

	var j queue.Job
	var wasScheduled bool
	err = s.commit(func(tx *bbolt.Tx) error {
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
		if waiting {
			j.Slot = entry.slot // the schedule's: a restart may have moved it
		}
		if err := delWaiting(tx, j.ID); err != nil {
			return err
		}
		wasScheduled = j.State == queue.StateScheduled
		j.State = queue.StateCancelled
		j.FinishedAt = s.clock.Now()
		if err := putJob(tx, j); err != nil {
			return err
		}
		if err := oweCallback(tx, j, j.FinishedAt); err != nil {
			return err
		}
		return tx.Bucket(bucketDone).Put(dueKey(j.FinishedAt, j.ID), nil)
	})
	s.mu.Lock()
	if err == nil {
		if tm, ok := s.tenants[j.Tenant]; ok {
			tm.leave(wasScheduled)
			tm.rec.CountEnd(queue.StateCancelled)
			tm.dirty = true
			// The last job of the schedule gives its place back, so that
			// cancelling does not leave the queue looking fuller than it is.
			// (Only then: a place in the middle is already spaced around.)
			// A booked retry is not in that line: it gives back its
			// booking only.
			p := s.policy(j.Tenant)
			if tm.rec.IsBooked(j.ID) {
				tm.rec.Unbook(j.ID)
			} else if p.Burst == 1 && len(p.Windows) == 0 && j.EffectiveSlot().Add(time.Duration(j.EffectiveCost())*p.Interval).Equal(tm.rec.TAT) {
				tm.rec.TAT = j.EffectiveSlot()
			}
		}
	} else if waiting {
		s.readd(entry) // not cancelled after all: it waits as before
	}
	s.mu.Unlock()
	if err == nil {
		s.finishes.Notify(j.ID)
	}
	var se *queue.StateError
	if errors.Is(err, queue.ErrNotFound) || errors.As(err, &se) {
		return queue.Job{}, err
	}
	if err != nil {
		return queue.Job{}, queue.Unavailable(err)
	}
	return j, nil
}

// Retry implements queue.Store.
func (s *Store) Retry(ctx context.Context, id string) (queue.Admission, error) {
	if !queue.ValidID(id) {
		return queue.Admission{}, queue.ErrNotFound
	}
	s.mu.Lock()
	failed, tm, err := s.failedJob(id)
	if err != nil {
		s.mu.Unlock()
		return queue.Admission{}, err
	}
	c := s.newCall(failed.Tenant, tm, 1)
	if cost, most := failed.EffectiveCost(), rules.MaxCost(c.policy, c.ceiling); cost > most {
		// A reload made the bucket too small for it: it would be refused
		// for ever, so say so, as Enqueue does.
		s.mu.Unlock()
		return queue.CostTooLarge(c.tenant, cost, most, c.policy.Capacity), nil
	}
	d := s.admit(c, failed.EffectiveCost(), failed.Deadline, true, time.Time{}, "")
	switch d.Verdict {
	case rules.Refused:
		tm.dirty = true
		s.mu.Unlock()
		return queue.Admission{Rejected: queue.Rejection(c.tenant, c.policy, d.RetryAfter, tm.depth), QueueDepth: tm.depth, Capacity: c.policy.Capacity, AsOf: c.asOf}, nil
	case rules.WouldExpire:
		s.mu.Unlock()
		return queue.Admission{Impossible: &queue.ImpossibleError{Tenant: c.tenant, Reason: queue.ReasonWouldExpire, ExpectedDelay: d.Delay, Deadline: failed.Deadline}, QueueDepth: tm.depth, Capacity: c.policy.Capacity}, nil
	}
	delay := d.Delay
	tm.depth++
	tm.pending++
	j := failed
	// Sent again as an ordinary job: its not_before, if it had one, is spent.
	j.State, j.Attempts, j.Failures, j.FinishedAt, j.NotBefore = queue.StateQueued, 0, 0, time.Time{}, time.Time{}
	j.Slot, j.DispatchAt = d.Slot, d.DispatchAt
	j.Prompt = d.Prompt
	s.claims[id] = queue.Job{ID: id, Tenant: j.Tenant} // held until durable: no second retry, no dispatch
	s.mu.Unlock()

	err = s.commit(func(tx *bbolt.Tx) error { return s.putRetried(tx, failed, j) })
	s.mu.Lock()
	tm.pending--
	s.unclaim(id)
	e := entryOf(j, rules.RealAt(tm.rec.Pause, j.Slot))
	if err != nil {
		tm.depth--
	} else {
		s.sched.add(e)
	}
	depth := tm.depth
	s.mu.Unlock()
	if errors.Is(err, queue.ErrNotFound) {
		return queue.Admission{}, err
	}
	if err != nil {
		return queue.Admission{}, queue.Unavailable(err)
	}
	s.pokeIfSooner(e.wakeBy())
	return queue.Admission{Job: j, ExpectedDelay: delay, QueueDepth: depth, Capacity: c.policy.Capacity, AsOf: c.asOf}, nil
}

// failedJob reads a job to retry and its tenant (s.mu held): a StateError
// unless it is failed and no other call holds it.
func (s *Store) failedJob(id string) (queue.Job, *tenantMem, error) {
	if _, held := s.claims[id]; held {
		return queue.Job{}, nil, &queue.StateError{ID: id, State: queue.StateDispatching, Op: "retry"}
	}
	j, found := s.loggedJob(id) // waiting: not failed
	var err error
	if !found {
		j, found, err = s.viewStored(id, false)
	}
	switch {
	case err != nil:
		return j, nil, queue.Unavailable(err)
	case !found:
		return j, nil, queue.ErrNotFound
	case j.State != queue.StateFailed:
		return j, nil, &queue.StateError{ID: id, State: j.State, Op: "retry"}
	}
	tm, err := s.loadTenant(j.Tenant)
	return j, tm, err
}

// putRetried writes a failed job sent again as j, if it is still there and
// still failed (the reaper may have removed it since it was read).
func (s *Store) putRetried(tx *bbolt.Tx, failed, j queue.Job) error {
	if cur, ok, err := getJob(tx, j.ID, false); err != nil {
		return err
	} else if !ok || cur.State != queue.StateFailed {
		return queue.ErrNotFound
	}
	if err := putJob(tx, j); err != nil {
		return err
	}
	if err := tx.Bucket(bucketDone).Delete(dueKey(failed.FinishedAt, j.ID)); err != nil {
		return err
	}
	if err := tx.Bucket(bucketFailed).Delete(failedKey(failed)); err != nil {
		return err
	}
	if err := putWaiting(tx, j); err != nil {
		return err
	}
	return s.putTenant(tx, j.Tenant)
}

// Failed implements queue.Store.
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
				if j.Response, err = getResponse(tx, id); err != nil {
					return err
				}
				if j.CallbackStatus, err = getCallback(tx, id); err != nil {
					return err
				}
				out = append(out, j)
			}
		}
		return nil
	})
	return out, queue.Unavailable(err)
}
