package redis

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	goredis "github.com/redis/go-redis/v9"

	"throttler/internal/clock"
	"throttler/internal/leaky"
	"throttler/internal/queue"
)

// Store is the queue.Store of many throttler processes sharing one Redis
// (standalone, Sentinel or Cluster). Bucket state and jobs are Redis
// hashes changed by Lua scripts (one round trip per decision, atomic
// across processes, in the server's clock); each waiting job is an asynq
// task (id = job id) due a little before its slot. A worker claims the job
// when its task runs, waits for the exact slot, and passes a gate in Redis
// (PassGate) right before the request is written: the schedule predicts,
// the gate enforces.
type Store struct {
	rdb      goredis.UniversalClient
	tasks    *asynq.Client
	policy   queue.PolicyFunc
	ceiling  func(tenant string) (string, *leaky.Policy)
	clock    clock.Clock // nil: the Redis server's TIME
	log      *slog.Logger
	retain   time.Duration
	idle     time.Duration
	lag      time.Duration
	timing   Timing
	expired  func(queue.Job)
	ownsConn bool

	resumesMu sync.Mutex
	resumes   map[string]chan struct{} // tenant -> closed when resumed here

	// trouble is when this process last failed to reach Redis (unix ns):
	// for a lease after it, it takes back no other worker's job (theirs
	// may have lapsed only because Redis was away).
	trouble atomic.Int64
}

// Timing is how a Redis-backed store drives asynq. Zero fields take
// the defaults.
type Timing struct {
	// Poll is asynq's TaskCheckInterval: how often an idle worker looks for
	// a due task (it sleeps 0.5x to 1.5x this). Default 20 ms: a job that
	// can go at once waits about that long for a worker.
	Poll time.Duration
	// Forward is asynq's DelayedTaskCheckInterval: how often scheduled
	// tasks that came due move to the pending list. Default 100 ms.
	Forward time.Duration
	// Lease is how long a worker that stopped renewing (it crashed) keeps
	// the job it was sending before another worker takes it back.
	// Default 10 s.
	Lease time.Duration
}

func (t Timing) withDefaults() Timing {
	t.Poll = cmp.Or(t.Poll, 20*time.Millisecond)
	t.Forward = cmp.Or(t.Forward, 100*time.Millisecond)
	t.Lease = cmp.Or(t.Lease, 10*time.Second)
	return t
}

// early is how long before its slot a job's task is made due: asynq
// stores due times in whole seconds (a task can start up to 1 s early,
// never late on that account) and moves due tasks every Forward.
func (t Timing) early() time.Duration { return time.Second + 2*t.Forward }

// Options configure Open.
type Options struct {
	// Client is the connection, shared with asynq. Required.
	Client goredis.UniversalClient
	// OwnsClient: Close closes Client too.
	OwnsClient bool
	Policy     queue.PolicyFunc
	// Ceiling names a tenant's downstream and its ceiling (nil: none).
	Ceiling func(tenant string) (string, *leaky.Policy)
	// Clock, if set, decides instead of the Redis server's TIME (tests).
	// Every process must then share it; production leaves it nil.
	Clock clock.Clock
	// Retention keeps finished jobs this long. Default 24 h.
	Retention time.Duration
	// IdleTTL: a tenant's bucket state expires this long after its
	// schedule runs out (a tenant seen again then starts afresh).
	// Default 10 min.
	IdleTTL time.Duration
	// StartLag is how long a send takes to start: the time from a job's
	// slot to a worker having claimed it. Default Timing.Poll + 20 ms;
	// negative: none.
	StartLag  time.Duration
	Timing    Timing
	OnExpired func(queue.Job)
	Logger    *slog.Logger
}

