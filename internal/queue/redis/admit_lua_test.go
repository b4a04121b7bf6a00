package redis

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/luascript"
	"github.com/throttler-dev/throttler/internal/rules"
)

// admit.lua and rules.Admit agree on every decision, slot, dispatch time,
// delay, Retry-After, promptness and record they leave, on thousands of
// random sequences: random policies (leaky, token, burst, capacity,
// windows), a downstream's ceiling, arrivals, start lags, costs,
// deadlines, a partition waiting for an owner, retries booked past their
// places, jobs handed over and jobs of the same batch, and pauses and holds
// coming and going. The Go is the rule; the Lua is its port.
func TestLuaAdmitAgreesWithRules(t *testing.T) {
	t.Parallel() // its own redis-server: overlapped with the other scripts' checks
	rdb := redisClient(t, 0)
	seqs, steps := 400, 40
	if testing.Short() {
		seqs = 60
	}
	decisions, heldRefusals, booked := 0, 0, 0
	for seq := range seqs {
		n, held, b := admitSequence(t, rdb, uint64(seq), steps)
		decisions, heldRefusals, booked = decisions+n, heldRefusals+held, booked+b
	}
	t.Logf("%d sequences, %d decisions agree (%d refusals during a hold, %d jobs booked for their not_before)", seqs, decisions, heldRefusals, booked)
	if booked == 0 {
		t.Fatal("no sequence booked a job for its not_before")
	}
	// A refusal's Retry-After during a hold has a floor of its own
	// (rules.HeldRetryAfter): the sequences must reach it.
	if heldRefusals == 0 {
		t.Fatal("no sequence refused a job during a hold")
	}
}

