package main

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/downstreamtest"
	"github.com/throttler-dev/throttler/internal/testutil"
)

// A 429 with Retry-After: 2 to one attempt pauses that tenant for 2 s (and
// only that tenant); then its queue goes on one interval apart, in the
// original order, with the pushed-back job first.
func TestRetryAfterPausesTheTenant(t *testing.T) {
	ds := downstreamtest.New(t)
	var mu sync.Mutex
	var pushedAt time.Time
	ds.Answer(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if r.Header.Get("X-Throttler-Tenant") == "acme" && strings.Contains(readBody(r), `"n":3`) && pushedAt.IsZero() {
			pushedAt = downstreamtest.ArrivalTime(r)
			w.Header().Set("Retry-After", "2")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	base := startServer(t, writeConfig(t, "[tenant_defaults]\nrate = \"10/s\"\ncapacity = 50\n", ds))
	const T = 100 * time.Millisecond
	ids := enqueueN(t, base, "acme", 10)
	other := enqueueN(t, base, "other", 20) // same downstream, no ceiling: not paused

	var ten map[string]any
	testutil.WaitFor(t, 3*time.Second, "acme paused by the 429", func() bool {
		_, _, ten = call(t, "GET", base+"/v1/tenants/acme", "")
		return ten["paused"] == true
	})
	if ten["paused_until"] == nil || ten["held"] != false {
		t.Fatalf("tenant during the pause: %v", ten)
	}
	if ms := ten["expected_delay_ms"].(float64); ms < 1500 {
		t.Fatalf("expected delay %vms during a 2s pause", ms)
	}
	testutil.WaitFor(t, 10*time.Second, "every job delivered", func() bool {
		return allSucceeded(t, base, ids) && allSucceeded(t, base, other)
	})

	acme := ds.Of("acme")
	if len(acme) != 11 {
		t.Fatalf("%d attempts for acme, want 11 (10 jobs, one of them twice)", len(acme))
	}
	// In order: n = 0, 1, 2, 3 (the 429), then 3 again, 4, ..., 9.
	wantOrder := []int{0, 1, 2, 3, 3, 4, 5, 6, 7, 8, 9}
	for i, a := range acme {
		if !strings.Contains(a.Body, fmt.Sprintf(`"n":%d}`, wantOrder[i])) {
			t.Fatalf("attempt %d carried %s, want n=%d (original order)", i, a.Body, wantOrder[i])
		}
	}
	if j := jobState(t, base, ids[3]); j["attempts"] != 2.0 {
		t.Fatalf("the pushed-back job: %v", j)
	}
	if gap := acme[4].At.Sub(acme[3].At); gap < 2*time.Second {
		t.Fatalf("acme's next attempt came %v after the 429, want no sooner than its Retry-After of 2s", gap)
	}
	// The other tenant kept going through acme's pause.
	during := 0
	for _, a := range ds.Of("other") {
		if a.At.After(acme[3].At) && a.At.Before(acme[4].At) {
			during++
		}
	}
	if during < 10 {
		t.Fatalf("only %d of the other tenant's jobs went during acme's pause", during)
	}
	if !testutil.Race {
		downstreamtest.CheckWindows(t, acme, T, 1)
		downstreamtest.CheckWindows(t, ds.Of("other"), T, 1)
	}
}

// The downstream refuses connections for 5 s while 30 jobs wait at 10/s:
// the circuit breaker keeps the attempts during the outage to a handful,
// no job is failed by the outage alone (max_attempts = 5), and all 30 are
// delivered, paced, once it is back.
func TestOutageOpensTheBreaker(t *testing.T) {
	testutil.SkipShort(t, "timing test: a 5 s outage of the downstream")
	ds := downstreamtest.New(t)
	addr := ds.Listener.Addr().String()
	base := startServer(t, writeConfig(t, "max_attempts = 5\n[tenant_defaults]\nrate = \"10/s\"\ncapacity = 50\n", ds))
	ds.Close() // down: connection refused
	down := time.Now()
	ids := enqueueN(t, base, "acme", 30)

	testutil.WaitFor(t, 4*time.Second, "the breaker open", func() bool {
		m := scrape(t, base)
		return value(m, `throttler_breaker_open{downstream="test"}`) == 1 && value(m, `throttler_tenants_paused{downstream="test",tenant="_other"}`) == 1
	})
	// Down 5 s in all: without the breaker the jobs would use up their 5
	// attempts by then; none may fail meanwhile.
	nothingMoreWithin(5*time.Second - time.Since(down))
	back, err := downstreamtest.Start(addr)
	if err != nil {
		t.Fatalf("restart the downstream on %s: %v", addr, err)
	}
	t.Cleanup(back.Close)
	testutil.WaitFor(t, 30*time.Second, "all 30 delivered", func() bool { return allSucceeded(t, base, ids) })

	failedAttempts := 0
	for _, id := range ids {
		j := jobState(t, base, id)
		failedAttempts += int(j["attempts"].(float64)) - 1
	}
	t.Logf("%d attempts failed during the 5s outage", failedAttempts)
	if failedAttempts > 8 {
		t.Fatalf("%d attempts during the outage: the breaker should have stopped them", failedAttempts)
	}
	if v := value(scrape(t, base), `throttler_breaker_open{downstream="test"}`); v != 0 {
		t.Fatalf("breaker still open after delivery: %v", v)
	}
	got := back.Of("acme")
	if len(got) != 30 {
		t.Fatalf("%d arrivals after the outage, want 30", len(got))
	}
	if !testutil.Race {
		downstreamtest.CheckWindows(t, got, 100*time.Millisecond, 1)
	}
}

// A ceiling of 10/s on the downstream, shared by A (500 jobs queued) and B
// (one job a second): B is served while A's backlog waits (B's six jobs all
// go within the 50 s that A's backlog takes), in order, neither tenant
// passes its own rate, the ceiling holds in every window, and A is not
// starved. How long B waits behind A's backlog (about two intervals of the
// ceiling on a quiet machine) measures the machine as much as the code:
// BenchmarkCeilingShare reports it.
func TestCeilingIsSharedFairly(t *testing.T) {
	testutil.SkipShort(t, "load test: a backlog of 500 jobs under a shared ceiling")
	ds, order, worst := shareCeiling(t)
	all := ds.All()
	t.Logf("B waited at most %v; %d sends in %v", worst, len(all), all[len(all)-1].At.Sub(all[0].At))
	for i, a := range ds.Of("b") {
		if a.Key != order[i] {
			t.Fatalf("B's arrival %d is job %s, want %s: B's jobs out of order", i, a.Key, order[i])
		}
	}
	if n := len(ds.Of("a")); n >= 500 {
		t.Fatalf("A's whole backlog (%d) went before B's last job", n)
	}
	if testutil.Race {
		return
	}
	downstreamtest.CheckWindows(t, all, ceilingInterval, 1)
	downstreamtest.CheckWindows(t, ds.Of("a"), 50*time.Millisecond, 1)
	downstreamtest.CheckWindows(t, ds.Of("b"), 200*time.Millisecond, 1)
	// A had the ceiling's rest: it was not starved either.
	if n := len(ds.Of("a")); n < 50 {
		t.Fatalf("A sent %d in ~6s under a 10/s ceiling", n)
	}
}

// ceilingInterval is the interval of shareCeiling's downstream ceiling.
const ceilingInterval = 100 * time.Millisecond

// shareCeiling runs the shared ceiling's workload: a downstream ceiling of
// 10/s, tenant A (20/s) with 500 jobs queued at once, tenant B (5/s)
// sending one job a second six times behind A's backlog. It returns the
// downstream once B's jobs have arrived, B's job ids in the order they
// were sent, and the longest B waited from its 202 to its arrival.
func shareCeiling(tb testing.TB) (ds *downstreamtest.Server, order []string, worst time.Duration) {
	ds = downstreamtest.New(tb)
	base := startServer(tb, writeConfig(tb, `rate = "10/s"
[tenant_defaults]
rate = "20/s"
capacity = 1000
[tenants.b]
rate = "5/s"
`, ds))
	var batch strings.Builder
	batch.WriteString(`{"jobs":[`)
	for i := 0; i < 500; i++ {
		if i > 0 {
			batch.WriteString(",")
		}
		fmt.Fprintf(&batch, `{"payload":{"n":%d}}`, i)
	}
	batch.WriteString("]}")
	if st, _, body := call(tb, "POST", base+"/v1/tenants/a/jobs:batch", batch.String()); st != 200 {
		tb.Fatalf("batch: %d %v", st, body)
	}
	sent := map[string]time.Time{}
	start := time.Now()
	for i := 0; i < 6; i++ {
		arriveAt(start.Add(time.Duration(i+1) * time.Second)) // B sends one a second behind A's backlog
		st, _, body := call(tb, "POST", base+"/v1/tenants/b/jobs", fmt.Sprintf(`{"payload":{"b":%d}}`, i))
		if st != 202 {
			tb.Fatalf("b: %d %v", st, body)
		}
		sent[body["id"].(string)] = time.Now()
		order = append(order, body["id"].(string))
	}
	testutil.WaitFor(tb, 30*time.Second, "B's jobs delivered", func() bool { return len(ds.Of("b")) == 6 })
	for _, a := range ds.Of("b") {
		worst = max(worst, a.At.Sub(sent[a.Key]))
	}
	return ds, order, worst
}

// An operator hold: nothing of the tenant goes from the moment the pause is
// answered (not even the jobs already handed to the dispatcher) until it is
// resumed, it keeps accepting while it has room, and it goes on in order.
func TestOperatorPauseAndResume(t *testing.T) {
	ds := downstreamtest.New(t)
	base := startServer(t, writeConfig(t, "[tenant_defaults]\nrate = \"20/s\"\ncapacity = 5\n", ds))
	ids := enqueueN(t, base, "acme", 4) // one goes at once, the next ones 50 ms apart
	st, _, ten := call(t, "POST", base+"/v1/tenants/acme/pause", "")
	paused := time.Now()
	if st != 200 || ten["paused"] != true || ten["held"] != true || ten["paused_until"] != nil {
		t.Fatalf("pause: %d %v", st, ten)
	}
	// A job handed to the dispatcher ahead of its slot (a busy machine may
	// not have sent even the first yet) goes back in line when the hold
	// stops it: the bound is checked once none is in flight.
	testutil.WaitFor(t, 5*time.Second, "no job in flight after the hold", func() bool {
		_, _, ten := call(t, "GET", base+"/v1/tenants/acme", "")
		return ten["in_flight"] == 0.0
	})
	for i := 0; ; i++ {
		st, _, body := call(t, "POST", base+"/v1/tenants/acme/jobs", fmt.Sprintf(`{"payload":{"n":%d}}`, 100+i))
		if st == 429 {
			if body["error"] != "queue_full" {
				t.Fatalf("refusal while held: %v", body)
			}
			break
		}
		if st != 202 || i > 5 {
			t.Fatalf("while held: %d %v", st, body)
		}
		ids = append(ids, body["id"].(string))
	}
	nothingMoreWithin(300 * time.Millisecond) // held: nothing may reach the downstream
	sentBefore := len(ds.All())
	for _, a := range ds.All() {
		if a.At.After(paused.Add(5 * time.Millisecond)) {
			t.Fatalf("a job reached the downstream %v after the pause was answered", a.At.Sub(paused))
		}
	}
	_, _, ten = call(t, "GET", base+"/v1/tenants/acme", "")
	if ten["queue_depth"] != 5.0 {
		t.Fatalf("held tenant holds %v jobs, want its capacity of 5: %v", ten["queue_depth"], ten)
	}
	resumed := time.Now()
	if st, _, ten := call(t, "POST", base+"/v1/tenants/acme/resume", ""); st != 200 || ten["paused"] != false {
		t.Fatalf("resume: %d %v", st, ten)
	}
	testutil.WaitFor(t, 5*time.Second, "delivered after resume", func() bool { return allSucceeded(t, base, ids) })
	got := ds.All()
	if len(got) != len(ids) || got[sentBefore].At.Before(resumed) {
		t.Fatalf("%d deliveries of %d jobs; first after the hold at %v", len(got), len(ids), got[sentBefore].At.Sub(resumed))
	}
	if !testutil.Race {
		downstreamtest.CheckWindows(t, got, 50*time.Millisecond, 1)
	}
	if st, _, _ := call(t, "GET", base+"/v1/tenants/acme/pause", ""); st != 405 {
		t.Fatalf("GET on pause: %d", st)
	}
}

// A job that would wait past its deadline is refused at once (422
// would_expire, nothing queued); one that fits is accepted; one that a
// downstream's pause pushes past its deadline ends expired and is never
// sent, while the jobs around it are delivered.
func TestDeadlines(t *testing.T) {
	ds := downstreamtest.New(t)
	var pushed atomic.Bool
	ds.Answer(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(readBody(r), `"n":1}`) && pushed.CompareAndSwap(false, true) {
			w.Header().Set("Retry-After", "2")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	base := startServer(t, writeConfig(t, "[tenant_defaults]\nrate = \"10/s\"\ncapacity = 50\n", ds))
	var ids []string
	for i := 0; i < 6; i++ {
		body := fmt.Sprintf(`{"payload":{"n":%d}}`, i)
		if i == 3 {
			body = `{"payload":{"n":3},"expires_in":"1s"}` // fits: due in 300 ms
		}
		st, _, a := call(t, "POST", base+"/v1/tenants/acme/jobs", body)
		if st != 202 {
			t.Fatalf("job %d: %d %v", i, st, a)
		}
		ids = append(ids, a["id"].(string))
	}
	// Behind six at 10/s it waits up to 600 ms, less the time the posts
	// took (a busy CI run: 497 ms): past its 200 ms either way, which is
	// what the answer must say.
	st, _, a := call(t, "POST", base+"/v1/tenants/acme/jobs", `{"payload":{"n":99},"expires_in":"200ms"}`)
	if st != 422 || a["error"] != "would_expire" || a["expected_delay_ms"].(float64) <= 200 {
		t.Fatalf("a job that cannot make its deadline: %d %v", st, a)
	}
	if st, _, a := call(t, "POST", base+"/v1/tenants/acme/jobs", `{"payload":1,"deadline":"2020-01-01T00:00:00Z"}`); st != 422 || a["error"] != "would_expire" {
		t.Fatalf("a deadline in the past: %d %v", st, a)
	}
	if _, _, ten := call(t, "GET", base+"/v1/tenants/acme", ""); ten["accepted_total"] != 6.0 || ten["queue_depth"].(float64) > 6 {
		t.Fatalf("a refused job was queued: %v", ten)
	}
	expired := ids[3]
	testutil.WaitFor(t, 10*time.Second, "the others delivered", func() bool {
		return allSucceeded(t, base, append(append([]string{}, ids[:3]...), ids[4:]...))
	})
	j := jobState(t, base, expired)
	if j["state"] != "expired" || j["attempts"] != 0.0 || j["deadline"] == nil {
		t.Fatalf("the job pushed past its deadline: %v", j)
	}
	for _, arr := range ds.All() {
		if arr.Key == expired {
			t.Fatal("an expired job was sent")
		}
	}
	if _, _, ten := call(t, "GET", base+"/v1/tenants/acme", ""); ten["expired_total"] != 1.0 || ten["delivered_total"] != 5.0 {
		t.Fatalf("tenant %v", ten)
	}
	m := scrape(t, base)
	if v := value(m, `throttler_jobs_expired_total{downstream="test",tenant="_other"}`); v != 1 {
		t.Fatalf("expired counter %v", v)
	}
	if v := value(m, `throttler_jobs_rejected_total{downstream="test",reason="would_expire",tenant="_other"}`); v != 2 {
		t.Fatalf("would_expire refusals counted %v, want 2", v)
	}
	for _, bad := range []string{`{"payload":1,"expires_in":"soon"}`, `{"payload":1,"deadline":"tomorrow"}`, `{"payload":1,"expires_in":"1s","deadline":"2030-01-01T00:00:00Z"}`, `{"payload":1,"cost":0}`, `{"payload":1,"cost":1.5}`} {
		if st, _, a := call(t, "POST", base+"/v1/tenants/acme/jobs", bad); st != 400 {
			t.Fatalf("%s: %d %v", bad, st, a)
		}
	}
}

// A cost-3 job then a cost-1 job at 10/s: the second reaches the downstream
// 300 ms after the first, as promised; the queue counts the cost in its
// Retry-After, and a cost it could never hold is 422.
func TestCost(t *testing.T) {
	ds := downstreamtest.New(t)
	base := startServer(t, writeConfig(t, "[tenant_defaults]\nrate = \"10/s\"\ncapacity = 3\n", ds))
	st, _, body := call(t, "POST", base+"/v1/tenants/acme/jobs:batch", `{"jobs":[{"payload":{"n":0},"cost":3},{"payload":{"n":1}},{"payload":{"n":2}},{"payload":{"n":3},"cost":5}]}`)
	if st != 200 {
		t.Fatalf("batch: %d %v", st, body)
	}
	res := body["results"].([]any)
	first, second := res[0].(map[string]any), res[1].(map[string]any)
	if first["status"] != 202.0 || second["status"] != 202.0 {
		t.Fatalf("results %v", res)
	}
	if d := second["expected_delay_ms"].(float64); d < 300 || d > 320 {
		t.Fatalf("the job after a cost-3 job is promised %vms, want about 300", d)
	}
	// One interval (a cost-3 job would make it three), plus the start lag
	// (at most 100 ms) that a Retry-After counts.
	if r := res[2].(map[string]any); r["status"] != 429.0 || r["retry_after_ms"].(float64) > 200 {
		t.Fatalf("third: %v", r)
	}
	if r := res[3].(map[string]any); r["status"] != 422.0 || r["error"] != "cost_too_large" || r["max_cost"] != 4.0 {
		t.Fatalf("cost 5: %v", r)
	}
	testutil.WaitFor(t, 5*time.Second, "both delivered", func() bool { return len(ds.All()) == 2 })
	got := ds.All()
	gap := got[1].At.Sub(got[0].At)
	t.Logf("cost 3 then cost 1: %v apart", gap)
	if j := jobState(t, base, first["id"].(string)); j["cost"] != 3.0 {
		t.Fatalf("job %v", j)
	}
	if testutil.Race {
		return
	}
	if gap < 300*time.Millisecond-downstreamtest.Jitter || gap > 350*time.Millisecond {
		t.Fatalf("second job %v after a cost-3 job at 10/s, want 300ms", gap)
	}
}