// Open returns a store on opts.Client. It checks that Redis answers.
func Open(ctx context.Context, opts Options) (*Store, error) {
	if opts.Client == nil {
		return nil, errors.New("queue: Open needs a client")
	}
	timing := opts.Timing.withDefaults()
	s := &Store{
		rdb:      opts.Client,
		tasks:    asynq.NewClientFromRedisClient(opts.Client),
		policy:   opts.Policy,
		ceiling:  opts.Ceiling,
		clock:    opts.Clock,
		log:      cmp.Or(opts.Logger, slog.Default()),
		retain:   cmp.Or(opts.Retention, 24*time.Hour),
		idle:     cmp.Or(opts.IdleTTL, 10*time.Minute),
		lag:      max(cmp.Or(opts.StartLag, timing.Poll+20*time.Millisecond), 0),
		timing:   timing,
		expired:  opts.OnExpired,
		ownsConn: opts.OwnsClient,
		resumes:  map[string]chan struct{}{},
	}
	if s.ceiling == nil {
		s.ceiling = func(string) (string, *leaky.Policy) { return "", nil }
	}
	if s.expired == nil {
		s.expired = func(queue.Job) {}
	}
	if s.policy == nil {
		return nil, errors.New("queue: Open needs a policy")
	}
	if err := s.Ping(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// now is the time scripts are told: 0 asks them for the server's TIME.
func (s *Store) now() int64 {
	if s.clock == nil {
		return 0
	}
	return micros(s.clock.Now())
}

// serverNow is the current time of the decisions' clock.
func (s *Store) serverNow(ctx context.Context) (time.Time, error) {
	if s.clock != nil {
		return s.clock.Now(), nil
	}
	t, err := s.rdb.Time(ctx).Result()
	if err != nil {
		return time.Time{}, queue.Unavailable(err)
	}
	return t, nil
}

// usCeil is d in whole microseconds, rounded up: a port of an interval
// that rounded down would send a little faster than the rate.
func usCeil(d time.Duration) int64 { return int64((d + time.Microsecond - 1) / time.Microsecond) }

// Ping implements queue.Store.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.rdb.Ping(ctx).Err(); err != nil {
		return queue.Unavailable(err)
	}
	return nil
}

// Close implements queue.Store.
func (s *Store) Close() error {
	if s.ownsConn {
		return s.rdb.Close()
	}
	return nil
}

// maxCost is the largest cost a tenant can ever be admitted with.
func (s *Store) maxCost(tenant string, p leaky.Policy) int {
	most := p.MaxCost()
	if _, c := s.ceiling(tenant); c != nil {
		for _, w := range c.Windows { // a ceiling spaces, it never refuses: only its windows bound a cost
			most = min(most, w.N)
		}
	}
	return most
}

// Enqueue implements Store: one script decides and keeps the whole batch
// (nothing is admitted if it fails), then each admitted job becomes an
// asynq task. A job whose task cannot be made (Redis went away just then)
// is still admitted: it is in the hand-off set, and a worker makes its task.
func (s *Store) Enqueue(ctx context.Context, tenant string, newJobs []queue.NewJob) ([]queue.Admission, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	p := s.policy(tenant)
	shard := shardOf(tenant)
	k := keysOf(shard)
	out := make([]queue.Admission, len(newJobs))
	most := s.maxCost(tenant, p)
	var idNow time.Time
	if s.clock != nil {
		idNow = s.clock.Now()
	} else {
		idNow = time.Now()
	}

	keys := []string{k.tenant(tenant), k.handoff(), k.active(), k.failed(tenant)}
	args := []any{s.now(), usCeil(s.lag), usCeil(p.Interval), p.Burst, p.Capacity, len(p.Windows)}
	for _, w := range p.Windows {
		keys = append(keys, k.window(tenant, w))
		args = append(args, w.N, usCeil(w.Length))
	}
	args = append(args, s.idle.Milliseconds(), "new", tenant)
	var sent []int             // index in newJobs of each job in the script
	inCall := map[string]int{} // idempotency key -> index of its first use
	copies := map[int]int{}    // a repeat in this call -> its first
	for i, nj := range newJobs {
		if nj.IdempotencyKey != "" {
			if first, ok := inCall[nj.IdempotencyKey]; ok {
				copies[i] = first
				continue
			}
			inCall[nj.IdempotencyKey] = i
		}
		cost := max(nj.Cost, 1)
		if cost > most {
			out[i] = queue.Admission{Impossible: &queue.ImpossibleError{Tenant: tenant, Reason: queue.ReasonCostTooLarge, Cost: cost, MaxCost: most}, Capacity: p.Capacity}
			continue
		}
		id := newRedisID(idNow, shard)
		ik := k.job(id)
		if nj.IdempotencyKey != "" {
			ik = k.idem(tenant, nj.IdempotencyKey)
		}
		keys = append(keys, k.job(id), ik)
		args = append(args, id, id, []byte(nj.Payload), nj.IdempotencyKey, cost, microsOf(nj.Deadline))
		sent = append(sent, i)
	}
	if len(sent) > 0 {
		res, err := enqueueScript.Run(ctx, s.rdb, keys, args...).Slice()
		if err != nil {
			return nil, queue.Unavailable(err)
		}
		var tasks []queue.Job
		for n, i := range sent {
			a, j, err := s.admission(ctx, tenant, p, newJobs[i], args, n, res[n].([]any))
			if err != nil {
				return nil, err
			}
			out[i] = a
			if j != nil {
				tasks = append(tasks, *j)
			}
		}
		for _, j := range tasks {
			s.makeTask(ctx, j)
		}
	}
	for i, first := range copies {
		out[i] = out[first]
		out[i].Duplicate = out[first].Admitted()
	}
	return out, nil
}

