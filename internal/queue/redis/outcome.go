package redis

import (
	"cmp"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/luascript"
	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/queue/redis/owner"
	"github.com/throttler-dev/throttler/internal/rules"
)

var (
	//go:embed finish.lua
	finishLua    string
	finishScript = newScript("finish.lua", owner.FenceLua+finishLua, true)
	//go:embed missed.lua
	missedLua    string
	missedScript = newScript("missed.lua", missedLua, true)
)

// ending is an attempt that ended its job (Succeeded, or Failed with no
// pause): what finish.lua records in batches.
func ending(o queue.Outcome) bool {
	return o.Result == queue.Succeeded || (o.Result == queue.Failed && o.PauseUntil.IsZero())
}

// finishBatch records attempts that ended their jobs (ending), jobs[i]'s
// outcome outs[i], in one fenced script: recorded[i] is false for a job
// that was not being sent. beside[i] counts the other jobs of jobs[i]'s
// tenant handed over and not yet written (owned.unwrittenBeside).
func (s *Store) finishBatch(ctx context.Context, f owner.Fence, k partKeys, jobs []queue.Job, outs []queue.Outcome, beside []int) (recorded []bool, err error) {
	args := []any{f.Token(), s.scriptNow(), s.retain.Milliseconds(), s.idle.Milliseconds(), k.tag}
	for i, j := range jobs {
		args = append(args, finishArgs(j, outs[i], s.policy(j.Tenant), s.clockMargin(), beside[i])...)
	}
	var r finishReplies
	if err := finishScript.Run(ctx, s.rdb, []string{f.Key(), k.active(), k.sending()}, args, &r); err != nil {
		return nil, f.Err(err)
	}
	if len(r) != len(jobs) {
		return nil, fmt.Errorf("finish.lua: %d replies for %d jobs", len(r), len(jobs))
	}
	return r, nil
}

// finishArgs is finish.lua's arguments for job j's outcome o (ending):
// what rules.Finish makes of the job, the tenant's next after it
// (rules.AfterWrite, with margin), and where a late write leaves the jobs
// behind it (rules.Record.RunLate: the beside jobs handed over and not
// written are counted here, finish.lua adds those waiting).
func finishArgs(j queue.Job, o queue.Outcome, p leaky.Policy, margin time.Duration, beside int) []any {
	state, msg := queue.StateSucceeded, ""
	if o.Result == queue.Failed {
		state, msg = queue.StateFailed, cmp.Or(o.Error, j.LastError)
	}
	after := rules.AfterWrite(p, o.SentAt, j.EffectiveCost(), margin)
	late := rules.LateNext(p, j, o.SentAt)
	if !late.IsZero() {
		late = late.Add(time.Duration(beside) * p.Interval)
	}
	args := []any{j.ID, j.Tenant, string(state), microsOf(o.SentAt), o.Status, msg, j.IdempotencyKey, microsOf(after), responseArg(o.Response),
		microsOf(late), p.Interval.Microseconds(), flag(rules.CountsWaiting(p)), len(p.Windows)}
	for _, w := range p.Windows {
		args = append(args, w.String(), w.N, w.Length.Microseconds())
	}
	return args
}

// finishReplies is finish.lua's answer: whether each job was recorded.
type finishReplies []bool

func (l *finishReplies) Decode(r *luascript.Reply) {
	for r.More() {
		*l = append(*l, r.Flag())
	}
}

