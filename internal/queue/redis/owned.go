package redis

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/queue/redis/owner"
	"github.com/throttler-dev/throttler/internal/rules"
)

// owned is one tenure of one partition: the partition's waiting jobs in
// memory (schedule), claimed in batches a lead before their dispatch
// time, each handed to the handler, which paces it in process; and the
// outcomes, recorded in batches. Every write is fenced by the tenure.
type owned struct {
	c     *consumer
	s     *Store
	k     partKeys
	fence owner.Fence
	// ctx ends with the tenure (lost, drained, or Consume's end): claims
	// stop, and sends not yet written go back to waiting.
	ctx    context.Context
	cancel context.CancelFunc
	send   context.Context // ctx, asking the lease right before each write

	mu    sync.Mutex
	sched schedule
	known map[string]bool // scheduled, or claimed and not recorded yet
	// handed are the jobs claimed and not recorded yet, by id: their
	// tenant, and whether their request is written (Store.Wrote).
	handed map[string]handedJob
	pace   map[string]time.Time // each tenant's next send by its rate, from the claims (see paced)
	// floors: each job waiting when the partition was taken over goes no
	// sooner than its tenant's next send as the last owner left it
	// (takeover.lua), whichever entry of it is claimed (its arrival may
	// have been scheduled before the load); jobs admitted since are
	// scheduled past it already.
	floors map[string]time.Time
	wake   chan struct{}
	// lastHanded is closed once the job claimed last is handed over.
	lastHanded chan struct{}
	// claiming: due entries are popped and their claim has not returned
	// (they are in neither the schedule nor the handler's hands).
	claiming bool
	// places are the places under caps held, by job id (places.go).
	places map[string]*place

	// parked are due jobs refused a place under their caps, by tenant, in
	// order (asked again when a place is given back here, and every
	// parkPoll: another process may give one back): the claim loop's own.
	parked map[string][]*entry

	// recountDue: the policies changed, and the claimed sets are to be
	// brought to them before the next claim (recount).
	recountDue atomic.Bool
	// repaceDue: tenants whose policies changed, whose backlogs are to be
	// placed anew before the next claim (repace.go). o.mu.
	repaceDue map[string]bool
	// repaced: the new dispatch times of jobs a repace moved before this
	// owner read their arrivals, whose lines have their old ones. o.mu.
	repaced map[string]time.Time

	// recording counts attempts that did not end their job and whose
	// outcome is being written: the job is back in the schedule after.
	recording atomic.Int64

	loaded   atomic.Bool    // load has read the partition
	sends    sync.WaitGroup // the claimed jobs' goroutines
	outcomes chan ended     // to the writer
	loopDone chan struct{}  // the claim loop has ended
	written  chan struct{}  // the writer has ended
	drained  sync.Once
}

// handedJob is a job claimed and not recorded yet (owned.handed).
type handedJob struct {
	tenant  string
	slot    time.Time
	cost    int
	written bool
}

// ended is an attempt that ended its job, for the writer.
type ended struct {
	job queue.Job
	out queue.Outcome
}

func newOwned(c *consumer, f owner.Fence) *owned {
	o := &owned{c: c, s: c.s, k: keysOf(f.Partition), fence: f,
		known: map[string]bool{}, repaced: map[string]time.Time{}, handed: map[string]handedJob{}, places: map[string]*place{}, parked: map[string][]*entry{}, pace: map[string]time.Time{}, floors: map[string]time.Time{}, wake: make(chan struct{}, 1),
		outcomes: make(chan ended, 1024), loopDone: make(chan struct{}), written: make(chan struct{})}
	o.lastHanded = make(chan struct{})
	close(o.lastHanded)
	o.ctx, o.cancel = context.WithCancel(c.stop)
	o.send = queue.WithSendCheck(o.ctx, func() bool { return c.mgr.Holds(f.Partition, f.Epoch) })
	return o
}

func (o *owned) start() {
	o.c.running.Add(3)
	go func() { defer o.c.running.Done(); defer close(o.loopDone); o.run() }()
	go func() { defer o.c.running.Done(); defer close(o.written); o.writeOutcomes() }()
	go func() { defer o.c.running.Done(); o.keepingPlaces() }()
}

