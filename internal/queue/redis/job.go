package redis

import (
	"context"
	_ "embed"
	"encoding/json"
	"strconv"
	"strings"
	"time"

	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/luascript"
	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/rules"
)

var (
	//go:embed cancel.lua
	cancelLua    string
	cancelScript = newScript("cancel.lua", cancelLua, true)
)

// Job implements queue.Store.
func (s *Store) Job(ctx context.Context, id string) (queue.Job, error) {
	part, ok := s.partOfID(id)
	if !ok {
		return queue.Job{}, queue.ErrNotFound
	}
	k := keysOf(part)
	h, err := s.rdb.HGetAll(ctx, k.job(id)).Result()
	if err != nil {
		return queue.Job{}, queue.Unavailable(err)
	}
	if len(h) == 0 {
		return queue.Job{}, queue.ErrNotFound
	}
	j := jobFromHash(h)
	if !j.State.Waiting() {
		return j, nil
	}
	// Its dispatch time moves with its tenant's pauses.
	v, err := s.rdb.HMGet(ctx, k.tenant(j.Tenant), tenantFields...).Result()
	if err != nil {
		return queue.Job{}, queue.Unavailable(err)
	}
	now, err := s.serverNow(ctx)
	if err != nil {
		return queue.Job{}, err
	}
	return underPause(j, parseTenant(v).rec.Pause, now), nil
}

// underPause is job j with its dispatch time (if it waits) under its
// tenant's pause at now.
func underPause(j queue.Job, pause leaky.Pause, now time.Time) queue.Job {
	if j.State.Waiting() {
		j.DispatchAt = rules.DispatchAt(pause, j.Slot, now)
	}
	return j
}

// jobFromHash is a job's hash, read.
func jobFromHash(h map[string]string) queue.Job {
	n := func(f string) int64 { v, _ := strconv.ParseInt(h[f], 10, 64); return v }
	j := queue.Job{
		ID: h["id"], Tenant: h["tenant"], State: queue.JobState(h["state"]), Payload: []byte(h["payload"]),
		IdempotencyKey: h["key"], Attempts: int(n("attempts")), Failures: int(n("failures")),
		EnqueuedAt: fromMicros(n("enq")), Slot: fromMicros(n("slot")), DispatchAt: fromMicros(n("dispatch")),
		Deadline: deadlineOf(h["deadline"]), SentAt: fromMicros(n("sent")), FinishedAt: fromMicros(n("fin")),
		LastError: h["err"], ResponseStatus: int(n("status")),
		AdmitDelay: time.Duration(n("delay")) * time.Microsecond, AdmitDepth: int(n("depth")), Prompt: h["prompt"] == "1",
		Type: h["type"], NotBefore: fromMicros(max(n("nb"), n("nbo"))), // booked for it, or queued after it
	}
	if _, ok := h["payload"]; !ok {
		j.Payload = nil
	}
	if c := int(n("cost")); c > 1 {
		j.Cost = c
	}
	if j.DispatchAt.IsZero() {
		j.DispatchAt = j.EnqueuedAt.Add(j.AdmitDelay)
	}
	// Hashes written before these fields were kept have neither. One that
	// does not decode (never written so) is left out rather than failing
	// the whole job.
	if raw := h["request"]; raw != "" {
		var r queue.JobRequest
		if json.Unmarshal([]byte(raw), &r) == nil {
			j.Request = &r
		}
	}
	if u := h["cbu"]; u != "" {
		j.Callback = &queue.JobCallback{URL: u}
		for st := range strings.SplitSeq(h["cbon"], ",") {
			if st != "" {
				j.Callback.On = append(j.Callback.On, queue.JobState(st))
			}
		}
	}
	if st := h["cbs"]; st != "" {
		j.CallbackStatus = &queue.CallbackStatus{State: st, Attempts: int(n("cba")), LastError: h["cbe"]}
		if st == queue.CallbackPending {
			j.CallbackStatus.NextAt = fromMicros(n("cbn"))
		}
	}
	if raw := h["resp"]; raw != "" {
		var r queue.Response
		if json.Unmarshal([]byte(raw), &r) == nil {
			j.Response = &r
		}
	}
	return j
}

// responseArg is the answer kept of an attempt as a job's hash keeps it
// (field "resp"): its JSON, "" for none.
func responseArg(r *queue.Response) []byte {
	if r == nil {
		return nil
	}
	raw, err := json.Marshal(r)
	if err != nil { // strings, an int and a bool: cannot fail
		panic(err)
	}
	return raw
}

// deadlineOf is a job's stored deadline: "" for none. "0" is none too:
// builds before this one wrote it for none, and no job is kept with a
// deadline at 1970-01-01T00:00:00Z, since its admission refuses it
// (would_expire), so "0" means nothing else.
func deadlineOf(v string) time.Time {
	us, err := strconv.ParseInt(v, 10, 64)
	if err != nil || us == 0 {
		return time.Time{}
	}
	return time.UnixMicro(us)
}

// cancelReply is cancel.lua's.
type cancelReply struct {
	Code       int64 // 0 no such job, 1 not waiting, 2 cancelled
	State      queue.JobState
	FinishedAt time.Time
}

func (c *cancelReply) Decode(r *luascript.Reply) {
	c.Code = r.Int()
	c.State = queue.JobState(r.Str())
	c.FinishedAt = r.Time()
}

// Cancel implements queue.Store.
func (s *Store) Cancel(ctx context.Context, id string) (queue.Job, error) {
	part, ok := s.partOfID(id)
	if !ok {
		return queue.Job{}, queue.ErrNotFound
	}
	k := keysOf(part)
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
	var r cancelReply
	err = cancelScript.Run(ctx, s.rdb, []string{k.job(id), k.tenant(j.Tenant), k.active(), k.idemOf(j), k.waiting(j.Tenant)},
		[]any{s.now(), s.retain.Milliseconds(), usCeil(p.Interval), giveBack, s.idle.Milliseconds()}, &r)
	switch {
	case err != nil:
		return queue.Job{}, err
	case r.Code == 0:
		return queue.Job{}, queue.ErrNotFound
	case r.Code == 1:
		return queue.Job{}, &queue.StateError{ID: id, State: r.State, Op: "cancel"}
	}
	j.State, j.FinishedAt, j.Payload = queue.StateCancelled, r.FinishedAt, nil
	return j, nil
}

// Failed implements queue.Store.
func (s *Store) Failed(ctx context.Context, tenant string, limit int) ([]queue.Job, error) {
	k := keysOf(s.partOf(tenant))
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
