package queuetest

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/queue"
)

// Consume: hand-over at the slot, outcomes, retries.

func testConsumeDeliversAtSlotsInOrder(t *testing.T, d Driver) {
	clk, s := d.start(t, Leaky20(10))
	ids := EnqueueN(t, s, "acme", 5)
	cancelled := EnqueueOne(t, s, "acme", Payload(99)).Job.ID
	if _, err := s.Cancel(context.Background(), cancelled); err != nil {
		t.Fatal(err)
	}
	lead := 20 * time.Millisecond
	got, stop := HandOver(t, s, clk, lead, 10, SucceedOnTime)
	for i, id := range ids {
		h := WaitHanded(t, clk, got, 5*time.Millisecond)
		if h.Job.ID != id || h.Job.Attempts != 1 || h.Job.State != queue.StateDispatching {
			t.Fatalf("Handed %d: %+v, want %s attempt 1", i, h.Job, id)
		}
		if early := h.Job.DispatchAt.Sub(h.At); early < 0 || early > lead {
			t.Fatalf("job %d Handed %v before its slot, want within the lead %v", i, early, lead)
		}
	}
	stop()
	for _, id := range ids {
		if j, _ := s.Job(context.Background(), id); j.State != queue.StateSucceeded || j.ResponseStatus != 200 || j.FinishedAt.IsZero() {
			t.Fatalf("job %s after delivery: %+v", id, j)
		}
	}
	st, _ := s.Tenant(context.Background(), "acme")
	if st.Delivered != 5 || st.QueueDepth != 0 || st.InFlight != 0 {
		t.Fatalf("status %+v", st)
	}
}

func testRetryFailAndRelease(t *testing.T, d Driver) {
	clk, s := d.start(t, Leaky20(10))
	ctx := context.Background()
	retry := EnqueueOne(t, s, "acme", Payload(1)).Job.ID
	fail := EnqueueOne(t, s, "acme", Payload(2)).Job.ID
	var mu sync.Mutex
	calls := map[string]int{}
	got, stop := HandOver(t, s, clk, 10*time.Millisecond, 10, func(ctx context.Context, j queue.Job) queue.Outcome {
		mu.Lock()
		calls[j.ID]++
		n := calls[j.ID]
		mu.Unlock()
		switch {
		case j.ID == retry && n == 1:
			return queue.Outcome{Result: queue.Retry, Status: 502, Error: "bad gateway", NotBefore: clk.Now().Add(time.Second)}
		case j.ID == fail:
			return queue.Outcome{Result: queue.Failed, Status: 400, Error: "400 Bad Request: no"}
		}
		return queue.Outcome{Result: queue.Succeeded, Status: 200}
	})
	first := WaitHanded(t, clk, got, 5*time.Millisecond)
	second := WaitHanded(t, clk, got, 5*time.Millisecond)
	if first.Job.ID != retry || second.Job.ID != fail {
		t.Fatalf("order %s %s", first.Job.ID, second.Job.ID)
	}
	WaitState(t, s, retry, queue.StateRetrying)
	j, _ := s.Job(ctx, retry)
	if j.LastError != "bad gateway" || j.ResponseStatus != 502 || j.DispatchAt.Before(first.At.Add(time.Second)) {
		t.Fatalf("retrying job %+v", j)
	}
	third := WaitHanded(t, clk, got, 20*time.Millisecond)
	if third.Job.ID != retry || third.Job.Attempts != 2 || third.At.Before(first.At.Add(time.Second-10*time.Millisecond)) {
		t.Fatalf("retry Handed %+v at %v", third.Job, third.At.Sub(first.At))
	}
	stop()
	if j, _ := s.Job(ctx, fail); j.State != queue.StateFailed || j.ResponseStatus != 400 || j.LastError == "" {
		t.Fatalf("failed job %+v", j)
	}
	if j, _ := s.Job(ctx, retry); j.State != queue.StateSucceeded || j.Attempts != 2 || j.LastError != "" {
		t.Fatalf("retried job %+v", j)
	}
	st, _ := s.Tenant(ctx, "acme")
	if st.Delivered != 1 || st.Failed != 1 || st.QueueDepth != 0 {
		t.Fatalf("status %+v", st)
	}

	// queue.Released: nothing was sent, so the attempt does not count.
	// (A released job is handed over again and again: only the first
	// hand-over is told.)
	rel := EnqueueOne(t, s, "acme", Payload(3)).Job.ID
	released := make(chan Handed, 1)
	stop = Consume(t, s, 10*time.Millisecond, func(ctx context.Context, j queue.Job) queue.Outcome {
		select {
		case released <- Handed{Job: j, At: clk.Now()}:
		default:
		}
		return queue.Outcome{Result: queue.Released}
	})
	WaitHanded(t, clk, released, 5*time.Millisecond)
	stop()
	if j, _ := s.Job(ctx, rel); j.State != queue.StateQueued || j.Attempts != 0 {
		t.Fatalf("released job %+v", j)
	}
}