// admission reads the script's answer for the n-th job it was given; for
// a job admitted now, it also returns the job (its task is to be made).
func (s *Store) admission(ctx context.Context, tenant string, p leaky.Policy, nj queue.NewJob, args []any, n int, r []any) (queue.Admission, *queue.Job, error) {
	kind := toInt(r[0])
	switch kind {
	case 2: // a repeated idempotency key
		prev, err := s.Job(ctx, r[1].(string))
		if err != nil {
			return queue.Admission{}, nil, err
		}
		return queue.Admission{Job: prev, Duplicate: true, ExpectedDelay: prev.AdmitDelay, QueueDepth: prev.AdmitDepth, Capacity: p.Capacity}, nil, nil
	case 4: // queue.Retry of a job no longer failed
		return queue.Admission{}, nil, &queue.StateError{State: queue.JobState(r[1].(string)), Op: "retry"}
	}
	slot, at, retry, depth, now := fromMicros(toInt(r[1])), fromMicros(toInt(r[2])), time.Duration(toInt(r[3]))*time.Microsecond, int(toInt(r[4])), fromMicros(toInt(r[5]))
	switch kind {
	case 0:
		return queue.Admission{Rejected: queue.Rejection(tenant, p, leaky.Decision{RetryAfter: retry}, depth), QueueDepth: depth, Capacity: p.Capacity}, nil, nil
	case 3:
		return queue.Admission{Impossible: &queue.ImpossibleError{Tenant: tenant, Reason: queue.ReasonWouldExpire, ExpectedDelay: at.Sub(now), Deadline: nj.Deadline}, QueueDepth: depth, Capacity: p.Capacity}, nil, nil
	}
	// The job's id is the one given with its arguments.
	base := 6 + 2*len(p.Windows) + 3 + n*6
	j := queue.Job{
		ID: args[base].(string), Tenant: tenant, State: queue.StateQueued, Payload: nj.Payload,
		IdempotencyKey: nj.IdempotencyKey, EnqueuedAt: now, DispatchAt: at, Slot: slot,
		AdmitDelay: at.Sub(now), AdmitDepth: depth + 1, Prompt: toInt(r[6]) == 1, Deadline: nj.Deadline,
	}
	if c := max(nj.Cost, 1); c > 1 {
		j.Cost = c
	}
	return queue.Admission{Job: j, ExpectedDelay: j.AdmitDelay, QueueDepth: j.AdmitDepth, Capacity: p.Capacity}, &j, nil
}

func toInt(v any) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case string:
		n, _ := strconv.ParseInt(x, 10, 64)
		return n
	}
	return 0
}

// taskType is the asynq type of every throttler job task.
const taskType = "throttler:job"

// maxTaskRetry bounds asynq's own retries, which count only crashes (a
// worker's lease running out): throttler reschedules its tasks without
// using retries, and counts failed attempts itself (max_attempts).
const maxTaskRetry = 1000

// makeTask makes the asynq task that carries job j's next attempt, due a
// little before its dispatch time. If that fails, the job stays in the
// hand-off set and a worker makes the task later.
func (s *Store) makeTask(ctx context.Context, j queue.Job) {
	if err := s.enqueueTask(ctx, j.ID, j.Tenant, j.ID, j.DispatchAt); err != nil && !errors.Is(err, asynq.ErrTaskIDConflict) {
		s.log.Warn("job admitted, its asynq task not made yet: a worker will make it", "job", j.ID, "err", err)
	}
}

