package redis

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/queue/redis/owner"
	"github.com/throttler-dev/throttler/internal/rules"
)

// takeover.lua and rules.Respace agree on every tenant's moved slots,
// dispatch times, schedule, next send, windows, bookings and reported
// deadlines, on random sequences: random policies (burst, windows, reloads
// to another rate), costs, deadlines, waiting jobs whose slots passed or
// are ahead, jobs being sent that are taken back, pauses and holds coming
// and going, retries booked past their places, a lost send left by an
// earlier run, several tenants per partition and per run. The Go is the
// rule; the Lua is its port.
func TestLuaTakeoverAgreesWithRules(t *testing.T) {
	t.Parallel() // its own redis-server: overlapped with the other scripts' checks
	rdb := redisClient(t, 0)
	seqs, steps := 300, 15
	if testing.Short() {
		seqs = 40
	}
	f := owner.Fence{Partition: 0, Worker: "next-owner", Epoch: 1}
	holdLease(t, rdb, f)
	var seen tkSeen
	for seq := range seqs {
		takeoverSequence(t, rdb, f, uint64(seq), steps, &seen)
	}
	t.Logf("%d sequences of %d takeovers agree: %+v", seqs, steps, seen)
	// The sequences must reach every case the rule tells apart, or they
	// agree on too little.
	for name, n := range map[string]int{
		"tenants": seen.Tenants, "moved": seen.Moved, "moved held": seen.MovedHeld, "moved paused": seen.MovedPaused,
		"held, left": seen.HeldLeft, "paused, left": seen.PausedLeft, "taken back": seen.TakenBack,
		"in windows": seen.MovedInWindows, "booked": seen.MovedBooked, "deadlines told": seen.Missed,
		"taken back, in windows": seen.UnrecordedInWindows, "placed anew from the sends made": seen.PlacedAnew,
	} {
		if n == 0 {
			t.Errorf("no sequence reached %q", name)
		}
	}
}

// tkSeen counts the cases the sequences reached.
type tkSeen struct {
	Tenants, Jobs, Moved, MovedHeld, MovedPaused, HeldLeft, PausedLeft int
	TakenBack, MovedInWindows, MovedBooked, Missed                     int
	// UnrecordedInWindows: a send taken back, counted in its windows at
	// its slot, that the windows count at the takeover instead.
	UnrecordedInWindows int
	// PlacedAnew: a tenant with windows whose sends made are known, its
	// jobs moved from them (rules.placeAnew).
	PlacedAnew int
}

// count counts what the rule did to a tenant at a takeover at now.
func (s *tkSeen) count(tn *tkTenant, w tkWant, now time.Time) {
	s.Tenants++
	s.Jobs += len(w.jobs)
	s.TakenBack += len(tn.sending)
	pz := tn.rec.Pause
	if len(w.jobs) > 0 {
		for _, u := range w.h.Unrecorded {
			for _, r := range tn.rec.Recent(tn.p) {
				if slices.ContainsFunc(r, u.Slot.Equal) && pz.TenantTime(now).After(u.Slot) {
					s.UnrecordedInWindows++
				}
			}
		}
	}
	moved := 0
	for i, j := range w.jobs {
		if w.moved[i] {
			moved++
			if len(tn.p.Windows) > 0 {
				s.MovedInWindows++
			}
			if tn.rec.IsBooked(j.id) {
				s.MovedBooked++
			}
		}
		if !rules.MissedDeadline(pz, j.slot, j.deadline).IsZero() {
			s.Missed++
		}
	}
	s.Moved += moved
	if _, known := tn.rec.Made(tn.p); known && moved > 0 && len(tn.p.Windows) > 0 && pz.Held.IsZero() {
		s.PlacedAnew++
	}
	held, paused := !pz.Held.IsZero(), pz.Until.After(now)
	switch {
	case held && moved > 0:
		s.MovedHeld++
	case held && len(w.jobs) > 0:
		s.HeldLeft++
	case paused && moved > 0:
		s.MovedPaused++
	case paused && len(w.jobs) > 0:
		s.PausedLeft++
	}
}