// admitSequence runs one random sequence of admissions through admit.lua
// and rules.Admit, and fails at the first difference. It returns the
// decisions compared, and how many were refusals during a hold.
func admitSequence(t *testing.T, rdb *goredis.Client, seed uint64, steps int) (decisions, heldRefusals, booked int) {
	ctx := context.Background()
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	rng := rand.New(rand.NewPCG(seed, 7))
	p := randomAdmitPolicy(rng)
	var ceiling *leaky.Policy
	if rng.IntN(4) == 0 {
		ceiling = &leaky.Policy{Interval: us(1000 + rng.Int64N(100_000)), Burst: 1 + rng.IntN(3)}
	}
	tenant := fmt.Sprintf("{t%d}", seed)
	keys := []string{tenant + ":b", tenant + ":waiting", tenant + ":claimed"}
	for i := range p.Windows {
		keys = append(keys, fmt.Sprintf("%s:w%d", tenant, i))
	}
	var rec rules.Record
	q := &admitView{}
	now := base
	for step := range steps {
		now = now.Add(us(rng.Int64N(int64(3 * p.Interval / time.Microsecond))))
		switch rng.IntN(12) { // pauses come and go
		case 0:
			rec.Pause = rec.Pause.PauseUntil(now, now.Add(us(rng.Int64N(2_000_000))), now.Add(-us(rng.Int64N(100_000))))
		case 1:
			rec.Pause = rec.Pause.Hold(now)
		case 2:
			rec.Pause = rec.Pause.Resume(now)
		}
		tnow := rec.Pause.TenantTime(now)
		q.step(rng, tnow, p, step)
		if rng.IntN(10) == 0 { // a retry booked past its place
			at := clock.Later(rec.TAT, tnow).Add(us(1 + rng.Int64N(int64(5*p.Interval/time.Microsecond))))
			rec.Booked = append(rec.Booked, rules.Booking{Slot: at.UnixNano(), Job: fmt.Sprintf("b%d", step)})
			slices.SortStableFunc(rec.Booked, func(a, b rules.Booking) int { return cmp.Compare(a.Slot, b.Slot) })
		}
		switch rng.IntN(8) { // a queue runs late, or caught up
		case 0:
			rec.Behind = now.Add(us(rng.Int64N(int64(6 * p.Interval / time.Microsecond))))
		case 1:
			rec.Behind = time.Time{}
		}
		if err := writeAdmitState(ctx, rdb, keys, rec, q); err != nil {
			t.Fatal(err)
		}
		c := rules.Call{
			Now: now, Policy: p, Ceiling: ceiling, Cost: min(1+rng.IntN(3), rules.MaxCost(p, ceiling)),
			Arrival: tnow.Add(us(rng.Int64N(5000))),
		}
		if rng.IntN(5) == 0 {
			c.Deadline = now.Add(us(rng.Int64N(int64(4 * p.Interval / time.Microsecond))))
		}
		if rng.IntN(8) == 0 {
			c.OwnerAt = now.Add(us(rng.Int64N(500_000)))
		}
		if rng.IntN(4) == 0 { // a not_before, past or up to ten intervals ahead
			c.NotBefore = now.Add(us(rng.Int64N(int64(11*p.Interval/time.Microsecond)) - int64(p.Interval/time.Microsecond)))
			c.Job = fmt.Sprintf("j%d", step)
		}
		lag := c.Arrival.Sub(tnow)
		var ceilingT int64
		var ceilingBurst int
		if ceiling != nil {
			ceilingT, ceilingBurst = ceiling.Interval.Microseconds(), ceiling.Burst
		}
		args := []any{micros(now), lag.Microseconds(), p.Interval.Microseconds(), p.Burst, p.Capacity, c.Cost, -1, 1, deadlineArg(c.Deadline), ceilingT, ceilingBurst}
		for _, w := range p.Windows {
			args = append(args, w.N, w.Length.Microseconds())
		}
		c.Capped = rng.IntN(6) == 0
		args = append(args, microsOf(c.OwnerAt), q.ownDue(c.Arrival), microsOf(c.NotBefore), p.MaxScheduled, c.Job, flagArg(c.Capped))
		want := rules.Admit(&rec, q, c)
		var got admitDecision
		if err := admitScript.Run(ctx, rdb, keys, args, &got); err != nil {
			t.Fatal(err)
		}
		decisions++
		where := fmt.Sprintf("seed %d step %d (policy %+v, ceiling %+v, call %+v, depth %d, pause %+v)", seed, step, p, ceiling, c, q.Depth(), rec.Pause)
		if msg := admitDiff(got, want); msg != "" {
			t.Fatalf("%s: %s", where, msg)
		}
		if want.Verdict == rules.Refused && !rec.Pause.Held.IsZero() {
			heldRefusals++
		}
		if want.Verdict != rules.Admitted {
			continue
		}
		if want.Scheduled {
			q.booked++
			booked++
		} else {
			q.waiting = append(q.waiting, queuedSlot{slot: want.Slot, scheduled: true})
		}
		if msg := admitRecordDiff(ctx, rdb, keys, rec, p, q.booked); msg != "" {
			t.Fatalf("%s: %s", where, msg)
		}
	}
	return decisions, heldRefusals, booked
}

func us(n int64) time.Duration { return time.Duration(n) * time.Microsecond }

// randomAdmitPolicy is a leaky, token or mixed policy, with windows or not.
func randomAdmitPolicy(rng *rand.Rand) leaky.Policy {
	p := leaky.Policy{Interval: us(1000 + rng.Int64N(200_000)), Burst: 1 + rng.IntN(4), Capacity: rng.IntN(8), MaxScheduled: rng.IntN(5)}
	if rng.IntN(3) == 0 {
		p.Capacity = 0 // token mode
	}
	if rng.IntN(2) == 0 {
		for range 1 + rng.IntN(2) {
			n := 1 + rng.IntN(6)
			w := leaky.Window{N: n, Length: time.Duration(n+rng.IntN(10)) * p.Interval}
			if !slices.ContainsFunc(p.Windows, func(o leaky.Window) bool { return o.String() == w.String() }) {
				p.Windows = append(p.Windows, w) // a window twice is refused by the config
			}
		}
	}
	return p
}

