package bolt

import (
	"context"
	"fmt"
	"slices"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/rules"
)

// Enqueue implements queue.Store: the jobs are decided in memory under
// s.mu, made durable in one group commit, and only then scheduled.
func (s *Store) Enqueue(ctx context.Context, tenant string, newJobs []queue.NewJob) ([]queue.Admission, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	tm, err := s.waitKeysAndLoad(tenant, newJobs)
	if err != nil {
		s.mu.Unlock()
		return nil, err
	}
	c := s.newCall(tenant, tm, len(newJobs))
	plan := queue.Precheck(tenant, newJobs, rules.MaxCost(c.policy, c.ceiling), c.policy.Capacity, c.out)
	for _, i := range plan.Lookup {
		prev, found, err := s.jobByKey(tenant, newJobs[i].IdempotencyKey)
		if err != nil {
			s.mu.Unlock()
			return nil, err
		}
		if found {
			c.out[i] = queue.Repeat(prev, c.policy.Capacity)
		}
	}
	if err := s.roomFor(newJobs, plan.Decide); err != nil {
		s.mu.Unlock()
		return nil, err
	}
	for _, i := range plan.Decide {
		if err := s.decide(c, i, newJobs[i]); err != nil {
			// Nothing of this call is admitted (the slots taken so far
			// stay taken: a gap is safe).
			s.undoAdmitted(c)
			s.mu.Unlock()
			return nil, err
		}
	}
	plan.FillRepeats(c.out)
	if len(c.admitted) == 0 {
		s.mu.Unlock()
		return c.out, nil
	}
	tm.pending++
	s.lag.deciding()
	s.mu.Unlock()

	ops, err := admissionOps(c)
	if err == nil {
		err = s.commitAdmission(tenant, ops, c.admitted)
	}
	if err := s.settle(c, err); err != nil {
		return nil, err
	}
	return c.out, nil
}

// call is one Enqueue's decisions, made under s.mu.
type call struct {
	tenant   string
	tm       *tenantMem
	policy   leaky.Policy
	ceiling  *leaky.Policy
	capped   bool // a cap on attempts in flight (rules.Call.Capped)
	now      time.Time
	arrival  time.Time // in tenant time
	asOf     time.Time // arrival in wall time (Admission.AsOf)
	ahead    int64     // calls being made durable when it was decided (startLag)
	out      []queue.Admission
	admitted []queue.Job
	keys     []string // idempotency keys this call admits, claimed in s.idemWait
}

func (s *Store) newCall(tenant string, tm *tenantMem, n int) *call {
	now := s.clock.Now()
	_, ceiling := s.ceiling(tenant)
	lag, ahead := s.lag.estimate()
	// Decided as if the job arrived when it can first be sent (see
	// rules.Arrival), in tenant time.
	arrival := rules.Arrival(tm.rec.Pause, now, lag, tm.arrived)
	tm.arrived = arrival
	return &call{
		tenant: tenant, tm: tm, policy: s.policy(tenant), ceiling: ceiling, capped: s.caps(tenant).Capped(), now: now, ahead: ahead,
		arrival: arrival, asOf: now.Add(arrival.Sub(tm.rec.Pause.TenantTime(now))),
		out: make([]queue.Admission, n),
	}
}

