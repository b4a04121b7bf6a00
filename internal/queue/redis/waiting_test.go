package redis

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/queue/queuetest"
)

// The index admission counts waiting jobs from (a tenant's waiting and
// claimed sets, by slot) follows every job through its life: admitted,
// cancelled, claimed, retried after a failure (at its new slot), released
// unsent, failed, delivered; a job whose attempt ended before its slot
// keeps its place until then. Once no job is left and every slot has
// passed, neither set is.
func TestWaitingIndexFollowsTheJobs(t *testing.T) {
	rdb := redisClient(t, 0)
	ctx := context.Background()
	clk := clock.NewFake(queuetest.T0)
	w, _ := leaky.ParseWindow("100/1m")
	s := openFake(t, rdb, clk, func(string) leaky.Policy {
		return leaky.Policy{Interval: queuetest.T, Burst: 1, Capacity: 10, Windows: []leaky.Window{w}}
	}, nil)
	k := keysOf(s.partOf("acme"))
	index := func() (waiting, claimed map[string]float64) {
		waiting, claimed = map[string]float64{}, map[string]float64{}
		for key, m := range map[string]map[string]float64{k.waiting("acme"): waiting, k.claimed("acme"): claimed} {
			zs, err := rdb.ZRangeWithScores(ctx, key, 0, -1).Result()
			if err != nil {
				t.Fatal(err)
			}
			for _, z := range zs {
				m[z.Member.(string)] = z.Score
			}
		}
		return waiting, claimed
	}
	var ids []string
	for i := range 4 {
		a := queuetest.EnqueueOne(t, s, "acme", queuetest.Payload(i))
		if !a.Admitted() {
			t.Fatalf("job %d: %+v", i, a)
		}
		ids = append(ids, a.Job.ID)
		if waiting, _ := index(); waiting[ids[i]] != float64(micros(a.Job.Slot)) {
			t.Fatalf("job %d admitted: waiting set %v, want it at its slot %v", i, waiting, a.Job.Slot)
		}
	}
	if _, err := s.Cancel(ctx, ids[3]); err != nil {
		t.Fatal(err)
	}
	if waiting, _ := index(); len(waiting) != 3 {
		t.Fatalf("after a cancel: waiting set %v, want 3", waiting)
	}

	// Job 0 fails once (5xx) then goes; job 1 is released unsent once,
	// then fails for good; each waits for its slot, as the dispatcher
	// does. Job 2 ends at once, before its slot.
	var mu sync.Mutex
	tries := map[string]int{}
	stop := queuetest.Consume(t, s, queue.DefaultLead, func(_ context.Context, j queue.Job) queue.Outcome {
		mu.Lock()
		tries[j.ID]++
		n := tries[j.ID]
		mu.Unlock()
		if _, claimed := index(); claimed[j.ID] != float64(micros(j.Slot)) {
			t.Errorf("job %s handed over: claimed set %v, want it at its slot", j.ID, claimed)
		}
		if j.ID == ids[2] {
			return queue.Outcome{Result: queue.Succeeded, SentAt: clk.Now(), Status: 200}
		}
		if j.ID == ids[1] && n == 1 {
			return queue.Outcome{Result: queue.Released}
		}
		<-clk.After(j.DispatchAt.Sub(clk.Now()))
		switch {
		case j.ID == ids[0] && n == 1:
			return queue.Outcome{Result: queue.Retry, SentAt: clk.Now(), Status: 503, Error: "busy", NotBefore: clk.Now().Add(time.Second)}
		case j.ID == ids[1]:
			return queue.Outcome{Result: queue.Failed, SentAt: clk.Now(), Status: 400, Error: "no"}
		}
		return queue.Outcome{Result: queue.Succeeded, SentAt: clk.Now(), Status: 200}
	})
	waitJob(t, s, ids[2], queue.StateSucceeded)
	if waiting, claimed := index(); claimed[ids[2]] == 0 || waiting[ids[2]] != 0 {
		t.Fatalf("job 2 done before its slot: waiting %v claimed %v, want it to keep its place until its slot", waiting, claimed)
	}
	advanceUntil(t, clk, 10*time.Millisecond, "job 0 retrying", func() bool {
		j, err := s.Job(ctx, ids[0])
		return err == nil && j.State == queue.StateRetrying
	})
	j, _ := s.Job(ctx, ids[0])
	if waiting, claimed := index(); waiting[ids[0]] != float64(micros(j.Slot)) || claimed[ids[0]] != 0 {
		t.Fatalf("job 0 to be retried at %v: waiting %v claimed %v, want it waiting at its new slot", j.Slot, waiting, claimed)
	}
	advanceUntil(t, clk, 10*time.Millisecond, "every job done", func() bool {
		for i, want := range []queue.JobState{queue.StateSucceeded, queue.StateFailed, queue.StateSucceeded} {
			if j, err := s.Job(ctx, ids[i]); err != nil || j.State != want {
				return false
			}
		}
		return true
	})
	stop()
	if n, err := rdb.Exists(ctx, k.waiting("acme"), k.claimed("acme")).Result(); err != nil || n != 0 {
		waiting, claimed := index()
		t.Fatalf("every job done, every slot past: index sets left: waiting %v claimed %v (%v)", waiting, claimed, err)
	}
}