// admitDiff says how admit.lua's answer differs from the rule's ("": it
// does not).
func admitDiff(got admitDecision, want rules.Decision) string {
	code := map[rules.Verdict]int64{rules.Admitted: 1, rules.Refused: 0, rules.WouldExpire: 3, rules.ScheduleFull: 5}[want.Verdict]
	if want.Verdict == rules.Admitted && want.Scheduled {
		code = 6
	}
	switch {
	case got.Code != code:
		return fmt.Sprintf("Lua code %d, rule %+v", got.Code, want)
	case want.Verdict == rules.ScheduleFull:
		return ""
	case want.Verdict == rules.Refused && got.RetryAfter != want.RetryAfter:
		return fmt.Sprintf("Retry-After Lua %v, rule %v", got.RetryAfter, want.RetryAfter)
	case want.Verdict == rules.Refused:
		return ""
	case !got.Slot.Equal(want.Slot) || !got.DispatchAt.Equal(want.DispatchAt) || got.Delay != want.Delay:
		return fmt.Sprintf("slot Lua %v dispatch %v delay %v, rule %v dispatch %v delay %v", got.Slot, got.DispatchAt, got.Delay, want.Slot, want.DispatchAt, want.Delay)
	case want.Verdict == rules.Admitted && got.Prompt != want.Prompt:
		return fmt.Sprintf("prompt Lua %v, rule %v", got.Prompt, want.Prompt)
	case got.Depth != want.Depth:
		return fmt.Sprintf("depth Lua %d, rule %d", got.Depth, want.Depth)
	}
	return ""
}

// admitRecordDiff says how the record admit.lua left differs from rec.
func admitRecordDiff(ctx context.Context, rdb *goredis.Client, keys []string, rec rules.Record, p leaky.Policy, scheduled int) string {
	h, err := rdb.HMGet(ctx, keys[0], "tat", "booked", "behind", "scheduled").Result()
	if err != nil {
		return err.Error()
	}
	if n, _ := h[3].(string); n != fmt.Sprint(scheduled) {
		return fmt.Sprintf("scheduled Lua %s, rule %d", n, scheduled)
	}
	tat, _ := h[0].(string)
	booked, _ := h[1].(string)
	behind, _ := h[2].(string)
	if behind != fmt.Sprint(microsOf(rec.Behind)) {
		return fmt.Sprintf("behind Lua %s, rule %d", behind, microsOf(rec.Behind))
	}
	if tat != fmt.Sprint(microsOf(rec.TAT)) {
		return fmt.Sprintf("TAT Lua %s, rule %d", tat, microsOf(rec.TAT))
	}
	if booked != formatBooked(rec.Booked) {
		return fmt.Sprintf("bookings Lua %q, rule %q", booked, formatBooked(rec.Booked))
	}
	recent := rec.Recent(p)
	for i := range p.Windows {
		list, err := rdb.LRange(ctx, keys[i+3], 0, -1).Result()
		if err != nil {
			return err.Error()
		}
		if fmt.Sprint(list) != fmt.Sprint(microsList(recent[i])) {
			return fmt.Sprintf("window %d Lua %v, rule %v", i, list, microsList(recent[i]))
		}
	}
	return ""
}

// writeAdmitState puts rec's pause, schedule, bookings and windows and
// q's jobs where admit.lua reads them.
func writeAdmitState(ctx context.Context, rdb *goredis.Client, keys []string, rec rules.Record, q *admitView) error {
	pz := rec.Pause
	_, err := rdb.TxPipelined(ctx, func(pipe goredis.Pipeliner) error {
		pipe.HSet(ctx, keys[0], "shift", pz.Shift.Microseconds(), "until", microsOf(pz.Until), "held", microsOf(pz.Held), "tat", microsOf(rec.TAT), "depth", q.Depth(), "booked", formatBooked(rec.Booked), "behind", microsOf(rec.Behind), "scheduled", q.booked)
		if len(rec.Booked) == 0 {
			pipe.HDel(ctx, keys[0], "booked")
		}
		pipe.Del(ctx, keys[1], keys[2])
		for i, w := range q.waiting {
			pipe.ZAdd(ctx, keys[1], goredis.Z{Score: float64(micros(w.slot)), Member: fmt.Sprint("w", i)})
		}
		for i, slot := range q.handed {
			pipe.ZAdd(ctx, keys[2], goredis.Z{Score: float64(micros(slot)), Member: fmt.Sprint("h", i)})
		}
		return nil
	})
	return err
}