// abandon ends a lost tenure: nothing more is claimed or sent; what is
// being written finishes, and its outcome is refused by the fence (the
// next owner sends the job again, with the same Idempotency-Key).
func (o *owned) abandon() {
	o.cancel()
	o.c.running.Add(1)
	go func() {
		defer o.c.running.Done()
		<-o.loopDone
		o.sends.Wait()
		o.closeOutcomes()
	}()
}

// drain ends a tenure cleanly: claims stop, sends not yet written go
// back to waiting, and drain returns once every outcome is recorded.
func (o *owned) drain(ctx context.Context) {
	o.cancel()
	<-o.loopDone
	o.sends.Wait()
	o.closeOutcomes()
	select {
	case <-o.written:
	case <-ctx.Done():
		o.s.log.Warn("a partition handed over before all its outcomes were recorded: those jobs go again from the next owner", "partition", o.fence.Partition)
	}
}

func (o *owned) closeOutcomes() { o.drained.Do(func() { close(o.outcomes) }) }

func (o *owned) isLoaded() bool { return o.loaded.Load() }

// caughtUp reports whether every job the tenure knows of and that is due
// by now plus the lead has been handed over (arrivals not yet read are
// the caller's to ask about).
func (o *owned) caughtUp() bool { return o.behind() == "" }

