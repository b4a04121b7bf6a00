package dispatch

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/queue"
)

// handlerDispatcher is a dispatcher whose one route is the Go handler call.
func handlerDispatcher(t *testing.T, f func(ctx context.Context, _ string, j queue.Job) Reply, timeout time.Duration) *Dispatcher {
	t.Helper()
	call := func(ctx context.Context, ds string, j queue.Job) func(time.Time) Reply {
		return func(time.Time) Reply { return f(ctx, ds, j) }
	}
	r := Route{Downstream: "h", Call: call, Timeout: timeout, MaxAttempts: 3,
		Policy: leaky.Policy{Interval: 20 * time.Millisecond, Burst: 1, Capacity: 10}}
	return New(Options{Routes: func(string) Route { return r }})
}

// A handler's reply decides as an answer would: each result gives the
// outcome and class of its HTTP twin, and the call's start is SentAt.
func TestHandlerRepliesDecideLikeAnswers(t *testing.T) {
	t.Parallel()
	cases := []struct {
		reply  Reply
		result queue.Result
		class  string
	}{
		{Reply{Result: queue.Succeeded, Body: []byte("ok")}, queue.Succeeded, "2xx"},
		{Reply{Result: queue.Retry, Error: "vendor down"}, queue.Retry, "5xx"},
		{Reply{Result: queue.Retry, Pushback: true, After: time.Hour, Error: "slow down"}, queue.Retry, "429"},
		{Reply{Result: queue.Failed, Error: "bad number"}, queue.Failed, "4xx"},
		{Reply{Result: queue.Cancelled, Error: "revoked"}, queue.Cancelled, "4xx"},
		{Reply{Error: "no result"}, queue.Retry, "5xx"},
	}
	for _, c := range cases {
		var gotCtx context.Context
		var started time.Time
		d := handlerDispatcher(t, func(ctx context.Context, _ string, j queue.Job) Reply {
			started, gotCtx = time.Now(), ctx
			return c.reply
		}, time.Second)
		o, class := d.attempt(context.Background(), job(jobID, 1, time.Now()))
		if o.Result != c.result || class != c.class {
			t.Fatalf("%+v: %v %q, want %v %q", c.reply, o.Result, class, c.result, c.class)
		}
		if o.SentAt.IsZero() || started.Before(o.SentAt) || started.Sub(o.SentAt) > 50*time.Millisecond {
			t.Fatalf("%+v: SentAt %v, the handler started at %v", c.reply, o.SentAt, started)
		}
		if dl, ok := gotCtx.Deadline(); !ok || dl.Sub(o.SentAt) > time.Second+50*time.Millisecond {
			t.Fatalf("the handler's context has deadline %v %v, want one the timeout after its start", dl, ok)
		}
		if c.reply.Pushback && (o.PauseUntil.Sub(o.SentAt) < 59*time.Minute || o.Error != "slow down") {
			t.Fatalf("pushback: %+v, want the tenant paused an hour", o)
		}
		if c.reply.Result == queue.Succeeded && (o.Response == nil || o.Response.Body != "ok") {
			t.Fatalf("the bytes returned are not kept: %+v", o.Response)
		}
	}
}

// A handler that does not return within the timeout is a timeout, retried;
// its context ends then. A panic is a failure, retried.
func TestHandlerTimeoutAndPanic(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	defer close(release)
	d := handlerDispatcher(t, func(ctx context.Context, _ string, j queue.Job) Reply {
		<-release // ignores its context
		return Reply{Result: queue.Succeeded}
	}, 50*time.Millisecond)
	o, class := d.attempt(context.Background(), job(jobID, 1, time.Now()))
	if o.Result != queue.Retry || class != "timeout" || !strings.Contains(o.Error, "did not return") {
		t.Fatalf("a handler past its timeout: %+v %q", o, class)
	}
	d = handlerDispatcher(t, func(ctx context.Context, _ string, j queue.Job) Reply { panic("boom") }, time.Second)
	o, class = d.attempt(context.Background(), job(jobID, 1, time.Now()))
	if o.Result != queue.Retry || class != "5xx" || !strings.Contains(o.Error, "panicked: boom") {
		t.Fatalf("a panicking handler: %+v %q", o, class)
	}
}

// Sends to a handler pass the gate: one tenant's calls start one interval
// apart even when they are all due at once, and a stop while waiting
// calls nothing.
func TestHandlerCallsArePaced(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var starts []time.Time
	d := handlerDispatcher(t, func(ctx context.Context, _ string, j queue.Job) Reply {
		now := time.Now()
		mu.Lock()
		starts = append(starts, now)
		mu.Unlock()
		return Reply{Result: queue.Succeeded}
	}, time.Second)
	now := time.Now()
	var wg sync.WaitGroup
	for i := range 10 {
		wg.Go(func() { d.Handle(context.Background(), job(jobID+string(rune('a'+i)), 1, now)) })
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	slices.SortFunc(starts, time.Time.Compare)
	for i := 1; i < len(starts); i++ {
		if gap := starts[i].Sub(starts[i-1]); gap < 18*time.Millisecond {
			t.Fatalf("calls %d and %d started %v apart, want at least 20ms - 2ms", i-1, i, gap)
		}
	}
	stop, cancel := context.WithCancel(context.Background())
	d.gate.Hold(tenantKey("acme"), time.Now().Add(time.Hour)) // it would wait an hour
	cancel()
	called := len(starts)
	mu.Unlock()
	o := d.Handle(stop, job("stopped", 1, time.Now()))
	mu.Lock()
	if o.Result != queue.Released || len(starts) != called {
		t.Fatalf("a stop before the slot: %+v, %d calls (want Released and none)", o, len(starts)-called)
	}
}

// A wait at the gate is never part of the handler's timeout: a job that
// waits longer than the timeout for its turn is called, and succeeds.
func TestHandlerTimeoutStandsStillAtTheGate(t *testing.T) {
	t.Parallel()
	call := func(ctx context.Context, _ string, j queue.Job) func(time.Time) Reply {
		return func(time.Time) Reply { return Reply{Result: queue.Succeeded} }
	}
	r := Route{Downstream: "h", Call: call, Timeout: 50 * time.Millisecond, MaxAttempts: 3,
		Policy: leaky.Policy{Interval: 200 * time.Millisecond, Burst: 1, Capacity: 10}}
	d := New(Options{Routes: func(string) Route { return r }})
	now := time.Now()
	var wg sync.WaitGroup
	outs := make([]queue.Outcome, 2)
	for i := range outs {
		wg.Go(func() { outs[i] = d.Handle(context.Background(), job(jobID+string(rune('a'+i)), 1, now)) })
	}
	wg.Wait()
	for i, o := range outs {
		if o.Result != queue.Succeeded {
			t.Fatalf("job %d: %+v, want succeeded after its wait at the gate", i, o)
		}
	}
}
