package queuetest

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/queue"
)

// Admission: decisions, idempotency, cost, lookups.

func testBurstAgainstCapacity(t *testing.T, d Driver) {
	_, s := d.start(t, Leaky20(10))
	var admitted []queue.Admission
	for i := 0; i < 40; i++ {
		a := EnqueueOne(t, s, "acme", Payload(i))
		if a.Rejected == nil {
			admitted = append(admitted, a)
			continue
		}
		r := a.Rejected
		if r.Reason != queue.ReasonQueueFull || r.RetryAfter != T || r.Capacity != 10 || r.QueueDepth != 11 {
			t.Fatalf("job %d: rejection %+v, want queue_full after %v with depth 11 of 10", i, r, T)
		}
	}
	if len(admitted) != 11 {
		t.Fatalf("admitted %d, want 11", len(admitted))
	}
	for i, a := range admitted {
		want := T0.Add(time.Duration(i) * T)
		if !a.Job.DispatchAt.Equal(want) || a.ExpectedDelay != time.Duration(i)*T || a.QueueDepth != i+1 || a.Job.State != queue.StateQueued {
			t.Fatalf("job %d: slot %v delay %v depth %d state %s", i, a.Job.DispatchAt.Sub(T0), a.ExpectedDelay, a.QueueDepth, a.Job.State)
		}
	}
	st, err := s.Tenant(context.Background(), "acme")
	if err != nil {
		t.Fatal(err)
	}
	if st.QueueDepth != 11 || st.Accepted != 11 || st.Rejected != 29 || st.ExpectedDelay != 11*T {
		t.Fatalf("status %+v", st)
	}
}

func testTokenMode(t *testing.T, d Driver) {
	_, s := d.start(t, func(string) leaky.Policy { return leaky.Policy{Interval: T, Burst: 10} })
	n := 0
	for i := 0; i < 30; i++ {
		a := EnqueueOne(t, s, "tok", Payload(i))
		if a.Rejected == nil {
			n++
			if a.ExpectedDelay != 0 {
				t.Fatalf("token job waits %v", a.ExpectedDelay)
			}
		} else if a.Rejected.Reason != queue.ReasonRateLimited || a.Rejected.RetryAfter != T {
			t.Fatalf("rejection %+v", a.Rejected)
		}
	}
	if n != 10 {
		t.Fatalf("admitted %d, want 10", n)
	}
}

func testBatchDecidesInOrder(t *testing.T, d Driver) {
	_, s := d.start(t, Leaky20(2))
	jobs := []queue.NewJob{Payload(0), Payload(1), Payload(2), Payload(3)}
	out, err := s.Enqueue(context.Background(), "b", jobs)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, true, true, false} {
		if (out[i].Rejected == nil) != want {
			t.Fatalf("job %d admitted=%v, want %v", i, out[i].Rejected == nil, want)
		}
	}
}

func testIdempotency(t *testing.T, d Driver) {
	_, s := d.start(t, Leaky20(100))
	key := queue.NewJob{Payload: json.RawMessage(`1`), IdempotencyKey: "k-1"}
	first := EnqueueOne(t, s, "acme", key)
	second := EnqueueOne(t, s, "acme", key)
	if first.Rejected != nil || !second.Duplicate || second.Job.ID != first.Job.ID || first.Duplicate {
		t.Fatalf("first %+v second %+v", first, second)
	}
	if second.ExpectedDelay != first.ExpectedDelay || second.QueueDepth != first.QueueDepth {
		t.Fatalf("repeat answered differently: %+v vs %+v", second, first)
	}
	other := EnqueueOne(t, s, "other", key)
	if other.Duplicate || other.Job.ID == first.Job.ID {
		t.Fatal("a key of one tenant matched another tenant's job")
	}
	// The same key in one batch, and from many callers at once: one job.
	out, err := s.Enqueue(context.Background(), "acme", []queue.NewJob{{Payload: json.RawMessage(`2`), IdempotencyKey: "k-2"}, {Payload: json.RawMessage(`2`), IdempotencyKey: "k-2"}})
	if err != nil || out[0].Job.ID != out[1].Job.ID || !out[1].Duplicate {
		t.Fatalf("same key in one batch: %+v %v", out, err)
	}
	var wg sync.WaitGroup
	ids := make([]string, 20)
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := s.Enqueue(context.Background(), "acme", []queue.NewJob{{Payload: json.RawMessage(`3`), IdempotencyKey: "k-3"}})
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
}