// behind says what the tenure has still to do at this moment ("" none):
// caughtUp, in words, for a test that waited for it in vain.
func (o *owned) behind() string {
	p := o.fence.Partition
	if !o.isLoaded() {
		return fmt.Sprintf("partition %d not loaded", p)
	}
	if n := o.recording.Load(); n > 0 {
		return fmt.Sprintf("partition %d recording %d outcomes", p, n)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.claiming {
		return fmt.Sprintf("partition %d claiming", p)
	}
	if next, any := o.sched.next(); any && !next.After(o.s.localNow().Add(o.c.lead)) {
		return fmt.Sprintf("partition %d has an entry due at %v (now %v, lead %v)", p, next.Format("15:04:05.000000"), o.s.localNow().Format("15:04:05.000000"), o.c.lead)
	}
	select {
	case <-o.lastHanded:
		return ""
	default:
		return fmt.Sprintf("partition %d has a claimed job not handed over", p)
	}
}

// holds is whether the tenure still holds, by this worker's clock.
func (o *owned) holds() bool { return o.c.mgr.Holds(o.fence.Partition, o.fence.Epoch) }

// run loads the partition, then claims each job as it comes due.
func (o *owned) run() {
	if !o.load() {
		return
	}
	backoff := 50 * time.Millisecond
	for o.ctx.Err() == nil {
		if o.recountDue.Swap(false) {
			o.recount()
			o.placeHanded()
		}
		o.repace()
		o.mu.Lock()
		due := o.paced(o.sched.popDue(o.s.localNow().Add(o.c.lead), claimBatchMax))
		next, any := o.sched.next()
		o.claiming = len(due) > 0 || len(o.parked) > 0
		o.mu.Unlock()
		var expiring []*entry
		if len(due) > 0 || len(o.parked) > 0 {
			due, expiring = o.place(due)
		}
		if len(due) == 0 && len(expiring) == 0 {
			o.mu.Lock()
			o.claiming = false
			o.mu.Unlock()
			wait := time.Hour
			if any {
				wait = next.Sub(o.s.localNow()) - o.c.lead
			}
			if len(o.parked) > 0 {
				wait = min(wait, parkPoll)
			}
			o.mu.Lock()
			if len(o.repaceDue) > 0 { // a repace that failed: again in a second
				wait = min(wait, time.Second)
			}
			o.mu.Unlock()
			o.s.sleep(o.ctx, max(wait, 0), o.wake)
			continue
		}
		err := o.claim(expiring, expireOnly)
		if err == nil {
			expiring = nil
			err = o.claim(due, o.c.lead)
		}
		o.mu.Lock()
		o.claiming = false
		o.mu.Unlock()
		if err != nil {
			if errors.Is(err, owner.ErrFenced) {
				o.s.log.Warn("the partition's lease is another worker's now: stopping", "partition", o.fence.Partition)
				o.cancel()
				return
			}
			o.s.log.Error("cannot claim due jobs; trying again", "partition", o.fence.Partition, "err", err)
			due = append(due, expiring...)
			o.unplace(idsOf(due)...)
			o.reschedule(due, o.s.localNow().Add(backoff))
			o.s.sleep(o.ctx, backoff, nil)
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 50 * time.Millisecond
	}
}

// paced keeps of due the entries whose tenants may send by a lead from
// now, at most a burst of each per batch, and puts the others back for
// when they may: a tenant's backlog (after an outage, a takeover, a
// pause) is claimed at its rate, a job or a burst at a time, not all at
// once. A claimed job is being sent: nobody else can cancel or hold it,
// and a crash repeats it. (Its pace is the dispatcher's gate's, read
// ahead: the gate still decides the write.) o.mu held.
func (o *owned) paced(due []*entry) []*entry {
	by := o.s.localNow().Add(o.c.lead)
	ready := due[:0]
	taken := map[string]int{}
	for _, e := range due {
		p := o.s.policy(e.tenant)
		if e.expiry {
			e.paced = false
			ready = append(ready, e)
			continue
		}
		at := o.pace[e.tenant].Add(-p.Tolerance())
		if at.After(by) || taken[e.tenant] >= max(p.Burst, 1) {
			// Looked at again once the tenant's pace comes (past the
			// claims of this batch, which move it on), or sooner if a
			// reload lets it (repace).
			if !e.paced {
				e.paced, e.due = true, e.at
			}
			e.at = clock.Later(at, e.at)
			o.sched.add(e)
			continue
		}
		e.paced = false
		taken[e.tenant]++
		ready = append(ready, e)
	}
	if len(o.pace) > 4096 { // the paces of tenants long idle
		for tenant, at := range o.pace {
			if at.Before(by.Add(-time.Hour)) {
				delete(o.pace, tenant)
			}
		}
	}
	return ready
}

// claimedPace moves tenant's pace past claimed job j: its next job may
// go cost intervals after it.
func (o *owned) claimedPace(j queue.Job) {
	p := o.s.policy(j.Tenant)
	o.mu.Lock()
	o.pace[j.Tenant] = clock.Later(o.pace[j.Tenant], j.DispatchAt).Add(time.Duration(j.EffectiveCost()) * p.Interval)
	o.mu.Unlock()
}

// claimBatchMax is the most jobs one claim takes.
const claimBatchMax = 200

// load is the tenure's first step: the last owner's sends taken back and
// the waiting jobs scheduled, each tenant no earlier than the last owner
// could have sent its next job. False if the tenure ended first.
func (o *owned) load() bool {
	backoff := 50 * time.Millisecond
	for {
		// A few loads at a time per worker: 32 partitions taken at once,
		// each a stream of takeover scripts, kept Redis from the lease
		// renewals long enough to lose them all (100,000 tenants waiting).
		select {
		case o.c.loading <- struct{}{}:
		case <-o.ctx.Done():
			return false
		}
		began := time.Now()
		now, taken, tenants, err := o.s.takeOver(o.ctx, o.fence, o.k)
		<-o.c.loading
		if err == nil {
			waiting := 0
			o.mu.Lock()
			margin := o.s.clockMargin() // this worker may read Redis's clock that early
			for _, t := range tenants {
				var floor time.Time
				if next := t.Next.Add(margin); !t.Next.IsZero() && next.After(now) {
					floor = next
				}
				for _, w := range t.Waiting {
					place := rules.DispatchAt(t.Pause, w.Slot, now)
					at := clock.Later(place, floor)
					if !w.Missed.IsZero() {
						// Moved past its deadline (or held, and the hold
						// may outlast it): claimed at the deadline (a lead
						// after its entry's time), which expires it.
						at = w.Missed.Add(o.c.lead)
					}
					if !floor.IsZero() {
						o.floors[w.ID] = floor
					}
					o.addLocked(&entry{at: at, place: place, id: w.ID, tenant: t.Name, held: !t.Pause.Held.IsZero(), expiry: !w.Missed.IsZero()})
				}
				waiting += len(t.Waiting)
			}
			o.mu.Unlock()
			o.loaded.Store(true)
			o.s.log.Info("loaded a partition taken", "partition", o.fence.Partition, "epoch", o.fence.Epoch,
				"tenants", len(tenants), "waiting", waiting, "took", time.Since(began).Round(time.Millisecond))
			if taken > 0 {
				o.s.log.Warn("took back jobs the last owner of the partition was sending: they go again with the same Idempotency-Key", "partition", o.fence.Partition, "jobs", taken)
			}
			return true
		}
		if errors.Is(err, owner.ErrFenced) {
			o.s.log.Warn("cannot load a partition taken: its lease is another worker's already", "partition", o.fence.Partition, "err", err)
			return false
		}
		if o.ctx.Err() != nil {
			return false
		}
		o.s.log.Error("cannot load a partition taken over; trying again", "partition", o.fence.Partition, "err", err)
		if !o.s.sleep(o.ctx, backoff, nil) {
			return false
		}
		backoff = min(2*backoff, time.Second)
	}
}

// arrive schedules the jobs of arrivals lines (pollArrivals).
func (o *owned) arrive(lines []string) {
	o.mu.Lock()
	for _, line := range lines {
		id, at, tenant, ok := parseArrival(line)
		if !ok {
			o.s.log.Error("a line in a partition's arrivals that is not a job; skipped", "partition", o.fence.Partition, "line", line)
			continue
		}
		if !o.known[id] {
			if moved, ok := o.repaced[id]; ok {
				at = moved
				delete(o.repaced, id)
			}
			o.addLocked(&entry{at: at, place: at, id: id, tenant: tenant})
		}
	}
	o.mu.Unlock()
	o.poke()
}

func (o *owned) addLocked(e *entry) {
	o.known[e.id] = true
	o.sched.add(e)
}

func (o *owned) poke() {
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

// reschedule puts entries back, due at (zero: their own time).
func (o *owned) reschedule(es []*entry, at time.Time) {
	o.mu.Lock()
	for _, e := range es {
		if !at.IsZero() {
			e.at = at
		}
		o.sched.add(e)
	}
	o.mu.Unlock()
	o.poke()
}

// forget drops job id from the tenure's memory: it is finished, or
// nobody's to send.
func (o *owned) forget(id string) {
	o.mu.Lock()
	delete(o.known, id)
	delete(o.floors, id)
	delete(o.handed, id)
	o.mu.Unlock()
}

// wrote notes that claimed job id's request is written.
func (o *owned) wrote(id string) {
	o.mu.Lock()
	if h, ok := o.handed[id]; ok {
		h.written = true
		o.handed[id] = h
	}
	o.mu.Unlock()
}

// unwrittenBeside counts the other jobs of j's tenant claimed here and not
// yet written, if out's write came late (rules.LateNext; 0 if not): behind
// it they go after it, whatever their slots (rules.Record.RunLate). Those
// written already are not counted, though their outcomes may not be
// recorded yet.
func (o *owned) unwrittenBeside(j queue.Job, out queue.Outcome) int {
	if rules.LateNext(o.s.policy(j.Tenant), j, out.SentAt).IsZero() {
		return 0 // not needed: most writes are on time
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for id, h := range o.handed {
		if h.tenant == j.Tenant && id != j.ID && !h.written {
			n++
		}
	}
	return n
}

func (o *owned) wakeHeld(tenant string) {
	o.mu.Lock()
	o.sched.wake(tenant, o.s.localNow(), func(id string) time.Time { return o.floors[id] })
	o.mu.Unlock()
	o.poke()
}

// expireOnly is a claim's horizon that no dispatch time is within: the
// claim expires the jobs whose deadlines have passed and claims none.
const expireOnly = -100 * 365 * 24 * time.Hour

// claim claims the due entries within horizon of their dispatch times
// and starts the send of each job claimed.
func (o *owned) claim(due []*entry, horizon time.Duration) error {
	if len(due) == 0 {
		return nil
	}
	r, err := o.s.claimBatch(context.WithoutCancel(o.ctx), o.fence, o.k, due, horizon)
	if err != nil {
		return err
	}
	now := o.s.localNow()
	var later []*entry
	var unclaimed []string
	for i, e := range due {
		c := r.Jobs[i]
		if c.Code != claimed {
			unclaimed = append(unclaimed, e.id)
		}
		switch c.Code {
		case claimDrop:
			o.forget(e.id)
		case claimExpired:
			o.forget(e.id)
			if j, err := o.s.Job(o.ctx, e.id); err == nil {
				o.s.expired(j)
			}
		case claimNotYet, claimHeld:
			e.at, e.held = now.Add(c.Wait+o.c.lead), c.Code == claimHeld
			e.expiry = c.Code == claimNotYet && c.Wait < c.DispatchAt.Sub(now)-o.c.lead
			if horizon == expireOnly && c.Code == claimNotYet {
				// Its wait is to its deadline: an expiry still if it goes
				// after it, else (a repace moved it) a job due at its time.
				if e.expiry = c.DispatchAt.After(r.Now.Add(c.Wait)); !e.expiry {
					e.at = c.DispatchAt
				}
			}
			later = append(later, e)
		case claimed:
			j := claimedJob(c)
			o.mu.Lock()
			floor := o.floors[j.ID]
			delete(o.floors, j.ID)
			o.handed[j.ID] = handedJob{tenant: j.Tenant, slot: j.Slot, cost: j.EffectiveCost()}
			// Claimed a lead before its tenant's pace let it (paced): it is
			// handed over for then, as the gate will let it go, not for its
			// slot, which the pace has passed.
			paced := o.pace[j.Tenant].Add(-o.s.policy(j.Tenant).Tolerance())
			o.mu.Unlock()
			j.DispatchAt = clock.Later(clock.Later(j.DispatchAt, floor), paced)
			if !j.NotBefore.IsZero() {
				// Its not_before is a time of Redis's clock, which this
				// process reads up to its margin early: waited for past
				// the margin, the job cannot go before it.
				j.DispatchAt = clock.Later(j.DispatchAt, j.NotBefore.Add(o.s.clockMargin()))
			}
			o.claimedPace(j)
			o.startSend(j)
		}
	}
	o.unplace(unclaimed...)
	if len(later) > 0 {
		o.reschedule(later, time.Time{})
	}
	return nil
}

// startSend hands claimed job j to the handler once there is room, and
// records how it went. Jobs are handed over in the order they were
// claimed (slot order): each waits for the one before it to be handed.
func (o *owned) startSend(j queue.Job) {
	o.sends.Add(1)
	o.mu.Lock()
	before, handed := o.lastHanded, make(chan struct{})
	o.lastHanded = handed
	o.mu.Unlock()
	go func() {
		defer o.sends.Done()
		var out queue.Outcome
		select {
		case <-before:
		case <-o.ctx.Done():
		}
		select {
		case o.c.sending <- struct{}{}:
			o.c.s.handed.Add(1)
			close(handed)
			out = o.c.h(o.send, j)
			<-o.c.sending
		case <-o.ctx.Done():
			close(handed)
			out = queue.Outcome{Result: queue.Released}
		}
		o.record(j, out)
	}()
}

// record records an attempt's outcome: in the writer's next batch if it
// ended the job, by the shared rule at once otherwise (the job waits
// again: it goes back in the schedule), or if its write moves a send in
// its tenant's windows (finish.lua leaves the windows as they are).
func (o *owned) record(j queue.Job, out queue.Outcome) {
	if ending(out) && !rules.LateInWindows(o.s.policy(j.Tenant), j, out.SentAt) {
		o.outcomes <- ended{job: j, out: out}
		return
	}
	o.recording.Add(1)
	defer o.recording.Add(-1)
	o.retrying(j.ID, func(ctx context.Context) error {
		cur, ok, paused, err := o.s.finishByRule(ctx, o.fence, o.k, j, out, o.unwrittenBeside(j, out))
		if err != nil {
			return err
		}
		o.mu.Lock()
		delete(o.handed, j.ID) // it waits again, or it is done; no longer sent, so placeHanded leaves it
		o.mu.Unlock()
		o.unplace(j.ID)
		if !ok || cur.State.Finished() {
			o.forget(j.ID)
			return nil
		}
		if paused {
			o.holdSharedLanes(ctx, j.Tenant, out)
			o.expireMissed(ctx, j.Tenant)
		}
		o.reschedule([]*entry{{at: cur.DispatchAt, place: cur.DispatchAt, id: j.ID, tenant: j.Tenant}}, time.Time{})
		return nil
	})
}

// expireMissed makes the jobs of tenant that its new pause moved past
// their deadlines due at those deadlines, when their claims expire them:
// the tenant's pace, which resends of a job pushed back again and again
// may take turn after turn, does not hold an expiry. If it cannot read
// them they are expired when the pace lets the owner look at them.
func (o *owned) expireMissed(ctx context.Context, tenant string) {
	missed, err := o.s.missedDeadlines(ctx, o.k, tenant)
	if err != nil {
		o.s.log.Warn("cannot read which jobs a pushback moved past their deadlines: they expire when their tenant's pace reaches them", "tenant", tenant, "err", err)
		return
	}
	if len(missed) == 0 {
		return
	}
	o.mu.Lock()
	o.sched.expire(missed, o.c.lead)
	o.mu.Unlock()
	o.poke()
}

// holdSharedLanes holds the shared gate's lanes of a tenant pushed back,
// when its downstream has a ceiling that spans partitions (other owners'
// sends to it pass that gate).
func (o *owned) holdSharedLanes(ctx context.Context, tenant string, out queue.Outcome) {
	if _, ceiling := o.s.ceiling(tenant); ceiling == nil {
		return
	}
	if err := o.s.holdLanes(ctx, tenant, out.PauseUntil, out.PauseDownstream); err != nil {
		o.s.log.Warn("cannot hold the shared gate after a pushback", "tenant", tenant, "err", err)
	}
}

// retrying runs write through passing Redis failures, while the tenure
// holds. A fenced write, or a tenure lost meanwhile, gives up: the next
// owner takes the job back.
func (o *owned) retrying(what string, write func(context.Context) error) {
	backoff := 50 * time.Millisecond
	for {
		err := write(context.WithoutCancel(o.ctx))
		if err == nil {
			return
		}
		if errors.Is(err, owner.ErrFenced) || !o.holds() {
			o.s.log.Warn("an outcome not recorded: the partition is another worker's now, which sends the job again", "partition", o.fence.Partition, "job", what, "err", err)
			return
		}
		o.s.log.Error("cannot record an outcome; trying again", "partition", o.fence.Partition, "job", what, "err", err)
		time.Sleep(backoff)
		backoff = min(2*backoff, time.Second)
	}
}

// writeOutcomes records the attempts that ended their jobs, in one round
// trip all those that come within finishWindow of the first (or
// finishBatchMax of them), until the tenure's outcomes are closed.
func (o *owned) writeOutcomes() {
	window := time.NewTimer(time.Hour)
	defer window.Stop()
	for first := range o.outcomes {
		batch := []ended{first}
		window.Reset(finishWindow)
	more:
		for len(batch) < finishBatchMax {
			select {
			case e, ok := <-o.outcomes:
				if !ok {
					break more
				}
				batch = append(batch, e)
			case <-window.C:
				break more
			}
		}
		window.Stop()
		o.writeBatch(batch)
	}
}

// finishWindow is how long the writer gathers outcomes before it records
// them, as the embedded store's group commit does: the send is made
// already, so only the record waits. Taking whatever had come at once
// instead wrote one or two outcomes per round trip under a steady flow.
const finishWindow = 5 * time.Millisecond

// finishBatchMax is the most outcomes one write records.
const finishBatchMax = 200

func (o *owned) writeBatch(batch []ended) {
	jobs := make([]queue.Job, len(batch))
	outs := make([]queue.Outcome, len(batch))
	beside := make([]int, len(batch))
	for i, e := range batch {
		jobs[i], outs[i], beside[i] = e.job, e.out, o.unwrittenBeside(e.job, e.out)
	}
	o.retrying(jobs[0].ID, func(ctx context.Context) error {
		_, err := o.s.finishBatch(ctx, o.fence, o.k, jobs, outs, beside)
		return err
	})
	ids := make([]string, len(jobs))
	for i, j := range jobs {
		o.forget(j.ID)
		ids[i] = j.ID
	}
	o.unplace(ids...)
}
