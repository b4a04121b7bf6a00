package queuetest

import (
	"context"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/queue"
)

// Go handlers (DESIGN.md section 6d): a job's type is kept with it and
// handed over; an attempt whose handler says the job is not to be done
// (queue.Cancelled) ends it cancelled, counted so, across a restart.

func testTypesAndHandlerCancels(t *testing.T, d Driver) {
	clk, s, reopen := d.startWith(t, Config{Policy: Leaky20(10)})
	ctx := context.Background()
	typed := Payload(1)
	typed.Type = "email:welcome"
	a := EnqueueOne(t, s, "acme", typed)
	b := EnqueueOne(t, s, "acme", Payload(2))
	if a.Job.Type != "email:welcome" || b.Job.Type != "" {
		t.Fatalf("admitted with types %q and %q, want email:welcome and none", a.Job.Type, b.Job.Type)
	}
	if j, err := s.Job(ctx, a.Job.ID); err != nil || j.Type != "email:welcome" {
		t.Fatalf("waiting: type %q %v, want email:welcome", j.Type, err)
	}
	types := make(chan string, 2)
	got, stop := HandOver(t, s, clk, 10*time.Millisecond, 10, func(_ context.Context, j queue.Job) queue.Outcome {
		types <- j.Type
		if j.ID == a.Job.ID {
			return queue.Outcome{Result: queue.Cancelled, SentAt: clk.Now(), Error: "revoked by the handler"}
		}
		return queue.Outcome{Result: queue.Succeeded, SentAt: clk.Now()}
	})
	for range 2 {
		WaitHanded(t, clk, got, 5*time.Millisecond)
	}
	WaitState(t, s, a.Job.ID, queue.StateCancelled)
	WaitState(t, s, b.Job.ID, queue.StateSucceeded)
	stop()
	if first, second := <-types, <-types; first != "email:welcome" || second != "" {
		t.Fatalf("handed over with types %q, %q; want email:welcome, then none", first, second)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = reopen()
	j, err := s.Job(ctx, a.Job.ID)
	if err != nil || j.State != queue.StateCancelled || j.Type != "email:welcome" || j.LastError != "revoked by the handler" {
		t.Fatalf("after a restart: %+v %v, want it cancelled, its type and why kept", j, err)
	}
	st, err := s.Tenant(ctx, "acme")
	if err != nil || st.Cancelled != 1 || st.Delivered != 1 || st.QueueDepth != 0 || st.InFlight != 0 {
		t.Fatalf("tenant: %+v %v, want 1 cancelled, 1 delivered, none waiting", st, err)
	}
	if _, err := s.Cancel(ctx, a.Job.ID); err == nil {
		t.Fatal("a job the handler cancelled was cancelled again")
	}
}
