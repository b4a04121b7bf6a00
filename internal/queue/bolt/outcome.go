package bolt

import (
	"errors"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/rules"
)

// finishWindow is how long the outcome of an attempt waits for others to
// share its write. Outcomes are not waited for by anyone outside (the job is
// held meanwhile), so they can share far more than admissions do: one commit
// (two fsyncs) per window instead of per millisecond.
const finishWindow = 10 * time.Millisecond

type finishReq struct {
	job  queue.Job
	o    queue.Outcome
	done chan error
}

// finish records the outcome of a claimed job, in a group with others.
func (s *Store) finish(j queue.Job, o queue.Outcome) error {
	if o.Result == queue.Released && o.PauseUntil.IsZero() {
		// Nothing was sent and nothing was written: the job waits as it was
		// (one booked for its not_before is still so on disk).
		s.mu.Lock()
		booked := s.booked[j.ID]
		s.unclaim(j.ID)
		delete(s.handedAt, j.ID)
		s.giveBackCeiling(j)
		at := j.DispatchAt
		if booked {
			j.State = queue.StateScheduled
		}
		if tm, ok := s.tenants[j.Tenant]; ok {
			tm.inFlight--
			if booked {
				tm.scheduled++
			} else {
				tm.depth++
			}
			at = rules.RealAt(tm.rec.Pause, j.Slot) // the tenant may have paused meanwhile
		}
		e := entryOf(j, at)
		s.sched.add(e)
		s.mu.Unlock()
		s.pokeIfSooner(e.wakeBy())
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
func (s *Store) finisher() {
	defer close(s.finisherDone)
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
func (s *Store) writeOutcomes(group []finishReq) error {
	now := s.clock.Now()
	results := make([]queue.Job, len(group))
	paused := map[string]bool{} // tenants whose pause changed
	var markSaved func()
	err := s.update(func(tx *bbolt.Tx) error {
		clear(paused)
		touched := map[string]bool{}
		for i, r := range group {
			cur, err := s.applyOne(tx, r.job, r.o, now, paused)
			if err != nil {
				return err
			}
			results[i] = cur
			touched[cur.Tenant] = true
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
		if isNoSpace(err) {
			// The outcome's room is the reserve's: the disk was filled past
			// it. The ballast gives it back for the retry.
			s.space.noSpace(now)
			s.space.releaseBallast()
		}
		return queue.Unavailable(err)
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
		if wake, waits := s.afterOutcome(result); waits {
			soonest = clock.Earliest(soonest, wake)
		}
	}
	s.mu.Unlock()
	if !soonest.IsZero() {
		s.pokeIfSooner(soonest)
	}
	return nil
}

// applyOne applies one outcome to its claimed job and tenant and writes the
// job (in tx; s.mu taken for the in-memory part). paused collects tenants
// whose pause changed.
func (s *Store) applyOne(tx *bbolt.Tx, j queue.Job, o queue.Outcome, now time.Time, paused map[string]bool) (queue.Job, error) {
	// The claimed job is the stored one: nothing else changes a job the
	// dispatcher holds.
	s.mu.Lock()
	tm, err := s.loadTenantTx(tx, j.Tenant)
	if err != nil {
		s.mu.Unlock()
		return queue.Job{}, err
	}
	if o.Result == queue.Released || o.Result == queue.Expired {
		s.giveBackCeiling(j)
	}
	if o.PauseDownstream && o.PauseUntil.After(now) {
		s.pauseCeiling(j.Tenant, o.PauseUntil)
	}
	p := s.policy(j.Tenant)
	cur, pausedNow := rules.ApplyOutcome(&tm.rec, j, o, now, p)
	if o.SentAt.After(j.DispatchAt.Add(rules.LateEnough)) {
		tm.rec.RunLate(p, j, o.SentAt, tm.depth+s.claimedBeside(j))
	}
	if pausedNow {
		paused[j.Tenant] = true
	}
	s.mu.Unlock()
	if err := putOutcome(tx, cur); err != nil {
		return queue.Job{}, err
	}
	if o.Response != nil {
		// The latest answer replaces the one before; an attempt that
		// got none (a connection error) leaves it, as ResponseStatus.
		if err := tx.Bucket(bucketResponses).Put([]byte(cur.ID), encodeResponse(o.Response)); err != nil {
			return queue.Job{}, err
		}
		cur.Response = o.Response
	}
	if !cur.State.Finished() {
		return cur, nil // still waiting: its index entry stays, its record has the new slot
	}
	if err := delWaiting(tx, cur.ID); err != nil {
		return queue.Job{}, err
	}
	if cur.State == queue.StateFailed {
		if err := tx.Bucket(bucketFailed).Put(failedKey(cur), nil); err != nil {
			return queue.Job{}, err
		}
	}
	if err := oweCallback(tx, cur, cur.FinishedAt); err != nil {
		return queue.Job{}, err
	}
	return cur, tx.Bucket(bucketDone).Put(dueKey(cur.FinishedAt, cur.ID), nil)
}

// afterOutcome lets a job go from the dispatcher once its outcome is
// durable (s.mu held): back into the schedule if it waits again (with when
// the dispatcher must look at it, see wakeBy), counted in its tenant
// otherwise.
func (s *Store) afterOutcome(result queue.Job) (time.Time, bool) {
	s.lag.observe(result, s.handedAt[result.ID])
	s.unclaim(result.ID)
	delete(s.handedAt, result.ID)
	tm, ok := s.tenants[result.Tenant]
	var at time.Time
	waits := !result.State.Finished()
	if !waits {
		s.finishes.Notify(result.ID) // written: the caller holds the commit's result
	}
	if waits {
		at = result.DispatchAt
		if ok {
			at = rules.RealAt(tm.rec.Pause, result.Slot)
		}
		e := entryOf(result, at)
		s.sched.add(e)
		at = e.wakeBy()
	}
	if !ok {
		return at, waits
	}
	tm.inFlight--
	tm.dirty = true
	// Counted here, once the write is durable, not with the rest of the
	// outcome (rules.ApplyOutcome): a write that failed is tried again.
	if !tm.rec.CountEnd(result.State) {
		tm.depth++
	}
	return at, waits
}

// putOutcome writes a job after an attempt. A delivered job's payload is
// freed at once (DESIGN.md 6c): nothing reads it again (a retry is of a
// failed job), and on a full disk it is the room that comes back. Its
// record stays for the retention.
func putOutcome(tx *bbolt.Tx, j queue.Job) error {
	if j.State != queue.StateSucceeded {
		return putJob(tx, j)
	}
	if err := tx.Bucket(bucketPayloads).Delete([]byte(j.ID)); err != nil {
		return err
	}
	j.Payload = nil
	return tx.Bucket(bucketJobs).Put([]byte(j.ID), encodeJob(make([]byte, 0, 128), j, nil))
}

// claimedBeside counts the other jobs of j's tenant handed to the
// dispatcher and not yet written (s.mu held): they go after j whatever
// their slots (a request that waits for a connection is written when it
// gets one, behind others). Those written already are not, though their
// outcomes may still be on their way: a busy machine records them late.
func (s *Store) claimedBeside(j queue.Job) int {
	n := 0
	for id, c := range s.claims {
		if c.Tenant == j.Tenant && id != j.ID && !s.written[id] {
			n++
		}
	}
	return n
}

// Wrote implements queue.WriteNoter: the attempt of claimed job j has
// written its request.
func (s *Store) Wrote(j queue.Job) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.claims[j.ID]; ok {
		s.written[j.ID] = true
	}
}

// unclaim forgets claimed job id (s.mu held).
func (s *Store) unclaim(id string) {
	s.capRelease(id)
	delete(s.claims, id)
	delete(s.written, id)
	delete(s.booked, id)
}
