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

	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/rules"
)

// claim.lua and rules.Claim agree on every decision, wait, dispatch time
// and attempt count, and on what each batch leaves of its tenants (depth,
// in flight, next, the last claim, expired, bookings, the partition's
// recent and active sets, the record's retention) and of its jobs, on
// random sequences of batches: several tenants with random rates, bursts
// and costs, pauses and operator holds coming and going, deadlines, booked
// retries, jobs gone, finished, claimed twice in a batch or being sent
// already. The Go is the rule; the Lua is its port.
func TestLuaClaimAgreesWithRules(t *testing.T) {
	t.Parallel() // its own redis-server: overlapped with the other scripts' checks
	rdb := redisClient(t, 0)
	seqs, steps := 300, 30
	if testing.Short() {
		seqs = 40
	}
	decisions := map[rules.ClaimVerdict]int{}
	for seq := range seqs {
		claimSequence(t, rdb, uint64(seq), steps, decisions)
	}
	t.Logf("%d sequences of %d batches: claim decisions agree (dropped %d, not yet %d, claimed %d, expired %d, held %d)", seqs, steps,
		decisions[rules.ClaimDrop], decisions[rules.ClaimNotYet], decisions[rules.Claimed], decisions[rules.ClaimExpired], decisions[rules.ClaimHeld])
	for v := rules.ClaimDrop; v <= rules.ClaimHeld; v++ {
		if decisions[v] == 0 {
			t.Errorf("no sequence made a decision %d: the sequences miss a case", v)
		}
	}
}

// claimSequence runs one random sequence of claim batches through
// claim.lua and rules.Claim, and fails at the first difference; it counts
// the decisions by verdict in decisions.
func claimSequence(t *testing.T, rdb *goredis.Client, seed uint64, steps int, decisions map[rules.ClaimVerdict]int) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, 11))
	w := newLuaWorld(rng, fmt.Sprintf("{c%d}:", seed))
	if err := rdb.Set(ctx, w.lease(), w.token, 0).Err(); err != nil {
		t.Fatal(err)
	}
	c := rules.ClaimCall{
		Horizon: w.span(0, 3),
		Recheck: w.span(1, 20) + us(w.grain),
		Margin:  w.span(0, 1) / 2 / us(w.grain) * us(w.grain),
	}
	// The idle time outlasts a sequence: the recent set lives that long.
	retention, idle := time.Minute+ms(rng.Int64N(60_000)), 10*time.Second+ms(rng.Int64N(100_000))
	for step := range steps {
		w.evolve(rng)
		w.deliverSome(rng)
		batch := w.claimBatch(rng)
		from, err := w.write(ctx, rdb)
		if err != nil {
			t.Fatal(err)
		}
		c.Now = w.now
		args := []any{w.token, micros(w.now), c.Horizon.Microseconds(), retention.Milliseconds(), c.Recheck.Microseconds(), w.prefix, idle.Milliseconds(), c.Margin.Microseconds()}
		for _, j := range batch {
			p := w.tenant(j.Tenant).p
			args = append(args, j.ID, j.Tenant, usCeil(p.Interval), usCeil(p.Tolerance()), flag(rules.CountsWaiting(p)))
		}
		var got claimReplies
		if err := claimScript.Run(ctx, rdb, []string{w.lease(), w.prefix + "active", w.prefix + "sending"}, args, &got); err != nil {
			t.Fatal(err)
		}
		if len(got.Jobs) != len(batch) {
			t.Fatalf("seed %d step %d: %d replies for %d jobs", seed, step, len(got.Jobs), len(batch))
		}
		ended, settled, claims := map[string]bool{}, map[string]bool{}, 0
		for i, j := range batch {
			tn := w.tenant(j.Tenant)
			c.Policy = tn.p
			want := rules.Claim(&tn.rec, &tn.h, *j, c)
			decisions[want.Verdict]++
			if msg := claimDiff(got.Jobs[i], want, j.ID); msg != "" {
				t.Fatalf("seed %d step %d, batch item %d (%s; policy %+v, pause %+v, call %+v): %s", seed, step, i, brief(*j), tn.p, tn.rec.Pause, c, msg)
			}
			switch want.Verdict {
			case rules.Claimed:
				j.State, j.Attempts, j.DispatchAt = queue.StateDispatching, want.Attempts, want.DispatchAt
				w.recent[tn.name], claims = tn.h.NoCredit, claims+1
			case rules.ClaimExpired:
				j.State, j.FinishedAt = queue.StateExpired, w.now
				ended[j.ID], settled[j.Tenant] = true, true
				w.dirty[j.ID] = true // its expiry goes
			}
		}
		if claims > 0 {
			w.pruneRecent()
		}
		snap, err := w.snapshot(ctx, rdb, from, batch)
		if err != nil {
			t.Fatal(err)
		}
		if msg := w.claimLeftDiff(snap, ended, settled, retention, idle); msg != "" {
			t.Fatalf("seed %d step %d (call %+v): %s", seed, step, c, msg)
		}
	}
}

