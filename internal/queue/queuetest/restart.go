package queuetest

import (
	"context"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/queue"
)

// Restart: jobs kept, overdue ones spaced.

func testRestartKeepsJobsAndSpacesOverdueOnes(t *testing.T, d Driver) {
	clk, s, reopen := d.startWith(t, Config{Policy: Leaky20(10)})
	if !d.RestartRespaces {
		// Many processes share such a store: none of them restarting
		// means the rest stopped.
		t.Skip("a shared store has no restart of its own")
	}
	ids := EnqueueN(t, s, "acme", 6)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Hour) // every slot passed while stopped
	s = reopen()
	st, err := s.Tenant(context.Background(), "acme")
	if err != nil || st.QueueDepth != 6 || st.Accepted != 6 {
		t.Fatalf("after restart %+v %v", st, err)
	}
	restart := clk.Now()
	for i, id := range ids {
		j, err := s.Job(context.Background(), id)
		if err != nil || j.State != queue.StateQueued {
			t.Fatalf("job %d lost: %+v %v", i, j, err)
		}
		if want := restart.Add(time.Duration(i) * T); !j.DispatchAt.Equal(want) {
			t.Fatalf("job %d slot %v after restart, want %v", i, j.DispatchAt.Sub(restart), want.Sub(restart))
		}
	}
	// A new job queues behind them, and is told so.
	a := EnqueueOne(t, s, "acme", Payload(7))
	if a.Rejected != nil || a.ExpectedDelay != 6*T {
		t.Fatalf("new job after restart: %+v", a)
	}
}
