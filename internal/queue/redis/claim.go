package redis

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	"throttler/internal/luascript"
	"throttler/internal/queue"
)

var (
	//go:embed claim.lua
	claimLua    string
	claimScript = newScript("claim.lua", claimLua, true)
)

// claim.lua's codes.
const (
	claimDrop    = 0 // the job is gone, done, or carried by another task
	claimNotYet  = 1
	claimed      = 2
	claimExpired = 3
	claimLeased  = 4 // another worker has it
	claimHeld    = 5 // its tenant is held by an operator
)

// claimReply is claim.lua's answer.
type claimReply struct {
	Code       int64
	Wait       time.Duration
	DispatchAt time.Time
	Now        time.Time
	Job        map[string]string // claimed: the job's hash
}

func (c *claimReply) Decode(r *luascript.Reply) {
	c.Code = r.Int()
	c.Wait = r.Duration()
	c.DispatchAt = r.Time()
	c.Now = r.Time()
	c.Job = r.Hash()
	if c.Code < claimDrop || c.Code > claimHeld {
		r.Fail(fmt.Errorf("unknown code %d", c.Code))
	}
}

// claim asks claim.lua for task taskID's job, lead before its slot.
func (s *Store) claim(ctx context.Context, k shardKeys, jobID, tenant, taskID string, lead time.Duration) (claimReply, error) {
	var r claimReply
	err := claimScript.Run(ctx, s.rdb, []string{k.job(jobID), k.tenant(tenant), k.handoff(), k.active(), k.inflight(), k.waiting(tenant), k.claimed(tenant)},
		[]any{s.now(), taskID, lead.Microseconds(), s.timing.Lease.Microseconds(), s.retain.Milliseconds(),
			(5 * time.Second).Microseconds(), s.holdMax().Microseconds(), k.tag, s.idle.Milliseconds()}, &r)
	return r, err
}

// runTask carries one task: claim its job, send it, record how it went;
// again while the job's next attempt is near; otherwise hand the task back
// to asynq for later.
func (c *consumer) runTask(stop context.Context, jobID, tenant, taskID string) error {
	s := c.s
	shard, ok := shardOfID(jobID)
	if !ok {
		s.log.Error("an asynq task that is not a throttler job; dropped", "payload", jobID)
		return nil
	}
	k := keysOf(shard)
	backoff, gaveUp := 50*time.Millisecond, time.Now().Add(30*time.Second)
	for {
		if stop.Err() != nil {
			return &notDue{wait: 0}
		}
		r, err := s.claim(stop, k, jobID, tenant, taskID, c.lead)
		if err != nil {
			// Redis is away (a restart, a failover): keep the task and
			// try again, rather than leave it to asynq's slower recovery
			// of tasks it could not hand back meanwhile.
			s.markTrouble()
			s.log.Error("cannot claim a due job; trying again", "job", jobID, "err", err)
			if !c.waitHolding(stop, jobID, shard, backoff, nil) || time.Now().After(gaveUp) {
				return &notDue{wait: time.Second}
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 50 * time.Millisecond
		switch r.Code {
		case claimDrop:
			return nil
		case claimExpired:
			if j, err := s.Job(stop, jobID); err == nil {
				s.expired(j)
			}
			return nil
		case claimLeased: // not ours to hold
			return &notDue{wait: r.Wait}
		case claimNotYet, claimHeld:
			if r.Wait > s.holdMax() {
				return &notDue{wait: r.Wait - s.timing.early()}
			}
			var resumed <-chan struct{}
			if r.Code == claimHeld { // a resume here wakes it at once
				resumed = s.resumed(tenant)
			}
			if !c.waitHolding(stop, jobID, shard, r.Wait, resumed) {
				return &notDue{wait: 0}
			}
			continue
		}
		j := jobFromHash(r.Job)
		j.DispatchAt = r.DispatchAt
		o := c.send(stop, k, j, taskID)
		if wait := time.Until(o.NotBefore); o.Result == queue.Released && wait > 0 {
			// Given back until then (the shared gate was busy): the job
			// keeps its place, and its task goes back to asynq meanwhile,
			// where a crash of this worker cannot strand it.
			return &notDue{wait: wait}
		}
	}
}

// waitHolding waits d (or until wake is closed) holding job id: its lease
// is renewed meanwhile. False if stop came first.
func (c *consumer) waitHolding(stop context.Context, id string, shard int, d time.Duration, wake <-chan struct{}) bool {
	c.held.add(id, shard)
	defer c.held.remove(id)
	return c.s.sleep(stop, d, wake)
}

// send hands claimed job j to the handler once there is room to send, and
// records the outcome; the job is held (its lease renewed) until then.
func (c *consumer) send(stop context.Context, k shardKeys, j queue.Job, taskID string) queue.Outcome {
	c.held.add(j.ID, k.shard)
	defer c.held.remove(j.ID)
	var o queue.Outcome
	select { // a place to send from: claimed jobs wait here, leased
	case c.sending <- struct{}{}:
		o = c.h(stop, j)
		<-c.sending
	case <-stop.Done():
		o = queue.Outcome{Result: queue.Released}
	}
	c.s.recordOutcome(stop, k, j, taskID, o)
	return o
}

// sleep waits d on the store's clock, or until wake is closed; false if
// stop came first.
func (s *Store) sleep(stop context.Context, d time.Duration, wake <-chan struct{}) bool {
	var after <-chan time.Time
	if s.clock != nil {
		after = s.clock.After(d)
	} else {
		t := time.NewTimer(d)
		defer t.Stop()
		after = t.C
	}
	select {
	case <-after:
		return true
	case <-wake:
		return true
	case <-stop.Done():
		return false
	}
}