// claimLeftDiff says how what claim.lua left in Redis (snap) differs from
// the world: its tenants' hashes and their retention (settled: those that
// lost a job to its deadline), its jobs (ended: expired by this batch),
// and the sets.
func (w *luaWorld) claimLeftDiff(snap luaSnap, ended, settled map[string]bool, retention, idle time.Duration) string {
	for _, tn := range w.tenants {
		ttl, forever := time.Duration(0), true
		if settled[tn.name] {
			depth, inflight := w.counts(tn.name)
			ttl, forever = rules.KeepRecord(tn.rec, depth+inflight, w.now, idle)
		}
		if msg := cmp.Or(w.tenantDiff(snap, tn), snap.kept.diff(snap.tenants[tn.name].expireAt, ttl, forever)); msg != "" {
			return fmt.Sprintf("tenant %s (policy %+v, pause %+v): %s", tn.name, tn.p, tn.rec.Pause, msg)
		}
	}
	for _, j := range w.jobs {
		if _, ok := snap.jobs[j.ID]; !ok {
			continue // not in the batch: the script did not look at it
		}
		if msg := w.jobDiff(snap, j, ended[j.ID], retention); msg != "" {
			return msg
		}
	}
	return w.setsDiff(snap, func(tenant string) map[string]int64 {
		claimed := map[string]int64{}
		for _, j := range w.jobs {
			if j.Tenant == tenant && j.State == queue.StateDispatching && rules.CountsWaiting(w.tenant(tenant).p) {
				claimed[j.ID] = micros(j.Slot)
			}
		}
		return claimed
	})
}

// claimDiff says how claim.lua's reply for a job differs from the rule's
// ("": it does not).
func claimDiff(got claimReply, want rules.ClaimDecision, id string) string {
	code := map[rules.ClaimVerdict]int64{rules.ClaimDrop: claimDrop, rules.ClaimNotYet: claimNotYet, rules.Claimed: claimed,
		rules.ClaimExpired: claimExpired, rules.ClaimHeld: claimHeld}[want.Verdict]
	waits := want.Verdict == rules.ClaimNotYet || want.Verdict == rules.ClaimHeld
	placed := want.Verdict == rules.ClaimNotYet || want.Verdict == rules.Claimed
	switch {
	case got.Code != code:
		return fmt.Sprintf("code Lua %d (wait %v, dispatch %v), rule %+v", got.Code, got.Wait, got.DispatchAt, want)
	case waits && got.Wait != want.Wait:
		return fmt.Sprintf("wait Lua %v, rule %v", got.Wait, want.Wait)
	case placed && !got.DispatchAt.Equal(want.DispatchAt):
		return fmt.Sprintf("dispatch time Lua %v, rule %v", got.DispatchAt, want.DispatchAt)
	case !waits && got.Wait != 0, !placed && !got.DispatchAt.IsZero():
		return fmt.Sprintf("Lua says wait %v, dispatch %v with code %d", got.Wait, got.DispatchAt, got.Code)
	case got.Attempts != want.Attempts:
		return fmt.Sprintf("attempts Lua %d, rule %d", got.Attempts, want.Attempts)
	case want.Verdict == rules.Claimed && (got.Job["id"] != id || got.Job["resp"] != ""):
		return fmt.Sprintf("the claimed job's hash in the reply: %v", got.Job)
	}
	return ""
}