// decide answers the i-th job of the call (s.mu held): a repeat of a stored
// idempotency key, a refusal, or an admission (in memory only: see settle).
func (s *Store) decide(c *call, i int, nj queue.NewJob) error {
	tm, p := c.tm, c.policy
	if nj.IdempotencyKey != "" {
		prev, found, err := s.jobByKey(c.tenant, nj.IdempotencyKey)
		if err != nil {
			return err
		}
		if found {
			c.out[i] = queue.Repeat(prev, p.Capacity)
			return nil
		}
	}
	cost := max(nj.Cost, 1)
	id := queue.NewID(c.now)
	d := s.admit(c, cost, nj.Deadline, false, nj.NotBefore, id)
	switch d.Verdict {
	case rules.ScheduleFull:
		tm.dirty = true
		c.out[i] = queue.Admission{Rejected: queue.ScheduleFull(c.tenant, tm.scheduled, p.MaxScheduled), QueueDepth: tm.depth, Capacity: p.Capacity, AsOf: c.asOf}
		return nil
	case rules.Refused:
		tm.dirty = true
		c.out[i] = queue.Admission{Rejected: queue.Rejection(c.tenant, p, d.RetryAfter, tm.depth), QueueDepth: tm.depth, Capacity: p.Capacity, AsOf: c.asOf}
		return nil
	case rules.WouldExpire:
		// Worthless by the time it would go: say so now, take nothing.
		c.out[i] = queue.Admission{Impossible: &queue.ImpossibleError{Tenant: c.tenant, Reason: queue.ReasonWouldExpire, ExpectedDelay: d.Delay, Deadline: nj.Deadline}, QueueDepth: tm.depth, Capacity: p.Capacity}
		return nil
	}
	j := queue.Job{
		ID: id, Tenant: c.tenant, State: queue.StateQueued, Payload: nj.Payload,
		IdempotencyKey: nj.IdempotencyKey, EnqueuedAt: c.now, DispatchAt: d.DispatchAt, Slot: d.Slot,
		AdmitDelay: d.Delay, Prompt: d.Prompt,
		Deadline: nj.Deadline, Request: nj.Request, Type: nj.Type, Callback: nj.Callback,
		NotBefore: nj.NotBefore, // kept on a queued job too: a re-pacing keeps it (Repace)
	}
	if d.Scheduled {
		tm.scheduled++
		j.State = queue.StateScheduled
	} else {
		tm.depth++
	}
	j.AdmitDepth = tm.depth
	if cost > 1 {
		j.Cost = cost
	}
	c.admitted = append(c.admitted, j)
	if !d.Scheduled {
		tm.unsettled = append(tm.unsettled, j.Slot)
	}
	c.out[i] = queue.Admission{Job: j, ExpectedDelay: j.AdmitDelay, QueueDepth: tm.depth, Capacity: p.Capacity, AsOf: c.asOf}
	if nj.IdempotencyKey != "" {
		k := string(idemKey(c.tenant, nj.IdempotencyKey))
		s.idemWait[k] = make(chan struct{})
		c.keys = append(c.keys, k)
	}
	return nil
}

// undoAdmitted takes back the call's admissions from the tenant's counts
// (s.mu held): they were not made durable. The slots stay taken: a gap in
// the schedule is safe, a second job in one slot is not.
func (s *Store) undoAdmitted(c *call) {
	c.settled()
	for _, j := range c.admitted {
		c.tm.leave(j.State == queue.StateScheduled)
	}
	c.tm.rec.Accepted -= int64(len(c.admitted))
	c.tm.dirty = true
	s.releaseKeys(c.keys)
}

// settled takes the call's admitted jobs out of the tenant's unsettled
// slots (s.mu held): they join the schedule, or are taken back.
func (c *call) settled() {
	for _, j := range c.admitted {
		if j.State == queue.StateScheduled {
			continue // not among them
		}
		if i := slices.IndexFunc(c.tm.unsettled, j.Slot.Equal); i >= 0 {
			c.tm.unsettled = slices.Delete(c.tm.unsettled, i, i+1)
		}
	}
	if len(c.tm.unsettled) == 0 {
		c.tm.unsettled = nil // a batch's worth of slots is not kept for the tenant's next call
	}
}

// admissionOps are the writes of the call's admitted jobs, as data for
// the write-ahead log (the committer adds the tenant's record): each job's
// record (with its payload if small), a large payload apart, its place in
// the index of waiting jobs, and its idempotency key.
func admissionOps(c *call) ([]byte, error) {
	size := 0
	for _, j := range c.admitted {
		// Four puts' headers, ids and names, a record's fixed fields (at
		// most ~150 bytes) and the payload, twice if it is stored apart.
		size += 256 + 3*len(j.ID) + 3*len(j.Tenant) + 3*len(j.IdempotencyKey) + 2*len(j.Payload)
	}
	ops := make([]byte, 0, size)
	var scratch [512]byte // the job's record, copied into ops
	for _, j := range c.admitted {
		id := []byte(j.ID)
		inline := j.Payload
		if len(inline) > inlinePayload {
			inline = nil
			ops = appendPut(ops, walPayloads, id, j.Payload)
		}
		ops = appendPut(ops, walJobs, id, encodeJob(scratch[:0], j, inline))
		ops = appendPut(ops, walWaiting, id, encodeWaiting(scratch[:0], j))
		if j.IdempotencyKey != "" {
			k := idemKey(c.tenant, j.IdempotencyKey)
			if len(k) > bbolt.MaxKeySize {
				return nil, fmt.Errorf("idempotency key of %d bytes: the embedded store keeps keys of up to %d bytes with their tenant's name", len(j.IdempotencyKey), bbolt.MaxKeySize-len(c.tenant)-1)
			}
			ops = appendPut(ops, walIdem, k, id)
		}
	}
	return ops, nil
}