func (s *Store) enqueueTask(ctx context.Context, jobID, tenant, taskID string, dispatchAt time.Time) error {
	shard, _ := shardOfID(jobID)
	opts := []asynq.Option{asynq.TaskID(taskID), asynq.Queue(queueName(shard)), asynq.MaxRetry(maxTaskRetry)}
	if s.clock == nil { // with a test clock, due at once: the worker waits on that clock
		if at := dispatchAt.Add(-s.timing.early()); at.After(time.Now()) {
			opts = append(opts, asynq.ProcessAt(at))
		}
	}
	_, err := s.tasks.EnqueueContext(ctx, asynq.NewTask(taskType, []byte(jobID+tenant)), opts...)
	return err
}

// tenantState is a tenant's hash, read.
type tenantState struct {
	rec             queue.TenantRecord
	depth, inFlight int
}

var tenantFields = []string{"tat", "shift", "until", "held", "depth", "inflight", "accepted", "rejected", "delivered", "failed", "cancelled", "expired"}

func parseTenant(v []any) tenantState {
	n := func(i int) int64 {
		if v[i] == nil {
			return 0
		}
		return toInt(v[i])
	}
	return tenantState{
		rec: queue.TenantRecord{
			TAT:      fromMicros(n(0)),
			Pause:    leaky.Pause{Shift: time.Duration(n(1)) * time.Microsecond, Until: fromMicros(n(2)), Held: fromMicros(n(3))},
			Accepted: n(6), Rejected: n(7), Delivered: n(8), Failed: n(9), Cancelled: n(10), Expired: n(11),
		},
		depth: int(n(4)), inFlight: int(n(5)),
	}
}

// queue.Job implements queue.Store.
func (s *Store) Job(ctx context.Context, id string) (queue.Job, error) {
	shard, ok := shardOfID(id)
	if !ok {
		return queue.Job{}, queue.ErrNotFound
	}
	h, err := s.rdb.HGetAll(ctx, keysOf(shard).job(id)).Result()
	if err != nil {
		return queue.Job{}, queue.Unavailable(err)
	}
	if len(h) == 0 {
		return queue.Job{}, queue.ErrNotFound
	}
	j := jobFromHash(h)
	if j.State.Waiting() {
		// Its dispatch time moves with its tenant's pauses.
		v, err := s.rdb.HMGet(ctx, keysOf(shard).tenant(j.Tenant), tenantFields...).Result()
		if err != nil {
			return queue.Job{}, queue.Unavailable(err)
		}
		now, err := s.serverNow(ctx)
		if err != nil {
			return queue.Job{}, err
		}
		j.DispatchAt = queue.DispatchAt(parseTenant(v).rec.Pause, j.Slot, now)
	}
	return j, nil
}

// jobFromHash is a job's hash, read.
func jobFromHash(h map[string]string) queue.Job {
	n := func(f string) int64 { v, _ := strconv.ParseInt(h[f], 10, 64); return v }
	j := queue.Job{
		ID: h["id"], Tenant: h["tenant"], State: queue.JobState(h["state"]), Payload: []byte(h["payload"]),
		IdempotencyKey: h["key"], Attempts: int(n("attempts")), Failures: int(n("failures")),
		EnqueuedAt: fromMicros(n("enq")), Slot: fromMicros(n("slot")), DispatchAt: fromMicros(n("dispatch")),
		Deadline: fromMicros(n("deadline")), SentAt: fromMicros(n("sent")), FinishedAt: fromMicros(n("fin")),
		LastError: h["err"], ResponseStatus: int(n("status")),
		AdmitDelay: time.Duration(n("delay")) * time.Microsecond, AdmitDepth: int(n("depth")), Prompt: h["prompt"] == "1",
	}
	if c := int(n("cost")); c > 1 {
		j.Cost = c
	}
	if j.DispatchAt.IsZero() {
		j.DispatchAt = j.EnqueuedAt.Add(j.AdmitDelay)
	}
	return j
}

