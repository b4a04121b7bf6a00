package queue

import (
	"bytes"
	"cmp"
	"container/heap"
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"

	"throttler/internal/leaky"
)

// claimEvery is the longest a due job waits to be claimed once within the
// lead; it lets one pass over the due index take every job due in that time.
const claimEvery = 10 * time.Millisecond

// pokeIfSooner wakes the dispatcher if a job due at slot is due before it
// planned to wake.
func (s *BoltStore) pokeIfSooner(slot time.Time) {
	if slot.Add(-DefaultLead).UnixNano() < s.nextWake.Load() {
		s.poke()
	}
}

// poke wakes the dispatcher.
func (s *BoltStore) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Job implements Store.
func (s *BoltStore) Job(ctx context.Context, id string) (Job, error) {
	if !validID(id) {
		return Job{}, ErrNotFound
	}
	var j Job
	var found bool
	err := s.db.View(func(tx *bolt.Tx) error {
		var err error
		j, found, err = getJob(tx, id, true)
		return err
	})
	if err != nil {
		return Job{}, unavailable(err)
	}
	if !found {
		return Job{}, ErrNotFound
	}
	s.mu.Lock()
	if c, ok := s.claims[id]; ok {
		j.State, j.Attempts, j.DispatchAt = StateDispatching, c.Attempts, c.DispatchAt
	} else if e, ok := s.sched.waiting[id]; ok {
		if tm, ok := s.tenants[e.tenant]; ok {
			j.DispatchAt = dispatchAt(tm.rec.Pause, e.slot, s.clock.Now()) // pauses move it
		}
	}
	s.mu.Unlock()
	return j, nil
}

// Cancel implements Store.
func (s *BoltStore) Cancel(ctx context.Context, id string) (Job, error) {
	if !validID(id) {
		return Job{}, ErrNotFound
	}
	// Take the job out of the schedule first, so the dispatcher cannot hand
	// it over meanwhile; put it back if the cancel does not happen.
	s.mu.Lock()
	if _, ok := s.claims[id]; ok {
		s.mu.Unlock()
		return Job{}, &StateError{ID: id, State: StateDispatching, Op: "cancel"}
	}
	entry, waiting := s.sched.remove(id)
	s.mu.Unlock()

	var j Job
	err := s.db.Batch(func(tx *bolt.Tx) error {
		var found bool
		var err error
		j, found, err = getJob(tx, id, false)
		if err != nil {
			return err
		}
		if !found {
			return ErrNotFound
		}
		if !j.State.Waiting() {
			return &StateError{ID: id, State: j.State, Op: "cancel"}
		}
		if err := tx.Bucket(bucketDue).Delete(dueKey(j.slot(), j.ID)); err != nil {
			return err
		}
		j.State = StateCancelled
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
			if p.Burst == 1 && len(p.Windows) == 0 && j.slot().Add(time.Duration(j.cost())*p.Interval).Equal(tm.rec.TAT) {
				tm.rec.TAT = j.slot()
			}
		}
	} else if waiting {
		s.readd(entry) // not cancelled after all: it waits as before
	}
	s.mu.Unlock()
	var se *StateError
	if errors.Is(err, ErrNotFound) || errors.As(err, &se) {
		return Job{}, err
	}
	if err != nil {
		return Job{}, unavailable(err)
	}
	return j, nil
}

