package api

import (
	"context"
	"testing"
	"time"

	"github.com/throttler-dev/throttler/internal/config"
	"github.com/throttler-dev/throttler/internal/metrics"
	"github.com/throttler-dev/throttler/internal/queue"
	"github.com/throttler-dev/throttler/internal/queue/bolt"
)

// Promises under a cap on attempts in flight: the rate's wait stays exact
// until the cap makes it longer; then the answer says limited_by in_flight
// and its delay is the estimate (the jobs ahead, cap at a time, each the
// downstream's recent latency). GET /v1/tenants/{t} says which limit binds.
func TestACapThatBindsIsSaidWithItsEstimate(t *testing.T) {
	t.Parallel()
	cfg := loadConfig(t, "[tenant_defaults]\nrate = \"100/s\"\ncapacity = 100\nmax_in_flight = 2\n[tenants.slow]\nrate = \"1/s\"\nmax_in_flight = 2\n")
	store := openStore(t, t.TempDir(), cfg, bolt.Options{})
	m := metrics.New(store, func(string) (string, string) { return "default", metrics.OtherTenants }, func() []string { return nil })
	h := New(Options{Store: store, Config: func() *config.Config { return cfg }, Metrics: m})

	// No attempt seen yet: nothing to estimate from, the rate's wait alone.
	st, _, a := do(t, h, "POST", "/v1/tenants/acme/jobs", `{"payload":1}`)
	if st != 202 || a["limited_by"] != nil {
		t.Fatalf("before any attempt: %d %v, want no limited_by", st, a)
	}
	for range 3 { // the downstream answers in 400 ms
		m.Attempt(queue.Job{Tenant: "acme"}, queue.Outcome{Result: queue.Succeeded, SentAt: time.Now()}, "2xx", 400*time.Millisecond)
	}
	if got, ok := m.RecentLatency("default"); !ok || got != 400*time.Millisecond {
		t.Fatalf("recent latency %v %v, want 400ms", got, ok)
	}
	var last map[string]any
	for i := 2; i <= 9; i++ {
		_, _, last = do(t, h, "POST", "/v1/tenants/acme/jobs", `{"payload":1}`)
		ahead := i - 1
		capWait := time.Duration(ahead/2) * 400 * time.Millisecond
		rateWait := timeMS(int64(last["expected_delay_ms"].(float64)))
		if capWait > time.Duration(ahead)*10*time.Millisecond { // the rate's: 10 ms a job
			if last["limited_by"] != "in_flight" || rateWait != capWait {
				t.Fatalf("job %d, %d ahead at 2 at a time of 400 ms: %v, want limited_by in_flight and %v", i, ahead, last, capWait)
			}
		} else if last["limited_by"] != nil {
			t.Fatalf("job %d: %v, want the rate's wait", i, last)
		}
	}
	if st, _, tn := do(t, h, "GET", "/v1/tenants/acme", ""); st != 200 || tn["limited_by"] != "in_flight" || tn["max_in_flight"] != float64(2) ||
		timeMS(int64(tn["expected_delay_ms"].(float64))) != 4*400*time.Millisecond {
		t.Fatalf("acme with 9 waiting, 2 at a time of 400 ms: %v, want limited_by in_flight and 1.6 s", tn)
	}
	// A tenant whose rate is slower than its cap lets it: the rate binds.
	for range 3 {
		do(t, h, "POST", "/v1/tenants/slow/jobs", `{"payload":1}`)
	}
	if _, _, tn := do(t, h, "GET", "/v1/tenants/slow", ""); tn["limited_by"] != "rate" || tn["expected_delay_ms"].(float64) < 2000 {
		t.Fatalf("slow (1/s, 3 waiting): %v, want limited_by rate and about 3 s", tn)
	}
	if _, err := store.Pause(context.Background(), "slow"); err != nil {
		t.Fatal(err)
	}
	if _, _, tn := do(t, h, "GET", "/v1/tenants/slow", ""); tn["limited_by"] != "paused" {
		t.Fatalf("slow, held: %v, want limited_by paused", tn)
	}
}
