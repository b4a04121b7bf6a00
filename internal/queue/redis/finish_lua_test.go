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

// finish.lua and rules.Finish agree on every attempt that ended its job
// (delivered, or failed for good), on random sequences of batches of them:
// several tenants with random rates, bursts and costs, jobs claimed by
// rules.Claim under pauses and holds, writes late, early or missing,
// answers kept or not, and jobs not being sent (gone, ended already, or
// twice in a batch). Each batch's replies, each job's end (state, times,
// status, error, answer, retention), each tenant's hash (in flight,
// counters, its next past the writes) and its record's retention, and the
// sets (claimed, sending, failed, active) agree. The Go is the rule; the
// Lua is its port.
func TestLuaFinishAgreesWithRules(t *testing.T) {
	t.Parallel() // its own redis-server: overlapped with the other scripts' checks
	rdb := redisClient(t, 0)
	seqs, steps := 300, 30
	if testing.Short() {
		seqs = 40
	}
	ended, refused := 0, 0
	for seq := range seqs {
		e, r := finishSequence(t, rdb, uint64(seq), steps)
		ended, refused = ended+e, refused+r
	}
	t.Logf("%d sequences of %d batches: %d ends and %d outcomes of jobs not being sent agree", seqs, steps, ended, refused)
	if ended == 0 || refused == 0 {
		t.Error("the sequences miss a case")
	}
}

// finishOutcome is one attempt's outcome in a batch, for job j.
type finishOutcome struct {
	j *queue.Job
	o queue.Outcome
}

// finishSequence runs one random sequence of outcome batches through
// finish.lua and rules.Finish, and fails at the first difference. It
// returns how many outcomes ended a job and how many were refused.
func finishSequence(t *testing.T, rdb *goredis.Client, seed uint64, steps int) (ended, refused int) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, 13))
	w := newLuaWorld(rng, fmt.Sprintf("{f%d}:", seed))
	if err := rdb.Set(ctx, w.lease(), w.token, 0).Err(); err != nil {
		t.Fatal(err)
	}
	margin := w.span(0, 1) / 2 / us(w.grain) * us(w.grain)
	retention, idle := time.Minute+ms(rng.Int64N(60_000)), 10*time.Second+ms(rng.Int64N(100_000))
	failed := map[string]map[string]int64{} // tenant -> its failed jobs' set
	for step := range steps {
		w.evolve(rng)
		w.claimSome(rng, margin)
		batch := w.finishBatch(rng)
		claimedBefore := map[string]map[string]int64{}
		for _, tn := range w.tenants {
			if rules.CountsWaiting(tn.p) { // only there is the set kept
				claimedBefore[tn.name] = w.sending(tn.name)
			}
		}
		from, err := w.write(ctx, rdb)
		if err != nil {
			t.Fatal(err)
		}
		args := []any{w.token, micros(w.now), retention.Milliseconds(), idle.Milliseconds(), w.prefix}
		var jobs []*queue.Job
		beside := make([]int, len(batch)) // handed over and not written, as the owner counts them
		for i, b := range batch {
			beside[i] = rng.IntN(3)
			args = append(args, finishArgs(*b.j, b.o, w.tenant(b.j.Tenant).p, margin, beside[i])...)
			jobs = append(jobs, b.j)
		}
		var got finishReplies
		if err := finishScript.Run(ctx, rdb, []string{w.lease(), w.prefix + "active", w.prefix + "sending"}, args, &got); err != nil {
			t.Fatal(err)
		}
		if len(got) != len(batch) {
			t.Fatalf("seed %d step %d: %d replies for %d outcomes", seed, step, len(got), len(batch))
		}
		touched, endedNow, answers := map[string]bool{}, map[string]bool{}, map[string]string{}
		for i, b := range batch {
			tn := w.tenant(b.j.Tenant)
			where := fmt.Sprintf("seed %d step %d outcome %d (%+v of %s; policy %+v)", seed, step, i, b.o, brief(*b.j), tn.p)
			if b.j.State != queue.StateDispatching {
				refused++
				if got[i] {
					t.Fatalf("%s: Lua recorded it; the job was not being sent", where)
				}
				continue
			}
			ended++
			if !got[i] {
				t.Fatalf("%s: Lua did not record it", where)
			}
			// The jobs behind a late write: those waiting, and those
			// handed over beside it and not written.
			depth, _ := w.counts(tn.name)
			tn.rec.RunLate(tn.p, *b.j, b.o.SentAt, depth+beside[i])
			cur, _ := rules.Finish(&tn.rec, &tn.h, *b.j, b.o, w.now, tn.p, margin)
			*b.j = cur
			touched[tn.name], endedNow[cur.ID], w.dirty[cur.ID] = true, true, true
			if b.o.Response != nil {
				answers[cur.ID] = string(responseArg(b.o.Response))
			}
			if cur.State == queue.StateFailed {
				failed[tn.name] = keepFailed(failed[tn.name], cur.ID, w.now, retention)
			}
		}
		snap, err := w.snapshot(ctx, rdb, from, jobs)
		if err != nil {
			t.Fatal(err)
		}
		if msg := w.finishLeftDiff(snap, finishLeft{touched, endedNow, answers, failed, claimedBefore}, retention, idle); msg != "" {
			t.Fatalf("seed %d step %d: %s", seed, step, msg)
		}
	}
	return ended, refused
}

// finishLeft is what the rule expects a batch to leave besides the world:
// the tenants it touched, the jobs it ended and the answers it kept, each
// tenant's failed set, and the claimed sets before it.
type finishLeft struct {
	touched, ended map[string]bool
	answers        map[string]string
	failed         map[string]map[string]int64
	claimedBefore  map[string]map[string]int64
}

