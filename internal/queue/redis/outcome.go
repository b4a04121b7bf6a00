package redis

import (
	"cmp"
	"context"
	_ "embed"
	"errors"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"throttler/internal/leaky"
	"throttler/internal/queue"
)

var (
	//go:embed finish.lua
	finishLua    string
	finishScript = newScript("finish.lua", finishLua, true)
)

// recordOutcome records o, through passing Redis failures: the job is held
// (its lease renewed) until it is recorded. Once the service is stopping it
// gives up after a few tries; the lease then runs out and another worker
// sends the job again with the same Idempotency-Key.
func (s *Store) recordOutcome(stop context.Context, k shardKeys, j queue.Job, taskID string, o queue.Outcome) {
	backoff := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		err := s.finish(context.WithoutCancel(stop), k, j, taskID, o)
		if err == nil {
			return
		}
		s.log.Error("cannot record the outcome of an attempt; trying again", "job", j.ID, "err", err)
		if stop.Err() != nil && attempt >= 5 {
			return
		}
		time.Sleep(backoff)
		backoff = min(2*backoff, 5*time.Second)
	}
}

// finish records an attempt's outcome: in one script if it ends the job
// and changes nothing of its tenant's schedule, by the shared rule
// otherwise.
func (s *Store) finish(ctx context.Context, k shardKeys, j queue.Job, taskID string, o queue.Outcome) error {
	if o.Result == queue.Succeeded || (o.Result == queue.Failed && o.PauseUntil.IsZero()) {
		return s.finishDone(ctx, k, j, taskID, o)
	}
	paused, err := s.finishByRule(ctx, k, j, taskID, o)
	if err != nil {
		return err
	}
	if paused {
		// Sends other processes hold stop at the gate.
		if err := s.holdLanes(ctx, j.Tenant, o.PauseUntil, o.PauseDownstream); err != nil {
			s.log.Warn("cannot hold the shared gate after a pushback", "tenant", j.Tenant, "err", err)
		}
	}
	return nil
}

// finishDone records an attempt that ended the job (finish.lua).
func (s *Store) finishDone(ctx context.Context, k shardKeys, j queue.Job, taskID string, o queue.Outcome) error {
	state, msg := queue.StateSucceeded, ""
	if o.Result == queue.Failed {
		state, msg = queue.StateFailed, cmp.Or(o.Error, j.LastError)
	}
	ok, err := finishScript.RunInt(ctx, s.rdb, []string{k.job(j.ID), k.tenant(j.Tenant), k.inflight(), k.active(), k.failed(j.Tenant), k.idemOf(j), k.claimed(j.Tenant)},
		[]any{s.now(), taskID, string(state), microsOf(o.SentAt), o.Status, msg, s.retain.Milliseconds(), s.idle.Milliseconds()})
	if err != nil {
		return err
	}
	if ok == 0 {
		s.log.Warn("an attempt's outcome came after its lease ran out: another worker has the job", "job", j.ID, "result", o.Result)
	}
	return nil
}

// finishByRule records an outcome by queue.ApplyOutcome, in one optimistic
// transaction on the job, its tenant and its windows. paused reports a new
// pause of the tenant.
func (s *Store) finishByRule(ctx context.Context, k shardKeys, j queue.Job, taskID string, o queue.Outcome) (paused bool, err error) {
	p := s.policy(j.Tenant)
	watch := []string{k.tenant(j.Tenant), k.job(j.ID)}
	for _, w := range p.Windows {
		watch = append(watch, k.window(j.Tenant, w))
	}
	var expired *queue.Job
	txf := func(tx *goredis.Tx) error {
		paused, expired = false, nil
		st, ours, err := s.readForOutcome(ctx, tx, k, j, taskID, p)
		if err != nil || !ours {
			return err
		}
		rec := st.rec
		cur, pausedNow := queue.ApplyOutcome(&rec, j, o, st.now, p)
		_, err = tx.TxPipelined(ctx, func(pipe goredis.Pipeliner) error {
			s.writeOutcome(ctx, pipe, k, cur, st, rec, p)
			return nil
		})
		if err == nil {
			paused = pausedNow
			if cur.State == queue.StateExpired {
				expired = &cur
			}
		}
		return err
	}
	for range 100 {
		err = s.rdb.Watch(ctx, txf, watch...)
		if !errors.Is(err, goredis.TxFailedErr) {
			break
		}
	}
	if err != nil {
		return false, queue.Unavailable(err)
	}
	if expired != nil {
		expired.Tenant = j.Tenant
		s.expired(*expired)
	}
	return paused, nil
}

// outcomeState is what an outcome is applied to: the tenant (its record
// with its windows) at now.
type outcomeState struct {
	tenantState
	now time.Time
}

// readForOutcome reads, watched, job j's tenant and windows; ours is false
// if the job is no longer this task's (its lease ran out, another worker
// took it).
func (s *Store) readForOutcome(ctx context.Context, tx *goredis.Tx, k shardKeys, j queue.Job, taskID string, p leaky.Policy) (st outcomeState, ours bool, err error) {
	pipe := tx.Pipeline()
	tcmd := pipe.HMGet(ctx, k.tenant(j.Tenant), tenantFields...)
	jcmd := pipe.HMGet(ctx, k.job(j.ID), "state", "task")
	var timeCmd *goredis.TimeCmd
	if s.clock == nil {
		timeCmd = pipe.Time(ctx)
	}
	wcmds := make([]*goredis.StringSliceCmd, len(p.Windows))
	for i, w := range p.Windows {
		wcmds[i] = pipe.LRange(ctx, k.window(j.Tenant, w), 0, -1)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return st, false, err
	}
	state, _ := jcmd.Val()[0].(string)
	task, _ := jcmd.Val()[1].(string)
	if state != string(queue.StateDispatching) || task != taskID {
		s.log.Warn("an attempt's outcome came after its lease ran out: another worker has the job", "job", j.ID)
		return st, false, nil
	}
	if s.clock != nil {
		st.now = s.clock.Now()
	} else {
		st.now = timeCmd.Val()
	}
	st.tenantState = parseTenant(tcmd.Val())
	if len(p.Windows) > 0 {
		recent := make([]leaky.Recent, len(p.Windows))
		for i, c := range wcmds {
			recent[i] = parseRecent(c.Val())
		}
		st.rec.SetRecent(p, recent)
	}
	return st, true, nil
}