// claimDue hands over up to limit waiting jobs due at or before horizon,
// earliest first: they leave the schedule and are held in memory (nothing is
// written), with their attempt counted in the job handed over. It also
// returns the jobs whose deadline passed before they could go (out of the
// schedule, to be expired), and the time of the next waiting job or
// deadline (zero if none).
//
// Lock order: s.mu is never taken inside a read transaction. A commit that
// grows the file waits for every reader to finish, and code that holds s.mu
// opens read transactions: a reader waiting for s.mu would deadlock both.
func (s *BoltStore) claimDue(horizon time.Time, limit int) ([]Job, []dueEntry, time.Time, error) {
	var chosen []dueEntry
	var next time.Time
	s.mu.Lock()
	expired := s.sched.expiring(s.clock.Now())
	if d := s.sched.nextExpiry(); !d.IsZero() {
		next = d.Add(horizon.Sub(s.clock.Now())) // Consume wakes a lead before next
	}
	for len(chosen) < limit {
		e, ok := s.sched.peek()
		if !ok {
			break
		}
		if e.at.After(horizon) {
			next = earlier(next, e.at)
			break
		}
		heap.Pop(&s.sched.heap)
		if ds, ceiling := s.ceiling(e.tenant); ceiling != nil {
			// Still waiting: it takes its turn for the ceiling below.
			s.fairQueue(ds, *ceiling).push(e)
			continue
		}
		s.sched.remove(e.id)
		s.claims[e.id] = Job{ID: e.id, Tenant: e.tenant} // held while read
		chosen = append(chosen, e)
	}
	if len(chosen) == limit {
		if e, ok := s.sched.peek(); ok {
			next = earlier(next, e.at)
		}
	}
	now := s.clock.Now()
	valid := func(e dueEntry) bool { w, ok := s.sched.waiting[e.id]; return ok && w.at.Equal(e.at) }
	for ds, q := range s.fair {
		skipped := 0 // tenants passed over in a row: their next job is not due yet
		for len(chosen) < limit && skipped < len(q.ring) {
			e, ok := q.next(valid)
			if !ok {
				if q.idle(now) {
					delete(s.fair, ds)
				}
				break
			}
			slot := q.slot(now, e)
			look := q.lookahead(horizon.Sub(now))
			if slot.After(now.Add(look)) {
				// Consume wakes a lead before next: make that look before
				// the time that holds this job back.
				wakeFor := func(at time.Time) { next = earlier(next, at.Add(horizon.Sub(now)-look)) }
				c := q.ceilingSlot(now)
				if c.After(now.Add(look)) {
					wakeFor(c) // the ceiling itself: nobody goes sooner
					break
				}
				wakeFor(slot)
				q.pass() // this tenant is not due yet (or its window is full): the next may go
				skipped++
				continue
			}
			q.take()
			skipped = 0
			s.sched.remove(e.id)
			if slot.After(e.at) {
				e.at = slot
				e.held = true
			}
			q.use(e.at, e.cost)
			s.claims[e.id] = Job{ID: e.id, Tenant: e.tenant}
			chosen = append(chosen, e)
		}
	}
	s.mu.Unlock()
	if len(chosen) == 0 {
		return nil, expired, next, nil
	}
	claimed := make([]Job, 0, len(chosen))
	var gone []Job
	err := s.db.View(func(tx *bolt.Tx) error {
		claimed, gone = claimed[:0], gone[:0]
		for _, e := range chosen {
			j, ok, err := getJob(tx, e.id, true)
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("job %s is scheduled but not stored", e.id)
			}
			if !j.State.Waiting() {
				j.DispatchAt = e.at
				gone = append(gone, j)
				continue
			}
			j.State = StateDispatching
			j.Attempts++
			j.Slot, j.DispatchAt = e.slot, e.at
			if e.held {
				j.Prompt = false // it waited for the ceiling: its start says nothing of startLag
			}
			claimed = append(claimed, j)
		}
		return nil
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		// Back in the schedule: nothing was handed over.
		for _, e := range chosen {
			delete(s.claims, e.id)
			s.readd(e)
		}
		return nil, expired, time.Time{}, unavailable(err)
	}
	for _, j := range gone {
		// Finished meanwhile (a failed write put it back): nothing to send.
		delete(s.claims, j.ID)
		s.giveBackCeiling(j)
		if tm, ok := s.tenants[j.Tenant]; ok {
			tm.depth--
		}
	}
	for _, j := range claimed {
		s.claims[j.ID] = j
		if tm, ok := s.tenants[j.Tenant]; ok {
			tm.depth--
			tm.inFlight++
		}
	}
	return claimed, expired, next, nil
}

// earlier is the earlier of a and b, where zero means none.
func earlier(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}