// finishLeftDiff says how what finish.lua left in Redis (snap) differs from
// the world: its tenants' hashes and their retention (settled if the batch
// touched them), its failed sets, its jobs, and the sets (a claimed job
// that ended keeps its place in its tenant's claimed set until its slot
// has come, in tenant time).
func (w *luaWorld) finishLeftDiff(snap luaSnap, l finishLeft, retention, idle time.Duration) string {
	for _, tn := range w.tenants {
		ttl, forever := time.Duration(0), true
		if l.touched[tn.name] {
			depth, inflight := w.counts(tn.name)
			ttl, forever = rules.KeepRecord(tn.rec, depth+inflight, w.now, idle)
		}
		if msg := cmp.Or(w.tenantDiff(snap, tn), snap.kept.diff(snap.tenants[tn.name].expireAt, ttl, forever)); msg != "" {
			return fmt.Sprintf("tenant %s (policy %+v, pause %+v): %s", tn.name, tn.p, tn.rec.Pause, msg)
		}
		want := l.failed[tn.name]
		if want == nil {
			want = map[string]int64{}
		}
		if msg := mapDiff("failed of "+tn.name, snap.failed[tn.name], want); msg != "" {
			return msg
		}
	}
	for id, k := range snap.jobs {
		j := w.job(id)
		msg := w.jobDiff(snap, j, l.ended[id], retention)
		if l.ended[id] && msg == "" && (k.h["err"] != j.LastError || k.h["resp"] != cmp.Or(l.answers[id], `{"status":200}`)) {
			msg = fmt.Sprintf("job %s: error and answer Lua %q %q, rule %q %q", id, k.h["err"], k.h["resp"], j.LastError, l.answers[id])
		}
		if msg != "" {
			return msg
		}
	}
	return w.setsDiff(snap, func(tenant string) map[string]int64 {
		if !l.touched[tenant] {
			return l.claimedBefore[tenant]
		}
		tnow := micros(w.tenant(tenant).rec.Pause.TenantTime(w.now))
		left := map[string]int64{}
		for id, slot := range l.claimedBefore[tenant] {
			if slot > tnow {
				left[id] = slot
			}
		}
		return left
	})
}

// keepFailed is a tenant's failed set after job id failed at now: those
// that failed within the retention.
func keepFailed(set map[string]int64, id string, now time.Time, retention time.Duration) map[string]int64 {
	if set == nil {
		set = map[string]int64{}
	}
	set[id] = micros(now)
	for k, at := range set {
		if at <= micros(now.Add(-retention)) {
			delete(set, k)
		}
	}
	return set
}

// claimSome claims about half the tenants' waiting jobs by the rule, as
// the owner would (the Lua twin of claims is claim.lua's test's).
func (w *luaWorld) claimSome(rng *rand.Rand, margin time.Duration) {
	for _, j := range w.jobs {
		if !j.State.Waiting() || rng.IntN(2) == 0 {
			continue
		}
		tn := w.tenant(j.Tenant)
		c := rules.ClaimCall{Now: w.now, Horizon: us(1000 * w.unit), Recheck: time.Second, Policy: tn.p, Margin: margin}
		switch d := rules.Claim(&tn.rec, &tn.h, *j, c); d.Verdict {
		case rules.Claimed:
			j.State, j.Attempts, j.DispatchAt = queue.StateDispatching, d.Attempts, d.DispatchAt
		case rules.ClaimExpired:
			j.State, j.FinishedAt = queue.StateExpired, w.now
		}
		w.dirty[j.ID] = true
	}
}

// finishBatch is a batch of outcomes: of jobs being sent, mostly, ending
// them (delivered or failed, written or not, with an answer or not), and
// now and then of one not being sent, or twice.
func (w *luaWorld) finishBatch(rng *rand.Rand) []finishOutcome {
	var batch []finishOutcome
	for range 1 + rng.IntN(8) {
		var j *queue.Job
		switch r := rng.IntN(12); {
		case r == 0 && len(batch) > 0:
			j = batch[rng.IntN(len(batch))].j
		case r == 1 && len(w.jobs) > 0:
			j = w.jobs[rng.IntN(len(w.jobs))]
		default:
			var sent []*queue.Job
			for _, c := range w.jobs {
				if c.State == queue.StateDispatching && !slices.ContainsFunc(batch, func(b finishOutcome) bool { return b.j == c }) {
					sent = append(sent, c)
				}
			}
			if len(sent) > 0 {
				j = sent[rng.IntN(len(sent))]
			}
		}
		if j == nil {
			continue
		}
		o := queue.Outcome{Result: queue.Succeeded, Status: []int{0, 200, 201}[rng.IntN(3)]}
		if rng.IntN(3) == 0 {
			o = queue.Outcome{Result: queue.Failed, Status: []int{0, 400, 500}[rng.IntN(3)], Error: []string{"", "400 Bad Request"}[rng.IntN(2)]}
		}
		if rng.IntN(5) > 0 { // written, up to a few units late or early
			o.SentAt = j.DispatchAt.Add(w.span(-1, 3))
		}
		if rng.IntN(3) == 0 {
			o.Response = &queue.Response{Status: cmp.Or(o.Status, 200), Body: fmt.Sprintf("answer %d", rng.IntN(100))}
		}
		batch = append(batch, finishOutcome{j, o})
	}
	return batch
}

// sending is tenant's jobs being sent, by slot.
func (w *luaWorld) sending(tenant string) map[string]int64 {
	out := map[string]int64{}
	for _, j := range w.jobs {
		if j.Tenant == tenant && j.State == queue.StateDispatching {
			out[j.ID] = micros(j.Slot)
		}
	}
	return out
}

func (w *luaWorld) job(id string) *queue.Job {
	for _, j := range w.jobs {
		if j.ID == id {
			return j
		}
	}
	panic("no job " + id)
}
