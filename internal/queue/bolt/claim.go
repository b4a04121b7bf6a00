package bolt

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/queue"
)

// claimEvery is the longest a due job waits to be claimed once within the
// lead; it lets one pass over the due index take every job due in that time.
const claimEvery = 10 * time.Millisecond

// pokeIfSooner wakes the dispatcher if a job due at slot is due before it
// planned to wake.
func (s *Store) pokeIfSooner(slot time.Time) {
	if slot.Add(-queue.DefaultLead).UnixNano() < s.nextWake.Load() {
		s.poke()
	}
}

// poke wakes the dispatcher.
func (s *Store) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
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
func (s *Store) claimDue(horizon time.Time, limit int) ([]queue.Job, []dueEntry, time.Time, error) {
	s.mu.Lock()
	now := s.clock.Now()
	expired := s.sched.expiring(now)
	var next time.Time
	if d := s.sched.nextExpiry(); !d.IsZero() {
		next = d.Add(horizon.Sub(now)) // Consume wakes a lead before next
	}
	p := &pick{horizon: horizon, limit: limit, now: now, next: next}
	s.pickDue(p)
	for ds, q := range s.fair {
		s.pickFair(p, ds, q)
	}
	s.mu.Unlock()
	if len(p.chosen) == 0 {
		return nil, expired, p.next, nil
	}
	claimed, gone, err := s.readChosen(p.chosen)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		// Back in the schedule: nothing was handed over.
		for _, e := range p.chosen {
			s.unclaim(e.id)
			s.readd(e)
		}
		return nil, expired, time.Time{}, queue.Unavailable(err)
	}
	s.handOver(claimed, gone, p.chosen)
	return claimed, expired, p.next, nil
}

// pick is one pass of claimDue: what it chose so far and when to look next.
type pick struct {
	horizon time.Time
	limit   int
	now     time.Time
	chosen  []dueEntry
	next    time.Time
}

func (p *pick) full() bool { return len(p.chosen) >= p.limit }

// pickDue takes due jobs from the schedule, earliest first (s.mu held);
// those of a tenant under a ceiling go to its fair queue instead.
func (s *Store) pickDue(p *pick) {
	for !p.full() {
		e, ok := s.sched.peek()
		if !ok {
			break
		}
		if e.at.After(p.horizon) {
			p.next = clock.Earliest(p.next, e.at)
			break
		}
		s.sched.pop()
		caps := s.caps(e.tenant)
		if ds, ceiling := s.ceiling(e.tenant); ceiling != nil || caps.Capped() {
			// Still waiting: it takes its turn for the ceiling, or for
			// room under its caps, below.
			var policy leaky.Policy // no ceiling: the zero policy paces nothing
			if ceiling != nil {
				policy = *ceiling
			}
			s.fairQueue(ds, policy).push(e)
			continue
		}
		s.sched.remove(e.tenant, e.slot, e.id)
		s.claims[e.id] = queue.Job{ID: e.id, Tenant: e.tenant} // held while read
		s.capHold(e.id, e.tenant, caps)
		p.chosen = append(p.chosen, e)
	}
	if p.full() {
		if e, ok := s.sched.peek(); ok {
			p.next = clock.Earliest(p.next, e.at)
		}
	}
}

// pickFair takes jobs from a downstream's fair queue, one per ceiling slot,
// tenants taking turns (s.mu held).
func (s *Store) pickFair(p *pick, ds string, q *fairQueue) {
	valid := s.sched.current
	look := q.lookahead(p.horizon.Sub(p.now))
	// Consume wakes a lead before next: make that look before the time
	// that holds a job back.
	wakeFor := func(at time.Time) { p.next = clock.Earliest(p.next, at.Add(p.horizon.Sub(p.now)-look)) }
	skipped := 0 // tenants passed over in a row: their next job is not due yet
	for !p.full() && skipped < len(q.ring) {
		e, ok := q.next(valid)
		if !ok {
			if q.idle(p.now) {
				delete(s.fair, ds)
			}
			return
		}
		caps := s.caps(e.tenant)
		if ok, shared, until := s.capRoom(caps, e.tenant, p.now); !ok {
			// Looked at again when an attempt of the scope ends (capRelease
			// pokes), or when what a crash may have left open ends.
			if !until.IsZero() {
				wakeFor(until)
			}
			if shared {
				return // its downstream's cap: no tenant of it goes
			}
			q.pass()
			skipped++
			continue
		}
		slot := q.slot(p.now, e)
		if slot.After(p.now.Add(look)) {
			if c := q.ceilingSlot(p.now); c.After(p.now.Add(look)) {
				wakeFor(c) // the ceiling itself: nobody goes sooner
				return
			}
			wakeFor(slot)
			q.pass() // this tenant is not due yet (or its window is full): the next may go
			skipped++
			continue
		}
		q.take()
		skipped = 0
		s.sched.remove(e.tenant, e.slot, e.id)
		if slot.After(e.at) {
			e.at = slot
			e.held = true
		}
		if caps.Capped() {
			e.held = true // it may have waited for a place: its start says nothing of the start lag
		}
		q.use(e.at, e.cost)
		s.claims[e.id] = queue.Job{ID: e.id, Tenant: e.tenant}
		s.capHold(e.id, e.tenant, caps)
		p.chosen = append(p.chosen, e)
	}
}