// finishByRule records an outcome by rules.Finish, in one optimistic
// transaction on the job, its tenant, its windows and the partition's
// lease (the fence: a stale owner's outcome is a *owner.FencedError). It
// returns the job as it is now (cur; ok false: it was not being sent) and
// whether the tenant paused anew. beside counts the other jobs of j's
// tenant handed over and not yet written (owned.unwrittenBeside).
func (s *Store) finishByRule(ctx context.Context, f owner.Fence, k partKeys, j queue.Job, o queue.Outcome, beside int) (cur queue.Job, ok, paused bool, err error) {
	p := s.policy(j.Tenant)
	watch := []string{f.Key(), k.tenant(j.Tenant), k.job(j.ID)}
	for _, w := range p.Windows {
		watch = append(watch, k.window(j.Tenant, w), k.sent(j.Tenant, w))
	}
	txf := func(tx *goredis.Tx) error {
		ok, paused = false, false
		st, ours, err := s.readForOutcome(ctx, tx, f, k, j, p)
		if err != nil || !ours {
			return err
		}
		rec := st.rec
		h := rules.Handover{Next: fromMicros(st.next)}
		next, pausedNow := rules.Finish(&rec, &h, j, o, st.now, p, s.clockMargin())
		// The jobs behind a late write: those waiting and those handed
		// over beside it and not written.
		rec.RunLate(p, j, o.SentAt, st.depth+beside)
		next.Response = o.Response // nil: the answer before stays in the hash
		_, err = tx.TxPipelined(ctx, func(pipe goredis.Pipeliner) error {
			s.writeOutcome(ctx, pipe, k, next, st, rec, p)
			if next.State.Finished() {
				oweCallback(ctx, pipe, k, next, st.now)     // in the same transaction (lib.lua's owe_callbacks)
				pipe.Publish(ctx, finishedChannel, next.ID) // and tell_finished
			}
			if micros(h.Next) > st.next {
				pipe.HSet(ctx, k.tenant(j.Tenant), "next", micros(h.Next))
			}
			if rec.Behind.After(st.rec.Behind) {
				pipe.HSet(ctx, k.tenant(j.Tenant), "behind", micros(rec.Behind))
			}
			return nil
		})
		if err == nil {
			cur, ok, paused = next, true, pausedNow
		}
		return err
	}
	for range 100 {
		err = s.rdb.Watch(ctx, txf, watch...)
		if !errors.Is(err, goredis.TxFailedErr) {
			break
		}
	}
	var fenced *owner.FencedError
	switch {
	case errors.As(err, &fenced):
		return cur, false, false, err
	case err != nil:
		return cur, false, false, queue.Unavailable(err)
	}
	if ok && cur.State == queue.StateExpired {
		expired := cur
		expired.Tenant = j.Tenant
		s.expired(expired)
	}
	return cur, ok, paused, nil
}

// missedDeadlines is the waiting jobs of tenant that its pause moved past
// their deadlines, each with its deadline (missed.lua).
func (s *Store) missedDeadlines(ctx context.Context, k partKeys, tenant string) (map[string]time.Time, error) {
	var r missedReply
	if err := missedScript.Run(ctx, s.rdb, []string{k.tenant(tenant), k.waiting(tenant)}, []any{k.tag}, &r); err != nil {
		return nil, err
	}
	return r, nil
}

// missedReply is missed.lua's answer: job id to deadline.
type missedReply map[string]time.Time

func (m *missedReply) Decode(r *luascript.Reply) {
	*m = map[string]time.Time{}
	for r.More() {
		id := r.Str()
		(*m)[id] = r.Time()
	}
}

// outcomeState is what an outcome is applied to: the tenant (its record
// with its windows) at now.
type outcomeState struct {
	tenantState
	now  time.Time
	next int64 // the tenant hash's next (claim.lua's), micros
}