// takeoverSequence runs one random sequence of takeovers of partition
// f.Partition through takeover.lua and rules.Respace, and fails at the
// first difference, counting in seen the cases it reached.
func takeoverSequence(t *testing.T, rdb *goredis.Client, f owner.Fence, seed uint64, steps int, seen *tkSeen) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, 11))
	k := keysOf(f.Partition)
	var tns []*tkTenant
	for i := range 1 + rng.IntN(4) {
		tns = append(tns, &tkTenant{name: fmt.Sprintf("s%d-%c", seed, 'a'+i), p: randomAdmitPolicy(rng)})
	}
	policy := func(name string) leaky.Policy {
		return tns[slices.IndexFunc(tns, func(tn *tkTenant) bool { return tn.name == name })].p
	}
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	ids := 0
	for step := range steps {
		now = now.Add(us(rng.Int64N(400_000)))
		for _, tn := range tns {
			tn.evolve(rng, now, &ids, seed)
		}
		if err := writeTakeoverState(ctx, rdb, k, tns); err != nil {
			t.Fatal(err)
		}
		want := make(map[string]tkWant, len(tns))
		taken := 0
		for _, tn := range tns {
			want[tn.name] = tn.expect(now)
			taken += len(tn.sending)
		}
		got, gotTaken, err := runTakeover(ctx, rdb, f, k, now, rng, tns, policy)
		if err != nil {
			t.Fatal(err)
		}
		if gotTaken != taken {
			t.Fatalf("seed %d step %d: took back %d jobs, want %d", seed, step, gotTaken, taken)
		}
		pipe := rdb.Pipeline()
		reads := make([]tkRead, len(tns))
		for i, tn := range tns {
			reads[i] = readTakeover(ctx, pipe, k, tn, want[tn.name])
		}
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatal(err)
		}
		for i, tn := range tns {
			w := want[tn.name]
			where := fmt.Sprintf("seed %d step %d tenant %s (policy %+v; %s; handover lost %d credit %v)",
				seed, step, tn.name, tn.p, tn.describe(now), w.h.Lost, w.h.Credit)
			if msg := takenDiff(got[tn.name], w, now); msg != "" {
				t.Fatalf("%s: %s", where, msg)
			}
			if msg := takeoverRecordDiff(reads[i], tn, w, now); msg != "" {
				t.Fatalf("%s: %s", where, msg)
			}
			seen.count(tn, w, now)
			tn.take(w)
		}
	}
}

// runTakeover runs takeover.lua at now over tns, in a random order, in one
// run or two (the jobs being sent are taken back in the first: a tenant of
// the second finds its lost send in its hash).
func runTakeover(ctx context.Context, rdb *goredis.Client, f owner.Fence, k partKeys, now time.Time, rng *rand.Rand, tns []*tkTenant, policy func(string) leaky.Policy) (map[string]takenTenant, int, error) {
	var names []string
	for _, i := range rng.Perm(len(tns)) {
		names = append(names, tns[i].name)
	}
	split := len(names)
	if rng.IntN(2) == 0 {
		split = rng.IntN(len(names) + 1)
	}
	got := map[string]takenTenant{}
	taken := 0
	for run, part := range [][]string{names[:split], names[split:]} {
		if run > 0 && len(part) == 0 {
			break
		}
		var r takeoverReply
		args := takeoverArgs(f, micros(now), k, run == 0, time.Hour, part, policy)
		if err := takeoverScript.Run(ctx, rdb, []string{f.Key(), k.sending()}, args, &r); err != nil {
			return nil, 0, err
		}
		if !r.Now.Equal(now) {
			return nil, 0, fmt.Errorf("the script's now %v, want %v", r.Now, now)
		}
		taken += r.Taken
		for _, tt := range r.Tenants {
			got[tt.Name] = tt
		}
	}
	return got, taken, nil
}

// tkTenant is a tenant as both sides see it: its record, its claims' next,
// a lost send an earlier run left in its hash (it had no job then), its
// waiting jobs (in slot order, then id) and its jobs being sent.
type tkTenant struct {
	name string
	p    leaky.Policy
	rec  rules.Record
	next time.Time
	lost int
	// unrecorded is what an earlier run left in the hash: the sends it
	// took back, for this tenant's respace (which had no job then).
	unrecorded []rules.Placed
	waiting    []tkJob
	sending    []tkJob
}

type tkJob struct {
	id       string
	slot     time.Time
	cost     int
	deadline time.Time
	attempts int
	// notBefore: admitted with a not_before its place came after (real
	// time; repace.lua's 'nbo'; the takeover test's jobs have none).
	notBefore time.Time
}