// expire ends waiting jobs whose deadline passed before they could go: they
// are never sent. On a write failure they go back to the schedule (and come
// out again on the next pass).
func (s *BoltStore) expire(entries []dueEntry) {
	if len(entries) == 0 {
		return
	}
	now := s.clock.Now()
	var done []Job
	err := s.db.Batch(func(tx *bolt.Tx) error {
		done = done[:0]
		for _, e := range entries {
			j, ok, err := getJob(tx, e.id, false)
			if err != nil {
				return err
			}
			if !ok || !j.State.Waiting() {
				continue
			}
			if err := tx.Bucket(bucketDue).Delete(dueKey(j.slot(), j.ID)); err != nil {
				return err
			}
			j.State, j.FinishedAt = StateExpired, now
			j.LastError = cmp.Or(j.LastError, "expired: its deadline passed before it could be sent")
			if err := putJob(tx, j); err != nil {
				return err
			}
			if err := tx.Bucket(bucketDone).Put(dueKey(now, j.ID), nil); err != nil {
				return err
			}
			done = append(done, j)
		}
		return nil
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.log.Error("cannot record expired jobs; trying again", "err", err)
		for _, e := range entries {
			s.readd(e)
		}
		return
	}
	for _, j := range done {
		if tm, ok := s.tenants[j.Tenant]; ok {
			tm.depth--
			tm.rec.Expired++
			tm.dirty = true
		}
		if s.onExpired != nil {
			s.onExpired(j)
		}
	}
}

// finishWindow is how long the outcome of an attempt waits for others to
// share its write. Outcomes are not waited for by anyone outside (the job is
// held meanwhile), so they can share far more than admissions do: one commit
// (two fsyncs) per window instead of per millisecond.
const finishWindow = 10 * time.Millisecond

type finishReq struct {
	job  Job
	o    Outcome
	done chan error
}

// finish records the outcome of a claimed job, in a group with others.
func (s *BoltStore) finish(j Job, o Outcome) error {
	if o.Result == Released && o.PauseUntil.IsZero() {
		// Nothing was sent and nothing was written: the job waits as it was.
		s.mu.Lock()
		delete(s.claims, j.ID)
		s.giveBackCeiling(j)
		at := j.DispatchAt
		if tm, ok := s.tenants[j.Tenant]; ok {
			tm.inFlight--
			tm.depth++
			at = realAt(tm.rec.Pause, j.Slot) // the tenant may have paused meanwhile
		}
		s.sched.add(entryOf(j, at))
		s.mu.Unlock()
		s.pokeIfSooner(at)
		return nil
	}
	r := finishReq{job: j, o: o, done: make(chan error, 1)}
	select {
	case s.finishQ <- r:
	case <-s.stop:
		return errors.New("store closed")
	}
	return <-r.done
}

// finisher writes outcomes in groups until the store closes.
func (s *BoltStore) finisher() {
	defer s.maintWG.Done()
	for {
		var group []finishReq
		select {
		case r := <-s.finishQ:
			group = append(group, r)
		case <-s.stop:
			return
		}
		window := time.NewTimer(finishWindow)
	collect:
		for len(group) < 1000 {
			select {
			case r := <-s.finishQ:
				group = append(group, r)
			case <-window.C:
				break collect
			}
		}
		window.Stop()
		err := s.writeOutcomes(group)
		for _, r := range group {
			r.done <- err
		}
	}
}

// writeOutcomes records a group of outcomes in one transaction.
func (s *BoltStore) writeOutcomes(group []finishReq) error {
	now := s.clock.Now()
	results := make([]Job, len(group))
	paused := map[string]bool{} // tenants whose pause changed
	var markSaved func()
	err := s.db.Update(func(tx *bolt.Tx) error {
		clear(paused)
		touched := map[string]bool{}
		for i, r := range group {
			j, o := r.job, r.o
			// The claimed job is the stored one: nothing else changes a job
			// the dispatcher holds.
			oldDue := dueKey(j.Slot, j.ID)
			s.mu.Lock()
			tm, err := s.loadTenantTx(tx, j.Tenant)
			if err != nil {
				s.mu.Unlock()
				return err
			}
			if o.Result == Released || o.Result == Expired {
				s.giveBackCeiling(j)
			}
			if o.PauseDownstream && o.PauseUntil.After(now) {
				s.pauseCeiling(j.Tenant, o.PauseUntil)
			}
			cur, pausedNow := applyOutcome(&tm.rec, j, o, now, s.policy(j.Tenant))
			if pausedNow {
				paused[j.Tenant] = true
			}
			s.mu.Unlock()
			if err := putJob(tx, cur); err != nil {
				return err
			}
			due := tx.Bucket(bucketDue)
			if err := due.Delete(oldDue); err != nil {
				return err
			}
			if cur.State.Finished() {
				if err := tx.Bucket(bucketDone).Put(dueKey(cur.FinishedAt, cur.ID), nil); err != nil {
					return err
				}
				if cur.State == StateFailed {
					if err := tx.Bucket(bucketFailed).Put(failedKey(cur), nil); err != nil {
						return err
					}
				}
			} else if err := due.Put(dueKey(cur.Slot, cur.ID), []byte(cur.Tenant)); err != nil {
				return err
			}
			results[i] = cur
			touched[j.Tenant] = true
		}
		for name := range touched {
			if err := s.putTenant(tx, name); err != nil {
				return err
			}
		}
		var err error
		markSaved, err = s.saveCeilingWindows(tx)
		return err
	})
	if err != nil {
		return unavailable(err)
	}
	s.mu.Lock()
	markSaved()
	for name := range paused {
		if tm, ok := s.tenants[name]; ok {
			s.sched.retime(name, tm.rec.Pause)
		}
	}
	var soonest time.Time
	for _, result := range results {
		s.observeStart(result)
		delete(s.claims, result.ID)
		tm, ok := s.tenants[result.Tenant]
		if !result.State.Finished() {
			at := result.DispatchAt
			if ok {
				at = realAt(tm.rec.Pause, result.Slot)
			}
			s.sched.add(entryOf(result, at))
			if soonest.IsZero() || at.Before(soonest) {
				soonest = at
			}
		}
		if ok {
			tm.inFlight--
			switch result.State {
			case StateSucceeded:
				tm.rec.Delivered++
			case StateFailed:
				tm.rec.Failed++
			case StateExpired:
				tm.rec.Expired++
			default:
				tm.depth++
			}
			tm.dirty = true
		}
	}
	s.mu.Unlock()
	if !soonest.IsZero() {
		s.pokeIfSooner(soonest)
	}
	return nil
}

// Consume implements Store.
func (s *BoltStore) Consume(ctx context.Context, h Handler, opts ConsumeOptions) error {
	lead := cmp.Or(opts.Lead, DefaultLead)
	sem := make(chan struct{}, cmp.Or(opts.Concurrency, 1024))
	freed := make(chan struct{}, 1)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		if ctx.Err() != nil {
			return nil
		}
		// While awake, every enqueue pokes (the poke waits in the channel);
		// once asleep, only those due before the planned wake do.
		s.nextWake.Store(math.MaxInt64)
		now := s.clock.Now()
		var next time.Time
		if free := cap(sem) - len(sem); free > 0 {
			jobs, expired, n, err := s.claimDue(now.Add(lead), free)
			if err != nil {
				s.log.Error("dispatcher cannot read due jobs; trying again", "err", err)
				n = now.Add(time.Second)
			}
			s.expire(expired)
			next = n
			for _, j := range jobs {
				sem <- struct{}{}
				wg.Add(1)
				go func() {
					defer wg.Done()
					s.runHandler(ctx, h, j)
					<-sem
					select {
					case freed <- struct{}{}:
					default:
					}
				}()
			}
		}
		// Sleep until the next job is well within the lead (so one pass
		// takes many jobs), something is enqueued that is due sooner, a
		// handler frees a place, or the poll interval passes.
		wait := time.Second
		var full <-chan struct{} // a freed place matters only when none was left
		if len(sem) == cap(sem) {
			full = freed
		} else if !next.IsZero() {
			wait = min(wait, next.Add(-lead+claimEvery).Sub(now))
		}
		s.nextWake.Store(now.Add(wait).UnixNano())
		select {
		case <-ctx.Done():
			return nil
		case <-s.wake:
		case <-full:
		case <-s.clock.After(max(wait, time.Millisecond)):
		}
	}
}

