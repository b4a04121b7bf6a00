package redis

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/rules"
)

// luaWorld is one partition as the agreement tests of the owner's scripts
// (claim.lua, finish.lua) drive it: its tenants, each with its record and
// handover as the rules keep them, and their jobs. Before each script it
// is written to Redis whole (write), so that a difference shows at the
// step that makes it.
type luaWorld struct {
	prefix, token string
	unit          int64 // the sequence's time scale, microseconds
	grain         int64 // every time and duration is a multiple of it, microseconds
	rng           *rand.Rand
	now           time.Time
	tenants       []*luaTenant
	jobs          []*queue.Job
	recent        map[string]time.Time // the partition's recent set: tenant -> no credit until
	dirty         map[string]bool      // jobs to write again (new, changed, or given an expiry)
	made          int
}

type luaTenant struct {
	name string
	p    leaky.Policy
	rec  rules.Record
	h    rules.Handover
}

// newLuaWorld is a partition of one to three tenants with random rates,
// bursts and scales, under the key prefix prefix. Half the worlds keep
// their times on a coarse grain, where comparisons meet their bounds
// exactly (a deadline at now, a dispatch time at the horizon).
func newLuaWorld(rng *rand.Rand, prefix string) *luaWorld {
	unit := 4 * (250 + rng.Int64N(25_000))
	grain := int64(1)
	if rng.IntN(2) == 0 {
		grain = unit / 4
	}
	w := &luaWorld{prefix: prefix, token: "owner-1", unit: unit, grain: grain, rng: rng, now: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC), recent: map[string]time.Time{}, dirty: map[string]bool{}}
	for i := range 1 + rng.IntN(3) {
		p := leaky.Policy{Interval: us(unit * (1 + rng.Int64N(3))), Burst: 1 + rng.IntN(4), Capacity: 10}
		if rng.IntN(3) == 0 { // its sends made are kept (finish.lua)
			p.Windows = []leaky.Window{{N: 2 + rng.IntN(5), Length: us(unit * (5 + rng.Int64N(15)))}}
			p.Burst = min(p.Burst, p.Windows[0].N)
		}
		w.tenants = append(w.tenants, &luaTenant{name: fmt.Sprintf("t%d", i), p: p})
	}
	return w
}

func (w *luaWorld) lease() string { return w.prefix + "lease" }

// span is a random duration from lo to hi units (hi excluded), a multiple
// of the grain.
func (w *luaWorld) span(lo, hi int64) time.Duration {
	n := lo*w.unit + w.rng.Int64N((hi-lo)*w.unit)
	return us(n - n%w.grain)
}

func (w *luaWorld) tenant(name string) *luaTenant {
	for _, tn := range w.tenants {
		if tn.name == name {
			return tn
		}
	}
	panic("no tenant " + name)
}

// counts is how many of tenant's jobs wait (its depth) and are being sent.
func (w *luaWorld) counts(tenant string) (depth, inflight int) {
	for _, j := range w.jobs {
		switch {
		case j.Tenant != tenant:
		case j.State.Waiting():
			depth++
		case j.State == queue.StateDispatching:
			inflight++
		}
	}
	return depth, inflight
}

// evolve moves the world on by a step: time passes, pauses and holds come
// and go, queues run late, jobs are admitted (some with deadlines, costs, idempotency keys,
// bookings; some retries), and finished jobs leave now and then.
func (w *luaWorld) evolve(rng *rand.Rand) {
	w.now = w.now.Add(w.span(0, 2))
	for _, tn := range w.tenants {
		pz := tn.rec.Pause
		switch rng.IntN(16) {
		case 0:
			tn.rec.Pause = pz.PauseUntil(w.now, w.now.Add(w.span(0, 20)), pz.TenantTime(w.now).Add(-w.span(0, 2)))
		case 1:
			tn.rec.Pause = pz.Hold(w.now)
		case 2, 3:
			tn.rec.Pause = pz.Resume(w.now)
		case 4: // its sends run late (rules.Record.RunLate)
			tn.rec.Behind = w.now.Add(w.span(0, 6))
		}
		for range rng.IntN(3) {
			w.admit(rng, tn)
		}
	}
	if len(w.jobs) > 24 {
		w.jobs = slices.DeleteFunc(w.jobs, func(j *queue.Job) bool { return j.State.Finished() && rng.IntN(2) == 0 })
	}
}

