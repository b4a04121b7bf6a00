package bolt

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/queue/queuetest"
)

// A restart after a crash counts a send with no outcome recorded in its
// tenant's windows at the latest moment it may have been written: the end
// of the lease on sending, when the restart comes after it (a crash, then
// half an hour of outage). The three jobs of a window of 3 per hour were due
// before the lease ended, so they may all have gone by then: their resends
// wait an hour from the lease's end. Counted at their slots they would go
// 10 s sooner, and counted at the restart, 30 minutes later, for sends
// that cannot have come then.
func TestRestartCountsUnrecordedSendsByTheLease(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(queuetest.T0)
	p := leaky.Policy{Interval: time.Second, Burst: 1, Capacity: 10, Windows: []leaky.Window{{N: 3, Length: time.Hour}}}
	openAt := func(path string) *Store {
		s, err := open(path, Options{Clock: clk, Policy: func(string) leaky.Policy { return p }}, testHooks{logIdle: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	s := openAt(filepath.Join(t.TempDir(), "live.db"))
	var ids []string
	for i := range 3 { // slots T0, T0+1s, T0+2s
		ids = append(ids, queuetest.EnqueueOne(t, s, "acme", queuetest.Payload(i)).Job.ID)
	}
	s.keepSendLease() // as the dispatcher does before it hands them over
	leaseEnd := queuetest.T0.Add(sendLeaseFor)
	clk.Set(queuetest.T0.Add(3 * time.Second))
	crashed := crashCopy(t, s)
	clk.Set(queuetest.T0.Add(30 * time.Minute)) // restarted after half an hour
	r := openAt(crashed)
	for i, id := range ids {
		j, err := r.Job(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		// The first resend: the oldest of the 3 sends counted (at the
		// lease's end) plus the window; the rest one interval apart.
		want := leaseEnd.Add(time.Hour + time.Duration(i)*time.Second)
		if i == 0 {
			want = leaseEnd.Add(time.Hour)
		}
		if !j.DispatchAt.Equal(want) {
			t.Errorf("job %d due at T0+%v after the restart, want T0+%v (the lease ended at T0+%v)", i, j.DispatchAt.Sub(queuetest.T0), want.Sub(queuetest.T0), sendLeaseFor)
		}
	}
}

// A job handed over may be written: the lease is renewed before it, however
// long the store was idle. One whose lease has ended may not.
func TestHandedOverJobsMaySend(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(queuetest.T0)
	s, err := open(filepath.Join(t.TempDir(), "t.db"), Options{Clock: clk, Policy: queuetest.Leaky20(10)}, testHooks{logIdle: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	clk.Set(queuetest.T0.Add(time.Hour)) // idle for longer than any lease
	queuetest.EnqueueOne(t, s, "acme", queuetest.Payload(1))
	got := make(chan bool, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.Consume(ctx, func(ctx context.Context, j queue.Job) queue.Outcome {
		got <- queue.MaySend(ctx)
		return queue.Outcome{Result: queue.Succeeded, Status: 200, SentAt: clk.Now()}
	}, queue.ConsumeOptions{})
	select {
	case may := <-got:
		if !may {
			t.Fatal("a job handed over after an idle hour may not be sent: the lease was not renewed first")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the job was not handed over")
	}
	s.sendsUntil.Store(clk.Now().UnixNano())
	if s.mayWrite() {
		t.Fatal("a send is allowed at the lease's end")
	}
}