// tkWant is what the rule makes of a tenant at a takeover.
type tkWant struct {
	h     rules.Pickup
	rec   rules.Record
	next  time.Time
	jobs  []tkJob // in the order the script lists them, at their new slots
	moved []bool
	lost  int // left in the hash
	// unrecorded left in the hash
	unrecorded []rules.Placed
	back       map[string]bool
}

// expect is what rules.Respace makes of tn at a takeover at now: its jobs
// being sent join the waiting ones, and the largest of their costs is a
// send that may have been written.
func (tn *tkTenant) expect(now time.Time) tkWant {
	// Taken back, the attempt its claim counted is not: nobody recorded
	// its outcome.
	back := slices.Clone(tn.sending)
	for i := range back {
		back[i].attempts = max(back[i].attempts-1, 0)
	}
	jobs := append(slices.Clone(tn.waiting), back...)
	slices.SortFunc(jobs, func(a, b tkJob) int { return cmp.Or(a.slot.Compare(b.slot), cmp.Compare(a.id, b.id)) })
	lost := tn.lost
	for _, j := range tn.sending {
		lost = max(lost, j.cost)
	}
	unrecorded := slices.Clone(tn.unrecorded)
	for _, j := range tn.sending {
		unrecorded = append(unrecorded, rules.Placed{Slot: j.slot, Cost: j.cost})
	}
	w := tkWant{h: rules.Pickup{Now: now, Next: tn.next, Lost: lost, Unrecorded: unrecorded}, rec: tn.rec, back: map[string]bool{}}
	for _, j := range back {
		w.back[j.id] = true
	}
	w.rec.Booked = slices.Clone(tn.rec.Booked)
	placed := make([]rules.Placed, len(jobs))
	for i, j := range jobs {
		placed[i] = rules.Placed{Slot: j.slot, Cost: j.cost, ID: j.id}
	}
	rules.Respace(&w.rec, placed, tn.p, w.h)
	w.next = w.h.NextSend(tn.rec, tn.p)
	for i, j := range jobs {
		j.slot = placed[i].Slot
		w.jobs = append(w.jobs, j)
		w.moved = append(w.moved, placed[i].Moved)
	}
	if len(jobs) == 0 {
		w.lost, w.unrecorded = lost, unrecorded
	}
	return w
}

// take makes w tn's state: the script's, once they agree.
func (tn *tkTenant) take(w tkWant) {
	tn.rec, tn.lost, tn.unrecorded, tn.waiting, tn.sending = w.rec, w.lost, w.unrecorded, w.jobs, nil
}

// describe is tn before a takeover at now, times from now.
func (tn *tkTenant) describe(now time.Time) string {
	rel := func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return fmt.Sprintf("now%+v", t.Sub(now))
	}
	rec, pz := tn.rec, tn.rec.Pause
	var b strings.Builder
	fmt.Fprintf(&b, "pause {shift %v until %s held %s}, tat %s, last attempt %s cost %d, next %s, lost %d, windows %v, booked %v; jobs:",
		pz.Shift, rel(pz.Until), rel(pz.Held), rel(rec.TAT), rel(rec.LastAttemptAt), rec.LastAttemptCost, rel(tn.next), tn.lost, rec.Windows, rec.Booked)
	for i, j := range append(slices.Clone(tn.waiting), tn.sending...) {
		fmt.Fprintf(&b, " %s@%s/c%d", j.id, rel(j.slot), j.cost)
		if !j.deadline.IsZero() {
			fmt.Fprintf(&b, "/deadline %s", rel(j.deadline))
		}
		if i >= len(tn.waiting) {
			b.WriteString("/sending")
		}
	}
	return b.String()
}