// Cancel implements queue.Store.
func (s *Store) Cancel(ctx context.Context, id string) (queue.Job, error) {
	shard, ok := shardOfID(id)
	if !ok {
		return queue.Job{}, queue.ErrNotFound
	}
	k := keysOf(shard)
	j, err := s.Job(ctx, id)
	if err != nil {
		return queue.Job{}, err
	}
	if !j.State.Waiting() {
		return queue.Job{}, &queue.StateError{ID: id, State: j.State, Op: "cancel"}
	}
	p := s.policy(j.Tenant)
	giveBack := 0
	if p.Burst == 1 && len(p.Windows) == 0 {
		giveBack = 1
	}
	r, err := cancelScript.Run(ctx, s.rdb, []string{k.job(id), k.tenant(j.Tenant), k.handoff(), k.active(), k.idemOf(j)},
		s.now(), s.retain.Milliseconds(), usCeil(p.Interval), giveBack, s.idle.Milliseconds()).Slice()
	if err != nil {
		return queue.Job{}, queue.Unavailable(err)
	}
	switch toInt(r[0]) {
	case 0:
		return queue.Job{}, queue.ErrNotFound
	case 1:
		return queue.Job{}, &queue.StateError{ID: id, State: queue.JobState(r[1].(string)), Op: "cancel"}
	}
	j.State, j.FinishedAt, j.Payload = queue.StateCancelled, fromMicros(toInt(r[1])), nil
	return j, nil
}

// queue.Retry implements Store: the failed job takes a new slot like a new job,
// under a new task id (its old task is gone).
func (s *Store) Retry(ctx context.Context, id string) (queue.Admission, error) {
	shard, ok := shardOfID(id)
	if !ok {
		return queue.Admission{}, queue.ErrNotFound
	}
	j, err := s.Job(ctx, id)
	if err != nil {
		return queue.Admission{}, err
	}
	if j.State != queue.StateFailed {
		return queue.Admission{}, &queue.StateError{ID: id, State: j.State, Op: "retry"}
	}
	k := keysOf(shard)
	p := s.policy(j.Tenant)
	keys := []string{k.tenant(j.Tenant), k.handoff(), k.active(), k.failed(j.Tenant)}
	args := []any{s.now(), usCeil(s.lag), usCeil(p.Interval), p.Burst, p.Capacity, len(p.Windows)}
	for _, w := range p.Windows {
		keys = append(keys, k.window(j.Tenant, w))
		args = append(args, w.N, usCeil(w.Length))
	}
	args = append(args, s.idle.Milliseconds(), "retry", j.Tenant,
		id, "", "", "", j.EffectiveCost(), microsOf(j.Deadline)) // the script names the new task
	keys = append(keys, k.job(id), k.idemOf(j))
	res, err := enqueueScript.Run(ctx, s.rdb, keys, args...).Slice()
	if err != nil {
		return queue.Admission{}, queue.Unavailable(err)
	}
	nj := queue.NewJob{Payload: j.Payload, IdempotencyKey: j.IdempotencyKey, Cost: j.Cost, Deadline: j.Deadline}
	a, admitted, err := s.admission(ctx, j.Tenant, p, nj, args, 0, res[0].([]any))
	if err != nil {
		var se *queue.StateError
		if errors.As(err, &se) {
			se.ID = id
		}
		return queue.Admission{}, err
	}
	if admitted != nil {
		a.Job.EnqueuedAt, a.Job.Attempts = j.EnqueuedAt, 0
		task := res[0].([]any)[7].(string)
		if err := s.enqueueTask(ctx, id, j.Tenant, task, a.Job.DispatchAt); err != nil && !errors.Is(err, asynq.ErrTaskIDConflict) {
			s.log.Warn("job sent again, its asynq task not made yet: a worker will make it", "job", id, "err", err)
		}
	}
	return a, nil
}

// queue.Failed implements queue.Store.
func (s *Store) Failed(ctx context.Context, tenant string, limit int) ([]queue.Job, error) {
	k := keysOf(shardOf(tenant))
	ids, err := s.rdb.ZRevRange(ctx, k.failed(tenant), 0, int64(max(limit, 1))-1).Result()
	if err != nil {
		return nil, queue.Unavailable(err)
	}
	out := make([]queue.Job, 0, len(ids))
	for _, id := range ids {
		h, err := s.rdb.HGetAll(ctx, k.job(id)).Result()
		if err != nil {
			return nil, queue.Unavailable(err)
		}
		if len(h) == 0 || h["state"] != string(queue.StateFailed) {
			s.rdb.ZRem(ctx, k.failed(tenant), id) // past retention, or retried
			continue
		}
		j := jobFromHash(h)
		j.Payload = nil
		out = append(out, j)
	}
	return out, nil
}

