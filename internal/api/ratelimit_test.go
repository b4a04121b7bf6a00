package api

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/clock"
	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/queue/bolt"
	"github.com/throttler-dev/throttler/internal/queue/queuetest"
	"github.com/throttler-dev/throttler/internal/testutil"
)

// The tenants of the RateLimit tests: a leaky queue, a token bucket, and
// one of each with a window.
const rateLimitConfig = `
[tenants.leaky]
rate = "1/s"
capacity = 3
[tenants.token]
mode = "token"
rate = "1/s"
burst = 3
[tenants.windowed]
rate = "10/s"
capacity = 5
windows = ["3/m"]
[tenants.windowed-token]
mode = "token"
rate = "10/s"
burst = 5
windows = ["3/m"]
`

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// step is one enqueue and the answer it must get: its status and its
// RateLimit field.
type step struct {
	advance time.Duration // the clock moves this much first
	status  int
	state   string
}

// runSteps enqueues a job for tenant at each step, and checks its answer
// and that the RateLimit-Policy field is policy.
func runSteps(t *testing.T, h http.Handler, clk *clock.Fake, tenant, policy string, steps []step) {
	t.Helper()
	for i, s := range steps {
		clk.Advance(s.advance)
		st, hdr, body := do(t, h, "POST", "/v1/tenants/"+tenant+"/jobs", fmt.Sprintf(`{"payload":%d}`, i))
		if st != s.status || hdr.Get("RateLimit-Policy") != policy || hdr.Get("RateLimit") != s.state {
			t.Errorf("%s job %d: %d\n  RateLimit-Policy: %s\n  RateLimit:        %s\nwant %d\n  RateLimit-Policy: %s\n  RateLimit:        %s\n%v",
				tenant, i+1, st, hdr.Get("RateLimit-Policy"), hdr.Get("RateLimit"), s.status, policy, s.state, body)
		}
	}
}

// Each tenant of rateLimitConfig, job after job on a fake clock: the
// status and the RateLimit fields each job gets.
func TestRateLimitSteps(t *testing.T) {
	for _, c := range []struct {
		name, tenant, policy string
		steps                []step
	}{
		// A leaky queue of capacity 3 at 1/s has 4 places (3 waiting, 1
		// going at once), all free again 4 s after a quiet spell; each job
		// takes one, and r is exactly how many more get in: the fifth is
		// refused.
		{"Leaky", "leaky", `"leaky";q=4;w=4`, []step{
			{0, 202, `"leaky";r=3;t=1`},
			{0, 202, `"leaky";r=2;t=1`},
			{0, 202, `"leaky";r=1;t=1`},
			{0, 202, `"leaky";r=0;t=1`},
			{0, 429, `"leaky";r=0;t=1`},
		}},
		// A leaky queue with a window of 3 per minute: the window item
		// counts the sends scheduled in it; jobs past it wait (they are not
		// refused), each taking a place, until the places run out. t of the
		// window is when the oldest send it counts leaves it: it counts the
		// newest 3, as the store does, so once jobs are due 60 s on (the
		// fourth when the first has left) it is they that a new job must
		// wait for.
		{"Windowed", "windowed", `"leaky";q=6;w=1, "3/m";q=3;w=60`, []step{
			{0, 202, `"leaky";r=5;t=1, "3/m";r=2;t=60`},
			{0, 202, `"leaky";r=4;t=1, "3/m";r=1;t=60`},
			{0, 202, `"leaky";r=3;t=1, "3/m";r=0;t=60`},
			{0, 202, `"leaky";r=2;t=1, "3/m";r=0;t=61`},
			{0, 202, `"leaky";r=1;t=1, "3/m";r=0;t=61`},
			{0, 202, `"leaky";r=0;t=1, "3/m";r=0;t=120`},
			{0, 429, `"leaky";r=0;t=1, "3/m";r=0;t=120`},
		}},
		// A token bucket with a window: the window, not the bucket, refuses
		// the fourth job, and the fields say so (tokens left, the window
		// full until its oldest send leaves, the Retry-After). A minute on,
		// the first three have left it. (Nothing is dispatched here: the
		// four jobs admitted take four of the five places by count.)
		{"WindowedToken", "windowed-token", `"token";q=5;w=1, "3/m";q=3;w=60`, []step{
			{0, 202, `"token";r=4;t=1, "3/m";r=2;t=60`},
			{0, 202, `"token";r=3;t=1, "3/m";r=1;t=60`},
			{0, 202, `"token";r=2;t=1, "3/m";r=0;t=60`},
			{0, 429, `"token";r=2;t=1, "3/m";r=0;t=60`},
			{60 * time.Second, 202, `"token";r=1;t=1, "3/m";r=2;t=60`},
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			clk := clock.NewFake(t0)
			h, _ := newAPIConfig(t, rateLimitConfig, clk)
			runSteps(t, h, clk, c.tenant, c.policy, c.steps)
		})
	}
}