// admitView is a tenant's jobs as both sides read them: waiting (in the
// waiting set; not scheduled: of the same batch, OWN_DUE) and handed over
// (in the claimed set).
type admitView struct {
	waiting []queuedSlot
	handed  []time.Time
	booked  int // jobs booked for their not_before (the hash's scheduled)
}

type queuedSlot struct {
	slot      time.Time
	scheduled bool
}

func (v *admitView) Depth() int { return len(v.waiting) }

func (v *admitView) Scheduled() int { return v.booked }

func (v *admitView) Waiting(yield func(time.Time, bool)) {
	for _, w := range v.waiting {
		yield(w.slot, w.scheduled)
	}
}

func (v *admitView) HandedOver(yield func(time.Time)) {
	for _, slot := range v.handed {
		yield(slot)
	}
}

// ownDue is OWN_DUE: the jobs of the batch due by the arrival.
func (v *admitView) ownDue(arrival time.Time) int {
	n := 0
	for _, w := range v.waiting {
		if !w.scheduled && !w.slot.After(arrival) {
			n++
		}
	}
	return n
}

// step moves the jobs on to tenant time tnow: those due are handed over
// (a few stay, as an owner late on a busy machine leaves them), those
// handed over whose slot has come leave, and now and then a job of the
// same batch, or a retry waiting past its place, joins.
func (v *admitView) step(rng *rand.Rand, tnow time.Time, p leaky.Policy, step int) {
	v.waiting = slices.DeleteFunc(v.waiting, func(w queuedSlot) bool {
		if w.slot.After(tnow) || rng.IntN(4) == 0 {
			return false
		}
		v.handed = append(v.handed, w.slot)
		return true
	})
	v.handed = slices.DeleteFunc(v.handed, func(slot time.Time) bool { return !slot.After(tnow) })
	for i := range v.waiting {
		v.waiting[i].scheduled = true
	}
	switch rng.IntN(8) {
	case 0: // a retry waiting past its place: counted, not in the schedule
		v.waiting = append(v.waiting, queuedSlot{slot: tnow.Add(us(1 + rng.Int64N(int64(6*p.Interval/time.Microsecond)))), scheduled: true})
	case 1: // a job of the same batch, admitted just before
		v.waiting = append(v.waiting, queuedSlot{slot: tnow.Add(us(rng.Int64N(int64(2*p.Interval/time.Microsecond)) - int64(p.Interval/time.Microsecond)))})
	case 2: // handed over a lead before its slot
		v.handed = append(v.handed, tnow.Add(us(1+rng.Int64N(100_000))))
	case 3: // a job booked for its not_before claimed
		v.booked = max(v.booked-1, 0)
	}
}

// admitDecision is admit.lua's reply (its header).
type admitDecision struct {
	Code             int64
	Slot, DispatchAt time.Time
	RetryAfter       time.Duration
	Depth            int
	Now              time.Time
	Prompt           bool
	Delay            time.Duration
	Scheduled        int // the tenant's jobs booked for their not_before after it (5, 6)
}

func (a *admitDecision) Decode(r *luascript.Reply) {
	a.Code = r.Int()
	a.Slot = r.Time()
	a.DispatchAt = r.Time()
	a.RetryAfter = r.Duration()
	a.Depth = int(r.Int())
	a.Now = r.Time()
	a.Prompt = r.Flag()
	a.Delay = r.Duration()
	a.Scheduled = int(r.Int())
}

// pauseReply is pause.lua's reply, in raw microseconds.
type pauseReply [4]int64