// Pause implements queue.Store.
func (s *Store) Pause(ctx context.Context, tenant string) (queue.TenantStatus, error) {
	return s.hold(ctx, tenant, "hold")
}

// Resume implements queue.Store.
func (s *Store) Resume(ctx context.Context, tenant string) (queue.TenantStatus, error) {
	return s.hold(ctx, tenant, "resume")
}

func (s *Store) hold(ctx context.Context, tenant, op string) (queue.TenantStatus, error) {
	k := keysOf(shardOf(tenant))
	p := s.policy(tenant)
	_, err := pauseScript.Run(ctx, s.rdb, []string{k.tenant(tenant)}, op, s.now(), usCeil(p.Tolerance())).Int64Slice()
	if err != nil {
		return queue.TenantStatus{}, queue.Unavailable(err)
	}
	if err := settleScript.Run(ctx, s.rdb, []string{k.tenant(tenant)}, s.now(), s.idle.Milliseconds()).Err(); err != nil {
		return queue.TenantStatus{}, queue.Unavailable(err)
	}
	ds, _ := s.ceiling(tenant)
	lane, _ := gateKeys(ds, tenant)
	gateOp := "hold"
	if op == "resume" {
		gateOp = "free"
	}
	if err := gateHoldScript.Run(ctx, s.rdb, []string{lane}, gateOp, 0, 0, time.Hour.Milliseconds()).Err(); err != nil {
		return queue.TenantStatus{}, queue.Unavailable(err)
	}
	if op == "resume" {
		s.wakeResumed(tenant)
	}
	return s.Tenant(ctx, tenant)
}

// Tenant implements queue.Store.
func (s *Store) Tenant(ctx context.Context, tenant string) (queue.TenantStatus, error) {
	v, err := s.rdb.HMGet(ctx, keysOf(shardOf(tenant)).tenant(tenant), tenantFields...).Result()
	if err != nil {
		return queue.TenantStatus{}, queue.Unavailable(err)
	}
	now, err := s.serverNow(ctx)
	if err != nil {
		return queue.TenantStatus{}, err
	}
	return s.status(ctx, tenant, parseTenant(v), now)
}

func (s *Store) status(ctx context.Context, name string, ts tenantState, now time.Time) (queue.TenantStatus, error) {
	p := s.policy(name)
	pz := ts.rec.Pause
	tnow := pz.TenantTime(now)
	slot := tnow.Add(leaky.ExpectedDelay(leaky.State{TAT: ts.rec.TAT}, tnow, p))
	if len(p.Windows) > 0 {
		k := keysOf(shardOf(name))
		recent := make([]leaky.Recent, len(p.Windows))
		for i, w := range p.Windows {
			l, err := s.rdb.LRange(ctx, k.window(name, w), 0, -1).Result()
			if err != nil {
				return queue.TenantStatus{}, queue.Unavailable(err)
			}
			for _, us := range l {
				n, _ := strconv.ParseInt(us, 10, 64)
				recent[i] = append(recent[i], time.UnixMicro(n))
			}
		}
		slot = leaky.WindowSlot(recent, p, slot, 1)
	}
	paused, until := pz.Paused(now)
	return queue.TenantStatus{
		Tenant: name, QueueDepth: max(ts.depth, 0), InFlight: max(ts.inFlight, 0),
		ExpectedDelay: queue.DispatchAt(pz, slot, now).Sub(now),
		Paused:        paused, PausedUntil: until, Held: !pz.Held.IsZero(),
		Accepted: ts.rec.Accepted, Rejected: ts.rec.Rejected, Delivered: ts.rec.Delivered,
		Failed: ts.rec.Failed, Cancelled: ts.rec.Cancelled, Expired: ts.rec.Expired,
	}, nil
}