// advanceUntil advances clk by step every 2 ms of real time (asynq works in
// real time) until cond holds, for at most 10 s.
func advanceUntil(t *testing.T, clk *clock.Fake, step time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10 s", what)
		}
		time.Sleep(2 * time.Millisecond)
		clk.Advance(step)
	}
}

// A tenant hash's booked field: any text reads to bookings, never a panic;
// bookings read write back to a field that reads to them again.
func FuzzBookedField(f *testing.F) {
	f.Add("")
	f.Add("1772366400350000 1 06eajh8a037m8bz83mjrps0h04")
	f.Add("1772366400350000 1 a;1772366400550000 3 b")
	f.Add("-5 2 x;junk;7 0 y")
	f.Fuzz(func(t *testing.T, field string) {
		bs := parseBooked(field)
		again := parseBooked(formatBooked(bs))
		if len(again) != len(bs) {
			t.Fatalf("%q: %d bookings, %d after a round trip", field, len(bs), len(again))
		}
		for i := range bs {
			if again[i] != bs[i] {
				t.Fatalf("%q: booking %d %+v, %+v after a round trip", field, i, bs[i], again[i])
			}
		}
	})
}

// The claimed set is kept only for a tenant whose admission reads it
// (windows and a capacity): a tenant without windows has none while its
// jobs are sent; a reload that gives it windows puts its jobs in flight in
// the set at their slots, as their claims would have, and one that takes
// them away drops the set.
func TestClaimedSetFollowsAReload(t *testing.T) {
	rdb := redisClient(t, 0)
	ctx := context.Background()
	clk := clock.NewFake(queuetest.T0)
	w, _ := leaky.ParseWindow("100/1m")
	var mu sync.Mutex
	windowed := false
	s := openFake(t, rdb, clk, func(string) leaky.Policy {
		mu.Lock()
		defer mu.Unlock()
		p := leaky.Policy{Interval: queuetest.T, Burst: 2, Capacity: 10}
		if windowed {
			p.Windows = []leaky.Window{w}
		}
		return p
	}, nil)
	reload := func(on bool) {
		mu.Lock()
		windowed = on
		mu.Unlock()
		s.PoliciesChanged()
	}
	k := keysOf(s.partOf("acme"))
	claimed := func() map[string]float64 {
		zs, err := rdb.ZRangeWithScores(ctx, k.claimed("acme"), 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]float64{}
		for _, z := range zs {
			m[z.Member.(string)] = z.Score
		}
		return m
	}
	slots := map[string]time.Time{}
	for i := range 2 {
		a := queuetest.EnqueueOne(t, s, "acme", queuetest.Payload(i))
		if !a.Admitted() {
			t.Fatalf("job %d: %+v", i, a)
		}
		slots[a.Job.ID] = a.Job.Slot
	}
	inFlight, release := make(chan string, 2), make(chan struct{})
	stop := queuetest.Consume(t, s, queue.DefaultLead, func(_ context.Context, j queue.Job) queue.Outcome {
		inFlight <- j.ID
		<-release
		return queue.Outcome{Result: queue.Succeeded, SentAt: clk.Now(), Status: 200}
	})
	defer stop()
	defer close(release) // before stop, which waits for the handlers
	for range 2 {
		select {
		case <-inFlight:
		case <-time.After(10 * time.Second):
			t.Fatal("the two jobs were not handed over within 10 s")
		}
	}
	if got := claimed(); len(got) != 0 {
		t.Fatalf("no windows: claimed set %v, want none", got)
	}
	waitFor := func(what string, cond func(map[string]float64) bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for got := claimed(); !cond(got); got = claimed() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: claimed set %v after 10 s", what, got)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	reload(true)
	waitFor("windows given", func(got map[string]float64) bool {
		for id, slot := range slots {
			if got[id] != float64(micros(slot)) {
				return false
			}
		}
		return len(got) == len(slots)
	})
	reload(false)
	waitFor("windows taken away", func(got map[string]float64) bool { return len(got) == 0 })
}
