package queuetest

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/queue"
)

// Callbacks (DESIGN.md section 6b): the callback a job's end owes is
// written with its final state, taken for a lease at a time, and its
// attempts recorded, across a restart.

const hookURL = "https://app.example/hooks/throttler"

func testCallbacksOwedWithTheFinalState(t *testing.T, d Driver) {
	clk, s0, reopen := d.startWith(t, Config{Policy: Leaky20(10)})
	ctx := context.Background()
	all := &queue.JobCallback{URL: hookURL}
	onSuccess := &queue.JobCallback{URL: hookURL, On: []queue.JobState{queue.StateSucceeded}}
	ids := map[string]string{}
	for _, c := range []struct {
		name string
		cb   *queue.JobCallback
	}{{"ok", all}, {"declined", onSuccess}, {"plain", nil}, {"cancelled", all}} {
		nj := Payload(len(ids))
		nj.Callback = c.cb
		a := EnqueueOne(t, s0, "acme", nj)
		if !a.Admitted() {
			t.Fatalf("%s: %+v", c.name, a)
		}
		ids[c.name] = a.Job.ID
		j, err := s0.Job(ctx, a.Job.ID)
		if err != nil || (c.cb == nil) != (j.Callback == nil) || (c.cb != nil && (j.Callback.URL != hookURL || !slices.Equal(j.Callback.On, c.cb.On))) || j.CallbackStatus != nil {
			t.Fatalf("%s waiting: callback %+v status %+v (%v), want %+v and none owed yet", c.name, j.Callback, j.CallbackStatus, err, c.cb)
		}
	}
	if _, err := s0.Cancel(ctx, ids["cancelled"]); err != nil {
		t.Fatal(err)
	}
	outcome := map[string]queue.Handler{ids["ok"]: Succeed(clk), ids["plain"]: Succeed(clk), ids["declined"]: func(context.Context, queue.Job) queue.Outcome {
		return queue.Outcome{Result: queue.Failed, Status: 402, SentAt: clk.Now(), Error: "402 declined"}
	}}
	got, stop := HandOver(t, s0, clk, 10*time.Millisecond, 10, func(ctx context.Context, j queue.Job) queue.Outcome { return outcome[j.ID](ctx, j) })
	for range 3 {
		WaitHanded(t, clk, got, 5*time.Millisecond)
	}
	WaitState(t, s0, ids["ok"], queue.StateSucceeded)
	WaitState(t, s0, ids["declined"], queue.StateFailed)
	WaitState(t, s0, ids["plain"], queue.StateSucceeded)
	stop()
	checkCallbacksOwed(t, s0, reopen, clk, ids)
}

// checkDue checks a job handed over for its callback: its callback,
// pending, no payload, and its finish time, which names the end the
// callback tells (its webhook-id: callback.MessageID).
func checkDue(t *testing.T, j queue.Job) {
	t.Helper()
	if j.Callback == nil || j.Callback.URL != hookURL || j.CallbackStatus == nil || j.CallbackStatus.State != queue.CallbackPending || j.Payload != nil || j.FinishedAt.IsZero() {
		t.Fatalf("due %s: callback %+v status %+v payload %q finished %v, want its callback, pending, no payload, a finish time", j.ID, j.Callback, j.CallbackStatus, j.Payload, j.FinishedAt)
	}
}

// checkCallbacksOwed checks the callbacks that the ended jobs (ids) owe:
// kept across restarts, taken for a lease, retried and given up.
func checkCallbacksOwed(t *testing.T, s0 queue.Store, reopen func() queue.Store, clk interface {
	Now() time.Time
	Advance(time.Duration)
}, ids map[string]string) {
	ctx := context.Background()
	status := func(s queue.Store, name string) *queue.CallbackStatus {
		t.Helper()
		j, err := s.Job(ctx, ids[name])
		if err != nil {
			t.Fatal(err)
		}
		return j.CallbackStatus
	}
	want := func(s queue.Store, name, state string, attempts int, lastErr, when string) {
		t.Helper()
		st := status(s, name)
		if st == nil || st.State != state || st.Attempts != attempts || st.LastError != lastErr {
			t.Fatalf("%s %s: callback %+v, want %s after %d attempts (last error %q)", name, when, st, state, attempts, lastErr)
		}
	}
	want(s0, "ok", queue.CallbackPending, 0, "", "once ended")
	want(s0, "cancelled", queue.CallbackPending, 0, "", "once ended")
	for _, name := range []string{"declined", "plain"} { // failed is not in its callback_on; no callback
		if st := status(s0, name); st != nil {
			t.Fatalf("%s: callback %+v, want none owed", name, st)
		}
	}
	// Nothing is lost to a restart.
	if err := s0.Close(); err != nil {
		t.Fatal(err)
	}
	s := reopen()
	want(s, "ok", queue.CallbackPending, 0, "", "after a restart")

	const lease = time.Minute
	due := func(wantNames ...string) []queue.Job {
		t.Helper()
		jobs, err := s.DueCallbacks(ctx, 10, lease)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, j := range jobs {
			for name, id := range ids {
				if id == j.ID {
					names = append(names, name)
				}
			}
			checkDue(t, j)
		}
		slices.Sort(names)
		slices.Sort(wantNames)
		if !slices.Equal(names, wantNames) {
			t.Fatalf("due callbacks %v, want %v", names, wantNames)
		}
		return jobs
	}
	for _, j := range due("cancelled", "ok") {
		if j.ID == ids["ok"] && (j.State != queue.StateSucceeded || j.Response != nil && j.Response.Status != 200) {
			t.Fatalf("ok handed for its callback as %+v", j)
		}
	}
	due() // taken: none again within the lease
	clk.Advance(lease + time.Second)
	due("cancelled", "ok") // the lease ran out without a word: taken again

	if err := s.CallbackAttempted(ctx, ids["ok"], queue.CallbackAttempt{Delivered: true}); err != nil {
		t.Fatal(err)
	}
	want(s, "ok", queue.CallbackDelivered, 1, "", "delivered")
	if err := s.CallbackAttempted(ctx, ids["cancelled"], queue.CallbackAttempt{Error: "the receiver answered 503", Retry: clk.Now().Add(10 * time.Second)}); err != nil {
		t.Fatal(err)
	}
	want(s, "cancelled", queue.CallbackPending, 1, "the receiver answered 503", "after a failed attempt")
	due()
	clk.Advance(10 * time.Second)
	jobs := due("cancelled")
	if jobs[0].CallbackStatus.Attempts != 1 {
		t.Fatalf("due again with %+v, want 1 attempt", jobs[0].CallbackStatus)
	}
	if err := s.CallbackAttempted(ctx, ids["cancelled"], queue.CallbackAttempt{Error: "no answer: connection refused"}); err != nil {
		t.Fatal(err)
	}
	want(s, "cancelled", queue.CallbackFailed, 2, "no answer: connection refused", "given up")
	// A late word on a callback no longer pending changes nothing.
	if err := s.CallbackAttempted(ctx, ids["ok"], queue.CallbackAttempt{Error: "late"}); err != nil {
		t.Fatal(err)
	}
	want(s, "ok", queue.CallbackDelivered, 1, "", "after a late word")
	clk.Advance(time.Hour)
	due()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = reopen()
	want(s, "ok", queue.CallbackDelivered, 1, "", "after another restart")
	want(s, "cancelled", queue.CallbackFailed, 2, "no answer: connection refused", "after another restart")
}