// Tenants implements queue.Store.
func (s *Store) Tenants(ctx context.Context, offset, limit int) ([]queue.TenantStatus, error) {
	type entry struct {
		name string
		n    float64
	}
	var all []entry
	for shard := range Shards {
		zs, err := s.rdb.ZRangeWithScores(ctx, keysOf(shard).active(), 0, -1).Result()
		if err != nil {
			return nil, queue.Unavailable(err)
		}
		for _, z := range zs {
			if z.Score > 0 {
				all = append(all, entry{z.Member.(string), z.Score})
			}
		}
	}
	slices.SortFunc(all, func(a, b entry) int {
		return cmp.Or(cmp.Compare(b.n, a.n), cmp.Compare(a.name, b.name))
	})
	if offset >= len(all) {
		return nil, nil
	}
	all = all[offset:]
	if limit > 0 && len(all) > limit {
		all = all[:limit]
	}
	// One pipeline for the page: a scrape of /metrics reads every busy
	// tenant.
	cmds := make([]*goredis.SliceCmd, len(all))
	_, err := s.rdb.Pipelined(ctx, func(p goredis.Pipeliner) error {
		for i, e := range all {
			cmds[i] = p.HMGet(ctx, keysOf(shardOf(e.name)).tenant(e.name), tenantFields...)
		}
		return nil
	})
	if err != nil {
		return nil, queue.Unavailable(err)
	}
	now, err := s.serverNow(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]queue.TenantStatus, 0, len(all))
	for i, e := range all {
		st, err := s.status(ctx, e.name, parseTenant(cmds[i].Val()), now)
		if err != nil {
			return nil, err
		}
		out = append(out, st)
	}
	return out, nil
}

// PassGate is the gate every process of one Redis shares: one atomic check
// per send, right before it is written (gate.lua).
func (s *Store) PassGate(ctx context.Context, r queue.GateRequest) (queue.GateAnswer, error) {
	lane, dsLane := gateKeys(r.Downstream, r.Tenant)
	var dsT, dsTau int64
	var dsWindows []leaky.Window
	if r.Ceiling != nil {
		dsT, dsTau, dsWindows = usCeil(r.Ceiling.Interval), usCeil(r.Ceiling.Tolerance()), r.Ceiling.Windows
	}
	keys := []string{lane, dsLane}
	args := []any{s.now(), usCeil(r.Policy.Interval), usCeil(r.Policy.Tolerance()),
		dsT, dsTau, max(r.Cost, 1), r.Slack.Microseconds(), s.idle.Milliseconds(), len(r.Policy.Windows), len(dsWindows)}
	for _, w := range r.Policy.Windows {
		keys = append(keys, lane+":w:"+w.String())
		args = append(args, w.N, usCeil(w.Length))
	}
	for _, w := range dsWindows {
		keys = append(keys, dsLane+":w:"+w.String())
		args = append(args, w.N, usCeil(w.Length))
	}
	return s.passGate(ctx, keys, args, nil)
}

// passGate asks gate.lua with args, and giveBack (a grant to give back
// first, or nil).
func (s *Store) passGate(ctx context.Context, keys []string, args, giveBack []any) (queue.GateAnswer, error) {
	v, err := gateScript.Run(ctx, s.rdb, keys, append(args[:len(args):len(args)], giveBack...)...).Int64Slice()
	if err != nil {
		return queue.GateAnswer{}, queue.Unavailable(err)
	}
	switch v[0] {
	case 1:
		return queue.GateAnswer{Wait: time.Duration(v[1]) * time.Microsecond}, nil
	case 2:
		return queue.GateAnswer{HeldUntil: fromMicros(v[1])}, nil
	}
	again := func(ctx context.Context) (queue.GateAnswer, error) {
		// The same question, and this grant to take back: one round trip.
		return s.passGate(ctx, keys, args, []any{"again", v[1], v[2], v[3], v[4], v[5]})
	}
	return queue.GateAnswer{Again: again}, nil
}

// holdLanes holds a tenant's gate lane (and its downstream's) after a
// pushback, so that sends other processes already hold stop too.
func (s *Store) holdLanes(ctx context.Context, tenant string, until time.Time, downstreamToo bool) error {
	ds, ceiling := s.ceiling(tenant)
	lane, dsLane := gateKeys(ds, tenant)
	p := s.policy(tenant)
	if err := gateHoldScript.Run(ctx, s.rdb, []string{lane}, "until", micros(until), usCeil(p.Tolerance()), s.idle.Milliseconds()).Err(); err != nil {
		return err
	}
	if downstreamToo && ceiling != nil {
		return gateHoldScript.Run(ctx, s.rdb, []string{dsLane}, "until", micros(until), usCeil(ceiling.Tolerance()), s.idle.Milliseconds()).Err()
	}
	return nil
}

var _ queue.Store = (*Store)(nil)
