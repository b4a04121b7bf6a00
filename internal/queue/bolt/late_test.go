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

// Behind a send written late, the jobs still to go are those waiting and
// those handed over and not yet written: a job handed over whose request
// is written (Wrote) but whose outcome is still on its way (a busy
// machine records outcomes late) is not counted again. Three jobs go at
// once (burst 3, T = 1 s): the second is written and held unanswered, the
// third neither; the first's outcome says it was written 10 s late. A
// probe admitted then is promised the write plus two intervals (the first
// job's and the third's), not three.
func TestALateSendCountsOnlyTheJobsNotYetWritten(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(queuetest.T0)
	const T = time.Second
	policy := func(string) leaky.Policy { return leaky.Policy{Interval: T, Burst: 3, Capacity: 10} }
	s := newBackend(t)(t, queuetest.Config{Clock: clk, Policy: policy}).(*Store)
	var ids []string
	for i := range 3 {
		ids = append(ids, queuetest.EnqueueOne(t, s, "acme", queuetest.Payload(i)).Job.ID)
	}
	lateWrite := queuetest.T0.Add(10 * time.Second)
	held, handed := make(chan struct{}), make(chan queuetest.Handed, 3)
	queuetest.Consume(t, s, 10*time.Millisecond, func(ctx context.Context, j queue.Job) queue.Outcome {
		handed <- queuetest.Handed{Job: j, At: clk.Now()}
		switch j.ID {
		case ids[0]:
			<-held // answered once all three are handed over
			return queue.Outcome{Result: queue.Succeeded, Status: 200, SentAt: lateWrite}
		case ids[1]:
			s.Wrote(j)
		}
		<-ctx.Done()
		return queue.Outcome{Result: queue.Released}
	})
	for range 3 {
		queuetest.WaitHanded(t, clk, handed, time.Millisecond)
	}
	queuetest.WaitFor(t, func() bool { s.mu.Lock(); defer s.mu.Unlock(); return s.written[ids[1]] })
	close(held)
	queuetest.WaitFor(t, func() bool { st, _ := s.Tenant(context.Background(), "acme"); return st.Delivered == 1 })
	clk.Set(lateWrite)
	a := queuetest.EnqueueOne(t, s, "acme", queuetest.Payload(9))
	if want := 2 * T; a.Rejected != nil || a.ExpectedDelay != want {
		t.Fatalf("the probe is promised %v (%+v), want %v: the write plus the first job's interval and the unwritten third's", a.ExpectedDelay, a.Rejected, want)
	}
}
