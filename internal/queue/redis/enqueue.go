package redis

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/luascript"
	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/queue/redis/owner"
	"github.com/throttler-dev/throttler/internal/rules"
)

// ownerLag is how long after a partition's vacancy ends its new owner may
// take to send: the take at the vacancy's end, the takeover's and the
// claim's round trips, the hand-over. Admission promises a tenant of a
// partition without an owner its owner's start plus this, and places its
// jobs there (admit.lua): an owner sooner waits for them, so it is set
// for a busy machine. 10-20 ms on a quiet two-core machine; 75-80 ms with
// a busy loop on each core (CI), which made a 20 ms promise 54-59 ms late.
const ownerLag = 150 * time.Millisecond

var (
	// admitLua is the admission decision as one Redis script, the same
	// rules as the embedded store's (checked against them in
	// admit_lua_test.go).
	//
	//go:embed admit.lua
	admitLua string
	//go:embed enqueue.lua
	enqueueLua string

	// admitConsts are the rules' constants admit.lua reads, from the Go
	// that is the rule: one value, however it changes.
	admitConsts = fmt.Sprintf("local HELD_RETRY_AFTER = %d\n", rules.HeldRetryAfter.Microseconds())
	// admitScript is admit.lua alone, as the agreement tests run it.
	admitScript = newScript("admit.lua", admitConsts+"local OWNER_AT, OWN_DUE, NOT_BEFORE, MAX_SCHEDULED, JOB_ID, CAPPED, ACCEPTS = "+
		"tonumber(ARGV[#ARGV - 5]), tonumber(ARGV[#ARGV - 4]), tonumber(ARGV[#ARGV - 3]), tonumber(ARGV[#ARGV - 2]), ARGV[#ARGV - 1], ARGV[#ARGV] == '1', false\n"+admitLua, true)
	// enqueueScript admits and keeps a batch; admit.lua is its decision,
	// loaded as a function (its KEYS and ARGV become the function's own).
	enqueueScript = newScript("enqueue.lua", admitConsts+"local function admit_decision(KEYS, ARGV, OWNER_AT, OWN_DUE, ACCEPTS, NOT_BEFORE, MAX_SCHEDULED, JOB_ID, CAPPED)\n"+admitLua+"\nend\n"+enqueueLua, true)
)

// enqueue.lua's codes (its header).
const (
	admitRefused      = 0
	admitAdmitted     = 1
	admitRepeat       = 2
	admitWouldExpire  = 3
	admitNotFailed    = 4
	admitScheduleFull = 5
	admitBooked       = 6 // admitted, booked for its not_before
)

// admitReply is enqueue.lua's answer for one job.
type admitReply struct {
	Code       int64
	Slot       time.Time // tenant time
	DispatchAt time.Time
	Delay      time.Duration // the expected delay, the ceiling counted
	RetryAfter time.Duration
	Depth      int // before this job
	Now        time.Time
	Prompt     bool
	Pause      leaky.Pause // a repeat: the tenant's, which moves its dispatch time
	Job        map[string]string
}

func (a *admitReply) Decode(r *luascript.Reply) {
	a.Code = r.Int()
	a.Slot = r.Time()
	a.DispatchAt = r.Time()
	a.Delay = r.Duration()
	a.RetryAfter = r.Duration()
	a.Depth = int(r.Int())
	a.Now = r.Time()
	a.Prompt = r.Flag()
	a.Pause = leaky.Pause{Shift: r.Duration(), Until: r.Time(), Held: r.Time()}
	a.Job = r.Hash()
	if a.Code < admitRefused || a.Code > admitBooked {
		r.Fail(fmt.Errorf("unknown code %d", a.Code))
	}
}

type admitReplies []admitReply

func (l *admitReplies) Decode(r *luascript.Reply) {
	r.Each(func(r *luascript.Reply) {
		var a admitReply
		a.Decode(r)
		*l = append(*l, a)
	})
}

// admitCall is one run of enqueue.lua for a tenant, built up job by job.
type admitCall struct {
	keys []string
	args []any
	ids  []string // each job's id, in order
}

// newAdmitCall starts a call of mode ("new", or "retry") for tenant, of
// policy p under ceiling (nil: none).
func (s *Store) newAdmitCall(k partKeys, tenant string, p leaky.Policy, ceiling *leaky.Policy, mode string) *admitCall {
	var ceilingT int64
	var ceilingBurst int
	if ceiling != nil {
		ceilingT, ceilingBurst = usCeil(ceiling.Interval), ceiling.Burst
	}
	c := &admitCall{
		keys: []string{k.tenant(tenant), k.arrivals(), k.active(), k.failed(tenant), k.waiting(tenant), k.claimed(tenant),
			owner.LeaseKey(k.part), owner.EpochKey(k.part)},
		args: []any{s.scriptNow(), usCeil(s.lag), usCeil(p.Interval), p.Burst, p.Capacity, ceilingT, ceilingBurst,
			s.idle.Milliseconds(), mode, tenant, k.tag, len(p.Windows), usCeil(s.timing.Lease), usCeil(ownerLag)},
	}
	for _, w := range p.Windows {
		c.keys = append(c.keys, k.window(tenant, w))
		c.args = append(c.args, w.N, usCeil(w.Length))
	}
	return c
}

