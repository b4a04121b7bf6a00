package metrics

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/throttler-dev/throttler/internal/queue"
)

// depths is a store of tenants' depths: busy ones listed deepest first.
type depths struct {
	mu    sync.Mutex
	depth map[string]int
	reads int           // Tenant calls
	lists int           // Tenants calls
	slow  time.Duration // how long Tenants takes
}

func (d *depths) set(tenant string, n int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.depth[tenant] = n
}

func (d *depths) Tenants(_ context.Context, offset, limit int) ([]queue.TenantStatus, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.lists++
	time.Sleep(d.slow)
	var out []queue.TenantStatus
	for name, n := range d.depth {
		if n > 0 {
			out = append(out, queue.TenantStatus{Tenant: name, QueueDepth: n, Delivered: int64(100 - n)})
		}
	}
	slices.SortFunc(out, func(a, b queue.TenantStatus) int {
		return cmp.Or(cmp.Compare(b.QueueDepth, a.QueueDepth), cmp.Compare(a.Tenant, b.Tenant))
	})
	out = out[min(offset, len(out)):]
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

func (d *depths) Tenant(_ context.Context, tenant string) (queue.TenantStatus, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.reads++
	return queue.TenantStatus{Tenant: tenant, QueueDepth: d.depth[tenant]}, nil
}

func recentSetup(t *testing.T, opts RecentOptions) (*Metrics, *depths, *Recent) {
	store := &depths{depth: map[string]int{}}
	m := New(store, func(string) (string, string) { return "sms", OtherTenants }, func() []string { return nil })
	opts.Every = time.Hour // passes are taken by hand below
	rc := m.KeepRecent(context.Background(), opts)
	t.Cleanup(rc.Stop)
	return m, store, rc
}

// pass takes a pass now, as if its time had come.
func pass(rc *Recent) {
	rc.mu.Lock()
	rc.nextTenants = time.Time{}
	rc.mu.Unlock()
	rc.sample(context.Background())
}

// Only the deepest busy tenants are sampled, a tenant that left the list is
// followed until it has been idle a whole window, and no more than twice
// the limit are ever tracked.
func TestRecentIsBounded(t *testing.T) {
	t.Parallel()
	m, store, rc := recentSetup(t, RecentOptions{Tenants: 3, Window: time.Hour})
	if m.Recent() != rc {
		t.Fatal("Recent() is not the running sampler")
	}
	for i := 1; i <= 10; i++ {
		store.set(fmt.Sprintf("t%02d", i), i)
	}
	pass(rc)
	got := rc.Tenants([]string{"t10", "t09", "t08", "t07"})
	if len(got) != 3 || len(got["t10"]) != 1 || got["t10"][0].Depth != 10 || got["t10"][0].Delivered != 90 {
		t.Fatalf("after one pass: %v", got)
	}
	// The deepest drain; t07..t05 become the deepest: t10..t08 are still
	// followed (busy a moment ago), read one by one.
	for i := 8; i <= 10; i++ {
		store.set(fmt.Sprintf("t%02d", i), 0)
	}
	pass(rc)
	if got := rc.Tenants([]string{"t10"}); len(got["t10"]) != 2 || got["t10"][1].Depth != 0 {
		t.Fatalf("a tenant that drained: %v", got)
	}
	if n := rc.Tracked(); n != 6 {
		t.Fatalf("%d tracked, want 6 (3 busy now, 3 busy a moment ago)", n)
	}
	// Churn: each pass a new set of deepest tenants. The tracked set stays
	// within 2 * 3, the longest idle dropped first.
	for round := 0; round < 5; round++ {
		for i := 0; i < 3; i++ {
			store.set(fmt.Sprintf("new-%d-%d", round, i), 50+i)
		}
		pass(rc)
		if n := rc.Tracked(); n > 6 {
			t.Fatalf("round %d: %d tracked, more than 6", round, n)
		}
		for i := 0; i < 3; i++ {
			store.set(fmt.Sprintf("new-%d-%d", round, i), 0)
		}
	}
}

// Idle tenants cost nothing: once idle a whole window, a tenant is dropped
// and no longer read.
func TestRecentForgetsIdleTenants(t *testing.T) {
	t.Parallel()
	_, store, rc := recentSetup(t, RecentOptions{Tenants: 10, Window: time.Nanosecond})
	store.set("a", 3)
	pass(rc)
	store.set("a", 0)
	pass(rc) // idle for more than the window: dropped, not read
	if n, reads := rc.Tracked(), store.reads; n != 0 || reads != 0 {
		t.Fatalf("%d tracked, %d reads of idle tenants", n, reads)
	}
}

// A tenant's ring keeps one window of samples (here the least, 2).
func TestRecentKeepsAWindow(t *testing.T) {
	t.Parallel()
	_, store, rc := recentSetup(t, RecentOptions{Window: 2 * time.Hour})
	store.set("b", 1)
	for i := 0; i < 5; i++ {
		pass(rc)
	}
	if got := rc.Tenants([]string{"b"}); len(got["b"]) != 2 {
		t.Fatalf("b: %d samples, want 2", len(got["b"]))
	}
}

// A store slow to list its tenants is listed less often: at most once per
// 20 times what a listing took.
func TestRecentSpacesSlowReads(t *testing.T) {
	t.Parallel()
	store := &depths{depth: map[string]int{"a": 1}, slow: 20 * time.Millisecond}
	m := New(store, func(string) (string, string) { return "sms", OtherTenants }, func() []string { return nil })
	rc := m.KeepRecent(context.Background(), RecentOptions{Every: time.Hour}) // one listing, at start
	t.Cleanup(rc.Stop)
	if e := rc.Every(); e != time.Hour {
		t.Fatalf("Every() = %v, want the hour asked for", e)
	}
	rc.every = 10 * time.Millisecond // as if asked for 10 ms: the listing's cost now rules
	pass(rc)
	if e := rc.Every(); e < costShare*store.slow {
		t.Fatalf("Every() = %v after a listing of %v", e, store.slow)
	}
	rc.sample(context.Background()) // too soon: downstreams only
	if store.lists != 2 {
		t.Fatalf("%d listings, want 2", store.lists)
	}
}

// Per downstream: attempts by class, pushbacks (429, or 503 that paused
// the tenant) and the breaker, as the counters and the dispatcher say.
func TestRecentDownstreams(t *testing.T) {
	t.Parallel()
	m, _, rc := recentSetup(t, RecentOptions{})
	j := queue.Job{Tenant: "x", Attempts: 1}
	later := time.Now().Add(time.Second)
	m.Attempt(j, queue.Outcome{Result: queue.Retry, Status: 429, PauseUntil: later}, "429", 0)
	m.Attempt(j, queue.Outcome{Result: queue.Retry, Status: 503, PauseUntil: later}, "5xx", 0)
	m.Attempt(j, queue.Outcome{Result: queue.Retry, Status: 502}, "5xx", 0)
	m.Attempt(j, queue.Outcome{Result: queue.Succeeded, Status: 200}, "2xx", 0)
	m.WatchBreakers(func() map[string]bool { return map[string]bool{"sms": true} })
	if n := testutil.ToFloat64(m.pushbacks.WithLabelValues("sms")); n != 2 {
		t.Fatalf("throttler_pushbacks_total = %v, want 2", n)
	}
	pass(rc)
	got := rc.Downstreams()["sms"]
	if len(got) != 1 { // the sample at start had no attempts of sms yet
		t.Fatalf("%d samples: %v", len(got), got)
	}
	last := got[0]
	if last.Attempts["5xx"] != 2 || last.Attempts["429"] != 1 || last.Attempts["2xx"] != 1 || last.Pushbacks != 2 || !last.BreakerOpen {
		t.Fatalf("last sample: %+v", last)
	}
}

func TestRingKeepsTheLast(t *testing.T) {
	t.Parallel()
	r := newRing[int](3)
	if got := r.all(); len(got) != 0 {
		t.Fatalf("empty ring: %v", got)
	}
	for i := 1; i <= 2; i++ {
		r.push(i)
	}
	if got := r.all(); !slices.Equal(got, []int{1, 2}) {
		t.Fatalf("%v", got)
	}
	for i := 3; i <= 7; i++ {
		r.push(i)
	}
	if got := r.all(); !slices.Equal(got, []int{5, 6, 7}) {
		t.Fatalf("%v", got)
	}
}
