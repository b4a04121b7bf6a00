package redis

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	goredis "github.com/redis/go-redis/v9"

	"throttler/internal/leaky"
	"throttler/internal/queue"
)

// notDue is a handler's answer for a task whose job must wait longer than
// a worker should hold it: asynq runs the task again after wait, and,
// since it is not a failure (Config.IsFailure), uses up none of its
// retries.
type notDue struct{ wait time.Duration }

func (e *notDue) Error() string { return fmt.Sprintf("not due for %v", e.wait) }

// holdMax is how long a worker holds a claimed task waiting for its job's
// claim time, rather than handing it back to asynq: a task comes up to
// early() before its slot, so a worker holds it about that long.
func (s *Store) holdMax() time.Duration {
	if s.clock != nil {
		return time.Duration(1 << 62) // a test clock: asynq cannot wait on it
	}
	return s.timing.early() + time.Second
}

// Consume implements Store: an asynq server per shard, whose handler claims
// the task's job, hands it to h at its slot, and records the outcome. (One
// server per shard, not one for all: an asynq server takes tasks one at a
// time, a round trip each, and one would cap a worker's deliveries.) Beside
// them, a worker renews the leases of the jobs it holds, takes back the
// jobs of workers that died holding them, and makes the tasks of jobs
// whose admitting process died before it could.
func (s *Store) Consume(ctx context.Context, h queue.Handler, opts queue.ConsumeOptions) error {
	lead := cmp.Or(opts.Lead, queue.DefaultLead)
	held := &heldJobs{ids: map[string]heldJob{}}
	// Jobs being sent (handed to h, not finished) are bounded by
	// Concurrency across the shards, as on the embedded store; tasks that
	// only wait for their slot are not (each shard's server holds that
	// many).
	sending := make(chan struct{}, cmp.Or(opts.Concurrency, 1024))
	mux := asynq.HandlerFunc(func(tctx context.Context, t *asynq.Task) error {
		taskID, _ := asynq.GetTaskID(tctx)
		jobID, tenant := splitTaskPayload(t.Payload())
		return s.runTask(ctx, h, lead, held, sending, jobID, tenant, taskID)
	})
	var servers []*asynq.Server
	defer func() {
		for _, srv := range servers {
			srv.Shutdown()
		}
	}()
	for shard := range Shards {
		srv := asynq.NewServerFromRedisClient(s.rdb, asynq.Config{
			Concurrency:              cmp.Or(opts.Concurrency, 1024),
			Queues:                   map[string]int{queueName(shard): 1},
			TaskCheckInterval:        s.timing.Poll,
			DelayedTaskCheckInterval: s.timing.Forward,
			IsFailure:                func(err error) bool { var nd *notDue; return !errors.As(err, &nd) },
			RetryDelayFunc: func(n int, err error, t *asynq.Task) time.Duration {
				var nd *notDue
				if errors.As(err, &nd) {
					return nd.wait
				}
				return asynq.DefaultRetryDelayFunc(n, err, t)
			},
			// Handlers watch ctx themselves and give their jobs back at
			// once; this only bounds a send already being written.
			ShutdownTimeout: 30 * time.Second,
			Logger:          asynqLogger{s},
			LogLevel:        asynq.WarnLevel,
		})
		if err := srv.Start(mux); err != nil {
			return fmt.Errorf("asynq server: %w", err)
		}
		servers = append(servers, srv)
	}
	var wg sync.WaitGroup
	wg.Add(2)
	stopRenewing := make(chan struct{})
	go func() {
		defer wg.Done()
		s.renew(stopRenewing, held)
	}()
	go func() {
		defer wg.Done()
		s.sweep(ctx)
	}()
	<-ctx.Done()
	// Shut the servers down together: each waits for its handlers, which
	// all see ctx and give their jobs back at once.
	var down sync.WaitGroup
	for _, srv := range servers {
		down.Add(1)
		go func() { defer down.Done(); srv.Shutdown() }()
	}
	down.Wait()
	servers = nil
	close(stopRenewing)
	wg.Wait()
	return nil
}

// heldJobs are the jobs this process holds (waiting for their slot, or
// being sent): their leases are renewed. Counted: two tasks of one job can
// be held at once (an old one asynq runs again, and the job's new one).
type heldJobs struct {
	mu  sync.Mutex
	ids map[string]heldJob
}

type heldJob struct{ shard, n int }

