package metrics

import (
	"context"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/throttler-dev/throttler/internal/leaky"
	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/queue/bolt"
)

func setup(t *testing.T) (*Metrics, *bolt.Store) {
	t.Helper()
	store, err := bolt.Open(filepath.Join(t.TempDir(), "m.db"), bolt.Options{Policy: func(string) leaky.Policy {
		return leaky.Policy{Interval: time.Hour, Burst: 1, Capacity: 2}
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	labels := func(tenant string) (string, string) {
		if tenant == "acme" || tenant == "idle" {
			return "sms", tenant
		}
		return "sms", OtherTenants
	}
	return New(store, labels, func() []string { return []string{"acme", "idle"} }), store
}

func TestCountersAndGauges(t *testing.T) {
	t.Parallel()
	m, store := setup(t)
	ctx := context.Background()
	// acme: 4 jobs at capacity 2: 3 admitted (one sent at once, two wait), 1 refused.
	var jobs []queue.NewJob
	for i := 0; i < 4; i++ {
		jobs = append(jobs, queue.NewJob{Payload: []byte("1")})
	}
	out, err := store.Enqueue(ctx, "acme", jobs)
	if err != nil {
		t.Fatal(err)
	}
	m.Admitted("acme", out)
	// A repeat of an idempotency key is not a new acceptance.
	for i := 0; i < 2; i++ {
		o, _ := store.Enqueue(ctx, "dyn-1", []queue.NewJob{{Payload: []byte("1"), IdempotencyKey: "k"}})
		m.Admitted("dyn-1", o)
	}
	sent := time.Now()
	j := out[0].Job
	j.Attempts = 1
	m.Attempt(j, queue.Outcome{Result: queue.Retry, SentAt: sent, Status: 502}, "5xx", 10*time.Millisecond)
	j.Attempts = 2
	m.Attempt(j, queue.Outcome{Result: queue.Succeeded, SentAt: sent, Status: 200}, "2xx", 10*time.Millisecond)
	m.Attempt(out[1].Job, queue.Outcome{Result: queue.Failed, SentAt: sent, Status: 400}, "4xx", 10*time.Millisecond)

	for _, c := range []struct {
		got  float64
		want float64
		what string
	}{
		{testutil.ToFloat64(m.accepted.WithLabelValues("sms", "acme")), 3, "accepted acme"},
		{testutil.ToFloat64(m.accepted.WithLabelValues("sms", OtherTenants)), 1, "accepted other"},
		{testutil.ToFloat64(m.rejected.WithLabelValues("sms", "acme", "queue_full")), 1, "rejected"},
		{testutil.ToFloat64(m.retried.WithLabelValues("sms", "acme")), 1, "retried"},
		{testutil.ToFloat64(m.delivered.WithLabelValues("sms", "acme")), 1, "delivered"},
		{testutil.ToFloat64(m.failed.WithLabelValues("sms", "acme")), 1, "failed"},
		{testutil.ToFloat64(m.attempts.WithLabelValues("sms", "5xx")), 1, "attempts 5xx"},
		{testutil.ToFloat64(m.attempts.WithLabelValues("sms", "2xx")), 1, "attempts 2xx"},
		{testutil.ToFloat64(m.attempts.WithLabelValues("sms", "4xx")), 1, "attempts 4xx"},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.what, c.got, c.want)
		}
	}
	// Gauges come from the store at scrape time, and match it.
	st, _ := store.Tenant(ctx, "acme")
	want := strings.NewReader(`# HELP throttler_queue_depth Jobs admitted and not yet handed to the downstream.
# TYPE throttler_queue_depth gauge
throttler_queue_depth{downstream="sms",tenant="_other"} 1
throttler_queue_depth{downstream="sms",tenant="acme"} ` + itoa(st.QueueDepth) + `
throttler_queue_depth{downstream="sms",tenant="idle"} 0
`)
	if err := testutil.GatherAndCompare(m.Registry, want, "throttler_queue_depth"); err != nil {
		t.Fatal(err)
	}
	if st.QueueDepth != 3 {
		t.Fatalf("store depth %d", st.QueueDepth)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

func TestNamesPassPromlint(t *testing.T) {
	t.Parallel()
	m, store := setup(t)
	out, _ := store.Enqueue(context.Background(), "acme", []queue.NewJob{{Payload: []byte("1")}})
	m.Admitted("acme", out)
	j := out[0].Job
	j.Attempts = 1
	m.Attempt(j, queue.Outcome{Result: queue.Succeeded, SentAt: time.Now()}, "2xx", time.Millisecond)
	problems, err := testutil.GatherAndLint(m.Registry)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if strings.HasPrefix(p.Metric, "throttler_") {
			t.Errorf("promlint: %s: %s", p.Metric, p.Text)
		}
	}
}

// tenantsOnly is a store that can only list tenants: all the metrics need.
type tenantsOnly map[string]queue.TenantStatus

func (s tenantsOnly) Tenants(context.Context, int, int) ([]queue.TenantStatus, error) {
	var out []queue.TenantStatus
	for _, st := range s {
		if st.QueueDepth > 0 {
			out = append(out, st)
		}
	}
	return out, nil
}

func (s tenantsOnly) Tenant(_ context.Context, tenant string) (queue.TenantStatus, error) {
	st := s[tenant]
	st.Tenant = tenant
	return st, nil
}

func TestGaugesNeedOnlyTheTenantReads(t *testing.T) {
	t.Parallel()
	store := tenantsOnly{"acme": {Tenant: "acme", QueueDepth: 4, Paused: true}}
	m := New(store, func(tenant string) (string, string) { return "sms", tenant }, func() []string { return []string{"acme", "idle"} })
	want := strings.NewReader(`# HELP throttler_queue_depth Jobs admitted and not yet handed to the downstream.
# TYPE throttler_queue_depth gauge
throttler_queue_depth{downstream="sms",tenant="acme"} 4
throttler_queue_depth{downstream="sms",tenant="idle"} 0
# HELP throttler_tenants_paused Tenants paused now (by the downstream's Retry-After, the circuit breaker, or an operator).
# TYPE throttler_tenants_paused gauge
throttler_tenants_paused{downstream="sms",tenant="acme"} 1
throttler_tenants_paused{downstream="sms",tenant="idle"} 0
`)
	if err := testutil.GatherAndCompare(m.Registry, want, "throttler_queue_depth", "throttler_tenants_paused"); err != nil {
		t.Fatal(err)
	}
	// The Go and process collectors are registered (from collectors, not the
	// deprecated constructors).
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, mf := range mfs {
		seen[mf.GetName()] = true
	}
	if !seen["go_goroutines"] || (runtime.GOOS == "linux" && !seen["process_start_time_seconds"]) {
		t.Errorf("runtime metrics missing: go_goroutines %v, process_start_time_seconds %v", seen["go_goroutines"], seen["process_start_time_seconds"])
	}
}
