package bolt

import (
	"context"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/queue/queuetest"
)

// Forgetting an idle tenant is invisible to its admissions: a tenant
// reloaded in the process that sent its last job decides as if it had
// stayed in memory (its burst credit is whole again), not as after a
// restart, when the sends before it may have used that credit.
func TestEvictionKeepsBurstCredit(t *testing.T) {
	t.Parallel()
	for _, evict := range []bool{false, true} {
		clk := clock.NewFake(queuetest.T0)
		burst2 := func(string) leaky.Policy {
			return leaky.Policy{Interval: queuetest.T, Burst: 2, Capacity: 5}
		}
		s := newBackend(t)(t, queuetest.Config{Clock: clk, Policy: burst2}).(*Store)
		clk.Advance(time.Millisecond) // a send after the open is this process's
		queuetest.EnqueueOne(t, s, "acme", queuetest.Payload(0))
		got := make(chan queuetest.Handed, 1)
		stop := queuetest.Consume(t, s, 10*time.Millisecond, func(ctx context.Context, j queue.Job) queue.Outcome {
			got <- queuetest.Handed{Job: j, At: clk.Now()}
			return queue.Outcome{Result: queue.Succeeded, Status: 200, SentAt: clk.Now()}
		})
		queuetest.WaitHanded(t, clk, got, time.Millisecond)
		stop()
		clk.Advance(queuetest.T) // the schedule has run out: quiet
		if evict {
			if err := s.flushDirty(); err != nil {
				t.Fatal(err)
			}
			s.evictIdle()
		}
		out, err := s.Enqueue(context.Background(), "acme", []queue.NewJob{queuetest.Payload(1), queuetest.Payload(2)})
		if err != nil {
			t.Fatal(err)
		}
		for i, a := range out {
			if a.Rejected != nil || !a.Job.Prompt {
				t.Errorf("evicted %v: job %d of a burst of 2 after a quiet spell not sent at once: %+v", evict, i, a)
			}
		}
	}
}