func testCostTakesSlots(t *testing.T, d Driver) {
	_, s := d.start(t, func(string) leaky.Policy {
		return leaky.Policy{Interval: 100 * time.Millisecond, Burst: 1, Capacity: 3}
	})
	out, err := s.Enqueue(context.Background(), "acme", []queue.NewJob{
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
	if imp := out[3].Impossible; imp == nil || imp.Reason != queue.ReasonCostTooLarge || imp.MaxCost != 4 {
		t.Fatalf("cost 5 with capacity 3: %+v", out[3])
	}
	if j, _ := s.Job(context.Background(), out[0].Job.ID); j.Cost != 3 {
		t.Fatalf("stored cost %d", j.Cost)
	}
}

func testJobLookupAndCancel(t *testing.T, d Driver) {
	_, s := d.start(t, Leaky20(10))
	ctx := context.Background()
	a := EnqueueOne(t, s, "acme", Payload(1))
	b := EnqueueOne(t, s, "acme", Payload(2))
	got, err := s.Job(ctx, a.Job.ID)
	if err != nil || got.ID != a.Job.ID || got.Tenant != "acme" || string(got.Payload) != `{"n":1}` || got.State != queue.StateQueued {
		t.Fatalf("queue.Job: %+v %v", got, err)
	}
	for _, id := range []string{"nope", queue.NewID(T0)} {
		if _, err := s.Job(ctx, id); !errors.Is(err, queue.ErrNotFound) {
			t.Fatalf("queue.Job(%q) err %v, want queue.ErrNotFound", id, err)
		}
		if _, err := s.Cancel(ctx, id); !errors.Is(err, queue.ErrNotFound) {
			t.Fatalf("Cancel(%q) err %v, want queue.ErrNotFound", id, err)
		}
	}
	c, err := s.Cancel(ctx, b.Job.ID)
	if err != nil || c.State != queue.StateCancelled {
		t.Fatalf("cancel: %+v %v", c, err)
	}
	var se *queue.StateError
	if _, err := s.Cancel(ctx, b.Job.ID); !errors.As(err, &se) || se.State != queue.StateCancelled {
		t.Fatalf("second cancel: %v", err)
	}
	st, _ := s.Tenant(ctx, "acme")
	if st.QueueDepth != 1 || st.Cancelled != 1 {
		t.Fatalf("status after cancel %+v", st)
	}
}

func testCancellingTheLastJobGivesItsPlaceBack(t *testing.T, d Driver) {
	_, s := d.start(t, Leaky20(2))
	ctx := context.Background()
	ids := EnqueueN(t, s, "acme", 3) // one at once, two waiting: full
	if a := EnqueueOne(t, s, "acme", Payload(9)); a.Rejected == nil {
		t.Fatal("admitted past capacity")
	}
	if _, err := s.Cancel(ctx, ids[2]); err != nil {
		t.Fatal(err)
	}
	a := EnqueueOne(t, s, "acme", Payload(10))
	if a.Rejected != nil || !a.Job.DispatchAt.Equal(T0.Add(2*T)) {
		t.Fatalf("after cancelling the last job: %+v (want its slot %v)", a, 2*T)
	}
	// A job cancelled in the middle leaves its slot empty: the rest keep theirs.
	if _, err := s.Cancel(ctx, ids[1]); err != nil {
		t.Fatal(err)
	}
	if a := EnqueueOne(t, s, "acme", Payload(11)); a.Rejected == nil {
		t.Fatal("a middle cancellation moved the schedule")
	}
}

func testTenantsDeepestFirst(t *testing.T, d Driver) {
	_, s := d.start(t, Leaky20(100))
	for tenant, n := range map[string]int{"a": 1, "b": 3, "c": 2} {
		for i := 0; i < n; i++ {
			EnqueueOne(t, s, tenant, Payload(i))
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
}

// After a reload shrank the bucket below a job's cost: a repeat of the
// key that admitted it is answered as its first use (the job is still
// sent: a 422 would tell the caller to give up on a job that goes), a new
// job of that cost is refused for good, and so is a Retry of such a job
// that failed (a 429 would invite it back for ever). Found by the model
// test (RepeatCost, RetryCost).
func testCostAfterAReload(t *testing.T, d Driver) {
	var capacity atomic.Int64
	capacity.Store(5)
	clk, s := d.start(t, func(string) leaky.Policy {
		return leaky.Policy{Interval: 100 * time.Millisecond, Burst: 1, Capacity: int(capacity.Load())}
	})
	ctx := context.Background()
	big := queue.NewJob{Payload: json.RawMessage(`1`), Cost: 3, IdempotencyKey: "k-big"}
	first := EnqueueOne(t, s, "acme", big)
	failing := EnqueueOne(t, s, "acme", queue.NewJob{Payload: json.RawMessage(`2`), Cost: 2})
	if !first.Admitted() || !failing.Admitted() {
		t.Fatalf("under capacity 5: %+v / %+v", first, failing)
	}
	got, stop := HandOver(t, s, clk, 10*time.Millisecond, 10, func(ctx context.Context, j queue.Job) queue.Outcome {
		if j.ID == failing.Job.ID {
			return queue.Outcome{Result: queue.Failed, Status: 400, Error: "400 Bad Request: no"}
		}
		return queue.Outcome{Result: queue.Succeeded, Status: 200}
	})
	WaitHanded(t, clk, got, 5*time.Millisecond)
	WaitHanded(t, clk, got, 5*time.Millisecond)
	WaitState(t, s, failing.Job.ID, queue.StateFailed)
	stop()

	capacity.Store(0) // the largest cost is now 1
	again := EnqueueOne(t, s, "acme", big)
	if !again.Duplicate || again.Job.ID != first.Job.ID || again.ExpectedDelay != first.ExpectedDelay {
		t.Fatalf("repeat of an admitted key after the reload: %+v, want the first answer %+v", again, first)
	}
	other := EnqueueOne(t, s, "acme", queue.NewJob{Payload: json.RawMessage(`3`), Cost: 3, IdempotencyKey: "k-new"})
	if other.Impossible == nil || other.Impossible.Reason != queue.ReasonCostTooLarge || other.Impossible.MaxCost != 1 {
		t.Fatalf("a new key of cost 3 after the reload: %+v, want 422 cost_too_large (at most 1)", other)
	}
	retried, err := s.Retry(ctx, failing.Job.ID)
	if err != nil || retried.Impossible == nil || retried.Impossible.Reason != queue.ReasonCostTooLarge || retried.Impossible.MaxCost != 1 {
		t.Fatalf("retry of a failed cost-2 job after the reload: %+v %v, want 422 cost_too_large (at most 1)", retried, err)
	}
}