func testRetryBackoffDoesNotFillTheQueue(t *testing.T, d Driver) {
	clk, s := d.start(t, Leaky20(3))
	ctx := context.Background()
	id := EnqueueOne(t, s, "acme", Payload(1)).Job.ID
	got, stop := HandOver(t, s, clk, 10*time.Millisecond, 10, func(ctx context.Context, j queue.Job) queue.Outcome {
		return queue.Outcome{Result: queue.Retry, Status: 503, Error: "busy", NotBefore: clk.Now().Add(10 * time.Second)}
	})
	WaitHanded(t, clk, got, time.Millisecond)
	WaitState(t, s, id, queue.StateRetrying)
	stop()
	j, _ := s.Job(ctx, id)
	if j.DispatchAt.Before(T0.Add(10 * time.Second)) {
		t.Fatalf("retry due at %v, before its backoff", j.DispatchAt.Sub(T0))
	}
	// The retry took one place of three; two more fit, not three.
	for i := 0; i < 2; i++ {
		if a := EnqueueOne(t, s, "acme", Payload(i)); a.Rejected != nil {
			t.Fatalf("job %d refused while one job waits out a 10s backoff: %+v", i, a.Rejected)
		}
	}
	if a := EnqueueOne(t, s, "acme", Payload(9)); a.Rejected == nil {
		t.Fatal("a fourth waiting job admitted at capacity 3")
	}
	st, _ := s.Tenant(ctx, "acme")
	if st.QueueDepth != 3 {
		t.Fatalf("depth %d, want 3 (a retrying job counts)", st.QueueDepth)
	}
}

func testFailedJobsListedAndRetried(t *testing.T, d Driver) {
	clk, s := d.start(t, Leaky20(1))
	ctx := context.Background()
	id := EnqueueOne(t, s, "acme", Payload(1)).Job.ID
	other := EnqueueOne(t, s, "other", Payload(2)).Job.ID
	var fail atomic.Bool
	fail.Store(true)
	got, stop := HandOver(t, s, clk, 10*time.Millisecond, 10, func(ctx context.Context, j queue.Job) queue.Outcome {
		if fail.Load() {
			return queue.Outcome{Result: queue.Failed, Status: 400, Error: "400 Bad Request: invalid number", SentAt: clk.Now()}
		}
		return queue.Outcome{Result: queue.Succeeded, Status: 200, SentAt: clk.Now()}
	})
	WaitHanded(t, clk, got, time.Millisecond)
	WaitHanded(t, clk, got, time.Millisecond)
	WaitState(t, s, id, queue.StateFailed)
	WaitState(t, s, other, queue.StateFailed)
	list, err := s.Failed(ctx, "acme", 10)
	if err != nil || len(list) != 1 || list[0].ID != id || list[0].LastError == "" || list[0].ResponseStatus != 400 {
		t.Fatalf("failed list %+v %v", list, err)
	}
	// Only failed jobs can be retried.
	EnqueueOne(t, s, "third", Payload(3))
	waiting := EnqueueOne(t, s, "third", Payload(4)).Job.ID // due an interval later
	var se *queue.StateError
	if _, err := s.Retry(ctx, waiting); !errors.As(err, &se) || se.State != queue.StateQueued {
		t.Fatalf("retry of a waiting job: %v", err)
	}
	if _, err := s.Cancel(ctx, waiting); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Retry(ctx, waiting); !errors.As(err, &se) || se.State != queue.StateCancelled {
		t.Fatalf("retry of a cancelled job: %v", err)
	}
	if _, err := s.Retry(ctx, queue.NewID(T0)); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("retry of an unknown job: %v", err)
	}
	fail.Store(false)
	if st, _ := s.Tenant(ctx, "acme"); st.Failed != 1 || st.Accepted != 1 {
		t.Fatalf("before the retry: %+v, want 1 accepted, 1 failed", st)
	}
	a, err := s.Retry(ctx, id)
	if err != nil || a.Rejected != nil || a.Job.State != queue.StateQueued || a.Job.Attempts != 0 {
		t.Fatalf("retry: %+v %v", a, err)
	}
	if list, _ := s.Failed(ctx, "acme", 10); len(list) != 0 {
		t.Fatalf("still listed as failed: %+v", list)
	}
	// It waits again: no longer failed, and still the one job accepted.
	if st, _ := s.Tenant(ctx, "acme"); st.Failed != 0 || st.Accepted != 1 || st.QueueDepth != 1 {
		t.Fatalf("after the retry: %+v, want 1 accepted, 0 failed, 1 waiting", st)
	}
	for h := WaitHanded(t, clk, got, time.Millisecond); h.Job.ID != id; h = WaitHanded(t, clk, got, time.Millisecond) {
	}
	WaitState(t, s, id, queue.StateSucceeded)
	stop()
	if j, _ := s.Job(ctx, id); j.Attempts != 1 || j.ResponseStatus != 200 {
		t.Fatalf("after the retry: %+v", j)
	}
	if st, _ := s.Tenant(ctx, "acme"); st.Failed != 0 || st.Delivered != 1 {
		t.Fatalf("delivered after the retry: %+v, want 0 failed, 1 delivered", st)
	}
	if _, err := s.Retry(ctx, id); !errors.As(err, &se) || se.State != queue.StateSucceeded {
		t.Fatalf("retry of a succeeded job: %v", err)
	}
}