// writeOutcome queues the writes of an outcome applied: job cur, and its
// tenant's record, before (st) and after (rec).
func (s *Store) writeOutcome(ctx context.Context, pipe goredis.Pipeliner, k shardKeys, cur queue.Job, st outcomeState, rec queue.TenantRecord, p leaky.Policy) {
	tk, jk, now := k.tenant(cur.Tenant), k.job(cur.ID), st.now
	pipe.HSet(ctx, jk, "state", string(cur.State), "attempts", cur.Attempts, "failures", cur.Failures,
		"slot", microsOf(cur.Slot), "dispatch", microsOf(cur.DispatchAt), "sent", microsOf(cur.SentAt),
		"fin", microsOf(cur.FinishedAt), "err", cur.LastError, "status", cur.ResponseStatus)
	pipe.ZRem(ctx, k.inflight(), cur.ID)
	s.leaveClaimed(ctx, pipe, k, cur, st)
	pipe.HIncrBy(ctx, tk, "inflight", -1)
	if rec.TAT != st.rec.TAT || rec.Pause != st.rec.Pause {
		pipe.HSet(ctx, tk, "tat", microsOf(rec.TAT), "shift", rec.Pause.Shift.Microseconds(),
			"until", microsOf(rec.Pause.Until), "held", microsOf(rec.Pause.Held))
	}
	s.writeWindows(ctx, pipe, k, cur.Tenant, rec, now, p)
	switch cur.State {
	case queue.StateSucceeded:
		pipe.HIncrBy(ctx, tk, "delivered", 1)
	case queue.StateFailed:
		pipe.HIncrBy(ctx, tk, "failed", 1)
		pipe.ZAdd(ctx, k.failed(cur.Tenant), goredis.Z{Score: float64(micros(now)), Member: cur.ID})
		pipe.ZRemRangeByScore(ctx, k.failed(cur.Tenant), "-inf", strconv.FormatInt(micros(now.Add(-s.retain)), 10))
		pipe.PExpire(ctx, k.failed(cur.Tenant), s.retain)
	case queue.StateExpired:
		pipe.HIncrBy(ctx, tk, "expired", 1)
	default:
		pipe.HIncrBy(ctx, tk, "depth", 1)
	}
	jobs := st.depth + st.inFlight // this one is counted in flight
	if cur.State.Finished() {
		jobs--
		pipe.PExpire(ctx, jk, s.retain)
		pipe.PExpire(ctx, k.idemOf(cur), s.retain)
		pipe.ZIncrBy(ctx, k.active(), -1, cur.Tenant)
		pipe.ZRemRangeByScore(ctx, k.active(), "-inf", "0")
	}
	// As lib.lua's settle: the state lives while the tenant has jobs or a
	// hold, then expires idle after its schedule.
	if jobs > 0 || !rec.Pause.Held.IsZero() {
		pipe.Persist(ctx, tk)
	} else {
		pipe.PExpire(ctx, tk, max(queue.DispatchAt(rec.Pause, rec.TAT, now).Sub(now), 0)+s.idle)
	}
}

// leaveClaimed queues the move of job cur out of its tenant's claimed set:
// to the waiting set at its slot if it waits again; if it is finished, once
// its slot has come (as lib.lua's leave_claimed).
func (s *Store) leaveClaimed(ctx context.Context, pipe goredis.Pipeliner, k shardKeys, cur queue.Job, st outcomeState) {
	claimed := k.claimed(cur.Tenant)
	if !cur.State.Finished() {
		pipe.ZRem(ctx, claimed, cur.ID)
		pipe.ZAdd(ctx, k.waiting(cur.Tenant), goredis.Z{Score: float64(micros(cur.Slot)), Member: cur.ID})
		return
	}
	tnow := st.rec.Pause.TenantTime(st.now)
	pipe.ZRemRangeByScore(ctx, claimed, "-inf", strconv.FormatInt(micros(tnow), 10))
	if cur.Slot.After(tnow) {
		pipe.PExpire(ctx, claimed, cur.Slot.Sub(tnow)+s.idle)
	}
}

// writeWindows queues the rewrite of tenant's windows from rec.
func (s *Store) writeWindows(ctx context.Context, pipe goredis.Pipeliner, k shardKeys, tenant string, rec queue.TenantRecord, now time.Time, p leaky.Policy) {
	recent := rec.Recent(p)
	for i, w := range p.Windows {
		key := k.window(tenant, w)
		pipe.Del(ctx, key)
		var list []any
		for _, t := range recent[i] {
			list = append(list, micros(t))
		}
		if len(list) > 0 {
			pipe.RPush(ctx, key, list...)
			pipe.PExpire(ctx, key, max(queue.DispatchAt(rec.Pause, rec.TAT, now).Sub(now), 0)+w.Length+s.idle)
		}
	}
}