// evolve moves tn on to now as a partition's owner would between two
// takeovers: pauses and holds come and go, a reload changes the rate, jobs
// are admitted (some at slots already passed), due jobs are sent (their
// attempt recorded) or claimed and left being sent (a few a lead early),
// retries are booked past their places, and the claims' next moves.
func (tn *tkTenant) evolve(rng *rand.Rand, now time.Time, ids *int, seed uint64) {
	rec := &tn.rec
	switch rng.IntN(10) {
	case 0:
		rec.Pause = rec.Pause.PauseUntil(now, now.Add(us(rng.Int64N(1_500_000))), rec.Pause.TenantTime(now).Add(-us(rng.Int64N(200_000))))
	case 1:
		rec.Pause = rec.Pause.Hold(now)
	case 2, 3:
		rec.Pause = rec.Pause.Resume(now)
	}
	if rng.IntN(20) == 0 { // the windows stay: their lists are keyed by them
		tn.p.Interval, tn.p.Burst = us(1000+rng.Int64N(200_000)), 1+rng.IntN(4)
	}
	p := tn.p
	T := int64(p.Interval / time.Microsecond)
	tnow := rec.Pause.TenantTime(now)
	for range rng.IntN(4) {
		*ids++
		j := tkJob{id: fmt.Sprintf("s%d-j%04d", seed, *ids), cost: 1 + rng.IntN(min(3, p.MaxCost())), attempts: rng.IntN(3)}
		j.slot = clock.Later(tnow, rec.TAT.Add(-p.Tolerance())).Add(us(rng.Int64N(6*T) - 4*T))
		if rng.IntN(3) > 0 {
			rec.TAT = clock.Later(rec.TAT, j.slot.Add(time.Duration(j.cost)*p.Interval))
		}
		if rng.IntN(2) == 0 {
			rec.CountSend(p, j.slot, j.cost)
		}
		if rng.IntN(3) == 0 {
			j.deadline = now.Add(us(rng.Int64N(11*T) - T))
		}
		tn.waiting = append(tn.waiting, j)
	}
	tn.waiting = slices.DeleteFunc(tn.waiting, func(j tkJob) bool {
		switch r := rng.IntN(8); {
		case j.slot.After(tnow) && r > 0:
			return false
		case r < 3: // sent, its outcome recorded
			rec.LastAttemptAt, rec.LastAttemptCost = now.Add(-us(rng.Int64N(T))), j.cost
			if rng.IntN(4) > 0 { // else as a build that did not record sends made
				rec.CountMade(p, clock.Later(j.slot, rec.Pause.TenantTime(rec.LastAttemptAt)), j.cost)
			}
			rec.Unbook(j.id)
			if rng.IntN(2) == 0 {
				tn.next = rec.LastAttemptAt.Add(time.Duration(j.cost)*p.Interval + us(rng.Int64N(T)))
			}
			return true
		case r < 5: // claimed, and being sent when its owner was lost
			j.attempts++
			tn.sending = append(tn.sending, j)
			return true
		}
		return false
	})
	if len(tn.waiting) > 0 && rng.IntN(5) == 0 { // a retry waiting past its place
		j := tn.waiting[rng.IntN(len(tn.waiting))]
		if !rec.IsBooked(j.id) {
			rec.Booked = append(slices.Clone(rec.Booked), rules.Booking{Slot: j.slot.UnixNano(), Cost: j.cost, Job: j.id})
			slices.SortStableFunc(rec.Booked, func(a, b rules.Booking) int { return cmp.Compare(a.Slot, b.Slot) })
		}
	}
	switch rng.IntN(12) {
	case 0:
		tn.next = now.Add(us(rng.Int64N(4*T) - T))
	case 1: // an earlier run's, for a tenant that had no job then
		tn.lost = 1 + rng.IntN(3)
	}
	slices.SortFunc(tn.waiting, func(a, b tkJob) int { return cmp.Or(a.slot.Compare(b.slot), cmp.Compare(a.id, b.id)) })
}