// claimBatch picks a batch: jobs waiting, mostly, and now and then one
// finished, being sent, gone, or twice.
func (w *luaWorld) claimBatch(rng *rand.Rand) []*queue.Job {
	var batch []*queue.Job
	for range 1 + rng.IntN(8) {
		switch r := rng.IntN(20); {
		case r == 0:
			batch = append(batch, &queue.Job{ID: fmt.Sprintf("gone%d", rng.IntN(1000)), Tenant: w.tenants[0].name})
		case r == 1 && len(batch) > 0:
			batch = append(batch, batch[rng.IntN(len(batch))])
		case len(w.jobs) > 0:
			j := w.jobs[rng.IntN(len(w.jobs))]
			if !j.State.Waiting() && rng.IntN(3) > 0 {
				continue
			}
			batch = append(batch, j)
		}
	}
	return batch
}

// pruneRecent drops the recent entries that no longer matter, as a batch
// that claimed does (the set is written only then).
func (w *luaWorld) pruneRecent() {
	for name, until := range w.recent {
		if !until.After(w.now) {
			delete(w.recent, name)
		}
	}
}

// sortBooked keeps bookings soonest first, as both sides keep them.
func sortBooked(b []rules.Booking) {
	slices.SortStableFunc(b, func(x, y rules.Booking) int { return cmp.Compare(x.Slot, y.Slot) })
}

// deliverSome ends about half the jobs being sent, delivered.
func (w *luaWorld) deliverSome(rng *rand.Rand) {
	for _, j := range w.jobs {
		if j.State == queue.StateDispatching && rng.IntN(2) == 0 {
			j.State, j.FinishedAt = queue.StateSucceeded, w.now
			w.tenant(j.Tenant).rec.CountEnd(j.State)
			w.dirty[j.ID] = true
		}
	}
}

// A batch that claims a job going sooner than one an earlier batch claimed
// (a burst admitted since, a retry) leaves the tenant's last claim as the
// one that goes last: a takeover spaces the next send from it. Before,
// each batch wrote its own latest claim over it.
func TestLuaClaimKeepsTheLastToGo(t *testing.T) {
	rdb := redisClient(t, 0)
	ctx := context.Background()
	w := newLuaWorld(rand.New(rand.NewPCG(1, 1)), "{last}:")
	tn := w.tenants[0]
	tn.h = rules.Handover{Next: w.now.Add(time.Second), Last: w.now.Add(500 * time.Millisecond), LastCost: 3}
	w.jobs = []*queue.Job{{ID: "soon", Tenant: tn.name, State: queue.StateQueued, Slot: w.now}}
	w.dirty["soon"] = true
	if err := rdb.Set(ctx, w.lease(), w.token, 0).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := w.write(ctx, rdb); err != nil {
		t.Fatal(err)
	}
	var got claimReplies
	args := []any{w.token, micros(w.now), 20_000, 60_000, 1_000_000, w.prefix, 60_000, 0, "soon", tn.name, usCeil(tn.p.Interval), usCeil(tn.p.Tolerance()), flag(rules.CountsWaiting(tn.p))}
	if err := claimScript.Run(ctx, rdb, []string{w.lease(), w.prefix + "active", w.prefix + "sending"}, args, &got); err != nil {
		t.Fatal(err)
	}
	h, err := rdb.HMGet(ctx, w.prefix+"tenant:"+tn.name, "last", "lastcost").Result()
	if err != nil || len(got.Jobs) != 1 || got.Jobs[0].Code != claimed {
		t.Fatalf("claim: %+v, %v", got, err)
	}
	if want := []any{fmt.Sprint(micros(tn.h.Last)), "3"}; fmt.Sprint(h) != fmt.Sprint(want) {
		t.Fatalf("last claim %v, want %v (the job claimed before, which goes later)", h, want)
	}
}
