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

	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/queue/redis/owner"
	"github.com/throttler-dev/throttler/internal/rules"
)

// repace.lua and rules.Repace agree on a tenant's moved slots, dispatch
// times, schedule, windows and bookings, on random sequences: the states
// the takeover test's tenants go through (pauses and holds, costs, jobs
// due or ahead, retries booked past their places, windows), each changed
// to another rate, burst and capacity, with or without jobs handed over
// ahead (of any cost). The
// Go is the rule; the Lua is its port.
func TestLuaRepaceAgreesWithRules(t *testing.T) {
	t.Parallel() // its own redis-server: overlapped with the other scripts' checks
	rdb := redisClient(t, 0)
	seqs, steps := 200, 12
	if testing.Short() {
		seqs = 30
	}
	f := owner.Fence{Partition: 0, Worker: "owner", Epoch: 1}
	holdLease(t, rdb, f)
	ctx := context.Background()
	k := keysOf(f.Partition)
	var tenants, moved, inWindows, fromMade, booked, left, handed, keptNotBefore, aroundScheduled int
	for seq := range seqs {
		rng := rand.New(rand.NewPCG(uint64(seq), 17))
		tn := &tkTenant{name: fmt.Sprintf("r%d", seq), p: randomAdmitPolicy(rng)}
		if tn.p.Capacity == 0 {
			tn.p.Capacity = 1 + rng.IntN(8) // a backlog waits: leaky mode
		}
		// Two windows written alike are one window's list.
		tn.p.Windows = slices.CompactFunc(tn.p.Windows, func(a, b leaky.Window) bool { return a.String() == b.String() })
		now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
		ids := 0
		nbRng := rand.New(rand.NewPCG(uint64(seq), 29)) // apart: the sequences stay those of the takeover test
		var sched []tkJob                               // booked for their not_before
		for step := range steps {
			now = now.Add(us(rng.Int64N(400_000)))
			tn.evolve(rng, now, &ids, uint64(seq))
			// Some jobs came with a not_before at or before their place.
			for i, j := range tn.waiting {
				if j.notBefore.IsZero() && !tn.rec.IsBooked(j.id) && tn.rec.Pause.Held.IsZero() && nbRng.IntN(3) == 0 {
					tn.waiting[i].notBefore = rules.RealAt(tn.rec.Pause, j.slot).Add(-us(nbRng.Int64N(int64(3 * tn.p.Interval / time.Microsecond))))
				}
			}
			p := tn.p
			p.Interval, p.Burst = us(1000+rng.Int64N(200_000)), 1+rng.IntN(4)
			if rng.IntN(3) == 0 {
				p.Capacity = rng.IntN(8) // 0: no bound by count, as in token mode
			}
			// The jobs claimed are handed over: their end, by the new
			// interval and their costs, is where the backlog starts at the
			// latest.
			var handedEnd time.Time
			var handedJobs []rules.Placed
			for _, j := range tn.sending {
				handedEnd = later(handedEnd, j.slot.Add(time.Duration(j.cost)*p.Interval))
				handedJobs = append(handedJobs, rules.Placed{Slot: j.slot, Cost: j.cost, ID: j.id})
			}
			tn.sending = nil
			if err := writeTakeoverState(ctx, rdb, k, []*tkTenant{tn}); err != nil {
				t.Fatal(err)
			}
			sched = scheduleSome(ctx, t, rdb, k, tn, sched, nbRng, now, &ids)
			// The rule.
			w := tkWant{rec: tn.rec, lost: tn.lost, back: map[string]bool{}}
			w.rec.Booked = slices.Clone(tn.rec.Booked)
			w.rec.Windows = cloneWindows(tn.rec.Windows)
			placed := make([]rules.Placed, len(tn.waiting))
			for i, j := range tn.waiting {
				placed[i] = rules.Placed{Slot: j.slot, Cost: j.cost, ID: j.id, NotBefore: j.notBefore}
			}
			for _, j := range sched {
				placed = append(placed, rules.Placed{Slot: j.slot, Cost: j.cost, ID: j.id, Scheduled: true})
			}
			bookedBefore := len(tn.rec.Booked)
			var after time.Time
			if !handedEnd.IsZero() {
				after = handedEnd.Add(tn.rec.Pause.Shift)
			}
			n := rules.Repace(&w.rec, placed, p, now, after, handedJobs)
			for i, j := range tn.waiting {
				j.slot = placed[i].Slot
				w.jobs = append(w.jobs, j)
				w.moved = append(w.moved, placed[i].Moved)
			}
			// The port.
			var r repaceMoved
			if err := repaceScript.Run(ctx, rdb, []string{f.Key()}, repaceArgs(f, micros(now), k, tn.name, p, handedEnd, handedJobs, time.Hour), &r); err != nil {
				t.Fatal(err)
			}
			where := fmt.Sprintf("seed %d step %d (policy %+v to interval %v burst %d; handed end %v; %s)", seq, step, tn.p, p.Interval, p.Burst, handedEnd, tn.describe(now))
			if len(r.moved) != n {
				t.Fatalf("%s: Lua moved %d jobs, rule %d", where, len(r.moved), n)
			}
			for _, m := range r.moved {
				i := slices.IndexFunc(w.jobs, func(j tkJob) bool { return j.id == m.id })
				if i < 0 || !w.moved[i] || !m.slot.Equal(w.jobs[i].slot) || !m.dispatch.Equal(rules.DispatchAt(w.rec.Pause, w.jobs[i].slot, now)) {
					t.Fatalf("%s: Lua moved %s to %v, rule %+v", where, m.id, m.slot.Sub(now), w.jobs)
				}
			}
			tn.p = p // the windows are the same: their lists are read by p's
			pipe := rdb.Pipeline()
			read := readTakeover(ctx, pipe, k, tn, w)
			if _, err := pipe.Exec(ctx); err != nil {
				t.Fatal(err)
			}
			if msg := takeoverRecordDiff(read, tn, w, now); msg != "" {
				t.Fatalf("%s: %s", where, msg)
			}
			tenants++
			switch {
			case n > 0 && len(p.Windows) > 0:
				inWindows++
				if _, known := tn.rec.Made(p); known {
					fromMade++ // counted from the sends made and those handed over
				}
			case n > 0 && len(tn.rec.Booked) > 0:
				booked++
			}
			for _, j := range w.jobs {
				if at := rules.RealAt(w.rec.Pause, j.slot); n > 0 && at.Before(j.notBefore) {
					t.Fatalf("%s: %s placed at %v, before its not_before %v", where, j.id, at.Sub(now), j.notBefore.Sub(now))
				}
			}
			if n > 0 && len(sched) > 0 {
				aroundScheduled++
			}
			if len(w.rec.Booked) > bookedBefore {
				keptNotBefore++
			}
			switch {
			case n == 0 && len(w.jobs) > 0:
				left++
			}
			if n > 0 {
				moved++
			}
			if !handedEnd.IsZero() && n > 0 {
				handed++
			}
			tn.take(w)
		}
	}
	t.Logf("%d tenants changed: %d moved (%d in windows, %d of them from the sends made, %d around a booking, %d after jobs handed over, %d booking a job at its not_before, %d beside jobs booked for theirs), %d left", tenants, moved, inWindows, fromMade, booked, handed, keptNotBefore, aroundScheduled, left)
	for name, n := range map[string]int{"moved": moved, "in windows": inWindows, "from the sends made": fromMade, "booked": booked, "left": left, "handed over": handed, "a not_before kept": keptNotBefore, "beside scheduled jobs": aroundScheduled} {
		if n == 0 {
			t.Errorf("no sequence reached %q", name)
		}
	}
}