// writeTakeoverState puts every tenant's record, jobs and windows where
// takeover.lua reads them.
func writeTakeoverState(ctx context.Context, rdb *goredis.Client, k partKeys, tns []*tkTenant) error {
	_, err := rdb.TxPipelined(ctx, func(pipe goredis.Pipeliner) error {
		pipe.Del(ctx, k.sending())
		for _, tn := range tns {
			rec, pz, tk := tn.rec, tn.rec.Pause, k.tenant(tn.name)
			pipe.Del(ctx, tk, k.waiting(tn.name), k.claimed(tn.name))
			pipe.HSet(ctx, tk, "shift", pz.Shift.Microseconds(), "until", microsOf(pz.Until), "held", microsOf(pz.Held),
				"tat", microsOf(rec.TAT), "next", microsOf(tn.next), "last", microsOf(rec.LastAttemptAt), "lastcost", rec.LastAttemptCost,
				"depth", len(tn.waiting), "inflight", len(tn.sending))
			if len(rec.Booked) > 0 {
				pipe.HSet(ctx, tk, "booked", formatBooked(rec.Booked))
			}
			if tn.lost > 0 {
				pipe.HSet(ctx, tk, "lost", tn.lost)
			}
			for _, j := range tn.waiting {
				pipe.ZAdd(ctx, k.waiting(tn.name), goredis.Z{Score: float64(micros(j.slot)), Member: j.id})
				writeTakeoverJob(ctx, pipe, k, tn.name, j, jobState(j.attempts))
			}
			for _, j := range tn.sending {
				pipe.ZAdd(ctx, k.sending(), goredis.Z{Score: float64(micros(j.slot)), Member: j.id})
				pipe.ZAdd(ctx, k.claimed(tn.name), goredis.Z{Score: float64(micros(j.slot)), Member: j.id})
				writeTakeoverJob(ctx, pipe, k, tn.name, j, "dispatching")
			}
			made, _ := rec.Made(tn.p)
			for i, w := range tn.p.Windows {
				pipe.Del(ctx, k.window(tn.name, w), k.sent(tn.name, w))
				if r := rec.Recent(tn.p)[i]; len(r) > 0 {
					pipe.RPush(ctx, k.window(tn.name, w), anySlice(microsList(r))...)
				}
				if len(made[i]) > 0 {
					pipe.RPush(ctx, k.sent(tn.name, w), anySlice(microsList(made[i]))...)
				}
			}
		}
		return nil
	})
	return err
}

func writeTakeoverJob(ctx context.Context, pipe goredis.Pipeliner, k partKeys, tenant string, j tkJob, state string) {
	pipe.Del(ctx, k.job(j.id))
	pipe.HSet(ctx, k.job(j.id), "state", state, "slot", micros(j.slot), "tenant", tenant, "cost", j.cost, "attempts", j.attempts)
	if !j.deadline.IsZero() {
		pipe.HSet(ctx, k.job(j.id), "deadline", micros(j.deadline))
	}
	if !j.notBefore.IsZero() {
		pipe.HSet(ctx, k.job(j.id), "nbo", micros(j.notBefore))
	}
}

// jobState is a waiting job's state: a job with an attempt recorded is
// retrying.
func jobState(attempts int) string {
	if attempts > 0 {
		return "retrying"
	}
	return "queued"
}

func anySlice[T any](s []T) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}

// takenDiff says how takeover.lua's answer for a tenant differs from the
// rule's ("": it does not).
func takenDiff(got takenTenant, w tkWant, now time.Time) string {
	pz := w.rec.Pause
	switch {
	case got.Name == "":
		return "not in the reply"
	case got.Pause.Shift != pz.Shift || !got.Pause.Until.Equal(pz.Until) || !got.Pause.Held.Equal(pz.Held):
		return fmt.Sprintf("pause Lua %+v, rule %+v", got.Pause, pz)
	case !got.Next.Equal(w.next):
		return fmt.Sprintf("next Lua %d, rule %d", microsOf(got.Next), microsOf(w.next))
	case len(got.Waiting) != len(w.jobs):
		return fmt.Sprintf("%d jobs waiting in the reply, rule %d", len(got.Waiting), len(w.jobs))
	}
	for i, j := range w.jobs {
		g := got.Waiting[i]
		missed := rules.MissedDeadline(pz, j.slot, j.deadline)
		if g.ID != j.id || !g.Slot.Equal(j.slot) || !g.Missed.Equal(missed) {
			return fmt.Sprintf("job %d: Lua %s slot %d (now%+v) deadline told %d, rule %s slot %d (now%+v, moved %v) deadline told %d",
				i, g.ID, micros(g.Slot), g.Slot.Sub(now), microsOf(g.Missed), j.id, micros(j.slot), j.slot.Sub(now), w.moved[i], microsOf(missed))
		}
	}
	return ""
}

// tkRead is what takeover.lua left in Redis of a tenant, read in one
// pipeline with the other tenants'.
type tkRead struct {
	hash  *goredis.SliceCmd
	set   *goredis.ZSliceCmd
	lists []*goredis.StringSliceCmd
	made  []*goredis.StringSliceCmd
	jobs  []*goredis.SliceCmd
}