// admit adds a job of tn near its tenant time.
func (w *luaWorld) admit(rng *rand.Rand, tn *luaTenant) {
	w.made++
	tnow := tn.rec.Pause.TenantTime(w.now)
	j := &queue.Job{ID: fmt.Sprintf("j%d", w.made), Tenant: tn.name, State: queue.StateQueued, Slot: tnow.Add(w.span(-3, 8))}
	if c := 1 + rng.IntN(3); c > 1 {
		j.Cost = c
	}
	if rng.IntN(3) == 0 {
		// What its last attempt left: an answer, a write, an error.
		j.State, j.Attempts, j.Failures = queue.StateRetrying, 1+rng.IntN(3), 1
		j.SentAt, j.ResponseStatus, j.LastError = w.now.Add(-w.span(0, 5)), 503, "503 Service Unavailable"
	}
	if rng.IntN(3) == 0 {
		j.Deadline = w.now.Add(w.span(-2, 10))
	}
	if rng.IntN(2) == 0 {
		j.IdempotencyKey = "k" + j.ID
	}
	if rng.IntN(6) == 0 {
		tn.rec.Booked = append(tn.rec.Booked, rules.Booking{Slot: j.Slot.UnixNano(), Cost: j.Cost, Job: j.ID})
		sortBooked(tn.rec.Booked)
	}
	j.DispatchAt = rules.DispatchAt(tn.rec.Pause, j.Slot, w.now)
	tn.rec.TAT = clock.Later(tn.rec.TAT, j.Slot.Add(time.Duration(j.EffectiveCost())*tn.p.Interval))
	w.jobs = append(w.jobs, j)
	w.dirty[j.ID] = true
}

// write puts the world in Redis: each tenant's hash (no expiry), its
// waiting and claimed sets, the partition's sending and active sets, and
// the hashes of the jobs new or changed since the last script (the others
// are as the script that passed left them; the recent set is the scripts'
// own). It returns the server's clock then, in ms.
func (w *luaWorld) write(ctx context.Context, rdb *goredis.Client) (int64, error) {
	var now *goredis.TimeCmd
	_, err := rdb.TxPipelined(ctx, func(pipe goredis.Pipeliner) error {
		pipe.Del(ctx, w.prefix+"sending", w.prefix+"active")
		for _, tn := range w.tenants {
			w.writeTenant(ctx, pipe, tn)
		}
		for _, j := range w.jobs {
			if w.dirty[j.ID] {
				w.writeJob(ctx, pipe, j)
			}
			switch {
			case j.State.Waiting():
				pipe.ZAdd(ctx, w.prefix+"waiting:"+j.Tenant, goredis.Z{Score: float64(micros(j.Slot)), Member: j.ID})
			case j.State == queue.StateDispatching:
				if rules.CountsWaiting(w.tenant(j.Tenant).p) { // only there is the set kept
					pipe.ZAdd(ctx, w.prefix+"claimed:"+j.Tenant, goredis.Z{Score: float64(micros(j.Slot)), Member: j.ID})
				}
				pipe.ZAdd(ctx, w.prefix+"sending", goredis.Z{Score: float64(micros(j.Slot)), Member: j.ID})
			}
		}
		now = pipe.Time(ctx)
		return nil
	})
	if err != nil {
		return 0, err
	}
	clear(w.dirty)
	return now.Val().UnixMilli(), nil
}

