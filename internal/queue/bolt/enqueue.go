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
	plan := queue.Precheck(tenant, newJobs, queue.MaxCost(c.policy, c.ceiling), c.policy.Capacity, c.out)
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
	now      time.Time
	arrival  time.Time // in tenant time
	asOf     time.Time // arrival in wall time (Admission.AsOf)
	ahead    int64     // calls being made durable when it was decided (startLag)
	paused   bool
	out      []queue.Admission
	admitted []queue.Job
	keys     []string // idempotency keys this call admits, claimed in s.idemWait
}

func (s *Store) newCall(tenant string, tm *tenantMem, n int) *call {
	now := s.clock.Now()
	_, ceiling := s.ceiling(tenant)
	paused, _ := tm.rec.Pause.Paused(now)
	lag, ahead := s.lag.estimate()
	// Decide as if the job arrived when it can first be sent: a job sent
	// at once is late by the time a send takes to start (the commit, the
	// hand-over, the connection), and every job queued behind it inherits
	// that lateness. Scheduling from there keeps the promises true. All in
	// tenant time: a paused tenant's clock stands still. A tenant's
	// arrivals never go back, though the estimate may fall between two of
	// its calls: the backlog decided from the later arrival would look
	// deeper than it is to a job decided from the earlier one, which
	// would be refused short of capacity (invariant 3).
	arrival := clock.Later(tm.rec.Pause.TenantTime(now).Add(lag), tm.arrived)
	tm.arrived = arrival
	return &call{
		tenant: tenant, tm: tm, policy: s.policy(tenant), ceiling: ceiling, now: now, paused: paused, ahead: ahead,
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
	d, st, recent, booked := s.admit(c, cost)
	if !d.Admitted {
		tm.rec.Rejected++
		tm.dirty = true
		c.out[i] = queue.Admission{Rejected: queue.Rejection(c.tenant, p, d, tm.depth), QueueDepth: tm.depth, Capacity: p.Capacity, AsOf: c.asOf}
		return nil
	}
	at := queue.DispatchAt(tm.rec.Pause, d.Slot, c.now)
	delay := max(at.Sub(c.now), queue.CeilingDelay(c.ceiling, tm.depth))
	if !nj.Deadline.IsZero() && c.now.Add(delay).After(nj.Deadline) {
		// Worthless by the time it would go: say so now, take nothing.
		c.out[i] = queue.Admission{Impossible: &queue.ImpossibleError{Tenant: c.tenant, Reason: queue.ReasonWouldExpire, ExpectedDelay: delay, Deadline: nj.Deadline}, QueueDepth: tm.depth, Capacity: p.Capacity}
		return nil
	}
	tm.rec.TAT, tm.rec.Booked = st.TAT, booked
	tm.rec.SetRecent(p, recent)
	tm.rec.Accepted++
	tm.depth++
	j := queue.Job{
		ID: queue.NewID(c.now), Tenant: c.tenant, State: queue.StateQueued, Payload: nj.Payload,
		IdempotencyKey: nj.IdempotencyKey, EnqueuedAt: c.now, DispatchAt: at, Slot: d.Slot,
		AdmitDelay: delay, AdmitDepth: tm.depth, Prompt: d.Delay == 0 && !c.paused,
		Deadline: nj.Deadline, Request: nj.Request, Type: nj.Type, Callback: nj.Callback,
	}
	if cost > 1 {
		j.Cost = cost
	}
	c.admitted = append(c.admitted, j)
	tm.unsettled = append(tm.unsettled, j.Slot)
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
	c.tm.depth -= len(c.admitted)
	c.tm.rec.Accepted -= int64(len(c.admitted))
	c.tm.dirty = true
	s.releaseKeys(c.keys)
}

// settled takes the call's admitted jobs out of the tenant's unsettled
// slots (s.mu held): they join the schedule, or are taken back.
func (c *call) settled() {
	for _, j := range c.admitted {
		if i := slices.IndexFunc(c.tm.unsettled, j.Slot.Equal); i >= 0 {
			c.tm.unsettled = slices.Delete(c.tm.unsettled, i, i+1)
		}
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
		ops = appendPut(ops, walWaiting, id, []byte(j.Tenant))
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
		e := entryOf(j, queue.RealAt(c.tm.rec.Pause, j.Slot))
		s.sched.add(e)
		soonest = clock.Earliest(soonest, e.wakeBy())
	}
	s.releaseKeys(c.keys)
	s.mu.Unlock()
	s.pokeIfSooner(soonest)
	return nil
}

// admit decides one job of cost in the tenant's time (leaky.Decide: the
// rate and every window), with a refusal's Retry-After in real time (it
// includes what is left of a pause). Beside the schedule it bounds the
// queue by count where the schedule alone does not:
//   - while paused, nothing goes at once: capacity jobs wait, no more (the
//     job at the frozen "now" looks as if it goes at once, but it waits);
//   - under a downstream's ceiling shared with others, sends are slower
//     than the tenant's rate, so jobs wait past their slots;
//   - with windows, a job waits for room in a window, not only for its
//     slot: capacity jobs may wait however long that is (see waiting).
func (s *Store) admit(c *call, cost int) (leaky.Decision, leaky.State, []leaky.Recent, []queue.Booking) {
	rec, p, depth := c.tm.rec, c.policy, c.tm.depth
	tnow := rec.Pause.TenantTime(c.now)
	// Placed around the retries booked ahead (the admission keeps what
	// this takes in; a refusal leaves them as they were).
	rec.Absorb(p, c.arrival, cost)
	windowed := len(p.Windows) > 0 && p.Capacity > 0
	var waiting []time.Time
	if windowed {
		// Depth is not the count of jobs that wait: jobs leave it when
		// handed to the dispatcher, a lead before their slot. Counted as
		// this job is decided, from its arrival (now plus the start lag):
		// a job due by then goes at once, it does not wait.
		waiting = s.waiting(c.tenant, c.arrival, c.ceiling != nil || c.paused)
		depth = len(waiting)
	}
	d, st, recent := leaky.Decide(leaky.State{TAT: rec.TAT}, rec.Recent(p), c.arrival, p, cost, depth)
	if !d.Admitted {
		// Decide's Retry-After counts from the arrival, the start lag ahead
		// of now; the lag is a moving estimate and may fall before the job
		// comes back. Counted from now, as if the lag were nil, it holds
		// whatever the estimate does.
		d.RetryAfter += c.arrival.Sub(tnow)
	}
	room := p.Capacity + p.Burst // waiting, and going at once
	if c.paused {
		room = p.Capacity // nothing goes at once: all of them wait
	}
	refuse := func(until time.Time) {
		d, st = leaky.Decision{RetryAfter: s.countRetryAfter(c, until, tnow)}, leaky.State{TAT: rec.TAT}
	}
	switch {
	case windowed && !d.Admitted && depth >= p.Capacity+p.Burst:
		// Decide refused it by count: room comes when enough have gone.
		refuse(untilFewer(waiting, p.Capacity+p.Burst))
	case !d.Admitted:
		// The rate refused it; the count may refuse it for longer (retries
		// booked past their places fill the room): the later of the two.
		if !windowed && depth >= room && s.countedAtArrival(c, depth) >= room {
			ra := s.countRetryAfter(c, untilFewer(s.depthSlots(c.tenant), p.Capacity+p.Burst), tnow)
			d.RetryAfter = max(d.RetryAfter, ra)
		}
	case windowed && (c.paused || d.Slot.After(c.arrival)) && depth >= p.Capacity:
		// It would wait, and capacity jobs wait already.
		refuse(untilFewer(waiting, p.Capacity))
	case !windowed && depth >= room && s.countedAtArrival(c, depth) >= room:
		// After a pause the room is capacity and burst again.
		refuse(untilFewer(s.depthSlots(c.tenant), p.Capacity+p.Burst))
	}
	if !d.Admitted {
		d.RetryAfter = queue.DispatchAt(rec.Pause, tnow.Add(d.RetryAfter), c.now).Sub(c.now)
	}
	return d, st, recent, rec.Booked
}

// countedAtArrival is how many of the tenant's depth jobs will still be
// counted when this job arrives (s.mu held; asked only when depth is at the
// bound). A job of an earlier call due by then leaves as the dispatcher
// takes it: the schedule has let this one in as of its arrival, and a
// dispatcher a few ms late on a busy machine must not refuse it while the
// queue has room (invariant 3; TestSimulatorAgreesWithTheService saw it).
// Paused or behind a ceiling, due jobs wait on: all of them count. Jobs of
// calls not yet committed always count (a batch's burst is counted as the
// model counts it).
func (s *Store) countedAtArrival(c *call, depth int) int {
	if c.paused || c.ceiling != nil {
		return depth
	}
	s.sched.tenantSlots(c.tenant, func(slot time.Time) {
		if !slot.After(c.arrival) {
			depth--
		}
	})
	return depth
}

// untilFewer is when fewer than n of the jobs at slots still wait: the
// slot (tenant time) of the one that leaves n behind it. Zero when fewer
// than n wait already. It sorts slots: only a refusal needs the order.
func untilFewer(slots []time.Time, n int) time.Time {
	if len(slots) < n {
		return time.Time{}
	}
	slices.SortFunc(slots, time.Time.Compare)
	return slots[len(slots)-n]
}

// countRetryAfter is a refusal's Retry-After, in tenant time from tnow,
// when the count bound refused the job until a waiting job's slot. A job
// due already and still counted leaves as soon as the dispatcher takes it
// (a job of the same call sent at once, or one a busy machine hands over
// late): 0, a retry at once (clients add their jitter). One held past its
// slot by a downstream's ceiling leaves when the ceiling lets it, which no
// slot says: one interval, as a guess. A pause is added by the caller.
func (s *Store) countRetryAfter(c *call, until, tnow time.Time) time.Duration {
	if until.After(tnow) {
		return until.Sub(tnow)
	}
	if c.ceiling != nil && !c.paused {
		return c.policy.Interval
	}
	return 0
}

// waiting lists the slots, in no order, of a tenant's jobs that wait at
// tenant time tnow (s.mu held): admitted, not being sent, and due later
// than tnow, or held back by a ceiling or a pause (dueWaits: due ones wait
// too). O(jobs of the tenant waiting): it is asked for every admission of
// a tenant with windows, and for a refusal by count.
func (s *Store) waiting(tenant string, tnow time.Time, dueWaits bool) []time.Time {
	var slots []time.Time
	count := func(slot time.Time, dueWaits bool) {
		if dueWaits || slot.After(tnow) {
			slots = append(slots, slot)
		}
	}
	s.sched.tenantSlots(tenant, func(slot time.Time) { count(slot, dueWaits) })
	if tm, ok := s.tenants[tenant]; ok {
		for _, slot := range tm.unsettled {
			count(slot, dueWaits) // admitted by a call not yet committed
		}
	}
	for _, j := range s.claims {
		if j.Tenant == tenant && !j.Slot.IsZero() {
			count(j.Slot, false) // handed over: waiting in the dispatcher until its slot
		}
	}
	return slots
}

// depthSlots lists the slots, in no order, of the jobs in a tenant's
// depth (s.mu held): waiting in the schedule or admitted by a call not yet
// committed. O(depth): asked only for a refusal by count.
func (s *Store) depthSlots(tenant string) []time.Time {
	var slots []time.Time
	s.sched.tenantSlots(tenant, func(slot time.Time) { slots = append(slots, slot) })
	if tm, ok := s.tenants[tenant]; ok {
		slots = append(slots, tm.unsettled...)
	}
	return slots
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
