package redis

import (
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
	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/rules"
)

// The Lua admission and the Go one agree on every decision, slot, dispatch
// time and Retry-After, on thousands of random sequences: random policies
// (leaky, token, burst, capacity, windows), random arrivals, random costs,
// and pauses and holds coming and going.
func TestLuaAdmitAgreesWithGo(t *testing.T) {
	rdb := redisClient(t, 0)
	ctx := context.Background()
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	us := func(n int64) time.Duration { return time.Duration(n) * time.Microsecond }
	rng := rand.New(rand.NewPCG(42, 1))
	decisions := 0
	for seq := 0; seq < 300; seq++ {
		p := leaky.Policy{Interval: us(1000 + rng.Int64N(200_000)), Burst: 1 + rng.IntN(4), Capacity: rng.IntN(8)}
		if rng.IntN(3) == 0 {
			p.Capacity = 0 // token mode
		}
		if rng.IntN(2) == 0 {
			for range 1 + rng.IntN(2) {
				n := 1 + rng.IntN(6)
				p.Windows = append(p.Windows, leaky.Window{N: n, Length: time.Duration(n+rng.IntN(10)) * p.Interval})
			}
		}
		tenant := fmt.Sprintf("{t%d}", seq)
		keys := []string{tenant + ":b", tenant + ":waiting", tenant + ":claimed"}
		for i := range p.Windows {
			keys = append(keys, fmt.Sprintf("%s:w%d", tenant, i))
		}
		var rec rules.Record
		// The slots (tenant time) of admitted jobs still waiting, as the
		// store's waiting set holds them: a job is sent at its slot.
		var pending []time.Time
		now := base
		for step := 0; step < 40; step++ {
			now = now.Add(us(rng.Int64N(int64(3 * p.Interval / time.Microsecond))))
			switch rng.IntN(12) { // pauses come and go
			case 0:
				rec.Pause = rec.Pause.PauseUntil(now, now.Add(us(rng.Int64N(2_000_000))), now.Add(-us(rng.Int64N(100_000))))
			case 1:
				rec.Pause = rec.Pause.Hold(now)
			case 2:
				rec.Pause = rec.Pause.Resume(now)
			}
			pz := rec.Pause
			if err := rdb.HSet(ctx, keys[0], "shift", pz.Shift.Microseconds(), "until", microsOf(pz.Until), "held", microsOf(pz.Held)).Err(); err != nil {
				t.Fatal(err)
			}
			tnow := pz.TenantTime(now)
			if rng.IntN(8) == 0 {
				// A retry waiting past its place (booked at its backoff's
				// end): counted, not in the schedule. With the room full
				// the rate and the count both refuse.
				slot := tnow.Add(us(1 + rng.Int64N(int64(6*p.Interval/time.Microsecond))))
				pending = append(pending, slot)
				if err := rdb.ZAdd(ctx, keys[1], goredis.Z{Score: float64(micros(slot)), Member: fmt.Sprintf("r%d", step)}).Err(); err != nil {
					t.Fatal(err)
				}
			}
			pending = slices.DeleteFunc(pending, func(s time.Time) bool { return !s.After(tnow) })
			if err := rdb.ZRemRangeByScore(ctx, keys[1], "-inf", fmt.Sprint(micros(tnow))).Err(); err != nil {
				t.Fatal(err)
			}
			slices.SortFunc(pending, time.Time.Compare)
			waiting := len(pending)
			cost := min(1+rng.IntN(3), p.MaxCost()) // the store refuses more first
			lag := us(rng.Int64N(5000))
			arrival := tnow.Add(lag)
			d, st, recent := goAdmit(rec, pending, arrival, now, p, cost)
			args := []any{micros(now), lag.Microseconds(), p.Interval.Microseconds(), p.Burst, p.Capacity, cost, waiting, 1, "", 0, 0}
			for _, w := range p.Windows {
				args = append(args, w.N, w.Length.Microseconds())
			}
			var got admitDecision
			if err := admitScript.Run(ctx, rdb, keys, args, &got); err != nil {
				t.Fatal(err)
			}
			where := fmt.Sprintf("sequence %d step %d (policy %+v, cost %d, waiting %d, pause %+v)", seq, step, p, cost, waiting, pz)
			if (got.Code == 1) != d.Admitted {
				t.Fatalf("%s: Lua admitted=%v, Go %+v", where, got.Code == 1, d)
			}
			decisions++
			if !d.Admitted {
				if got.RetryAfter != d.RetryAfter {
					t.Fatalf("%s: Retry-After Lua %v, Go %v", where, got.RetryAfter, d.RetryAfter)
				}
				continue
			}
			at := rules.DispatchAt(pz, d.Slot, now)
			if !got.Slot.Equal(d.Slot) || !got.DispatchAt.Equal(at) || got.Delay != at.Sub(now) {
				t.Fatalf("%s: slot Lua %v dispatch %v delay %v, Go %v dispatch %v", where, got.Slot, got.DispatchAt, got.Delay, d.Slot, at)
			}
			rec.TAT = st.TAT
			rec.SetRecent(p, recent)
			pending = append(pending, d.Slot)
			if err := rdb.ZAdd(ctx, keys[1], goredis.Z{Score: float64(micros(d.Slot)), Member: fmt.Sprint(step)}).Err(); err != nil {
				t.Fatal(err)
			}
			if tat, _ := rdb.HGet(ctx, keys[0], "tat").Int64(); tat != micros(st.TAT) {
				t.Fatalf("%s: TAT Lua %d, Go %d", where, tat, micros(st.TAT))
			}
			for i := range p.Windows {
				list, _ := rdb.LRange(ctx, keys[i+3], 0, -1).Result()
				if fmt.Sprint(list) != fmt.Sprint(microsList(recent[i])) {
					t.Fatalf("%s: window %d Lua %v, Go %v", where, i, list, microsList(recent[i]))
				}
			}
		}
	}
	t.Logf("%d decisions agree", decisions)
}