func (hj *heldJobs) add(id string, shard int) {
	hj.mu.Lock()
	h := hj.ids[id]
	hj.ids[id] = heldJob{shard, h.n + 1}
	hj.mu.Unlock()
}

func (hj *heldJobs) remove(id string) {
	hj.mu.Lock()
	if h := hj.ids[id]; h.n > 1 {
		hj.ids[id] = heldJob{h.shard, h.n - 1}
	} else {
		delete(hj.ids, id)
	}
	hj.mu.Unlock()
}

func (hj *heldJobs) byShard() map[int][]any {
	hj.mu.Lock()
	defer hj.mu.Unlock()
	out := map[int][]any{}
	for id, h := range hj.ids {
		out[h.shard] = append(out[h.shard], id)
	}
	return out
}

// runTask carries one task: claim its job, send it, record how it went;
// again while the job's next attempt is near; otherwise hand the task back
// to asynq for later.
func (s *Store) runTask(stop context.Context, h queue.Handler, lead time.Duration, held *heldJobs, sending chan struct{}, jobID, tenant, taskID string) error {
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
		r, err := s.claim(stop, k, jobID, tenant, taskID, lead)
		if err != nil {
			// Redis is away (a restart, a failover): keep the task and
			// try again, rather than leave it to asynq's slower recovery
			// of tasks it could not hand back meanwhile.
			s.trouble.Store(time.Now().UnixNano())
			s.log.Error("cannot claim a due job; trying again", "job", jobID, "err", err)
			held.add(jobID, shard)
			ok := s.sleep(stop, backoff, nil)
			held.remove(jobID)
			if !ok || time.Now().After(gaveUp) {
				return &notDue{wait: time.Second}
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 50 * time.Millisecond
		switch toInt(r[0]) {
		case 0: // gone, done, or carried by another task
			return nil
		case 3:
			j, err := s.Job(stop, jobID)
			if err == nil {
				s.expired(j)
			}
			return nil
		case 4: // another worker is sending it: not ours to hold
			return &notDue{wait: time.Duration(toInt(r[1])) * time.Microsecond}
		case 1, 5:
			wait := time.Duration(toInt(r[1])) * time.Microsecond
			if wait > s.holdMax() {
				return &notDue{wait: wait - s.timing.early()}
			}
			var resumed <-chan struct{}
			if toInt(r[0]) == 5 { // held: a resume here wakes it at once
				resumed = s.resumed(tenant)
			}
			held.add(jobID, shard) // its lease is renewed while it waits here
			ok := s.sleep(stop, wait, resumed)
			held.remove(jobID)
			if !ok {
				return &notDue{wait: 0}
			}
			continue
		}
		fields := map[string]string{}
		for i := 3; i+1 < len(r); i += 2 {
			fields[r[i].(string)] = r[i+1].(string)
		}
		j := jobFromHash(fields)
		j.DispatchAt = fromMicros(toInt(r[1]))
		held.add(jobID, shard) // claimed: its lease is renewed until it is recorded
		var o queue.Outcome
		select { // a place to send from: claimed jobs wait here, leased
		case sending <- struct{}{}:
			o = h(stop, j)
			<-sending
		case <-stop.Done():
			o = queue.Outcome{Result: queue.Released}
		}
		s.recordOutcome(stop, k, j, taskID, o)
		held.remove(jobID)
		if wait := time.Until(o.NotBefore); o.Result == queue.Released && wait > 0 {
			// Given back until then (the shared gate was busy): the job
			// keeps its place, and its task goes back to asynq meanwhile,
			// where a crash of this worker cannot strand it.
			return &notDue{wait: wait}
		}
	}
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

// resumed is closed when this process resumes tenant (other processes'
// resumes are seen at the next recheck).
func (s *Store) resumed(tenant string) <-chan struct{} {
	s.resumesMu.Lock()
	defer s.resumesMu.Unlock()
	ch, ok := s.resumes[tenant]
	if !ok {
		ch = make(chan struct{})
		s.resumes[tenant] = ch
	}
	return ch
}

// wakeResumed wakes this process's tasks of tenant, waiting out a hold.
func (s *Store) wakeResumed(tenant string) {
	s.resumesMu.Lock()
	defer s.resumesMu.Unlock()
	if ch, ok := s.resumes[tenant]; ok {
		close(ch)
		delete(s.resumes, tenant)
	}
}

func (s *Store) claim(ctx context.Context, k shardKeys, jobID, tenant, taskID string, lead time.Duration) ([]any, error) {
	return claimScript.Run(ctx, s.rdb, []string{k.job(jobID), k.tenant(tenant), k.handoff(), k.active(), k.inflight()},
		s.now(), taskID, lead.Microseconds(), s.timing.Lease.Microseconds(), s.retain.Milliseconds(),
		(5 * time.Second).Microseconds(), s.holdMax().Microseconds(), k.tag, s.idle.Milliseconds()).Slice()
}

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

// finish records an attempt's outcome (applyOutcome, the embedded store's
// rule) in one optimistic transaction on the job and its tenant.
func (s *Store) finish(ctx context.Context, k shardKeys, j queue.Job, taskID string, o queue.Outcome) error {
	tk, jk := k.tenant(j.Tenant), k.job(j.ID)
	if o.Result == queue.Succeeded || (o.Result == queue.Failed && o.PauseUntil.IsZero()) {
		// Done for good: nothing of the tenant's schedule changes.
		state, msg := queue.StateSucceeded, ""
		if o.Result == queue.Failed {
			state, msg = queue.StateFailed, cmp.Or(o.Error, j.LastError)
		}
		ok, err := finishScript.Run(ctx, s.rdb, []string{jk, tk, k.inflight(), k.active(), k.failed(j.Tenant), k.idemOf(j)},
			s.now(), taskID, string(state), microsOf(o.SentAt), o.Status, msg, s.retain.Milliseconds(), s.idle.Milliseconds()).Int()
		if err != nil {
			return queue.Unavailable(err)
		}
		if ok == 0 {
			s.log.Warn("an attempt's outcome came after its lease ran out: another worker has the job", "job", j.ID, "result", o.Result)
		}
		return nil
	}
	p := s.policy(j.Tenant)
	watch := []string{tk, jk}
	for _, w := range p.Windows {
		watch = append(watch, k.window(j.Tenant, w))
	}
	var paused bool
	txf := func(tx *goredis.Tx) error {
		paused = false
		pipe := tx.Pipeline()
		tcmd := pipe.HMGet(ctx, tk, tenantFields...)
		jcmd := pipe.HMGet(ctx, jk, "state", "task")
		var timeCmd *goredis.TimeCmd
		if s.clock == nil {
			timeCmd = pipe.Time(ctx)
		}
		wcmds := make([]*goredis.StringSliceCmd, len(p.Windows))
		for i, w := range p.Windows {
			wcmds[i] = pipe.LRange(ctx, k.window(j.Tenant, w), 0, -1)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return err
		}
		if st := jcmd.Val(); st[0] != string(queue.StateDispatching) || st[1] != taskID {
			s.log.Warn("an attempt's outcome came after its lease ran out: another worker has the job", "job", j.ID, "result", o.Result)
			return nil
		}
		now := time.Time{}
		if s.clock != nil {
			now = s.clock.Now()
		} else {
			now = timeCmd.Val()
		}
		ts := parseTenant(tcmd.Val())
		rec := ts.rec
		if len(p.Windows) > 0 {
			recent := make([]leaky.Recent, len(p.Windows))
			for i, c := range wcmds {
				for _, us := range c.Val() {
					n, _ := strconv.ParseInt(us, 10, 64)
					recent[i] = append(recent[i], time.UnixMicro(n))
				}
			}
			rec.SetRecent(p, recent)
		}
		before := rec
		cur, pausedNow := queue.ApplyOutcome(&rec, j, o, now, p)
		paused = pausedNow
		_, err := tx.TxPipelined(ctx, func(pipe goredis.Pipeliner) error {
			fields := []any{"state", string(cur.State), "attempts", cur.Attempts, "failures", cur.Failures,
				"slot", microsOf(cur.Slot), "dispatch", microsOf(cur.DispatchAt), "sent", microsOf(cur.SentAt),
				"fin", microsOf(cur.FinishedAt), "err", cur.LastError, "status", cur.ResponseStatus}
			pipe.HSet(ctx, jk, fields...)
			pipe.ZRem(ctx, k.inflight(), j.ID)
			pipe.HIncrBy(ctx, tk, "inflight", -1)
			if rec.TAT != before.TAT || rec.Pause != before.Pause {
				pipe.HSet(ctx, tk, "tat", microsOf(rec.TAT), "shift", rec.Pause.Shift.Microseconds(),
					"until", microsOf(rec.Pause.Until), "held", microsOf(rec.Pause.Held))
			}
			for i, w := range p.Windows {
				key := k.window(j.Tenant, w)
				pipe.Del(ctx, key)
				var list []any
				for _, t := range rec.Recent(p)[i] {
					list = append(list, micros(t))
				}
				if len(list) > 0 {
					pipe.RPush(ctx, key, list...)
					pipe.PExpire(ctx, key, max(queue.DispatchAt(rec.Pause, rec.TAT, now).Sub(now), 0)+w.Length+s.idle)
				}
			}
			switch cur.State {
			case queue.StateSucceeded:
				pipe.HIncrBy(ctx, tk, "delivered", 1)
			case queue.StateFailed:
				pipe.HIncrBy(ctx, tk, "failed", 1)
				pipe.ZAdd(ctx, k.failed(j.Tenant), goredis.Z{Score: float64(micros(now)), Member: j.ID})
				pipe.ZRemRangeByScore(ctx, k.failed(j.Tenant), "-inf", strconv.FormatInt(micros(now.Add(-s.retain)), 10))
				pipe.PExpire(ctx, k.failed(j.Tenant), s.retain)
			case queue.StateExpired:
				pipe.HIncrBy(ctx, tk, "expired", 1)
			default:
				pipe.HIncrBy(ctx, tk, "depth", 1)
			}
			jobs := ts.depth + ts.inFlight // this one is counted in flight
			if cur.State.Finished() {
				jobs--
				pipe.PExpire(ctx, jk, s.retain)
				pipe.PExpire(ctx, k.idemOf(j), s.retain)
				pipe.ZIncrBy(ctx, k.active(), -1, j.Tenant)
				pipe.ZRemRangeByScore(ctx, k.active(), "-inf", "0")
			}
			// As lib.lua's settle: the state lives while the tenant has
			// jobs or a hold, then expires idle after its schedule.
			if jobs > 0 || !rec.Pause.Held.IsZero() {
				pipe.Persist(ctx, tk)
			} else {
				pipe.PExpire(ctx, tk, max(queue.DispatchAt(rec.Pause, rec.TAT, now).Sub(now), 0)+s.idle)
			}
			return nil
		})
		if err == nil && cur.State == queue.StateExpired {
			cur.Tenant = j.Tenant
			s.expired(cur)
		}
		return err
	}
	var err error
	for range 100 {
		err = s.rdb.Watch(ctx, txf, watch...)
		if !errors.Is(err, goredis.TxFailedErr) {
			break
		}
	}
	if err != nil {
		return queue.Unavailable(err)
	}
	if paused {
		// Sends other processes hold stop at the gate.
		if err := s.holdLanes(ctx, j.Tenant, o.PauseUntil, o.PauseDownstream); err != nil {
			s.log.Warn("cannot hold the shared gate after a pushback", "tenant", j.Tenant, "err", err)
		}
	}
	return nil
}

// renew renews the leases of the jobs this process holds until stop is
// closed: after its asynq servers have shut down, so that a send that
// outlives the stop is never taken back while it is still being written.
func (s *Store) renew(stop <-chan struct{}, held *heldJobs) {
	t := time.NewTicker(s.timing.Lease / 4)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), s.timing.Lease/4)
		for shard, ids := range held.byShard() {
			args := append([]any{s.now(), s.timing.Lease.Microseconds()}, ids...)
			if err := leaseScript.Run(ctx, s.rdb, []string{keysOf(shard).inflight()}, args...).Err(); err != nil {
				s.trouble.Store(time.Now().UnixNano())
				s.log.Warn("cannot renew the leases of jobs being sent", "err", err)
			}
		}
		cancel()
	}
}