// writeJob queues the write of j's hash, with no expiry.
func (w *luaWorld) writeJob(ctx context.Context, pipe goredis.Pipeliner, j *queue.Job) {
	jk := w.prefix + "job:" + j.ID
	pipe.HSet(ctx, jk, "id", j.ID, "tenant", j.Tenant, "state", string(j.State), "slot", micros(j.Slot),
		"dispatch", microsOf(j.DispatchAt), "deadline", deadlineArg(j.Deadline), "cost", j.EffectiveCost(),
		"attempts", j.Attempts, "failures", j.Failures, "key", j.IdempotencyKey, "payload", "{}",
		"sent", microsOf(j.SentAt), "status", j.ResponseStatus, "err", j.LastError, "fin", microsOf(j.FinishedAt), "resp", `{"status":200}`)
	pipe.Persist(ctx, jk)
}

// writeTenant queues the writes of tn's hash and sets.
func (w *luaWorld) writeTenant(ctx context.Context, pipe goredis.Pipeliner, tn *luaTenant) {
	tk, pz := w.prefix+"tenant:"+tn.name, tn.rec.Pause
	depth, inflight := w.counts(tn.name)
	pipe.HSet(ctx, tk, "shift", pz.Shift.Microseconds(), "until", microsOf(pz.Until), "held", microsOf(pz.Held),
		"tat", microsOf(tn.rec.TAT), "depth", depth, "inflight", inflight, "expired", tn.rec.Expired,
		"delivered", tn.rec.Delivered, "failed", tn.rec.Failed, "booked", formatBooked(tn.rec.Booked), "behind", microsOf(tn.rec.Behind))
	if len(tn.rec.Booked) == 0 {
		pipe.HDel(ctx, tk, "booked")
	}
	pipe.HDel(ctx, tk, "next", "last", "lastcost")
	if !tn.h.Next.IsZero() {
		pipe.HSet(ctx, tk, "next", micros(tn.h.Next))
	}
	if !tn.h.Last.IsZero() {
		pipe.HSet(ctx, tk, "last", micros(tn.h.Last), "lastcost", tn.h.LastCost)
	}
	pipe.Persist(ctx, tk)
	pipe.Del(ctx, w.prefix+"waiting:"+tn.name, w.prefix+"claimed:"+tn.name)
	made, _ := tn.rec.Made(tn.p)
	for i, win := range tn.p.Windows {
		key := w.prefix + "sent:" + tn.name + ":" + win.String()
		pipe.Del(ctx, key)
		if len(made[i]) > 0 {
			pipe.RPush(ctx, key, anySlice(microsList(made[i]))...)
		}
	}
	if depth+inflight > 0 {
		pipe.ZAdd(ctx, w.prefix+"active", goredis.Z{Score: float64(depth + inflight), Member: tn.name})
	}
}

// luaSnap is what Redis holds of a world after a script, read in one round
// trip: each tenant's hash and each job's, with their expiry times
// (PEXPIRETIME: -1 none), and the sets by member and score.
type luaSnap struct {
	kept    expiryWindow
	tenants map[string]keySnap
	jobs    map[string]keySnap
	waiting map[string]map[string]int64 // tenant -> id -> slot
	claimed map[string]map[string]int64
	failed  map[string]map[string]int64 // tenant -> id -> when it failed
	sending map[string]int64
	recent  map[string]int64
	active  map[string]int64
	made    map[string][]string // "tenant window" -> its sends made (a sent list)
}

type keySnap struct {
	h        map[string]string
	expireAt int64
}

