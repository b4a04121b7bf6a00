package queuetest

import (
	"context"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/leaky"
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

// A backlog longer than a window's N, across a stop: 12 jobs at 10/s with
// a window of 3 per second go in four groups of three, one a second; the
// first group is sent, and the process stops for the second's time. After
// the restart every job left goes 300 ms after its old dispatch time (the
// stop), the window holding; not a window past the backlog's end, which
// is where the window's list of sends to come would put them.
func testRestartMovesALongBacklogInAWindowByTheStop(t *testing.T, d Driver) {
	w, _ := leaky.ParseWindow("3/1s")
	clk, s, reopen := d.startWith(t, Config{Policy: func(string) leaky.Policy {
		return leaky.Policy{Interval: T, Burst: 1, Capacity: 20, Windows: []leaky.Window{w}}
	}})
	if !d.RestartRespaces {
		t.Skip("a shared store has no restart of its own")
	}
	ids := EnqueueN(t, s, "acme", 12)
	due := map[string]time.Time{}
	for i, id := range ids {
		j, err := s.Job(context.Background(), id)
		want := T0.Add(time.Duration(i/3)*time.Second + time.Duration(i%3)*T)
		if err != nil || !j.DispatchAt.Equal(want) {
			t.Fatalf("job %d due T0+%v (%v), want T0+%v", i, j.DispatchAt.Sub(T0), err, want.Sub(T0))
		}
		due[id] = j.DispatchAt
	}
	got, stop := HandOver(t, s, clk, 10*time.Millisecond, 10, SucceedOnTime)
	for range 3 {
		WaitHanded(t, clk, got, 50*time.Millisecond)
	}
	for _, id := range ids[:3] {
		WaitState(t, s, id, queue.StateSucceeded)
	}
	stop()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	clk.Advance(T0.Add(1300 * time.Millisecond).Sub(clk.Now()))
	s = reopen()
	for i, id := range ids[3:] {
		j, err := s.Job(context.Background(), id)
		if want := due[id].Add(300 * time.Millisecond); err != nil || !j.DispatchAt.Equal(want) {
			t.Errorf("job %d due T0+%v after the restart (%v), want T0+%v", i+3, j.DispatchAt.Sub(T0), err, want.Sub(T0))
		}
	}
}
