package bolt

import (
	"context"
	"time"

	bbolt "go.etcd.io/bbolt"

	"throttler/internal/leaky"
	"throttler/internal/queue"
)

// Enqueue implements queue.Store.
func (s *Store) Enqueue(ctx context.Context, tenant string, newJobs []queue.NewJob) ([]queue.Admission, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	policy := s.policy(tenant)
	out := make([]queue.Admission, len(newJobs))
	var admitted []queue.Job
	var claimedKeys []string

	s.mu.Lock()
	tm, err := s.waitKeysAndLoad(tenant, newJobs)
	if err != nil {
		s.mu.Unlock()
		return nil, err
	}
	now := s.clock.Now()
	pz := tm.rec.Pause
	paused, _ := pz.Paused(now)
	// Decide as if the job arrived when it can first be sent: a job sent at
	// once is late by the time a send takes to start (the commit, the
	// hand-over, the connection), and every job queued behind it inherits
	// that lateness. Scheduling from there keeps the promises true. All in
	// tenant time: a paused tenant's clock stands still.
	arrival := pz.TenantTime(now).Add(s.startLag())
	_, ceiling := s.ceiling(tenant)
	most := policy.MaxCost() // the largest cost that can ever be admitted
	if ceiling != nil {
		for _, w := range ceiling.Windows { // a ceiling spaces, it never refuses: only its windows bound a cost
			most = min(most, w.N)
		}
	}
	inCall := map[string]int{} // idempotency key -> index of its first use in this call
	for i, nj := range newJobs {
		if nj.IdempotencyKey != "" {
			if first, ok := inCall[nj.IdempotencyKey]; ok {
				out[i] = out[first]
				out[i].Duplicate = out[first].Admitted()
				continue
			}
			inCall[nj.IdempotencyKey] = i
			prev, found, err := s.jobByKey(tenant, nj.IdempotencyKey)
			if err != nil {
				// Nothing of this call is admitted (the slots taken so far
				// stay taken: a gap is safe).
				tm.depth -= len(admitted)
				tm.rec.Accepted -= int64(len(admitted))
				s.releaseKeys(claimedKeys)
				s.mu.Unlock()
				return nil, err
			}
			if found {
				out[i] = queue.Admission{Job: prev, Duplicate: true, ExpectedDelay: prev.AdmitDelay, QueueDepth: prev.AdmitDepth, Capacity: policy.Capacity}
				continue
			}
		}
		cost := max(nj.Cost, 1)
		if cost > most {
			out[i] = queue.Admission{Impossible: &queue.ImpossibleError{Tenant: tenant, Reason: queue.ReasonCostTooLarge, Cost: cost, MaxCost: most}, QueueDepth: tm.depth, Capacity: policy.Capacity}
			continue
		}
		d, st, recent := admit(tm.rec, tm.depth, arrival, now, policy, cost)
		if !d.Admitted {
			tm.rec.Rejected++
			tm.dirty = true
			out[i] = queue.Admission{Rejected: queue.Rejection(tenant, policy, d, tm.depth), QueueDepth: tm.depth, Capacity: policy.Capacity}
			continue
		}
		at := queue.DispatchAt(pz, d.Slot, now)
		delay := max(at.Sub(now), queue.CeilingDelay(ceiling, tm.depth))
		if !nj.Deadline.IsZero() && now.Add(delay).After(nj.Deadline) {
			// Worthless by the time it would go: say so now, take nothing.
			out[i] = queue.Admission{Impossible: &queue.ImpossibleError{Tenant: tenant, Reason: queue.ReasonWouldExpire, ExpectedDelay: delay, Deadline: nj.Deadline}, QueueDepth: tm.depth, Capacity: policy.Capacity}
			continue
		}
		tm.rec.TAT = st.TAT
		tm.rec.SetRecent(policy, recent)
		tm.rec.Accepted++
		tm.depth++
		j := queue.Job{
			ID: queue.NewID(now), Tenant: tenant, State: queue.StateQueued, Payload: nj.Payload,
			IdempotencyKey: nj.IdempotencyKey, EnqueuedAt: now, DispatchAt: at, Slot: d.Slot,
			AdmitDelay: delay, AdmitDepth: tm.depth, Prompt: d.Delay == 0 && !paused,
			Deadline: nj.Deadline,
		}
		if cost > 1 {
			j.Cost = cost
		}
		admitted = append(admitted, j)
		out[i] = queue.Admission{Job: j, ExpectedDelay: j.AdmitDelay, QueueDepth: tm.depth, Capacity: policy.Capacity}
		if nj.IdempotencyKey != "" {
			k := string(idemKey(tenant, nj.IdempotencyKey))
			s.idemWait[k] = make(chan struct{})
			claimedKeys = append(claimedKeys, k)
		}
	}
	if len(admitted) > 0 {
		tm.pending++
	}
	s.mu.Unlock()

	if len(admitted) == 0 {
		return out, nil
	}
	err = s.db.Batch(func(tx *bbolt.Tx) error {
		payloads, due, idem := tx.Bucket(bucketPayloads), tx.Bucket(bucketDue), tx.Bucket(bucketIdem)
		for _, j := range admitted {
			if err := putJob(tx, j); err != nil {
				return err
			}
			if err := payloads.Put([]byte(j.ID), j.Payload); err != nil {
				return err
			}
			if err := due.Put(dueKey(j.Slot, j.ID), []byte(tenant)); err != nil {
				return err
			}
			if j.IdempotencyKey != "" {
				if err := idem.Put(idemKey(tenant, j.IdempotencyKey), []byte(j.ID)); err != nil {
					return err
				}
			}
		}
		return s.putTenant(tx, tenant)
	})

	s.mu.Lock()
	tm.pending--
	if err != nil {
		// Nothing was admitted after all. The slots stay taken: a gap in the
		// schedule is safe, a second job in one slot is not.
		tm.depth -= len(admitted)
		tm.rec.Accepted -= int64(len(admitted))
		tm.dirty = true
	}
	var soonest time.Time
	if err == nil {
		// The tenant's pause may have changed since the decision: schedule
		// by the current one.
		for _, j := range admitted {
			e := entryOf(j, queue.RealAt(tm.rec.Pause, j.Slot))
			s.sched.add(e)
			if soonest.IsZero() || e.at.Before(soonest) {
				soonest = e.at
			}
		}
	}
	s.releaseKeys(claimedKeys)
	s.mu.Unlock()
	if err != nil {
		return nil, queue.Unavailable(err)
	}
	s.pokeIfSooner(soonest)
	return out, nil
}