// add puts a job in the call: its hash's key, its idempotency key's key
// (its hash's again if none) and its id; maxScheduled is its tenant's, and
// capped whether it has a cap on attempts in flight (rules.Call.Capped).
func (c *admitCall) add(jobKey, idemKey, id string, nj queue.NewJob, maxScheduled int, capped bool) {
	var notBefore int64
	if !nj.NotBefore.IsZero() {
		notBefore = microsUp(nj.NotBefore)
	}
	c.keys = append(c.keys, jobKey, idemKey)
	c.args = append(c.args, id, []byte(nj.Payload), nj.IdempotencyKey, max(nj.Cost, 1), deadlineArg(nj.Deadline), requestArg(nj.Request), nj.Type,
		callbackURLArg(nj.Callback), callbackOnArg(nj.Callback), notBefore, maxScheduled, flagArg(capped))
	c.ids = append(c.ids, id)
}

// requestArg is a job's request as enqueue.lua keeps it: its JSON, ""
// for none.
func requestArg(r *queue.JobRequest) []byte {
	if r == nil {
		return nil
	}
	raw, err := json.Marshal(r)
	if err != nil { // maps of strings: cannot fail
		panic(err)
	}
	return raw
}

// admittingAtOnce bounds the jobs of one process's admission scripts in
// Redis at once. Redis runs one script at a time: a burst of batches sent
// all together only queues there, in front of the claims and the shared
// gate's calls of the sends due meanwhile (a hundred batches of 25 held
// each send back by up to 100 ms, and each tenant's queue with it). Held
// here instead, they keep Redis as busy, and a send waits for at most
// about a hundred jobs' admission (some 5 ms). Counted in jobs, not
// scripts: single-job admissions, each a fraction of that, are not held
// back by it.
const admittingAtOnce = 100

func (c *admitCall) run(ctx context.Context, s *Store) (admitReplies, error) {
	n := int64(min(len(c.ids), admittingAtOnce))
	if err := s.admitting.Acquire(ctx, n); err != nil {
		return nil, queue.Unavailable(err)
	}
	defer s.admitting.Release(n)
	var out admitReplies
	if err := enqueueScript.Run(ctx, s.rdb, c.keys, c.args, &out); err != nil {
		return nil, err
	}
	if len(out) != len(c.ids) {
		return nil, fmt.Errorf("enqueue.lua: %d replies for %d jobs", len(out), len(c.ids))
	}
	return out, nil
}

// Enqueue implements queue.Store: one script decides and keeps the whole
// batch (nothing is admitted if it fails), tells the partition's owner of
// the jobs admitted (its arrivals), and answers every job from what it
// read itself, a repeated key too.
func (s *Store) Enqueue(ctx context.Context, tenant string, jobs []queue.NewJob) ([]queue.Admission, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	p := s.policy(tenant)
	_, ceiling := s.ceiling(tenant)
	out := make([]queue.Admission, len(jobs))
	plan := queue.Precheck(tenant, jobs, rules.MaxCost(p, ceiling), p.Capacity, out)
	for _, i := range plan.Lookup {
		prev, found, err := s.jobOfKey(ctx, tenant, jobs[i].IdempotencyKey)
		if err != nil {
			return nil, err
		}
		if found {
			out[i] = queue.Repeat(prev, p.Capacity)
		}
	}
	if len(plan.Decide) > 0 {
		part := s.partOf(tenant)
		k := keysOf(part)
		call := s.newAdmitCall(k, tenant, p, ceiling, "new")
		capped := s.caps(tenant).Capped()
		idNow := s.localNow()
		for _, i := range plan.Decide {
			id := newJobID(idNow, part)
			ik := k.job(id)
			if key := jobs[i].IdempotencyKey; key != "" {
				ik = k.idem(tenant, key)
			}
			call.add(k.job(id), ik, id, jobs[i], p.MaxScheduled, capped)
		}
		replies, err := call.run(ctx, s)
		if err != nil {
			return nil, err
		}
		for n, i := range plan.Decide {
			out[i] = s.admission(tenant, p, jobs[i], call.ids[n], replies[n])
		}
	}
	plan.FillRepeats(out)
	return out, nil
}

