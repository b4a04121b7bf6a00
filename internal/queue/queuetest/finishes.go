package queuetest

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/queue"
)

// A final state tells whoever watches its job (Store.WatchFinish: what
// GET /v1/jobs/{id}?wait answers by, rather than by its reread every
// second): a cancel, a success, a failure and an expiry each close their
// own job's watch, and no other's.
func testFinalStatesTellTheirWatchers(t *testing.T, d Driver) {
	clk, s := d.start(t, Leaky20(10))
	ctx := context.Background()
	ids := EnqueueN(t, s, "acme", 3) // slots 0, T, 2T
	succeeds, fails, cancelled := ids[0], ids[1], ids[2]
	expires := EnqueueOne(t, s, "acme", queue.NewJob{Payload: json.RawMessage(`3`), Deadline: T0.Add(3*T + T/2)}).Job.ID

	watches := map[string]<-chan struct{}{}
	for _, id := range []string{succeeds, fails, cancelled, expires} {
		ch, stop := s.WatchFinish(id)
		t.Cleanup(stop)
		watches[id] = ch
	}
	told := func(id string) bool {
		select {
		case <-watches[id]:
			return true
		default:
			return false
		}
	}
	// A notice from another process (Redis) arrives a moment after the
	// write: a deadline, not a speed.
	awaitTold := func(id, what string) {
		t.Helper()
		select {
		case <-watches[id]:
		case <-time.After(10 * time.Second):
			t.Fatalf("job %s %s: its watch not told within 10s", id, what)
		}
	}

	if _, err := s.Cancel(ctx, cancelled); err != nil {
		t.Fatal(err)
	}
	awaitTold(cancelled, "cancelled")
	for _, id := range []string{succeeds, fails, expires} {
		if told(id) {
			t.Fatalf("a cancel of %s told the watch of %s, still waiting", cancelled, id)
		}
	}

	// The first job is pushed back for a second: the expiring job's slot
	// moves past its deadline.
	pushBack := PushBackOnce(clk, func(now time.Time) time.Time { return now.Add(time.Second) })
	got, stop := HandOver(t, s, clk, 10*time.Millisecond, 10, func(ctx context.Context, j queue.Job) queue.Outcome {
		switch j.ID {
		case succeeds:
			return pushBack(ctx, j)
		case fails:
			return queue.Outcome{Result: queue.Failed, Status: 400, SentAt: clk.Now(), Error: "400 bad number"}
		}
		return queue.Outcome{Result: queue.Succeeded, Status: 200, SentAt: clk.Now()}
	})
	defer stop()
	for range 3 { // the first job twice, the second
		if h := WaitHanded(t, clk, got, 10*time.Millisecond); h.Job.ID == expires {
			t.Fatalf("job %s handed over past its deadline", expires)
		}
	}
	for _, c := range []struct {
		id    string
		state queue.JobState
	}{{succeeds, queue.StateSucceeded}, {fails, queue.StateFailed}, {expires, queue.StateExpired}} {
		WaitState(t, s, c.id, c.state)
		awaitTold(c.id, string(c.state))
	}
}