// readForOutcome reads, watched, job j's tenant and windows, and the
// partition's lease: a *owner.FencedError if it is no longer f's; ours is
// false if the job is not being sent.
func (s *Store) readForOutcome(ctx context.Context, tx *goredis.Tx, f owner.Fence, k partKeys, j queue.Job, p leaky.Policy) (st outcomeState, ours bool, err error) {
	pipe := tx.Pipeline()
	lease := pipe.Get(ctx, f.Key())
	tcmd := pipe.HMGet(ctx, k.tenant(j.Tenant), tenantFields...)
	ncmd := pipe.HGet(ctx, k.tenant(j.Tenant), "next")
	jcmd := pipe.HMGet(ctx, k.job(j.ID), "state")
	var timeCmd *goredis.TimeCmd
	if s.clock == nil {
		timeCmd = pipe.Time(ctx)
	}
	wcmds := make([]*goredis.StringSliceCmd, len(p.Windows))
	scmds := make([]*goredis.StringSliceCmd, len(p.Windows))
	for i, w := range p.Windows {
		wcmds[i] = pipe.LRange(ctx, k.window(j.Tenant, w), 0, -1)
		scmds[i] = pipe.LRange(ctx, k.sent(j.Tenant, w), 0, -1)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, goredis.Nil) {
		return st, false, err
	}
	if holder := lease.Val(); holder != f.Token() {
		return st, false, &owner.FencedError{Partition: f.Partition, Epoch: f.Epoch, Holder: holder}
	}
	if state, _ := jcmd.Val()[0].(string); state != string(queue.StateDispatching) {
		s.log.Warn("an attempt's outcome for a job that is not being sent; ignored", "job", j.ID, "state", state)
		return st, false, nil
	}
	if s.clock != nil {
		st.now = s.clock.Now()
	} else {
		st.now = timeCmd.Val()
	}
	st.tenantState = parseTenant(tcmd.Val())
	st.next, _ = strconv.ParseInt(ncmd.Val(), 10, 64)
	if len(p.Windows) > 0 {
		recent := make([]leaky.Recent, len(p.Windows))
		for i, c := range wcmds {
			recent[i] = parseRecent(c.Val())
		}
		st.rec.SetRecent(p, recent)
		for i, c := range scmds {
			recent[i] = parseRecent(c.Val())
		}
		st.rec.SetMade(p, recent)
	}
	return st, true, nil
}

// writeOutcome queues the writes of an outcome applied: job cur, and its
// tenant's record, before (st) and after (rec).
func (s *Store) writeOutcome(ctx context.Context, pipe goredis.Pipeliner, k partKeys, cur queue.Job, st outcomeState, rec rules.Record, p leaky.Policy) {
	tk, jk, now := k.tenant(cur.Tenant), k.job(cur.ID), st.now
	pipe.HSet(ctx, jk, "state", string(cur.State), "attempts", cur.Attempts, "failures", cur.Failures,
		"slot", microsOf(cur.Slot), "dispatch", microsOf(cur.DispatchAt), "sent", microsOf(cur.SentAt),
		"fin", microsOf(cur.FinishedAt), "err", cur.LastError, "status", cur.ResponseStatus)
	if cur.Response != nil {
		pipe.HSet(ctx, jk, "resp", responseArg(cur.Response))
	}
	pipe.ZRem(ctx, k.sending(), cur.ID)
	s.leaveClaimed(ctx, pipe, k, cur, st, p)
	pipe.HIncrBy(ctx, tk, "inflight", -1)
	if rec.TAT != st.rec.TAT || rec.Pause != st.rec.Pause {
		pipe.HSet(ctx, tk, "tat", microsOf(rec.TAT), "shift", rec.Pause.Shift.Microseconds(),
			"until", microsOf(rec.Pause.Until), "held", microsOf(rec.Pause.Held))
	}
	if !slices.Equal(rec.Booked, st.rec.Booked) {
		if len(rec.Booked) == 0 {
			pipe.HDel(ctx, tk, "booked")
		} else {
			pipe.HSet(ctx, tk, "booked", formatBooked(rec.Booked))
		}
	}
	s.writeWindows(ctx, pipe, k, cur.Tenant, rec, now, p)
	// The counter the end counted in (rules.Record.CountEnd), by an
	// increment: the hash's other counters are not rewritten.
	for _, c := range []struct {
		field  string
		before int64
		after  int64
	}{
		{"delivered", st.rec.Delivered, rec.Delivered}, {"failed", st.rec.Failed, rec.Failed},
		{"expired", st.rec.Expired, rec.Expired}, {"cancelled", st.rec.Cancelled, rec.Cancelled},
	} {
		if c.after != c.before {
			pipe.HIncrBy(ctx, tk, c.field, c.after-c.before)
		}
	}
	if cur.State == queue.StateFailed {
		pipe.ZAdd(ctx, k.failed(cur.Tenant), goredis.Z{Score: float64(micros(now)), Member: cur.ID})
		pipe.ZRemRangeByScore(ctx, k.failed(cur.Tenant), "-inf", strconv.FormatInt(micros(now.Add(-s.retain)), 10))
		pipe.PExpire(ctx, k.failed(cur.Tenant), s.retain)
	}
	jobs := st.depth + st.scheduled + st.inFlight // this one is counted in flight
	if cur.State.Finished() {
		jobs--
		pipe.PExpire(ctx, jk, s.retain)
		pipe.PExpire(ctx, k.idemOf(cur), s.retain)
		pipe.ZIncrBy(ctx, k.active(), -1, cur.Tenant)
		pipe.ZRemRangeByScore(ctx, k.active(), "-inf", "0")
	} else {
		pipe.HIncrBy(ctx, tk, "depth", 1) // it waits again
	}
	// As lib.lua's settle.
	if ttl, forever := rules.KeepRecord(rec, jobs, now, s.idle); forever {
		pipe.Persist(ctx, tk)
	} else {
		pipe.PExpire(ctx, tk, ttl)
	}
}