// readTakeover queues the reads of tn's record, windows, waiting set and
// jobs (w's) on pipe.
func readTakeover(ctx context.Context, pipe goredis.Pipeliner, k partKeys, tn *tkTenant, w tkWant) tkRead {
	r := tkRead{
		hash: pipe.HMGet(ctx, k.tenant(tn.name), "tat", "booked", "lost", "depth", "inflight"),
		set:  pipe.ZRangeWithScores(ctx, k.waiting(tn.name), 0, -1),
	}
	for _, win := range tn.p.Windows {
		r.lists = append(r.lists, pipe.LRange(ctx, k.window(tn.name, win), 0, -1))
		r.made = append(r.made, pipe.LRange(ctx, k.sent(tn.name, win), 0, -1))
	}
	for _, j := range w.jobs {
		r.jobs = append(r.jobs, pipe.HMGet(ctx, k.job(j.id), "slot", "dispatch", "state", "attempts"))
	}
	return r
}

// takeoverRecordDiff says how what takeover.lua left in Redis of tn (r)
// differs from the rule's w: the record, the windows, the waiting set in
// order, and each job's slot, dispatch time (moved) and state.
func takeoverRecordDiff(r tkRead, tn *tkTenant, w tkWant, now time.Time) string {
	h, zs, lists, jobs := r.hash, r.set, r.lists, r.jobs
	lost := ""
	if w.lost > 0 {
		lost = fmt.Sprint(w.lost)
	}
	got := hashStrings(h.Val())
	if tat := fmt.Sprint(microsOf(w.rec.TAT)); got[0] != tat {
		gotTAT, _ := strconv.ParseInt(got[0], 10, 64)
		return fmt.Sprintf("tat Lua %s (now%+v), rule %s (now%+v)", got[0], fromMicros(gotTAT).Sub(now), tat, w.rec.TAT.Sub(now))
	}
	if want := []string{formatBooked(w.rec.Booked), lost, fmt.Sprint(len(w.jobs)), "0"}; fmt.Sprint(got[1:]) != fmt.Sprint(want) {
		return fmt.Sprintf("booked, lost, depth, inflight: Lua %q, rule %q", got[1:], want)
	}
	recent := w.rec.Recent(tn.p)
	for i, l := range lists {
		if fmt.Sprint(l.Val()) != fmt.Sprint(microsList(recent[i])) {
			return fmt.Sprintf("window %v: Lua %v, rule %v", tn.p.Windows[i], l.Val(), microsList(recent[i]))
		}
	}
	made, _ := w.rec.Made(tn.p)
	for i, l := range r.made {
		if fmt.Sprint(l.Val()) != fmt.Sprint(microsList(made[i])) {
			return fmt.Sprintf("sends made in window %v: Lua %v, rule %v", tn.p.Windows[i], l.Val(), microsList(made[i]))
		}
	}
	order := slices.Clone(w.jobs)
	slices.SortFunc(order, func(a, b tkJob) int { return cmp.Or(a.slot.Compare(b.slot), cmp.Compare(a.id, b.id)) })
	var gotSet, wantSet []string
	for _, z := range zs.Val() {
		gotSet = append(gotSet, fmt.Sprintf("%v@%d", z.Member, int64(z.Score)))
	}
	for _, j := range order {
		wantSet = append(wantSet, fmt.Sprintf("%s@%d", j.id, micros(j.slot)))
	}
	if fmt.Sprint(gotSet) != fmt.Sprint(wantSet) {
		return fmt.Sprintf("waiting set: Lua %v, rule %v", gotSet, wantSet)
	}
	for i, j := range w.jobs {
		got := hashStrings(jobs[i].Val())
		want := []string{fmt.Sprint(micros(j.slot)), got[1], jobState(j.attempts), fmt.Sprint(j.attempts)}
		if w.moved[i] {
			want[1] = fmt.Sprint(micros(rules.DispatchAt(w.rec.Pause, j.slot, now)))
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			return fmt.Sprintf("job %s (moved %v, taken back %v): slot, dispatch, state, attempts: Lua %q, rule %q", j.id, w.moved[i], w.back[j.id], got, want)
		}
	}
	return ""
}

// hashStrings is an HMGET's answer, a missing field as "".
func hashStrings(vals []any) []string {
	out := make([]string, len(vals))
	for i, v := range vals {
		out[i], _ = v.(string)
	}
	return out
}