// settle ends a call once its commit is done: the admitted jobs join the
// schedule, or, if the commit failed, are taken back.
func (s *Store) settle(c *call, commitErr error) error {
	s.mu.Lock()
	c.tm.pending--
	if commitErr != nil {
		s.lag.failed()
		s.undoAdmitted(c)
		s.mu.Unlock()
		if isNoSpace(commitErr) {
			return s.space.noSpace(s.clock.Now())
		}
		return queue.Unavailable(commitErr)
	}
	c.settled()
	s.lag.durableCall(c.now, s.clock.Now(), c.ahead, c.admitted)
	var soonest time.Time
	for _, j := range c.admitted {
		// The tenant's pause may have changed since the decision: schedule
		// by the current one.
		e := entryOf(j, rules.RealAt(c.tm.rec.Pause, j.Slot))
		s.sched.add(e)
		soonest = clock.Earliest(soonest, e.wakeBy())
	}
	s.releaseKeys(c.keys)
	s.mu.Unlock()
	s.pokeIfSooner(soonest)
	return nil
}

// admit decides one job of cost for the call's tenant (s.mu held) by
// rules.Admit, and keeps an admission in the tenant's record.
// notBefore and id: see rules.Call (zero and "" for a job sent again).
func (s *Store) admit(c *call, cost int, deadline time.Time, resend bool, notBefore time.Time, id string) rules.Decision {
	return rules.Admit(&c.tm.rec, tenantQueue{s, c.tenant, c.tm}, rules.Call{
		Now: c.now, Arrival: c.arrival, Policy: c.policy, Ceiling: c.ceiling,
		Cost: cost, Deadline: deadline, Resend: resend, NotBefore: notBefore, Job: id, Capped: c.capped,
	})
}

// tenantQueue is a tenant's jobs as rules.Admit reads them (s.mu held).
type tenantQueue struct {
	s      *Store
	tenant string
	tm     *tenantMem
}

func (q tenantQueue) Depth() int { return q.tm.depth }

func (q tenantQueue) Scheduled() int { return q.tm.scheduled }

// Waiting walks the schedule, then the jobs of calls not yet committed.
// O(jobs of the tenant waiting): asked for every admission of a tenant
// with windows, and for a refusal by count.
func (q tenantQueue) Waiting(yield func(slot time.Time, scheduled bool)) {
	q.s.sched.tenantSlots(q.tenant, func(slot time.Time) { yield(slot, true) })
	for _, slot := range q.tm.unsettled {
		yield(slot, false)
	}
}

// HandedOver walks the claims: a job handed over waits in the dispatcher
// until its slot.
func (q tenantQueue) HandedOver(yield func(slot time.Time)) {
	for _, j := range q.s.claims {
		if j.Tenant == q.tenant && !j.Slot.IsZero() {
			yield(j.Slot)
		}
	}
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
	var err error
	if id, inLog := s.unappliedKeys[string(idemKey(tenant, key))]; inLog {
		j, found = s.loggedJob(id)
		j.Payload = nil
	}
	if !found {
		err = s.db.View(func(tx *bbolt.Tx) error {
			id := tx.Bucket(bucketIdem).Get(idemKey(tenant, key))
			if id == nil {
				return nil
			}
			var err error
			j, found, err = getJob(tx, string(id), false)
			return err
		})
	}
	if c, ok := s.claims[j.ID]; found && ok {
		j.State, j.Attempts = queue.StateDispatching, c.Attempts
	} else if found && j.State.Waiting() {
		s.placeWaiting(&j)
	}
	return j, found, queue.Unavailable(err)
}

// roomFor refuses the jobs of decide (new admissions: a repeated key is
// answered whatever the room) while the store is full (space.go).
func (s *Store) roomFor(jobs []queue.NewJob, decide []int) error {
	if len(decide) == 0 {
		return nil
	}
	var n int64
	for _, i := range decide {
		n += admissionBytes(jobs[i : i+1])
	}
	if err := s.space.admit(s.clock.Now(), n); err != nil {
		return err
	}
	return nil
}