func (p *pauseReply) Decode(r *luascript.Reply) {
	for i := range p {
		p[i] = r.Int()
	}
}

func microsList(r leaky.Recent) []int64 {
	out := make([]int64, len(r))
	for i, t := range r {
		out[i] = micros(t)
	}
	return out
}

// A slot earlier than sends already counted (a pause wound tenant time
// back) goes in place, in a window of many thousands.
func TestLuaAdmitInsertsOutOfOrder(t *testing.T) {
	rdb := redisClient(t, 0)
	ctx := context.Background()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	const n = 20000
	future := make([]any, 9000)
	for i := range future {
		future[i] = micros(now.Add(time.Second + time.Duration(i)*time.Millisecond))
	}
	if err := rdb.RPush(ctx, "{x}:w0", future...).Err(); err != nil {
		t.Fatal(err)
	}
	var got admitDecision
	err := admitScript.Run(ctx, rdb, []string{"{x}:b", "{x}:waiting", "{x}:claimed", "{x}:w0"}, []any{micros(now), 0, 1000, 1, 10, 2, 0, 1, "", 0, 0, n, (24 * time.Hour).Microseconds(), 0, 0, 0, 0, "", "0"}, &got)
	if err != nil || got.Code != 1 || !got.Slot.Equal(now) {
		t.Fatalf("admit: %+v %v", got, err)
	}
	list, _ := rdb.LRange(ctx, "{x}:w0", 0, 3).Result()
	want := []string{fmt.Sprint(micros(now)), fmt.Sprint(micros(now)), fmt.Sprint(future[0]), fmt.Sprint(future[1])}
	if fmt.Sprint(list) != fmt.Sprint(want) {
		t.Fatalf("head of the window %v, want %v", list, want)
	}
	if l, _ := rdb.LLen(ctx, "{x}:w0").Result(); l != 9002 {
		t.Fatalf("window holds %d, want 9002", l)
	}
}

// The Lua pause and leaky.Pause (with the store's TAT floor) agree on
// random sequences of pushbacks, holds and resumes.
func TestLuaPauseAgreesWithGo(t *testing.T) {
	t.Parallel() // its own redis-server: overlapped with the other scripts' checks
	rdb := redisClient(t, 0)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(9, 9))
	us := func(n int64) time.Duration { return time.Duration(n) * time.Microsecond }
	steps := 0
	for seq := 0; seq < 200; seq++ {
		key := fmt.Sprintf("{p%d}:b", seq)
		var pz leaky.Pause
		tat := time.Unix(0, 0)
		tau := us(rng.Int64N(3)) * 1000
		now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
		for step := 0; step < 30; step++ {
			now = now.Add(us(rng.Int64N(2_000_000)))
			var args []any
			switch rng.IntN(3) {
			case 0:
				until := now.Add(us(rng.Int64N(3_000_000) - 500_000))
				var from time.Time
				if rng.IntN(4) > 0 {
					from = pz.TenantTime(now).Add(-us(rng.Int64N(200_000)))
				}
				args = []any{"until", micros(now), tau.Microseconds(), micros(until), microsOf(from)}
				if until.After(now) {
					pz = pz.PauseUntil(now, until, from)
					tat = clock.Later(tat, pz.TenantTime(now).Add(tau))
				}
			case 1:
				args = []any{"hold", micros(now), tau.Microseconds()}
				pz = pz.Hold(now)
				tat = clock.Later(tat, pz.TenantTime(now).Add(tau))
			default:
				args = []any{"resume", micros(now), tau.Microseconds()}
				pz = pz.Resume(now)
			}
			var got pauseReply
			if err := pauseScript.Run(ctx, rdb, []string{key}, args, &got); err != nil {
				t.Fatal(err)
			}
			want := []int64{pz.Shift.Microseconds(), microsOf(pz.Until), microsOf(pz.Held), micros(tat)}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("sequence %d step %d %v: Lua %v, Go %v (%+v)", seq, step, args, got, want, pz)
			}
			steps++
		}
	}
	t.Logf("%d pause changes agree", steps)
}