// snapshot reads w's tenants and sets, and the hashes of jobs (those the
// script was given: no other changes); from is the server's clock before
// the script.
func (w *luaWorld) snapshot(ctx context.Context, rdb *goredis.Client, from int64, jobs []*queue.Job) (luaSnap, error) {
	pipe := rdb.Pipeline()
	now := pipe.Time(ctx)
	read := func(key string) func() keySnap {
		h, at := pipe.HGetAll(ctx, key), pipe.Do(ctx, "PEXPIRETIME", key)
		return func() keySnap { n, _ := at.Int64(); return keySnap{h: h.Val(), expireAt: n} }
	}
	zset := func(key string) func() map[string]int64 {
		z := pipe.ZRangeWithScores(ctx, key, 0, -1)
		return func() map[string]int64 {
			m := map[string]int64{}
			for _, e := range z.Val() {
				m[e.Member.(string)] = int64(e.Score)
			}
			return m
		}
	}
	tenants := map[string]func() keySnap{}
	waiting, claimed, failed := map[string]func() map[string]int64{}, map[string]func() map[string]int64{}, map[string]func() map[string]int64{}
	for _, tn := range w.tenants {
		tenants[tn.name] = read(w.prefix + "tenant:" + tn.name)
		waiting[tn.name], claimed[tn.name] = zset(w.prefix+"waiting:"+tn.name), zset(w.prefix+"claimed:"+tn.name)
		failed[tn.name] = zset(w.prefix + "failed:" + tn.name)
	}
	made := map[string]*goredis.StringSliceCmd{}
	for _, tn := range w.tenants {
		for _, win := range tn.p.Windows {
			made[tn.name+" "+win.String()] = pipe.LRange(ctx, w.prefix+"sent:"+tn.name+":"+win.String(), 0, -1)
		}
	}
	jobHashes := map[string]func() keySnap{}
	for _, j := range jobs {
		jobHashes[j.ID] = read(w.prefix + "job:" + j.ID)
	}
	sending, recent, active := zset(w.prefix+"sending"), zset(w.prefix+"recent"), zset(w.prefix+"active")
	if _, err := pipe.Exec(ctx); err != nil {
		return luaSnap{}, err
	}
	s := luaSnap{kept: expiryWindow{from, now.Val().UnixMilli()}, tenants: map[string]keySnap{}, jobs: map[string]keySnap{},
		waiting: map[string]map[string]int64{}, claimed: map[string]map[string]int64{}, failed: map[string]map[string]int64{},
		sending: sending(), recent: recent(), active: active(), made: map[string][]string{}}
	for k, c := range made {
		s.made[k] = c.Val()
	}
	for name, f := range tenants {
		s.tenants[name], s.waiting[name], s.claimed[name], s.failed[name] = f(), waiting[name](), claimed[name](), failed[name]()
	}
	for id, f := range jobHashes {
		s.jobs[id] = f()
	}
	return s, nil
}

// expiryWindow is the server's clock before and after a script ran (ms):
// a PEXPIRE in it of ttl puts the key's expiry between the two plus ttl.
type expiryWindow struct{ from, to int64 }

// diff says how an expiry time (PEXPIRETIME) differs from one ttl from the
// script's run (forever: none).
func (e expiryWindow) diff(at int64, ttl time.Duration, forever bool) string {
	switch {
	case forever && at != -1:
		return fmt.Sprintf("expires in %d ms, want never", at-e.to)
	case !forever && (at < e.from+ttl.Milliseconds() || at > e.to+ttl.Milliseconds()):
		return fmt.Sprintf("expires at %d, want %d ms after the script's run (%d..%d)", at, ttl.Milliseconds(), e.from, e.to)
	}
	return ""
}

// mapDiff says how got differs from want ("": it does not).
func mapDiff[V comparable](what string, got, want map[string]V) string {
	if !maps.Equal(got, want) {
		return fmt.Sprintf("%s Lua %v, rule %v", what, got, want)
	}
	return ""
}

// tenantDiff says how tenant tn's hash in s differs from its record, its
// handover and its jobs' counts.
func (w *luaWorld) tenantDiff(s luaSnap, tn *luaTenant) string {
	h := s.tenants[tn.name].h
	depth, inflight := w.counts(tn.name)
	want := map[string]string{"depth": fmt.Sprint(depth), "inflight": fmt.Sprint(inflight), "next": fmt.Sprint(microsOf(tn.h.Next)),
		"last": fmt.Sprint(microsOf(tn.h.Last)), "lastcost": fmt.Sprint(tn.h.LastCost), "expired": fmt.Sprint(tn.rec.Expired),
		"delivered": fmt.Sprint(tn.rec.Delivered), "failed": fmt.Sprint(tn.rec.Failed), "booked": formatBooked(tn.rec.Booked),
		"behind": fmt.Sprint(microsOf(tn.rec.Behind))}
	for _, f := range slices.Sorted(maps.Keys(want)) {
		got := h[f]
		if got == "" && f != "booked" {
			got = "0"
		}
		if got != want[f] {
			return fmt.Sprintf("%s Lua %q, rule %q", f, got, want[f])
		}
	}
	made, _ := tn.rec.Made(tn.p)
	for i, win := range tn.p.Windows {
		if got, want := s.made[tn.name+" "+win.String()], microsList(made[i]); fmt.Sprint(got) != fmt.Sprint(want) {
			return fmt.Sprintf("sends made in window %v: Lua %v, rule %v", win, got, want)
		}
	}
	return ""
}

