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

// An attempt written later than its claim's dispatch time (a loaded
// machine, a slow gate) moves its tenant's next to its real write plus an
// interval, and the next owner after a clean handover starts the tenant no
// earlier (issue 14's faults between worker and Redis: a partition handed
// over right after a cut had two sends 87 ms apart at T = 100 ms). Both
// ways of recording: the batch (finish.lua) and the rule (a retry).
func TestOutcomeMovesNextToTheRealWrite(t *testing.T) {
	for _, tc := range []struct {
		name string
		out  queue.Outcome
	}{
		{"succeeded", queue.Outcome{Result: queue.Succeeded, Status: 200}},
		{"retry", queue.Outcome{Result: queue.Retry, Status: 503, Error: "503"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rdb := redisClient(t, 8)
			clk := clock.NewFake(time.Unix(1_800_000_000, 0))
			s := openFake(t, rdb, clk, queuetest.Leaky20(50), nil)
			ctx := context.Background()
			var ids []string
			for i := range 2 {
				out, err := s.Enqueue(ctx, "acme", []queue.NewJob{queuetest.Payload(i)})
				if err != nil || !out[0].Admitted() {
					t.Fatalf("job %d: %+v %v", i, out, err)
				}
				ids = append(ids, out[0].Job.ID)
			}
			p := s.partOf("acme")
			k := keysOf(p)
			f := owner.Fence{Partition: p, Worker: "owner", Epoch: 1}
			if err := rdb.Set(ctx, f.Key(), f.Token(), 0).Err(); err != nil {
				t.Fatal(err)
			}
			r, err := s.claimBatch(ctx, f, k, []*entry{{at: clk.Now(), id: ids[0], tenant: "acme"}}, queue.DefaultLead)
			if err != nil || r.Jobs[0].Code != claimed {
				t.Fatalf("claim: %+v %v", r, err)
			}
			j := claimedJob(r.Jobs[0])
			o := tc.out
			o.SentAt = j.DispatchAt.Add(30 * time.Millisecond) // written late
			if tc.out.Result == queue.Succeeded {
				_, err = s.finishBatch(ctx, f, k, []queue.Job{j}, []queue.Outcome{o})
			} else {
				_, _, _, err = s.finishByRule(ctx, f, k, j, o)
			}
			if err != nil {
				t.Fatal(err)
			}

			f.Worker, f.Epoch = "next-owner", 2 // a clean handover
			if err := rdb.Set(ctx, f.Key(), f.Token(), 0).Err(); err != nil {
				t.Fatal(err)
			}
			_, _, tenants, err := s.takeOver(ctx, f, k)
			if err != nil || len(tenants) != 1 {
				t.Fatalf("takeover: %+v %v", tenants, err)
			}
			if got, want := tenants[0].Next, o.SentAt.Add(queuetest.T); !got.Equal(want) {
				t.Fatalf("the next owner may send from %v, want %v (the real write plus an interval; the claim's dispatch time was %v)",
					got.Sub(clk.Now()), want.Sub(clk.Now()), j.DispatchAt.Sub(clk.Now()))
			}
		})
	}
}