// leaveClaimed queues the move of job cur out of its tenant's claimed set:
// to the waiting set at its slot if it waits again; if it is finished, once
// its slot has come (as lib.lua's leave_claimed), where the set is kept
// (rules.CountsWaiting for p).
func (s *Store) leaveClaimed(ctx context.Context, pipe goredis.Pipeliner, k partKeys, cur queue.Job, st outcomeState, p leaky.Policy) {
	claimed := k.claimed(cur.Tenant)
	if !cur.State.Finished() {
		pipe.ZRem(ctx, claimed, cur.ID)
		pipe.ZAdd(ctx, k.waiting(cur.Tenant), goredis.Z{Score: float64(micros(cur.Slot)), Member: cur.ID})
		return
	}
	if !rules.CountsWaiting(p) {
		return
	}
	tnow := st.rec.Pause.TenantTime(st.now)
	pipe.ZRemRangeByScore(ctx, claimed, "-inf", strconv.FormatInt(micros(tnow), 10))
	if cur.Slot.After(tnow) {
		pipe.PExpire(ctx, claimed, cur.Slot.Sub(tnow)+s.idle)
	}
}

// writeWindows queues the rewrite of tenant's windows from rec, and of
// their sends made (each kept as long as its window's list).
func (s *Store) writeWindows(ctx context.Context, pipe goredis.Pipeliner, k partKeys, tenant string, rec rules.Record, now time.Time, p leaky.Policy) {
	recent := rec.Recent(p)
	made, _ := rec.Made(p)
	for i, w := range p.Windows {
		ttl := max(rules.DispatchAt(rec.Pause, rec.TAT, now).Sub(now), 0) + w.Length + s.idle
		writeList(ctx, pipe, k.window(tenant, w), recent[i], ttl)
		writeList(ctx, pipe, k.sent(tenant, w), made[i], ttl)
	}
}

// writeList queues the rewrite of list key as times (microseconds), kept
// for ttl (none: no key).
func writeList(ctx context.Context, pipe goredis.Pipeliner, key string, times []time.Time, ttl time.Duration) {
	pipe.Del(ctx, key)
	var list []any
	for _, t := range times {
		list = append(list, micros(t))
	}
	if len(list) > 0 {
		pipe.RPush(ctx, key, list...)
		pipe.PExpire(ctx, key, ttl)
	}
}