// scheduleSome keeps tn's jobs booked for their not_before (sched) as a
// tenant's would go: those due are sent (their bookings dropped), a new
// one comes now and then, booked or already reached by the queue (its
// booking absorbed); it writes them to Redis and returns them.
func scheduleSome(ctx context.Context, t *testing.T, rdb *goredis.Client, k partKeys, tn *tkTenant, sched []tkJob, rng *rand.Rand, now time.Time, ids *int) []tkJob {
	t.Helper()
	tnow := tn.rec.Pause.TenantTime(now)
	sched = slices.DeleteFunc(sched, func(j tkJob) bool {
		if j.slot.After(tnow) {
			return false
		}
		tn.rec.Unbook(j.id)
		return true
	})
	if rng.IntN(3) == 0 {
		*ids++
		T := int64(tn.p.Interval / time.Microsecond)
		j := tkJob{id: fmt.Sprintf("sched-j%04d", *ids), cost: 1 + rng.IntN(min(3, tn.p.MaxCost())), slot: tnow.Add(us(1 + rng.Int64N(8*T)))}
		if rng.IntN(2) == 0 {
			tn.rec.Booked = append(slices.Clone(tn.rec.Booked), rules.Booking{Slot: j.slot.UnixNano(), Cost: j.cost, Job: j.id})
			slices.SortStableFunc(tn.rec.Booked, func(a, b rules.Booking) int { return cmp.Compare(a.Slot, b.Slot) })
		}
		sched = append(sched, j)
	}
	pipe := rdb.TxPipeline()
	pipe.Del(ctx, k.sched(tn.name))
	for _, j := range sched {
		pipe.ZAdd(ctx, k.sched(tn.name), goredis.Z{Score: float64(micros(j.slot)), Member: j.id})
		writeTakeoverJob(ctx, pipe, k, tn.name, j, "scheduled")
	}
	pipe.HSet(ctx, k.tenant(tn.name), "booked", formatBooked(tn.rec.Booked))
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	return sched
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func cloneWindows(w map[string][]int64) map[string][]int64 {
	if w == nil {
		return nil
	}
	out := make(map[string][]int64, len(w))
	for k, v := range w {
		out[k] = slices.Clone(v)
	}
	return out
}