// sweep, until ctx is done, takes back the jobs of workers whose leases ran
// out and makes the tasks of jobs left in the hand-off set.
func (s *Store) sweep(ctx context.Context) {
	t := time.NewTicker(max(s.timing.Lease/4, time.Second))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for shard := range Shards {
			if err := s.sweepShard(ctx, shard); err != nil && ctx.Err() == nil {
				s.trouble.Store(time.Now().UnixNano())
				s.log.Warn("cannot sweep for crashed workers' jobs", "err", err)
			}
		}
	}
}

// handoffAge is how long a job may sit in the hand-off set before a worker
// checks that its task exists: well past the moment between the admission
// script and asynq's enqueue.
const handoffAge = 5 * time.Second

func (s *Store) sweepShard(ctx context.Context, shard int) error {
	k := keysOf(shard)
	var taken []string
	// After Redis was away, every lease may have lapsed meanwhile: wait a
	// lease, so that live workers renew theirs before anything is taken.
	if time.Since(time.Unix(0, s.trouble.Load())) > s.timing.Lease {
		var err error
		taken, err = recoverScript.Run(ctx, s.rdb, []string{k.inflight(), k.handoff()}, s.now(), k.tag, 100).StringSlice()
		if err != nil {
			return err
		}
	}
	for i := 0; i+2 < len(taken); i += 3 {
		s.log.Warn("took back a job whose worker stopped renewing its lease (it crashed?); it goes again with the same Idempotency-Key", "job", taken[i])
		if err := s.enqueueTask(ctx, taken[i], taken[i+2], taken[i+1], time.Time{}); err != nil && !errors.Is(err, asynq.ErrTaskIDConflict) {
			return err // it stays in the hand-off set
		}
	}
	now, err := s.serverNow(ctx)
	if err != nil {
		return err
	}
	entries, err := s.rdb.ZRangeByScoreWithScores(ctx, k.handoff(), &goredis.ZRangeBy{Min: "-inf", Max: strconv.FormatInt(micros(now.Add(-handoffAge)), 10), Count: 500}).Result()
	if err != nil || len(entries) == 0 {
		return err
	}
	// One pipeline reads the jobs and whether their tasks exist.
	q := queueName(shard)
	jobs := make([]*goredis.SliceCmd, len(entries))
	tasks := make([]*goredis.IntCmd, len(entries))
	if _, err := s.rdb.Pipelined(ctx, func(p goredis.Pipeliner) error {
		for i, e := range entries {
			jobs[i] = p.HMGet(ctx, k.job(e.Member.(string)), "task", "state", "tenant")
		}
		return nil
	}); err != nil {
		return err
	}
	if _, err := s.rdb.Pipelined(ctx, func(p goredis.Pipeliner) error {
		for i := range entries {
			task, _ := jobs[i].Val()[0].(string)
			// asynq's key of a task (asynq:{queue}:t:<id>): read only.
			tasks[i] = p.Exists(ctx, "asynq:{"+q+"}:t:"+task)
		}
		return nil
	}); err != nil {
		return err
	}
	var done []any
	for i, e := range entries {
		id := e.Member.(string)
		v := jobs[i].Val()
		task, _ := v[0].(string)
		tenant, _ := v[2].(string)
		waiting := v[1] == string(queue.StateQueued) || v[1] == string(queue.StateRetrying)
		if waiting && tasks[i].Val() == 0 {
			// Due at once: the claim tells the task how long to wait.
			err := s.enqueueTask(ctx, id, tenant, task, time.Time{})
			if err != nil && !errors.Is(err, asynq.ErrTaskIDConflict) {
				return err
			}
			if err == nil {
				s.log.Info("made the asynq task of a job whose admitting process stopped first", "job", id)
			}
		}
		done = append(done, id, strconv.FormatFloat(e.Score, 'f', -1, 64))
	}
	return handoffScript.Run(ctx, s.rdb, []string{k.handoff()}, done...).Err()
}

// splitTaskPayload reads a task's payload: its job's id, then its tenant.
func splitTaskPayload(b []byte) (jobID, tenant string) {
	if len(b) < jobIDLen {
		return string(b), ""
	}
	return string(b[:jobIDLen]), string(b[jobIDLen:])
}

// asynqLogger sends asynq's log lines to the store's logger.
type asynqLogger struct{ s *Store }

func (l asynqLogger) Debug(args ...any) { l.s.log.Debug(fmt.Sprint(args...), "from", "asynq") }
func (l asynqLogger) Info(args ...any)  { l.s.log.Info(fmt.Sprint(args...), "from", "asynq") }
func (l asynqLogger) Warn(args ...any)  { l.s.log.Warn(fmt.Sprint(args...), "from", "asynq") }
func (l asynqLogger) Error(args ...any) { l.s.log.Error(fmt.Sprint(args...), "from", "asynq") }
func (l asynqLogger) Fatal(args ...any) { l.s.log.Error(fmt.Sprint(args...), "from", "asynq") }

const jobIDLen = 26