// jobDiff says how job j's hash in s differs from j: its state, its
// attempt and dispatch time if being sent, its end if ended, and its
// expiry (retention if it ended in this script, ended; none otherwise).
func (w *luaWorld) jobDiff(s luaSnap, j *queue.Job, ended bool, retention time.Duration) string {
	k := s.jobs[j.ID]
	want := map[string]string{"state": string(j.State)}
	switch {
	case j.State == queue.StateDispatching:
		want["attempts"], want["dispatch"] = fmt.Sprint(j.Attempts), fmt.Sprint(micros(j.DispatchAt))
	case j.State.Finished():
		want["fin"] = fmt.Sprint(microsOf(j.FinishedAt))
		want["sent"], want["status"] = fmt.Sprint(microsOf(j.SentAt)), strconv.Itoa(j.ResponseStatus)
	}
	for _, f := range slices.Sorted(maps.Keys(want)) {
		if k.h[f] != want[f] {
			return fmt.Sprintf("job %s: %s Lua %q, rule %q", j.ID, f, k.h[f], want[f])
		}
	}
	if msg := s.kept.diff(k.expireAt, retention, !ended); msg != "" {
		return fmt.Sprintf("job %s %s", j.ID, msg)
	}
	return ""
}

// setsDiff says how the sets in s differ from the world's: each tenant's
// waiting jobs by slot, its claimed set (claimed(tenant)), the jobs being
// sent, the recent set and the active tenants.
func (w *luaWorld) setsDiff(s luaSnap, claimed func(tenant string) map[string]int64) string {
	sending, active := map[string]int64{}, map[string]int64{}
	for _, tn := range w.tenants {
		waiting := map[string]int64{}
		for _, j := range w.jobs {
			switch {
			case j.Tenant != tn.name:
			case j.State.Waiting():
				waiting[j.ID] = micros(j.Slot)
			case j.State == queue.StateDispatching:
				sending[j.ID] = micros(j.Slot)
			}
		}
		if msg := mapDiff("waiting of "+tn.name, s.waiting[tn.name], waiting); msg != "" {
			return msg
		}
		if msg := mapDiff("claimed of "+tn.name, s.claimed[tn.name], claimed(tn.name)); msg != "" {
			return msg
		}
		if d, f := w.counts(tn.name); d+f > 0 {
			active[tn.name] = int64(d + f)
		}
	}
	recent := map[string]int64{}
	for name, until := range w.recent {
		recent[name] = micros(until)
	}
	for _, d := range []struct {
		what      string
		got, want map[string]int64
	}{{"sending", s.sending, sending}, {"recent", s.recent, recent}, {"active", s.active, active}} {
		if msg := mapDiff(d.what, d.got, d.want); msg != "" {
			return msg
		}
	}
	return ""
}

func ms(n int64) time.Duration { return time.Duration(n) * time.Millisecond }

// brief is what a failure says of job j: what the scripts read of it.
func brief(j queue.Job) string {
	return fmt.Sprintf("job %s of %s, %s, attempt %d, slot %v, dispatch %v, deadline %v, cost %d, sent %v",
		j.ID, j.Tenant, j.State, j.Attempts, j.Slot.Format(time.StampMicro), j.DispatchAt.Format(time.StampMicro),
		j.Deadline.Format(time.StampMicro), j.EffectiveCost(), j.SentAt.Format(time.StampMicro))
}
