package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"throttler/internal/clock"
	"throttler/internal/leaky"
)

// backend opens a store on the test's data with the given clock and
// policies. Calling it again after Close reopens the same data: a restart.
type backend func(t *testing.T, clk clock.Clock, policy PolicyFunc) Store

// opener returns a fresh opener per test (fresh data for each test).
type opener func(t *testing.T) backend

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

const T = 50 * time.Millisecond // 20/s

func leaky20(capacity int) PolicyFunc {
	return func(string) leaky.Policy { return leaky.Policy{Interval: T, Burst: 1, Capacity: capacity} }
}

func payload(i int) NewJob {
	return NewJob{Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))}
}

func enqueueOne(t *testing.T, s Store, tenant string, nj NewJob) Admission {
	t.Helper()
	out, err := s.Enqueue(context.Background(), tenant, []NewJob{nj})
	if err != nil {
		t.Fatalf("enqueue: %v", err)
	}
	return out[0]
}

// runConformance is the suite every backend passes: same decisions, same
// states, same errors.
func runConformance(t *testing.T, open opener) {
	t.Run("BurstAgainstCapacity", func(t *testing.T) {
		t.Parallel()
		clk := clock.NewFake(t0)
		s := open(t)(t, clk, leaky20(10))
		var admitted []Admission
		for i := 0; i < 40; i++ {
			a := enqueueOne(t, s, "acme", payload(i))
			if a.Rejected == nil {
				admitted = append(admitted, a)
				continue
			}
			r := a.Rejected
			if r.Reason != ReasonQueueFull || r.RetryAfter != T || r.Capacity != 10 || r.QueueDepth != 11 {
				t.Fatalf("job %d: rejection %+v, want queue_full after %v with depth 11 of 10", i, r, T)
			}
		}
		if len(admitted) != 11 {
			t.Fatalf("admitted %d, want 11", len(admitted))
		}
		for i, a := range admitted {
			want := t0.Add(time.Duration(i) * T)
			if !a.Job.DispatchAt.Equal(want) || a.ExpectedDelay != time.Duration(i)*T || a.QueueDepth != i+1 || a.Job.State != StateQueued {
				t.Fatalf("job %d: slot %v delay %v depth %d state %s", i, a.Job.DispatchAt.Sub(t0), a.ExpectedDelay, a.QueueDepth, a.Job.State)
			}
		}
		st, err := s.Tenant(context.Background(), "acme")
		if err != nil {
			t.Fatal(err)
		}
		if st.QueueDepth != 11 || st.Accepted != 11 || st.Rejected != 29 || st.ExpectedDelay != 11*T {
			t.Fatalf("status %+v", st)
		}
	})

	t.Run("TokenMode", func(t *testing.T) {
		t.Parallel()
		clk := clock.NewFake(t0)
		s := open(t)(t, clk, func(string) leaky.Policy { return leaky.Policy{Interval: T, Burst: 10} })
		n := 0
		for i := 0; i < 30; i++ {
			a := enqueueOne(t, s, "tok", payload(i))
			if a.Rejected == nil {
				n++
				if a.ExpectedDelay != 0 {
					t.Fatalf("token job waits %v", a.ExpectedDelay)
				}
			} else if a.Rejected.Reason != ReasonRateLimited || a.Rejected.RetryAfter != T {
				t.Fatalf("rejection %+v", a.Rejected)
			}
		}
		if n != 10 {
			t.Fatalf("admitted %d, want 10", n)
		}
	})

	t.Run("BatchDecidesInOrder", func(t *testing.T) {
		t.Parallel()
		s := open(t)(t, clock.NewFake(t0), leaky20(2))
		jobs := []NewJob{payload(0), payload(1), payload(2), payload(3)}
		out, err := s.Enqueue(context.Background(), "b", jobs)
		if err != nil {
			t.Fatal(err)
		}
		for i, want := range []bool{true, true, true, false} {
			if (out[i].Rejected == nil) != want {
				t.Fatalf("job %d admitted=%v, want %v", i, out[i].Rejected == nil, want)
			}
		}
	})

	t.Run("Idempotency", func(t *testing.T) {
		t.Parallel()
		s := open(t)(t, clock.NewFake(t0), leaky20(100))
		key := NewJob{Payload: json.RawMessage(`1`), IdempotencyKey: "k-1"}
		first := enqueueOne(t, s, "acme", key)
		second := enqueueOne(t, s, "acme", key)
		if first.Rejected != nil || !second.Duplicate || second.Job.ID != first.Job.ID || first.Duplicate {
			t.Fatalf("first %+v second %+v", first, second)
		}
		if second.ExpectedDelay != first.ExpectedDelay || second.QueueDepth != first.QueueDepth {
			t.Fatalf("repeat answered differently: %+v vs %+v", second, first)
		}
		other := enqueueOne(t, s, "other", key)
		if other.Duplicate || other.Job.ID == first.Job.ID {
			t.Fatal("a key of one tenant matched another tenant's job")
		}
		// The same key in one batch, and from many callers at once: one job.
		out, err := s.Enqueue(context.Background(), "acme", []NewJob{{Payload: json.RawMessage(`2`), IdempotencyKey: "k-2"}, {Payload: json.RawMessage(`2`), IdempotencyKey: "k-2"}})
		if err != nil || out[0].Job.ID != out[1].Job.ID || !out[1].Duplicate {
			t.Fatalf("same key in one batch: %+v %v", out, err)
		}
		var wg sync.WaitGroup
		ids := make([]string, 20)
		for i := range ids {
			wg.Add(1)
			go func() {
				defer wg.Done()
				out, err := s.Enqueue(context.Background(), "acme", []NewJob{{Payload: json.RawMessage(`3`), IdempotencyKey: "k-3"}})
				if err == nil {
					ids[i] = out[0].Job.ID
				}
			}()
		}
		wg.Wait()
		for _, id := range ids {
			if id == "" || id != ids[0] {
				t.Fatalf("concurrent repeats gave ids %v", ids)
			}
		}
		st, _ := s.Tenant(context.Background(), "acme")
		if st.Accepted != 3 || st.QueueDepth != 3 {
			t.Fatalf("want 3 jobs for 3 keys, status %+v", st)
		}
	})

	t.Run("JobLookupAndCancel", func(t *testing.T) {
		t.Parallel()
		s := open(t)(t, clock.NewFake(t0), leaky20(10))
		ctx := context.Background()
		a := enqueueOne(t, s, "acme", payload(1))
		b := enqueueOne(t, s, "acme", payload(2))
		got, err := s.Job(ctx, a.Job.ID)
		if err != nil || got.ID != a.Job.ID || got.Tenant != "acme" || string(got.Payload) != `{"n":1}` || got.State != StateQueued {
			t.Fatalf("Job: %+v %v", got, err)
		}
		for _, id := range []string{"nope", newID(t0)} {
			if _, err := s.Job(ctx, id); !errors.Is(err, ErrNotFound) {
				t.Fatalf("Job(%q) err %v, want ErrNotFound", id, err)
			}
			if _, err := s.Cancel(ctx, id); !errors.Is(err, ErrNotFound) {
				t.Fatalf("Cancel(%q) err %v, want ErrNotFound", id, err)
			}
		}
		c, err := s.Cancel(ctx, b.Job.ID)
		if err != nil || c.State != StateCancelled {
			t.Fatalf("cancel: %+v %v", c, err)
		}
		var se *StateError
		if _, err := s.Cancel(ctx, b.Job.ID); !errors.As(err, &se) || se.State != StateCancelled {
			t.Fatalf("second cancel: %v", err)
		}
		st, _ := s.Tenant(ctx, "acme")
		if st.QueueDepth != 1 || st.Cancelled != 1 {
			t.Fatalf("status after cancel %+v", st)
		}
	})

	t.Run("ConsumeDeliversAtSlotsInOrder", func(t *testing.T) {
		t.Parallel()
		clk := clock.NewFake(t0)
		s := open(t)(t, clk, leaky20(10))
		var ids []string
		for i := 0; i < 5; i++ {
			ids = append(ids, enqueueOne(t, s, "acme", payload(i)).Job.ID)
		}
		cancelled := enqueueOne(t, s, "acme", payload(99)).Job.ID
		if _, err := s.Cancel(context.Background(), cancelled); err != nil {
			t.Fatal(err)
		}
		lead := 20 * time.Millisecond
		got := make(chan handed, 10)
		stop := consume(t, s, lead, func(ctx context.Context, j Job) Outcome {
			got <- handed{j, clk.Now()}
			return Outcome{Result: Succeeded, Status: 200, SentAt: j.DispatchAt}
		})
		for i, id := range ids {
			h := waitHanded(t, clk, got, 5*time.Millisecond)
			if h.job.ID != id || h.job.Attempts != 1 || h.job.State != StateDispatching {
				t.Fatalf("handed %d: %+v, want %s attempt 1", i, h.job, id)
			}
			if early := h.job.DispatchAt.Sub(h.at); early < 0 || early > lead {
				t.Fatalf("job %d handed %v before its slot, want within the lead %v", i, early, lead)
			}
		}
		stop()
		for _, id := range ids {
			if j, _ := s.Job(context.Background(), id); j.State != StateSucceeded || j.ResponseStatus != 200 || j.FinishedAt.IsZero() {
				t.Fatalf("job %s after delivery: %+v", id, j)
			}
		}
		st, _ := s.Tenant(context.Background(), "acme")
		if st.Delivered != 5 || st.QueueDepth != 0 || st.InFlight != 0 {
			t.Fatalf("status %+v", st)
		}
	})

	t.Run("RetryFailAndRelease", func(t *testing.T) {
		t.Parallel()
		clk := clock.NewFake(t0)
		s := open(t)(t, clk, leaky20(10))
		ctx := context.Background()
		retry := enqueueOne(t, s, "acme", payload(1)).Job.ID
		fail := enqueueOne(t, s, "acme", payload(2)).Job.ID
		got := make(chan handed, 10)
		var mu sync.Mutex
		calls := map[string]int{}
		stop := consume(t, s, 10*time.Millisecond, func(ctx context.Context, j Job) Outcome {
			mu.Lock()
			calls[j.ID]++
			n := calls[j.ID]
			mu.Unlock()
			got <- handed{j, clk.Now()}
			switch {
			case j.ID == retry && n == 1:
				return Outcome{Result: Retry, Status: 502, Error: "bad gateway", NotBefore: clk.Now().Add(time.Second)}
			case j.ID == fail:
				return Outcome{Result: Failed, Status: 400, Error: "400 Bad Request: no"}
			}
			return Outcome{Result: Succeeded, Status: 200}
		})
		first := waitHanded(t, clk, got, 5*time.Millisecond)
		second := waitHanded(t, clk, got, 5*time.Millisecond)
		if first.job.ID != retry || second.job.ID != fail {
			t.Fatalf("order %s %s", first.job.ID, second.job.ID)
		}
		waitFor(t, func() bool { j, _ := s.Job(ctx, retry); return j.State == StateRetrying })
		j, _ := s.Job(ctx, retry)
		if j.LastError != "bad gateway" || j.ResponseStatus != 502 || j.DispatchAt.Before(first.at.Add(time.Second)) {
			t.Fatalf("retrying job %+v", j)
		}
		third := waitHanded(t, clk, got, 20*time.Millisecond)
		if third.job.ID != retry || third.job.Attempts != 2 || third.at.Before(first.at.Add(time.Second-10*time.Millisecond)) {
			t.Fatalf("retry handed %+v at %v", third.job, third.at.Sub(first.at))
		}
		stop()
		if j, _ := s.Job(ctx, fail); j.State != StateFailed || j.ResponseStatus != 400 || j.LastError == "" {
			t.Fatalf("failed job %+v", j)
		}
		if j, _ := s.Job(ctx, retry); j.State != StateSucceeded || j.Attempts != 2 || j.LastError != "" {
			t.Fatalf("retried job %+v", j)
		}
		st, _ := s.Tenant(ctx, "acme")
		if st.Delivered != 1 || st.Failed != 1 || st.QueueDepth != 0 {
			t.Fatalf("status %+v", st)
		}

		// Released: nothing was sent, so the attempt does not count.
		rel := enqueueOne(t, s, "acme", payload(3)).Job.ID
		stop = consume(t, s, 10*time.Millisecond, func(ctx context.Context, j Job) Outcome {
			select {
			case got <- handed{j, clk.Now()}:
			default:
			}
			return Outcome{Result: Released}
		})
		waitHanded(t, clk, got, 5*time.Millisecond)
		stop()
		if j, _ := s.Job(ctx, rel); j.State != StateQueued || j.Attempts != 0 {
			t.Fatalf("released job %+v", j)
		}
	})

	t.Run("RetryBackoffDoesNotFillTheQueue", func(t *testing.T) {
		t.Parallel()
		clk := clock.NewFake(t0)
		s := open(t)(t, clk, leaky20(3))
		ctx := context.Background()
		id := enqueueOne(t, s, "acme", payload(1)).Job.ID
		got := make(chan handed, 10)
		stop := consume(t, s, 10*time.Millisecond, func(ctx context.Context, j Job) Outcome {
			got <- handed{j, clk.Now()}
			return Outcome{Result: Retry, Status: 503, Error: "busy", NotBefore: clk.Now().Add(10 * time.Second)}
		})
		waitHanded(t, clk, got, time.Millisecond)
		waitFor(t, func() bool { j, _ := s.Job(ctx, id); return j.State == StateRetrying })
		stop()
		j, _ := s.Job(ctx, id)
		if j.DispatchAt.Before(t0.Add(10 * time.Second)) {
			t.Fatalf("retry due at %v, before its backoff", j.DispatchAt.Sub(t0))
		}
		// The retry took one place of three; two more fit, not three.
		for i := 0; i < 2; i++ {
			if a := enqueueOne(t, s, "acme", payload(i)); a.Rejected != nil {
				t.Fatalf("job %d refused while one job waits out a 10s backoff: %+v", i, a.Rejected)
			}
		}
		if a := enqueueOne(t, s, "acme", payload(9)); a.Rejected == nil {
			t.Fatal("a fourth waiting job admitted at capacity 3")
		}
		st, _ := s.Tenant(ctx, "acme")
		if st.QueueDepth != 3 {
			t.Fatalf("depth %d, want 3 (a retrying job counts)", st.QueueDepth)
		}
	})

	t.Run("FailedJobsListedAndRetried", func(t *testing.T) {
		t.Parallel()
		clk := clock.NewFake(t0)
		s := open(t)(t, clk, leaky20(1))
		ctx := context.Background()
		id := enqueueOne(t, s, "acme", payload(1)).Job.ID
		other := enqueueOne(t, s, "other", payload(2)).Job.ID
		got := make(chan handed, 10)
		var mu sync.Mutex
		fail := true
		stop := consume(t, s, 10*time.Millisecond, func(ctx context.Context, j Job) Outcome {
			got <- handed{j, clk.Now()}
			mu.Lock()
			defer mu.Unlock()
			if fail {
				return Outcome{Result: Failed, Status: 400, Error: "400 Bad Request: invalid number", SentAt: clk.Now()}
			}
			return Outcome{Result: Succeeded, Status: 200, SentAt: clk.Now()}
		})
		waitHanded(t, clk, got, time.Millisecond)
		waitHanded(t, clk, got, time.Millisecond)
		waitFor(t, func() bool { j, _ := s.Job(ctx, id); return j.State == StateFailed })
		waitFor(t, func() bool { j, _ := s.Job(ctx, other); return j.State == StateFailed })
		list, err := s.Failed(ctx, "acme", 10)
		if err != nil || len(list) != 1 || list[0].ID != id || list[0].LastError == "" || list[0].ResponseStatus != 400 {
			t.Fatalf("failed list %+v %v", list, err)
		}
		// Only failed jobs can be retried.
		enqueueOne(t, s, "third", payload(3))
		waiting := enqueueOne(t, s, "third", payload(4)).Job.ID // due an interval later
		var se *StateError
		if _, err := s.Retry(ctx, waiting); !errors.As(err, &se) || se.State != StateQueued {
			t.Fatalf("retry of a waiting job: %v", err)
		}
		if _, err := s.Cancel(ctx, waiting); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Retry(ctx, waiting); !errors.As(err, &se) || se.State != StateCancelled {
			t.Fatalf("retry of a cancelled job: %v", err)
		}
		if _, err := s.Retry(ctx, newID(t0)); !errors.Is(err, ErrNotFound) {
			t.Fatalf("retry of an unknown job: %v", err)
		}
		mu.Lock()
		fail = false
		mu.Unlock()
		a, err := s.Retry(ctx, id)
		if err != nil || a.Rejected != nil || a.Job.State != StateQueued || a.Job.Attempts != 0 {
			t.Fatalf("retry: %+v %v", a, err)
		}
		if list, _ := s.Failed(ctx, "acme", 10); len(list) != 0 {
			t.Fatalf("still listed as failed: %+v", list)
		}
		for h := waitHanded(t, clk, got, time.Millisecond); h.job.ID != id; h = waitHanded(t, clk, got, time.Millisecond) {
		}
		waitFor(t, func() bool { j, _ := s.Job(ctx, id); return j.State == StateSucceeded })
		stop()
		if j, _ := s.Job(ctx, id); j.Attempts != 1 || j.ResponseStatus != 200 {
			t.Fatalf("after the retry: %+v", j)
		}
		if _, err := s.Retry(ctx, id); !errors.As(err, &se) || se.State != StateSucceeded {
			t.Fatalf("retry of a succeeded job: %v", err)
		}
	})

	t.Run("CancellingTheLastJobGivesItsPlaceBack", func(t *testing.T) {
		t.Parallel()
		s := open(t)(t, clock.NewFake(t0), leaky20(2))
		ctx := context.Background()
		var ids []string
		for i := 0; i < 3; i++ { // one at once, two waiting: full
			a := enqueueOne(t, s, "acme", payload(i))
			if a.Rejected != nil {
				t.Fatalf("job %d refused", i)
			}
			ids = append(ids, a.Job.ID)
		}
		if a := enqueueOne(t, s, "acme", payload(9)); a.Rejected == nil {
			t.Fatal("admitted past capacity")
		}
		if _, err := s.Cancel(ctx, ids[2]); err != nil {
			t.Fatal(err)
		}
		a := enqueueOne(t, s, "acme", payload(10))
		if a.Rejected != nil || !a.Job.DispatchAt.Equal(t0.Add(2*T)) {
			t.Fatalf("after cancelling the last job: %+v (want its slot %v)", a, 2*T)
		}
		// A job cancelled in the middle leaves its slot empty: the rest keep theirs.
		if _, err := s.Cancel(ctx, ids[1]); err != nil {
			t.Fatal(err)
		}
		if a := enqueueOne(t, s, "acme", payload(11)); a.Rejected == nil {
			t.Fatal("a middle cancellation moved the schedule")
		}
	})

	t.Run("RestartKeepsJobsAndSpacesOverdueOnes", func(t *testing.T) {
		t.Parallel()
		clk := clock.NewFake(t0)
		reopen := open(t)
		s := reopen(t, clk, leaky20(10))
		if _, shared := s.(*RedisStore); shared {
			// Many processes share a Redis store: none of them restarting
			// means the rest stopped. Overdue jobs there are spaced by
			// the shared gate (TestRedisOverdueJobsAreSpaced).
			t.Skip("a shared store has no restart of its own")
		}
		var ids []string
		for i := 0; i < 6; i++ {
			ids = append(ids, enqueueOne(t, s, "acme", payload(i)).Job.ID)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		clk.Advance(time.Hour) // every slot passed while stopped
		s = reopen(t, clk, leaky20(10))
		st, err := s.Tenant(context.Background(), "acme")
		if err != nil || st.QueueDepth != 6 || st.Accepted != 6 {
			t.Fatalf("after restart %+v %v", st, err)
		}
		restart := clk.Now()
		for i, id := range ids {
			j, err := s.Job(context.Background(), id)
			if err != nil || j.State != StateQueued {
				t.Fatalf("job %d lost: %+v %v", i, j, err)
			}
			if want := restart.Add(time.Duration(i) * T); !j.DispatchAt.Equal(want) {
				t.Fatalf("job %d slot %v after restart, want %v", i, j.DispatchAt.Sub(restart), want.Sub(restart))
			}
		}
		// A new job queues behind them, and is told so.
		a := enqueueOne(t, s, "acme", payload(7))
		if a.Rejected != nil || a.ExpectedDelay != 6*T {
			t.Fatalf("new job after restart: %+v", a)
		}
	})

	t.Run("PushbackPausesTheTenantAndKeepsOrder", func(t *testing.T) {
		t.Parallel()
		clk := clock.NewFake(t0)
		s := open(t)(t, clk, leaky20(5))
		ctx := context.Background()
		var ids []string
		for i := 0; i < 4; i++ {
			ids = append(ids, enqueueOne(t, s, "acme", payload(i)).Job.ID)
		}
		until := t0.Add(2 * time.Second)
		got := make(chan handed, 10)
		var mu sync.Mutex
		pushed := false
		stop := consume(t, s, 10*time.Millisecond, func(ctx context.Context, j Job) Outcome {
			got <- handed{j, clk.Now()}
			mu.Lock()
			defer mu.Unlock()
			if !pushed {
				pushed = true
				return Outcome{Result: Retry, Status: 429, Error: "429 Too Many Requests", SentAt: clk.Now(), PauseUntil: until}
			}
			return Outcome{Result: Succeeded, Status: 200, SentAt: clk.Now()}
		})
		if h := waitHanded(t, clk, got, time.Millisecond); h.job.ID != ids[0] {
			t.Fatalf("first handed %s", h.job.ID)
		}
		waitFor(t, func() bool { j, _ := s.Job(ctx, ids[0]); return j.State == StateRetrying })
		st, _ := s.Tenant(ctx, "acme")
		if !st.Paused || !st.PausedUntil.Equal(until) || st.Held || st.QueueDepth != 4 {
			t.Fatalf("status during the pause %+v", st)
		}
		if j, _ := s.Job(ctx, ids[0]); j.Failures != 0 || j.Attempts != 1 || j.DispatchAt.Before(until) {
			t.Fatalf("pushed-back job %+v: no failure counted, due after the pause", j)
		}
		// While paused the queue takes only what fits (4 wait, capacity 5),
		// and what it says includes the rest of the pause.
		a := enqueueOne(t, s, "acme", payload(4))
		if a.Rejected != nil || a.ExpectedDelay < until.Sub(clk.Now())+4*T {
			t.Fatalf("during the pause: %+v, want a delay past the pause plus 4 intervals", a)
		}
		ids = append(ids, a.Job.ID)
		r := enqueueOne(t, s, "acme", payload(5)).Rejected
		if r == nil || r.RetryAfter < until.Sub(clk.Now()) {
			t.Fatalf("a sixth waiting job: %+v, want refused until after the pause", r)
		}
		// Then all of them in their original order, one interval apart,
		// none before the pause ends.
		var first time.Time
		for i, id := range ids {
			h := waitHanded(t, clk, got, 5*time.Millisecond)
			if h.job.ID != id {
				t.Fatalf("after the pause, handed %d is %s, want %s", i, h.job.ID, id)
			}
			if i == 0 {
				first = h.job.DispatchAt
				if first.Before(until) {
					t.Fatalf("first after the pause due at %v, before its end", first.Sub(t0))
				}
			} else if want := first.Add(time.Duration(i) * T); !h.job.DispatchAt.Equal(want) {
				t.Fatalf("job %d due at %v, want %v", i, h.job.DispatchAt.Sub(t0), want.Sub(t0))
			}
		}
		waitFor(t, func() bool { st, _ := s.Tenant(ctx, "acme"); return st.Delivered == 5 })
		stop()
		if st, _ := s.Tenant(ctx, "acme"); st.Paused {
			t.Fatalf("still paused: %+v", st)
		}
	})

	t.Run("OperatorHoldAndResume", func(t *testing.T) {
		t.Parallel()
		clk := clock.NewFake(t0)
		reopen := open(t)
		s := reopen(t, clk, leaky20(3))
		ctx := context.Background()
		var ids []string
		for i := 0; i < 2; i++ {
			ids = append(ids, enqueueOne(t, s, "acme", payload(i)).Job.ID)
		}
		st, err := s.Pause(ctx, "acme")
		if err != nil || !st.Paused || !st.Held || !st.PausedUntil.IsZero() {
			t.Fatalf("pause: %+v %v", st, err)
		}
		// Held: accepted while there is room (all of them wait: capacity 3
		// holds 3), and kept across a restart.
		ids = append(ids, enqueueOne(t, s, "acme", payload(2)).Job.ID)
		if a := enqueueOne(t, s, "acme", payload(3)); a.Rejected == nil {
			t.Fatal("a held tenant admitted past its capacity")
		}
		s.Close()
		s = reopen(t, clk, leaky20(3))
		if st, _ := s.Tenant(ctx, "acme"); !st.Held || st.QueueDepth != 3 {
			t.Fatalf("after a restart: %+v", st)
		}
		got := make(chan handed, 10)
		stop := consume(t, s, 10*time.Millisecond, func(ctx context.Context, j Job) Outcome {
			got <- handed{j, clk.Now()}
			return Outcome{Result: Succeeded, Status: 200, SentAt: clk.Now()}
		})
		for range 50 {
			clk.Advance(100 * time.Millisecond)
			time.Sleep(time.Millisecond)
		}
		select {
		case h := <-got:
			t.Fatalf("a held tenant's job was handed over: %+v", h.job)
		case <-time.After(20 * time.Millisecond):
		}
		resumeAt := clk.Now()
		if st, err := s.Resume(ctx, "acme"); err != nil || st.Paused || st.Held {
			t.Fatalf("resume: %+v %v", st, err)
		}
		for i, id := range ids {
			h := waitHanded(t, clk, got, 5*time.Millisecond)
			want := resumeAt.Add(time.Duration(i) * T)
			if h.job.ID != id || !h.job.DispatchAt.Equal(want) {
				t.Fatalf("after resume, handed %d: %s due %v, want %s due %v", i, h.job.ID, h.job.DispatchAt.Sub(t0), id, want.Sub(t0))
			}
		}
		stop()
	})

	t.Run("WindowBesideTheRate", func(t *testing.T) {
		t.Parallel()
		clk := clock.NewFake(t0)
		w, _ := leaky.ParseWindow("20/m")
		const rateT = 200 * time.Millisecond // 5/s
		s := open(t)(t, clk, func(string) leaky.Policy {
			return leaky.Policy{Interval: rateT, Burst: 1, Capacity: 100, Windows: []leaky.Window{w}}
		})
		promised := map[string]time.Time{}
		for i := 0; i < 60; i++ {
			a := enqueueOne(t, s, "acme", payload(i))
			if a.Rejected != nil {
				t.Fatalf("job %d refused: %+v", i, a.Rejected)
			}
			want := t0.Add(time.Duration(i/20)*time.Minute + time.Duration(i%20)*rateT)
			if !a.Job.DispatchAt.Equal(want) || a.ExpectedDelay != want.Sub(t0) {
				t.Fatalf("job %d promised %v (delay %v), want %v", i, a.Job.DispatchAt.Sub(t0), a.ExpectedDelay, want.Sub(t0))
			}
			promised[a.Job.ID] = a.Job.DispatchAt
		}
		if st, _ := s.Tenant(context.Background(), "acme"); st.ExpectedDelay != 3*time.Minute {
			t.Fatalf("expected delay for a 61st job %v, want 3m (the window)", st.ExpectedDelay)
		}
		got := make(chan handed, 100)
		stop := consume(t, s, 10*time.Millisecond, func(ctx context.Context, j Job) Outcome {
			got <- handed{j, clk.Now()}
			return Outcome{Result: Succeeded, Status: 200, SentAt: j.DispatchAt}
		})
		defer stop()
		var sent []time.Time
		for len(sent) < 60 {
			h := waitHanded(t, clk, got, 100*time.Millisecond)
			// (When it is handed over depends on how fast this test moves
			// the fake clock; what it is due at does not.)
			if !h.job.DispatchAt.Equal(promised[h.job.ID]) {
				t.Fatalf("job due %v, promised %v", h.job.DispatchAt.Sub(t0), promised[h.job.ID].Sub(t0))
			}
			sent = append(sent, h.job.DispatchAt)
		}
		slices.SortFunc(sent, func(a, b time.Time) int { return a.Compare(b) })
		for i := range sent {
			for j := i; j < len(sent); j++ {
				span := sent[j].Sub(sent[i])
				if n := j - i + 1; (span < time.Second && n > 5+1) || (span < time.Minute && n > 20) {
					t.Fatalf("%d sends within %v", n, span)
				}
			}
		}
	})

	t.Run("CostTakesSlots", func(t *testing.T) {
		t.Parallel()
		s := open(t)(t, clock.NewFake(t0), func(string) leaky.Policy {
			return leaky.Policy{Interval: 100 * time.Millisecond, Burst: 1, Capacity: 3}
		})
		out, err := s.Enqueue(context.Background(), "acme", []NewJob{
			{Payload: json.RawMessage(`1`), Cost: 3}, {Payload: json.RawMessage(`2`)}, {Payload: json.RawMessage(`3`)}, {Payload: json.RawMessage(`4`), Cost: 5},
		})
		if err != nil {
			t.Fatal(err)
		}
		if out[0].Rejected != nil || out[0].ExpectedDelay != 0 || out[1].Rejected != nil || out[1].ExpectedDelay != 300*time.Millisecond {
			t.Fatalf("cost 3 then cost 1: %+v / %+v", out[0], out[1])
		}
		if r := out[2].Rejected; r == nil || r.RetryAfter != 100*time.Millisecond {
			t.Fatalf("third job: %+v, want refused for one interval", out[2])
		}
		if imp := out[3].Impossible; imp == nil || imp.Reason != ReasonCostTooLarge || imp.MaxCost != 4 {
			t.Fatalf("cost 5 with capacity 3: %+v", out[3])
		}
		if j, _ := s.Job(context.Background(), out[0].Job.ID); j.Cost != 3 {
			t.Fatalf("stored cost %d", j.Cost)
		}
	})

	t.Run("Deadlines", func(t *testing.T) {
		t.Parallel()
		clk := clock.NewFake(t0)
		s := open(t)(t, clk, leaky20(10))
		ctx := context.Background()
		var ids []string
		for i := 0; i < 5; i++ { // slots 0, T, ..., 4T
			ids = append(ids, enqueueOne(t, s, "acme", payload(i)).Job.ID)
		}
		// Would wait 5T: refused at once, nothing taken.
		a := enqueueOne(t, s, "acme", NewJob{Payload: json.RawMessage(`9`), Deadline: t0.Add(4 * T)})
		if a.Impossible == nil || a.Impossible.Reason != ReasonWouldExpire || a.Impossible.ExpectedDelay != 5*T {
			t.Fatalf("would expire: %+v", a)
		}
		if st, _ := s.Tenant(ctx, "acme"); st.QueueDepth != 5 || st.ExpectedDelay != 5*T {
			t.Fatalf("after a would_expire: %+v", st)
		}
		// Fits now (slot 5T, deadline 8T); a pause pushes it past.
		late := enqueueOne(t, s, "acme", NewJob{Payload: json.RawMessage(`10`), Deadline: t0.Add(8 * T)}).Job.ID
		after := enqueueOne(t, s, "acme", payload(11)).Job.ID
		got := make(chan handed, 20)
		var mu sync.Mutex
		pushed := false
		stop := consume(t, s, 10*time.Millisecond, func(ctx context.Context, j Job) Outcome {
			got <- handed{j, clk.Now()}
			mu.Lock()
			defer mu.Unlock()
			if !pushed { // the first job: come back in a second
				pushed = true
				return Outcome{Result: Retry, Status: 429, SentAt: clk.Now(), PauseUntil: clk.Now().Add(time.Second)}
			}
			return Outcome{Result: Succeeded, Status: 200, SentAt: clk.Now()}
		})
		defer stop()
		var handedIDs []string
		for len(handedIDs) < 7 { // 6 jobs, the first twice
			handedIDs = append(handedIDs, waitHanded(t, clk, got, 5*time.Millisecond).job.ID)
		}
		for _, id := range handedIDs {
			if id == late {
				t.Fatal("a job past its deadline was handed over")
			}
		}
		waitFor(t, func() bool { j, _ := s.Job(ctx, late); return j.State == StateExpired })
		waitFor(t, func() bool { j, _ := s.Job(ctx, after); return j.State == StateSucceeded })
		st, _ := s.Tenant(ctx, "acme")
		if st.Expired != 1 || st.Delivered != 6 || st.QueueDepth != 0 {
			t.Fatalf("status %+v", st)
		}
		if _, err := s.Cancel(ctx, late); err == nil {
			t.Fatal("cancelled an expired job")
		}
	})

	t.Run("TenantsDeepestFirst", func(t *testing.T) {
		t.Parallel()
		s := open(t)(t, clock.NewFake(t0), leaky20(100))
		for tenant, n := range map[string]int{"a": 1, "b": 3, "c": 2} {
			for i := 0; i < n; i++ {
				enqueueOne(t, s, tenant, payload(i))
			}
		}
		ctx := context.Background()
		all, err := s.Tenants(ctx, 0, 10)
		if err != nil || len(all) != 3 || all[0].Tenant != "b" || all[1].Tenant != "c" || all[2].Tenant != "a" || all[0].QueueDepth != 3 {
			t.Fatalf("tenants %+v %v", all, err)
		}
		page, _ := s.Tenants(ctx, 1, 1)
		if len(page) != 1 || page[0].Tenant != "c" {
			t.Fatalf("page %+v", page)
		}
		if none, _ := s.Tenants(ctx, 3, 10); len(none) != 0 {
			t.Fatalf("past the end: %+v", none)
		}
		if st, err := s.Tenant(ctx, "never-seen"); err != nil || st.QueueDepth != 0 || st.ExpectedDelay != 0 {
			t.Fatalf("unseen tenant %+v %v", st, err)
		}
	})
}

type handed struct {
	job Job
	at  time.Time
}

// consume runs s.Consume in the background; the returned func stops it and
// waits for it to return.
func consume(t *testing.T, s Store, lead time.Duration, h Handler) func() {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Consume(ctx, h, ConsumeOptions{Lead: lead, Concurrency: 16}) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Consume: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// waitHanded advances the fake clock by step until a job is handed over.
func waitHanded(t *testing.T, clk *clock.Fake, got <-chan handed, step time.Duration) handed {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	// A backend that works in real time too (asynq's polls, a round trip
	// per claim) must not see the clock run ahead of it: first a moment
	// for what is due already, then steps far enough apart in real time
	// (more so under the race detector, which slows it down) that jobs
	// due one step apart are handed over in order.
	step1, stepN := 25*time.Millisecond, 2*time.Millisecond
	if raceEnabled {
		step1, stepN = 100*time.Millisecond, 8*time.Millisecond
	}
	pause := step1
	for time.Now().Before(deadline) {
		select {
		case h := <-got:
			return h
		case <-time.After(pause):
			clk.Advance(step)
		}
		pause = stepN
	}
	t.Fatal("no job handed over within 10s")
	return handed{}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(time.Millisecond)
	}
}