// The store schedules a job from when a send can start (its start lag
// after now): the fields count from there too, or each would say one place
// fewer than there is.
func TestRateLimitCountsFromTheStartLag(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(t0)
	h, _ := newAPIConfig(t, rateLimitConfig, clk, func(o *bolt.Options) { o.InitialStartLag = 30 * time.Millisecond })
	runSteps(t, h, clk, "leaky", `"leaky";q=4;w=4`, []step{
		{0, 202, `"leaky";r=3;t=1`},
		{0, 202, `"leaky";r=2;t=1`},
	})
	runSteps(t, h, clk, "token", `"token";q=3;w=3`, []step{
		{0, 202, `"token";r=2;t=1`},
		{0, 202, `"token";r=1;t=1`},
	})
}

// A token bucket of 3 at 1/s: r is the tokens left, t when the next comes
// back. Once its jobs have been handed to the dispatcher (depth 0) only the
// schedule says the bucket is empty: the API's memo of it.
func TestRateLimitToken(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(t0)
	h, store := newAPIConfig(t, rateLimitConfig, clk)
	p := `"token";q=3;w=3`
	runSteps(t, h, clk, "token", p, []step{
		{0, 202, `"token";r=2;t=1`},
		{0, 202, `"token";r=1;t=1`},
		{0, 202, `"token";r=0;t=1`},
		{0, 429, `"token";r=0;t=1`},
	})
	dispatched := dispatcher(t, store)
	for _, s := range []step{
		{time.Second, 202, `"token";r=0;t=1`},     // one token came back, and went
		{2 * time.Second, 202, `"token";r=1;t=1`}, // two came back, one went
		{3 * time.Second, 202, `"token";r=2;t=1`}, // full again, one went
	} {
		dispatched("token")
		runSteps(t, h, clk, "token", p, []step{s})
	}
}

// A batch's fields say what is left after its last job; a repeated key
// (200) says where the queue stands now.
func TestRateLimitBatchAndRepeat(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(t0)
	h, _ := newAPIConfig(t, rateLimitConfig, clk)
	st, hdr, body := do(t, h, "POST", "/v1/tenants/leaky/jobs:batch", `{"jobs":[{"payload":1,"idempotency_key":"a"},{"payload":2}]}`)
	if st != 200 || hdr.Get("RateLimit-Policy") != `"leaky";q=4;w=4` || hdr.Get("RateLimit") != `"leaky";r=2;t=1` {
		t.Fatalf("batch: %d %q %q %v", st, hdr.Get("RateLimit-Policy"), hdr.Get("RateLimit"), body)
	}
	st, hdr, body = do(t, h, "POST", "/v1/tenants/leaky/jobs", `{"payload":1,"idempotency_key":"a"}`)
	if st != 200 || hdr.Get("RateLimit") != `"leaky";r=2;t=1` {
		t.Fatalf("repeat: %d %q %v", st, hdr.Get("RateLimit"), body)
	}
	st, hdr, _ = do(t, h, "POST", "/v1/tenants/leaky/jobs:batch", `{"jobs":[{"payload":3},{"payload":4},{"payload":5}]}`)
	if st != 200 || hdr.Get("RateLimit") != `"leaky";r=0;t=1` {
		t.Fatalf("batch past the places: %d %q", st, hdr.Get("RateLimit"))
	}
}

// dispatcher runs a dispatcher on store that succeeds at once, for the rest
// of the test; the function it returns waits until tenant's queue is empty.
func dispatcher(t *testing.T, store queue.Store) func(tenant string) {
	t.Helper()
	queuetest.Consume(t, store, queue.DefaultLead, queuetest.SucceedOnTime)
	return func(tenant string) {
		t.Helper()
		testutil.WaitFor(t, 10*time.Second, tenant+"'s queue drained", func() bool {
			st, err := store.Tenant(context.Background(), tenant)
			return err == nil && st.QueueDepth == 0 && st.InFlight == 0
		})
	}
}

// The fields count from the moment the store decided the tenant's jobs as
// of (Admission.AsOf), not from another tenant's start lag: here tenant a's
// prompt job showed a lag of 80 ms, tenant b's call was decided 10 ms
// ahead, and the place that frees at 50 ms is not there for b's next call.
func TestRateLimitCountsFromTheTenantsOwnDecision(t *testing.T) {
	var ms memos
	p := leaky.Policy{Interval: 100 * time.Millisecond, Capacity: 3, Burst: 1}
	ms.observe("a", p, []queue.Admission{{Job: queue.Job{Prompt: true, EnqueuedAt: t0, DispatchAt: t0.Add(80 * time.Millisecond)}, AsOf: t0.Add(80 * time.Millisecond)}}, t0)
	if ms.lag != 80*time.Millisecond {
		t.Fatalf("lag %v after a's prompt job, want 80ms", ms.lag)
	}
	for _, c := range []struct {
		asOf time.Time
		want int64
	}{
		{t0.Add(10 * time.Millisecond), 0}, // 340 ms ahead: four places taken
		{time.Time{}, 1},                   // no word: from a's lag, 270 ms ahead
	} {
		b := queue.Admission{Job: queue.Job{EnqueuedAt: t0, DispatchAt: t0.Add(250 * time.Millisecond)}, QueueDepth: 2, AsOf: c.asOf}
		tl := ms.observe("b", p, []queue.Admission{b}, t0)
		var it quota
		bucketState(&it, p, tl, tl.at)
		if it.r != c.want {
			t.Errorf("AsOf %v: r=%d, want %d", c.asOf, it.r, c.want)
		}
	}
}