// readChosen reads the chosen jobs to hand over, each with its attempt
// counted; gone are those finished meanwhile (a failed write put them
// back): nothing to send.
func (s *Store) readChosen(chosen []dueEntry) (claimed, gone []queue.Job, err error) {
	claimed = make([]queue.Job, 0, len(chosen))
	// Admissions the write-ahead log alone has are read from memory, first:
	// s.mu is not taken in a read transaction (see claimDue).
	inLog := map[string]queue.Job{}
	s.mu.Lock()
	for _, e := range chosen {
		if j, ok := s.loggedJob(e.id); ok {
			j.Payload = slices.Clone(j.Payload)
			inLog[e.id] = j
		}
	}
	s.mu.Unlock()
	err = s.db.View(func(tx *bbolt.Tx) error {
		claimed, gone = claimed[:0], gone[:0]
		for _, e := range chosen {
			j, ok := inLog[e.id]
			if !ok {
				var err error
				if j, ok, err = getJob(tx, e.id, true); err != nil {
					return err
				}
			}
			if !ok {
				return fmt.Errorf("job %s is scheduled but not stored", e.id)
			}
			if !j.State.Waiting() {
				j.DispatchAt = e.at
				gone = append(gone, j)
				continue
			}
			j.State = queue.StateDispatching
			j.Attempts++
			j.Slot, j.DispatchAt = e.slot, e.at
			if e.held {
				j.Prompt = false // it waited for the ceiling: its start says nothing of startLag
			}
			claimed = append(claimed, j)
		}
		return nil
	})
	return claimed, gone, err
}

// handOver marks jobs handed to the dispatcher (s.mu held); chosen are
// their schedule entries, which say what each was counted in.
func (s *Store) handOver(claimed, gone []queue.Job, chosen []dueEntry) {
	var scheduled map[string]bool
	for _, e := range chosen {
		if e.scheduled {
			if scheduled == nil {
				scheduled = map[string]bool{}
			}
			scheduled[e.id] = true
		}
	}
	for _, j := range gone {
		s.unclaim(j.ID)
		s.giveBackCeiling(j)
		if tm, ok := s.tenants[j.Tenant]; ok {
			tm.leave(scheduled[j.ID])
		}
	}
	now := s.clock.Now()
	for _, j := range claimed {
		s.claims[j.ID] = j
		s.handedAt[j.ID] = now
		if scheduled[j.ID] {
			s.booked[j.ID] = true
		}
		if tm, ok := s.tenants[j.Tenant]; ok {
			tm.leave(scheduled[j.ID])
			tm.inFlight++
		}
	}
}

// expire ends waiting jobs whose deadline passed before they could go: they
// are never sent. On a write failure they go back to the schedule (and come
// out again on the next pass).
func (s *Store) expire(entries []dueEntry) {
	if len(entries) == 0 {
		return
	}
	now := s.clock.Now()
	var done []queue.Job
	var wasScheduled []bool
	err := s.commit(func(tx *bbolt.Tx) error {
		done, wasScheduled = done[:0], wasScheduled[:0]
		for _, e := range entries {
			j, ok, err := getJob(tx, e.id, false)
			if err != nil {
				return err
			}
			if !ok || !j.State.Waiting() {
				continue
			}
			if err := delWaiting(tx, j.ID); err != nil {
				return err
			}
			wasScheduled = append(wasScheduled, j.State == queue.StateScheduled)
			j.State, j.FinishedAt = queue.StateExpired, now
			j.LastError = cmp.Or(j.LastError, "expired: its deadline passed before it could be sent")
			if err := putJob(tx, j); err != nil {
				return err
			}
			if err := oweCallback(tx, j, now); err != nil {
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
	for i, j := range done {
		if tm, ok := s.tenants[j.Tenant]; ok {
			tm.leave(wasScheduled[i])
			tm.rec.CountEnd(queue.StateExpired)
			tm.rec.Unbook(j.ID) // never sent: nothing to place around
			tm.dirty = true
		}
		if s.onExpired != nil {
			s.onExpired(j)
		}
		s.finishes.Notify(j.ID)
	}
}