func (s *BoltStore) runHandler(ctx context.Context, h Handler, j Job) {
	o := h(ctx, j)
	// The outcome must be recorded before the job is let go: until then it
	// stays held (not sent again, not cancellable). Keep trying through a
	// passing failure; once the service is stopping, give up after a few
	// tries: the job is still waiting on disk and a restart sends it again
	// with the same Idempotency-Key.
	backoff := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		err := s.finish(j, o)
		if err == nil {
			return
		}
		s.log.Error("cannot record the outcome of an attempt; trying again", "job", j.ID, "err", err)
		if (ctx.Err() != nil && attempt >= 5) || s.isClosing() {
			return
		}
		select {
		case <-time.After(backoff):
		case <-s.stop:
			return
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// isClosing reports whether Close has begun.
func (s *BoltStore) isClosing() bool {
	select {
	case <-s.stop:
		return true
	default:
		return false
	}
}

// Retry implements Store.
func (s *BoltStore) Retry(ctx context.Context, id string) (Admission, error) {
	if !validID(id) {
		return Admission{}, ErrNotFound
	}
	s.mu.Lock()
	if _, held := s.claims[id]; held {
		s.mu.Unlock()
		return Admission{}, &StateError{ID: id, State: StateDispatching, Op: "retry"}
	}
	var j Job
	var found bool
	err := s.db.View(func(tx *bolt.Tx) error {
		var err error
		j, found, err = getJob(tx, id, false)
		return err
	})
	switch {
	case err != nil:
		s.mu.Unlock()
		return Admission{}, unavailable(err)
	case !found:
		s.mu.Unlock()
		return Admission{}, ErrNotFound
	case j.State != StateFailed:
		s.mu.Unlock()
		return Admission{}, &StateError{ID: id, State: j.State, Op: "retry"}
	}
	tm, err := s.loadTenant(j.Tenant)
	if err != nil {
		s.mu.Unlock()
		return Admission{}, err
	}
	policy := s.policy(j.Tenant)
	now := s.clock.Now()
	pz := tm.rec.Pause
	d, st, recent := admit(tm.rec, tm.depth, pz.TenantTime(now).Add(s.startLag()), now, policy, j.cost())
	if d.Admitted && !j.Deadline.IsZero() && dispatchAt(pz, d.Slot, now).After(j.Deadline) {
		s.mu.Unlock()
		delay := dispatchAt(pz, d.Slot, now).Sub(now)
		return Admission{Impossible: &ImpossibleError{Tenant: j.Tenant, Reason: ReasonWouldExpire, ExpectedDelay: delay, Deadline: j.Deadline}, QueueDepth: tm.depth, Capacity: policy.Capacity}, nil
	}
	if !d.Admitted {
		tm.rec.Rejected++
		tm.dirty = true
		depth := tm.depth
		s.mu.Unlock()
		return Admission{Rejected: rejection(j.Tenant, policy, d, depth), QueueDepth: depth, Capacity: policy.Capacity}, nil
	}
	failed := j
	tm.rec.TAT = st.TAT
	tm.rec.setRecent(policy, recent)
	tm.depth++
	tm.pending++
	j.State, j.Attempts, j.Failures, j.FinishedAt = StateQueued, 0, 0, time.Time{}
	j.Slot, j.DispatchAt = d.Slot, dispatchAt(pz, d.Slot, now)
	paused, _ := pz.Paused(now)
	j.Prompt = d.Delay == 0 && !paused
	s.claims[id] = Job{ID: id, Tenant: j.Tenant} // held until durable: no second retry, no dispatch
	s.mu.Unlock()

	err = s.db.Batch(func(tx *bolt.Tx) error {
		// Still there and still failed? (The reaper may have removed it
		// since it was read.)
		if cur, ok, err := getJob(tx, id, false); err != nil {
			return err
		} else if !ok || cur.State != StateFailed {
			return ErrNotFound
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
	at := realAt(tm.rec.Pause, j.Slot)
	if err != nil {
		tm.depth--
	} else {
		s.sched.add(entryOf(j, at))
	}
	depth := tm.depth
	s.mu.Unlock()
	if errors.Is(err, ErrNotFound) {
		return Admission{}, err
	}
	if err != nil {
		return Admission{}, unavailable(err)
	}
	s.pokeIfSooner(at)
	return Admission{Job: j, ExpectedDelay: j.DispatchAt.Sub(now), QueueDepth: depth, Capacity: policy.Capacity}, nil
}

// Failed implements Store.
func (s *BoltStore) Failed(ctx context.Context, tenant string, limit int) ([]Job, error) {
	var out []Job
	prefix := append([]byte(tenant), 0)
	err := s.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketFailed).Cursor()
		for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix) && (limit <= 0 || len(out) < limit); k, _ = c.Next() {
			id := string(k[len(prefix)+8:])
			j, ok, err := getJob(tx, id, false)
			if err != nil {
				return err
			}
			if ok && j.State == StateFailed {
				out = append(out, j)
			}
		}
		return nil
	})
	return out, unavailable(err)
}

// Pause implements Store.
func (s *BoltStore) Pause(ctx context.Context, tenant string) (TenantStatus, error) {
	return s.hold(tenant, true)
}

// Resume implements Store.
func (s *BoltStore) Resume(ctx context.Context, tenant string) (TenantStatus, error) {
	return s.hold(tenant, false)
}

// hold starts or ends an operator hold, durably: a restart keeps it.
func (s *BoltStore) hold(tenant string, hold bool) (TenantStatus, error) {
	s.mu.Lock()
	tm, err := s.loadTenant(tenant)
	if err != nil {
		s.mu.Unlock()
		return TenantStatus{}, err
	}
	now := s.clock.Now()
	before := tm.rec.Pause
	if hold {
		tm.rec.Pause = before.Hold(now)
		// Jobs admitted while held go one interval apart after it.
		tm.rec.TAT = later(tm.rec.TAT, tm.rec.Pause.TenantTime(now).Add(s.policy(tenant).Tolerance()))
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
		err = s.db.Batch(func(tx *bolt.Tx) error { return s.putTenant(tx, tenant) })
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
		return TenantStatus{}, unavailable(err)
	}
	if !hold {
		s.poke()
	}
	return st, nil
}

// giveBackCeiling returns the ceiling's window places a claimed job took and
// did not use (nothing was sent). s.mu held.
func (s *BoltStore) giveBackCeiling(j Job) {
	ds, c := s.ceiling(j.Tenant)
	if c == nil || len(c.Windows) == 0 {
		return
	}
	if q := s.fair[ds]; q != nil {
		q.unuse(j.DispatchAt, j.cost())
	}
}

// pauseCeiling stops a tenant's downstream ceiling until until (s.mu
// held): no tenant of it is handed a slot sooner. Saved with the outcome.
func (s *BoltStore) pauseCeiling(tenant string, until time.Time) {
	ds, c := s.ceiling(tenant)
	if c == nil {
		return
	}
	q := s.fairQueue(ds, *c)
	if until.After(q.pausedUntil) {
		q.pausedUntil = until
		q.tat = later(q.tat, until.Add(c.Tolerance()))
		q.version++
	}
}

// fairQueue returns a downstream's fair queue, made (and its saved state
// read) if needed. s.mu held.
func (s *BoltStore) fairQueue(ds string, ceiling leaky.Policy) *fairQueue {
	q := s.fair[ds]
	if q == nil {
		q = newFairQueue(ceiling)
		q.recent, q.pausedUntil = s.loadCeiling(ds, ceiling)
		q.tat = q.pausedUntil.Add(ceiling.Tolerance())
		if !s.fairStarted[ds] && !s.cleanStart {
			// A send may have used the ceiling just before a crash.
			q.tat = later(q.tat, s.clock.Now().Add(ceiling.Interval))
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
func (s *BoltStore) loadCeiling(ds string, p leaky.Policy) ([]leaky.Recent, time.Time) {
	var st ceilingState
	err := s.db.View(func(tx *bolt.Tx) error {
		_, err := getJSON(tx.Bucket(bucketMeta), ceilingKey(ds), &st)
		return err
	})
	if err != nil {
		s.log.Error("cannot read a ceiling's saved state; starting it afresh", "downstream", ds, "err", err)
	}
	return tenantRecord{Recent: st.Recent}.recent(p), st.PausedUntil
}

// saveCeilingWindows writes the window bookkeeping of ceilings that changed
// (with the outcomes of the sends that changed it). It returns what to mark
// saved once the transaction commits.
func (s *BoltStore) saveCeilingWindows(tx *bolt.Tx) (func(), error) {
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
			var rec tenantRecord
			if len(q.recent) == len(q.policy.Windows) {
				rec.setRecent(q.policy, q.recent)
			}
			saves = append(saves, save{q, ceilingKey(ds), ceilingState{Recent: rec.Recent, PausedUntil: q.pausedUntil}, q.version})
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