// jobOfKey is the job an idempotency key of tenant admitted, if any.
func (s *Store) jobOfKey(ctx context.Context, tenant, key string) (queue.Job, bool, error) {
	id, err := s.rdb.Get(ctx, keysOf(s.partOf(tenant)).idem(tenant, key)).Result()
	switch {
	case errors.Is(err, goredis.Nil):
		return queue.Job{}, false, nil
	case err != nil:
		return queue.Job{}, false, queue.Unavailable(err)
	}
	j, err := s.Job(ctx, id)
	if errors.Is(err, queue.ErrNotFound) {
		return queue.Job{}, false, nil // expired with its job
	}
	return j, err == nil, err
}

// admission is the answer to job nj, given id, from enqueue.lua's reply r.
func (s *Store) admission(tenant string, p leaky.Policy, nj queue.NewJob, id string, r admitReply) queue.Admission {
	switch r.Code {
	case admitRefused:
		return queue.Admission{Rejected: queue.Rejection(tenant, p, r.RetryAfter, r.Depth), QueueDepth: r.Depth, Capacity: p.Capacity}
	case admitWouldExpire:
		return queue.Admission{Impossible: &queue.ImpossibleError{Tenant: tenant, Reason: queue.ReasonWouldExpire, ExpectedDelay: r.Delay, Deadline: nj.Deadline},
			QueueDepth: r.Depth, Capacity: p.Capacity}
	case admitScheduleFull:
		n, _ := strconv.Atoi(r.Job["scheduled"])
		return queue.Admission{Rejected: queue.ScheduleFull(tenant, n, p.MaxScheduled), QueueDepth: r.Depth, Capacity: p.Capacity}
	case admitRepeat: // the first job, as Job reads it
		return queue.Repeat(underPause(jobFromHash(r.Job), r.Pause, r.Now), p.Capacity)
	}
	j := queue.Job{
		ID: id, Tenant: tenant, State: queue.StateQueued, Payload: nj.Payload,
		IdempotencyKey: nj.IdempotencyKey, EnqueuedAt: r.Now, DispatchAt: r.DispatchAt, Slot: r.Slot,
		AdmitDelay: r.Delay, AdmitDepth: r.Depth + 1, Prompt: r.Prompt, Deadline: nj.Deadline,
		Request: nj.Request, Type: nj.Type, Callback: nj.Callback, NotBefore: nj.NotBefore,
	}
	if r.Code == admitBooked {
		j.State, j.AdmitDepth = queue.StateScheduled, r.Depth
	}
	if c := max(nj.Cost, 1); c > 1 {
		j.Cost = c
	}
	return queue.Admission{Job: j, ExpectedDelay: j.AdmitDelay, QueueDepth: j.AdmitDepth, Capacity: p.Capacity}
}

// Retry implements queue.Store: the failed job takes a new slot like a new
// job, and its partition's owner is told of it as of one.
func (s *Store) Retry(ctx context.Context, id string) (queue.Admission, error) {
	part, ok := s.partOfID(id)
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
	k := keysOf(part)
	p := s.policy(j.Tenant)
	_, ceiling := s.ceiling(j.Tenant)
	if cost, most := j.EffectiveCost(), rules.MaxCost(p, ceiling); cost > most {
		// A reload made the bucket too small for it: it would be refused
		// for ever, so say so, as Enqueue does.
		return queue.CostTooLarge(j.Tenant, cost, most, p.Capacity), nil
	}
	call := s.newAdmitCall(k, j.Tenant, p, ceiling, "retry")
	// Its payload and key stay in its hash.
	call.add(k.job(id), k.idemOf(j), id, queue.NewJob{Cost: j.Cost, Deadline: j.Deadline}, p.MaxScheduled, s.caps(j.Tenant).Capped())
	replies, err := call.run(ctx, s)
	if err != nil {
		return queue.Admission{}, err
	}
	r := replies[0]
	if r.Code == admitNotFailed { // another retry took it meanwhile
		return queue.Admission{}, &queue.StateError{ID: id, State: queue.JobState(r.Job["state"]), Op: "retry"}
	}
	a := s.admission(j.Tenant, p, queue.NewJob{Payload: j.Payload, IdempotencyKey: j.IdempotencyKey, Cost: j.Cost, Deadline: j.Deadline, Request: j.Request, Type: j.Type}, id, r)
	if r.Code == admitAdmitted {
		a.Job.EnqueuedAt, a.Job.Attempts = j.EnqueuedAt, 0
	}
	return a, nil
}

// flagArg is a yes or no as the scripts read it: "1" or "0".
func flagArg(b bool) string {
	if b {
		return "1"
	}
	return "0"
}