// goAdmit is the embedded store's admission (internal/queue/bolt's admit),
// for the jobs waiting at slots (sorted): leaky.Decide under the tenant's
// pause, with the store's own bound (with windows, a job that would wait is
// refused when capacity jobs wait, until fewer do; without, a paused tenant
// sends nothing at once) and a refusal's Retry-After in real time, a
// refusal by count until enough jobs have left. The Lua is checked against
// it.
func goAdmit(rec rules.Record, slots []time.Time, arrival, now time.Time, p leaky.Policy, cost int) (leaky.Decision, leaky.State, []leaky.Recent) {
	tnow := rec.Pause.TenantTime(now)
	paused, _ := rec.Pause.Paused(now)
	windowed := len(p.Windows) > 0 && p.Capacity > 0
	waiting := len(slots)
	d, st, recent := leaky.Decide(leaky.State{TAT: rec.TAT}, rec.Recent(p), arrival, p, cost, waiting)
	room := p.Capacity + p.Burst
	if paused {
		room = p.Capacity
	}
	refuse := func(n int) {
		d, st = leaky.Decision{}, leaky.State{TAT: rec.TAT}
		if waiting >= n && slots[waiting-n].After(tnow) {
			d.RetryAfter = slots[waiting-n].Sub(tnow)
		}
	}
	switch {
	case windowed && !d.Admitted && waiting >= p.Capacity+p.Burst:
		refuse(p.Capacity + p.Burst)
	case !d.Admitted:
		if !windowed && waiting >= room { // the rate and the count: the later
			ra := d.RetryAfter
			refuse(p.Capacity + p.Burst)
			d.RetryAfter = max(ra, d.RetryAfter)
		}
	case windowed && (paused || d.Slot.After(arrival)) && waiting >= p.Capacity:
		refuse(p.Capacity)
	case !windowed && waiting >= room:
		refuse(p.Capacity + p.Burst)
	}
	if !d.Admitted {
		d.RetryAfter = rules.DispatchAt(rec.Pause, tnow.Add(d.RetryAfter), now).Sub(now)
	}
	return d, st, recent
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
	err := admitScript.Run(ctx, rdb, []string{"{x}:b", "{x}:waiting", "{x}:claimed", "{x}:w0"}, []any{micros(now), 0, 1000, 1, 10, 2, 0, 1, "", 0, 0, n, (24 * time.Hour).Microseconds()}, &got)
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