// admit decides one job of cost in the tenant's time (leaky.Decide: the
// rate and every window), with a refusal's queue.Retry-After in real time (it
// includes what is left of a pause). It also refuses a job when depth jobs
// already wait and the bucket could not hold one more. The schedule alone
// would admit one too many while the tenant is paused (the job at the
// frozen "now" looks as if it goes at once, but it waits), and past
// capacity when sends are slower than the tenant's rate (a downstream's
// ceiling shared with others).
func admit(rec queue.TenantRecord, depth int, arrival, now time.Time, p leaky.Policy, cost int) (leaky.Decision, leaky.State, []leaky.Recent) {
	d, st, recent := leaky.Decide(leaky.State{TAT: rec.TAT}, rec.Recent(p), arrival, p, cost, depth)
	room := p.Capacity + p.Burst // waiting, and going at once
	if paused, _ := rec.Pause.Paused(now); paused {
		room = p.Capacity // nothing goes at once: all of them wait
	}
	if d.Admitted && depth >= room {
		d, st = leaky.Decision{RetryAfter: p.Interval}, leaky.State{TAT: rec.TAT}
	}
	if !d.Admitted {
		tnow := rec.Pause.TenantTime(now)
		d.RetryAfter = queue.DispatchAt(rec.Pause, tnow.Add(d.RetryAfter), now).Sub(now)
	}
	return d, st, recent
}

// waitKeysAndLoad waits (s.mu held, released while waiting) until none of
// the call's idempotency keys is being admitted by another call, then
// returns the tenant loaded.
func (s *Store) waitKeysAndLoad(tenant string, jobs []queue.NewJob) (*tenantMem, error) {
	for {
		var busy chan struct{}
		for _, j := range jobs {
			if j.IdempotencyKey == "" {
				continue
			}
			if ch, ok := s.idemWait[string(idemKey(tenant, j.IdempotencyKey))]; ok {
				busy = ch
				break
			}
		}
		if busy == nil {
			return s.loadTenant(tenant)
		}
		s.mu.Unlock()
		<-busy
		s.mu.Lock()
	}
}

func (s *Store) releaseKeys(keys []string) {
	for _, k := range keys {
		close(s.idemWait[k])
		delete(s.idemWait, k)
	}
}

func (s *Store) jobByKey(tenant, key string) (queue.Job, bool, error) {
	var j queue.Job
	var found bool
	err := s.db.View(func(tx *bbolt.Tx) error {
		id := tx.Bucket(bucketIdem).Get(idemKey(tenant, key))
		if id == nil {
			return nil
		}
		var err error
		j, found, err = getJob(tx, string(id), false)
		return err
	})
	if c, ok := s.claims[j.ID]; found && ok {
		j.State, j.Attempts = queue.StateDispatching, c.Attempts
	}
	return j, found, queue.Unavailable(err)
}

// maxStartLag caps how far the measured start of a send moves schedules.
const maxStartLag = 100 * time.Millisecond

// startLag is how long a job sent at once takes to reach the downstream,
// measured (a moving average over prompt first attempts).
func (s *Store) startLag() time.Duration {
	return min(time.Duration(s.promptLag.Load()), maxStartLag)
}

// observeStart feeds the moving average with one prompt first attempt.
func (s *Store) observeStart(j queue.Job) {
	if !j.Prompt || j.Attempts != 1 || j.SentAt.IsZero() {
		return
	}
	sample := max(0, j.SentAt.Sub(j.EnqueuedAt))
	for {
		old := s.promptLag.Load()
		next := old + (int64(sample)-old)/8
		if s.promptLag.CompareAndSwap(old, next) {
			return
		}
	}
}
