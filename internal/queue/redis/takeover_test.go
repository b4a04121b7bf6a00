package redis

import (
	"context"
	"testing"
	"time"

	"throttler/internal/clock"
	"throttler/internal/queue"
	"throttler/internal/queue/queuetest"
	"throttler/internal/queue/redis/owner"
)

// A partition taken over after its jobs' time passed unsent (its owner cut
// off from Redis, or killed) has each such tenant's schedule moved past
// them: a job admitted after the takeover is promised when the new owner
// will send it, behind the backlog, and not the slot the backlog already
// holds (issue 14's faults between worker and Redis: before, a job
// admitted a second after a 3 s cut was promised 40 ms and waited 1.1 s).
func TestTakeoverMovesTheScheduleOfJobsOverdue(t *testing.T) {
	rdb := redisClient(t, 8)
	clk := clock.NewFake(time.Unix(1_800_000_000, 0))
	s := openFake(t, rdb, clk, queuetest.Leaky20(50), nil)
	ctx := context.Background()
	admit := func(n int) queue.Admission {
		t.Helper()
		out, err := s.Enqueue(ctx, "acme", []queue.NewJob{queuetest.Payload(n)})
		if err != nil || !out[0].Admitted() {
			t.Fatalf("job %d: %+v %v", n, out, err)
		}
		return out[0]
	}
	for i := range 5 {
		admit(i) // due at 0, T, ... 4T
	}
	clk.Advance(3 * time.Second) // and nobody sent them

	p := s.partOf("acme")
	f := owner.Fence{Partition: p, Worker: "next-owner", Epoch: 1}
	if err := rdb.Set(ctx, f.Key(), f.Token(), 0).Err(); err != nil {
		t.Fatal(err)
	}
	if _, _, tenants, err := s.takeOver(ctx, f, keysOf(p)); err != nil || len(tenants) != 1 || len(tenants[0].Waiting) != 5 {
		t.Fatalf("takeover: %+v %v", tenants, err)
	}
	// The five go from now, one interval apart; the next after them.
	if got, want := admit(5).ExpectedDelay, 5*queuetest.T; got != want {
		t.Fatalf("a job admitted after the takeover is promised %v, want %v (behind the five overdue)", got, want)
	}
	// A second takeover moves nothing more: the schedule is already past
	// the jobs.
	f.Epoch++
	if err := rdb.Set(ctx, f.Key(), f.Token(), 0).Err(); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := s.takeOver(ctx, f, keysOf(p)); err != nil {
		t.Fatal(err)
	}
	if got, want := admit(6).ExpectedDelay, 6*queuetest.T; got != want {
		t.Fatalf("after a second takeover: promised %v, want %v", got, want)
	}
}
